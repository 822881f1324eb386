"""What a resume says before it starts: `launch --resume RUN --dry-run` plans the run in its own
(existing) directory and names the checkpoint it would load; a run with no complete checkpoint is
refused (its trainer would start again at step 1); `smoke --resume RUN` refuses, in one line, an
option that differs from the run's, as `launch --resume` does.  Synthetic tree and run records."""

from __future__ import annotations

import json

import pytest
from synthetic_tree import make_project, trust_synthetic_tree

from dancegrpo_npu.cli import main
from dancegrpo_npu.project import find_project
from dancegrpo_npu.run import resume
from dancegrpo_npu.run.directory import write_json
from dancegrpo_npu.smoke import runner as smoke

SMOKE_ARGS = ["--seed", "42", "--h", "64", "--w", "64", "--num_generations", "2", "--max_train_steps", "3",
              "--checkpointing_steps", "1", "--output_dir", "OUT"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    return find_project(make_project(tmp_path / "proj"))


def recorded_run(project, name="20260101-100000-smoke", checkpoints=(), script="flux"):
    run = project.runs_dir / name
    (run / "outputs").mkdir(parents=True)
    write_json(run / "launch.json", {
        "script": script, "nproc_per_node": 1, "nnodes": 1, "node_rank": 0, "world_size": 1, "device": "cpu",
        "strict": True, "script_args": [a.replace("OUT", str(run / "outputs")) for a in SMOKE_ARGS],
        "env_set": [], "identity": resume.tree_identity(project)})
    write_json(run / "summary.json", {"status": "interrupted", "world_size": 1, "steps": 2})
    for step in checkpoints:
        directory = run / "outputs" / "resume" / f"step-{step:06d}"
        directory.mkdir(parents=True)
        (directory / "rank_0.pt").write_bytes(b"x" * 8)
        (directory / "manifest.json").write_text(json.dumps({"format": 1, "files": {"rank_0.pt": 8}}))
    return run


def test_the_dry_run_plans_the_run_in_its_directory_and_names_the_checkpoint(project, capsys):
    run = recorded_run(project, checkpoints=(1, 2))
    assert main(["-C", str(project.root), "launch", "--resume", run.name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "was not created" not in out
    assert f"# dry run: nothing was started; the run continues in its own directory {run}" in out
    assert f"# resume: from its checkpoint step 2 ({run / 'outputs' / 'resume' / 'step-000002'})" in out
    assert "--resume_from_checkpoint latest" in out


def test_a_checkpoint_named_after_the_run_is_the_one_named(project, capsys):
    run = recorded_run(project, checkpoints=(1, 2))
    first = run / "outputs" / "resume" / "step-000001"
    assert main(["-C", str(project.root), "launch", "--resume", run.name, "--dry-run", "--",
                 "--resume_from_checkpoint", str(first)]) == 0
    assert f"# resume: from its checkpoint step 1 ({first})" in capsys.readouterr().out


def test_a_run_without_a_complete_checkpoint_is_not_resumed(project, capsys):
    run = recorded_run(project)
    torn = run / "outputs" / "resume" / "step-000002"
    torn.mkdir(parents=True)
    (torn / "rank_0.pt").write_bytes(b"x" * 3)
    (torn / "manifest.json").write_text(json.dumps({"format": 1, "files": {"rank_0.pt": 8}}))  # cut short
    assert main(["-C", str(project.root), "launch", "--resume", run.name, "--dry-run"]) == 1
    out = capsys.readouterr().out
    says = (f"--resume {run.name}: the run has no complete checkpoint under {run / 'outputs' / 'resume'}, so its "
            "trainer would start again at step 1")
    assert says in out.split("# could not start here:")[1]
    before = sorted(p.name for p in run.rglob("*"))
    assert main(["-C", str(project.root), "launch", "--resume", run.name]) == 1
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing started, nothing written


@pytest.mark.parametrize("words, says", [
    (["--steps", "5"], "--steps 5 would change the run (it has 3)"),
    (["--generations", "4"], "--generations 4 would change the run (it has 2)"),
    (["--nproc", "2"], "--nproc 2 would change the run (it has 1)"),
    (["--trainer", "flux-lora"], "--trainer flux-lora would change the run (it has flux)"),
    (["--lora"], "--trainer flux-lora would change the run (it has flux)"),
    (["--checkpointing-steps", "3"], "--checkpointing-steps 3 would change the run (it has 1)"),
    (["--device", "cuda"], "--device cuda would change the run (it has cpu)"),
])
def test_smoke_resume_refuses_another_value_in_one_line(project, capsys, words, says):
    run = recorded_run(project, checkpoints=(2,))
    assert main(["-C", str(project.root), "smoke", "--resume", run.name, *words]) == 2
    err = capsys.readouterr().err
    assert f"smoke --resume {run.name}: {says}" in err and len(err.strip().splitlines()) == 1


def test_smoke_resume_takes_the_runs_own_values_given_again(project):
    run = recorded_run(project, checkpoints=(2,))
    given = {"trainer": "flux", "steps": 3, "generations": 2, "nproc": 1, "checkpointing-steps": 1, "device": "cpu"}
    options = smoke.resumed_options(project, smoke.SmokeOptions(resume=run.name), given)
    assert (options.trainer, options.steps, options.generations, options.nproc) == ("flux", 3, 2, 1)


def test_a_launch_records_the_digests_its_verified_tree_carries_without_reading_the_series_again(monkeypatch, tmp_path):
    from dancegrpo_npu.run import resume

    def read_again(project):
        raise AssertionError("the series and overlay were read again")

    monkeypatch.setattr(resume, "tree_identity", read_again)
    verified = {"state": "verified", "upstream_commit": "c" * 40, "series_sha256": "s" * 64, "overlay_sha256": "o" * 64}
    assert resume.launch_identity(None, verified) == {"upstream_commit": "c" * 40, "series": "s" * 64,
                                                      "overlay": "o" * 64}
    with pytest.raises(AssertionError, match="read again"):  # a tree the command did not verify is read
        resume.launch_identity(None, {"state": "unverified"})
