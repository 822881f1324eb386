"""What a smoke leaves in its run directory and how the run is read back, on the synthetic tree
(a stand-in trainer, no tiny models): an import that fails is named with its file and line, a
smoke whose checks fail is listed as failed by ``runs``, and a finished run is not resumed."""

from __future__ import annotations

import json

import pytest
from synthetic_tree import make_project, trust_synthetic_tree

from dancegrpo_npu.cli import main
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import find_project
from dancegrpo_npu.smoke import runner
from dancegrpo_npu.trainers.flux import smoke as flux

SMOKE_ARGS = ("--max_train_steps", "2", "--num_generations", "2", "--checkpointing_steps", "2")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The synthetic project; the smoke's fixtures and arguments stood in for (the stand-in trainer
    needs neither)."""
    trust_synthetic_tree(monkeypatch)
    monkeypatch.setattr(flux, "fixtures", lambda *a: None)  # the row's hooks
    monkeypatch.setattr(flux, "arguments", lambda *a: SMOKE_ARGS)
    return find_project(make_project(tmp_path / "proj"))


def options(**kw):
    return runner.SmokeOptions(device="cpu", **kw)


def test_a_trainer_whose_import_fails_is_named_with_the_file_and_line(project):
    trainer = project.workdir / "fastvideo" / "train_grpo_flux.py"
    trainer.write_text('"""A stand-in trainer whose module-level import fails."""\nimport os\nimport dancegrpo_no_such_module\n')
    with pytest.raises(DancegrpoError) as err:
        runner.run_smoke(project, options())
    line = err.value.one_line()
    assert err.value.message.startswith("smoke: the training run failed at an import (exit 1): "
                                        "ModuleNotFoundError: No module named 'dancegrpo_no_such_module', at "), line
    assert err.value.message.endswith(f"{trainer} line 3: import dancegrpo_no_such_module"), line
    assert "checkpoint" not in line, line  # no step ran: checkpoints are no advice
    assert "install what it imports" in err.value.hint and "stderr.log" in err.value.hint
    (run,) = project.runs_dir.iterdir()
    assert json.loads((run / "smoke.json").read_text())["passed"] is False


def test_a_smoke_whose_checks_fail_is_listed_as_failed_and_a_finished_run_is_not_resumed(project, capsys):
    with pytest.raises(DancegrpoError) as err:
        runner.run_smoke(project, options())  # the stand-in trainer ends well, the checks fail
    (run,) = project.runs_dir.iterdir()
    assert json.loads((run / "summary.json").read_text())["status"] == "succeeded"  # the training run's end
    capsys.readouterr()
    assert main(["-C", str(project.root), "runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == [run.name, "failed"], lines
    assert lines[2].strip() == f"failed: {err.value.message}", lines
    assert main(["-C", str(project.root), "runs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "failed"

    # its training run ended: a resume would train nothing; it is refused at once, in one line
    assert main(["-C", str(project.root), "smoke", "--resume", run.name]) == 1
    out, err_text = capsys.readouterr()
    assert err_text.strip().splitlines() == [
        f"dancegrpo-npu: error: smoke --resume {run.name}: the run is already complete: it trained its 2 steps and "
        "failed its checks; start a new smoke run to train again (`dancegrpo-npu runs` shows this one)"]
    assert "smoke:" not in out  # nothing started
    assert not json.loads((run / "summary.json").read_text()).get("resumes")  # none counted


@pytest.mark.parametrize("verbose", [False, True])
def test_a_stopped_runs_continuation_is_said_once(project, monkeypatch, verbose):
    """The launch prints how to continue a stopped run (-v shows the launch's own lines); the
    smoke's error adds it only where the launch's lines were hidden."""
    from dancegrpo_npu.run import launch as launch_mod
    from dancegrpo_npu.run.runner import RunRecord

    line = "run R terminated; continue it with: dancegrpo-npu launch --resume R"
    run_dir = project.runs_dir / "R"
    summary = {"status": "terminated", "failure": {"log": "logs/stderr.log"},
               "continue_with": {"line": line, "checkpoint": "outputs/resume/step-2"}}
    monkeypatch.setattr(launch_mod, "launch", lambda project, spec, **kw: RunRecord(run_dir=run_dir, returncode=143,
                                                                                    command=(), summary=summary))
    with pytest.raises(DancegrpoError) as err:
        runner._launch(project, options(verbose=verbose), SMOKE_ARGS)
    assert err.value.message.startswith("smoke: the training run was terminated (exit 143)")
    assert (line in err.value.hint) is not verbose, err.value.hint
