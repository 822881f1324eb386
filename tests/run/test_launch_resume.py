"""launch --resume's planning (dancegrpo_npu.run.resume) on synthetic run records, without a
training run: the recorded arguments plus --resume_from_checkpoint latest, the one-line refusals
of a resume that would change the run, the restart count, and `runs` showing both.  The real
trainers resume in tests/patches/test_resume.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dancegrpo_npu.cli import main
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import find_project
from dancegrpo_npu.run import resume
from dancegrpo_npu.run.directory import write_json

ARGS = ["--seed", "42", "--h", "64", "--w", "64", "--num_generations", "2", "--max_train_steps", "4",
        "--output_dir", "OUT", "--rng", "cpu", "--record"]


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    for name in ("upstream.lock",):
        (root).mkdir(exist_ok=True)
        (root / name).write_text((Path(__file__).parents[2] / name).read_text())
    (root / "patches").mkdir()
    (root / "patches" / "series").write_text("")
    (root / "overlay").mkdir()
    return find_project(root)


def recorded_run(project, name="20260101-100000-flux", identity=None, world=2, **launch):
    run = project.runs_dir / name
    (run / "outputs").mkdir(parents=True)
    args = [a.replace("OUT", str(run / "outputs")) for a in ARGS]
    write_json(run / "launch.json", {"script": "flux", "nproc_per_node": world, "nnodes": 1, "node_rank": 0,
                                     "world_size": world, "device": "cpu", "strict": True, "script_args": args,
                                     "env_set": [{"name": "FOO", "value": "1", "source": "--env"}],
                                     "identity": resume.tree_identity(project) if identity is None else identity,
                                     **launch})
    write_json(run / "summary.json", {"status": "failed", "world_size": world, "steps": 2})
    return run


def test_a_resume_is_the_recorded_run_continued_from_latest(project):
    run = recorded_run(project)
    spec = resume.resume_spec(project, run.name, ("--max_train_steps", "8"), max_restarts=2)
    assert spec.resume_of == run and spec.nproc_per_node == 2 and spec.device == "cpu" and spec.strict
    assert spec.args[-4:] == ("--max_train_steps", "8", "--resume_from_checkpoint", "latest")
    assert not spec.upstream_defaults and spec.env == (("FOO", "1"),) and spec.max_restarts == 2
    named = resume.with_resume_flag(("--resume_from_checkpoint", "/x/step-000002"))
    assert named == ("--resume_from_checkpoint", "/x/step-000002")


@pytest.mark.parametrize("extra, given, words", [
    (("--h", "128"), {}, "--h 64 (now 128)"),
    (("--num_generations", "4"), {}, "--num_generations 2 (now 4)"),
    (("--seed", "7"), {}, "--seed 42 (now 7)"),
    ((), {"nproc_per_node": 4}, "nproc-per-node 4 would change the run (it has 2)"),
])
def test_a_resume_that_would_change_the_run_is_one_line(project, extra, given, words):
    run = recorded_run(project)
    with pytest.raises(DancegrpoError) as err:
        resume.resume_spec(project, run.name, extra, given)
    assert words in err.value.message and "\n" not in err.value.message and err.value.exit_code == 2


def test_another_series_or_checkpoint_world_size_is_refused(project):
    run = recorded_run(project, identity={**resume.tree_identity(project), "series": "0" * 64})
    with pytest.raises(DancegrpoError, match="series 000000000000"):
        resume.resume_spec(project, run.name)
    other = recorded_run(project, name="20260101-110000-flux")
    (other / "outputs" / "resume" / "step-000002").mkdir(parents=True)
    (other / "outputs" / "resume" / "step-000002" / "manifest.json").write_text(json.dumps({"world_size": 4}))
    with pytest.raises(DancegrpoError, match="world size 4 in the checkpoint"):
        resume.resume_spec(project, other.name)


def test_restarts_are_counted_and_runs_shows_them(project, capsys):
    run = recorded_run(project)
    for attempt in ("a/attempt_0", "a/attempt_1", "a/attempt_2", "b/attempt_0"):
        (run / "logs" / "torchrun" / attempt).mkdir(parents=True)
    assert resume.restarts(run) == 2
    write_json(run / "summary.json", {"status": "succeeded", "world_size": 2, "steps": 4, "resumes": 1, "restarts": 2})
    assert main(["-C", str(project.root), "runs"]) == 0
    assert "continued from checkpoints: resumed 1, restarted 2" in capsys.readouterr().out


def test_launch_resume_takes_no_script(project, capsys):
    run = recorded_run(project)
    assert main(["-C", str(project.root), "launch", "--resume", run.name, "flux"]) == 2
    assert "the script comes from the run's record" in capsys.readouterr().err
