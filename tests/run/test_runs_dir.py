"""Run directories anywhere (--runs-dir, $DANCEGRPO_RUNS), and runs directories that cannot be
written: one line naming the path and the reason, and a run that dies on a full disk still
leaves a record that `runs` lists as failed, with why.

The tests run as root, which permissions do not stop: an unwritable place is a path under a
regular file (ENOTDIR, for root too), and a full disk is simulated by making the record writer
raise ENOSPC.
"""

from __future__ import annotations

import errno
import json
import sys
from dataclasses import replace

import pytest
from synthetic_tree import make_project, trust_synthetic_tree

from dancegrpo_npu.cli import main
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import find_project, project_from_args
from dancegrpo_npu.run import directory, runner
from dancegrpo_npu.run.launch import LaunchSpec, build_plan


@pytest.fixture
def project(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    monkeypatch.delenv("DANCEGRPO_RUNS", raising=False)
    return find_project(make_project(tmp_path / "proj"))


def fake_run(runs_dir, name, summary=None):
    run = runs_dir / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary or {"status": "succeeded", "world_size": 1, "steps": 1}))
    (run / "reward.txt").write_text("0.3\n0.4\n")
    return run


def test_the_option_wins_over_the_variable_which_wins_over_the_project(project, tmp_path):
    class Args:
        project_dir = str(project.root)
        workdir = None
        runs_dir = None

    assert project_from_args(Args, {}).runs_dir == project.root / "runs"
    assert project_from_args(Args, {"DANCEGRPO_RUNS": str(tmp_path / "env")}).runs_dir == tmp_path / "env"
    Args.runs_dir = "relative/runs"
    assert project_from_args(Args, {"DANCEGRPO_RUNS": str(tmp_path / "env")}).runs_dir.is_absolute()
    assert str(project_from_args(Args, {}).runs_dir).endswith("relative/runs")


@pytest.mark.parametrize("how", ["option", "variable"])
def test_every_verb_uses_the_runs_directory_given(project, tmp_path, monkeypatch, capsys, how):
    shared = tmp_path / "shared" / "runs"
    argv = ["-C", str(project.root)] + (["--runs-dir", str(shared)] if how == "option" else [])
    if how == "variable":
        monkeypatch.setenv("DANCEGRPO_RUNS", str(shared))
    fake_run(shared, "20260101-100000-a")
    assert main([*argv, "launch", "flux", "--nproc-per-node", "8", "--device", "cpu", "--dry-run"]) == 0
    assert f"mkdir -p {shared}/" in capsys.readouterr().out
    assert main([*argv, "runs"]) == 0 and "20260101-100000-a" in capsys.readouterr().out
    assert main([*argv, "compare", "nosuch", "a"]) == 2
    assert f"no run 'nosuch' in {shared}" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert main([*argv, "plot", "a"]) == 0 and (shared / "20260101-100000-a" / "reward.png").is_file()
    assert not (project.root / "runs").exists()


def test_launch_option_after_the_script(project, tmp_path, capsys):
    shared = tmp_path / "elsewhere"
    assert main(["-C", str(project.root), "launch", "flux", "--nproc-per-node", "8", "--runs-dir", str(shared),
                 "--device", "cpu", "--dry-run"]) == 0  # fmt: skip
    assert f"cd {shared}/" in capsys.readouterr().out


def test_a_runs_directory_that_cannot_be_made_is_one_line(project, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    rc = main(["-C", str(project.root), "--runs-dir", str(blocker / "runs"), "launch", "flux", "--nproc-per-node", "8",
               "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"dancegrpo-npu: error: cannot write {blocker / 'runs'}: {blocker} is a file, not a directory")
    assert "--runs-dir DIR or DANCEGRPO_RUNS" in err


@pytest.mark.parametrize("under", [False, True])
def test_a_dry_run_into_a_runs_directory_that_is_a_file_is_one_line(project, tmp_path, capsys, under):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    runs = blocker / "runs" if under else blocker
    rc = main(["-C", str(project.root), "launch", "flux", "--runs-dir", str(runs), "--nproc-per-node", "8",
               "--device", "cpu", "--dry-run"])  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 1 and captured.err.count("\n") == 1 and not captured.out
    assert captured.err.startswith(f"dancegrpo-npu: error: cannot write {runs}: {blocker} is a file, not a directory")


def test_plot_to_a_place_that_cannot_be_written_is_one_line(project, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    fake_run(project.runs_dir, "20260101-100000-a")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc = main(["-C", str(project.root), "plot", "a", "-o", str(blocker / "x.png")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert f"cannot write {blocker / 'x.png'}: {blocker} is a file, not a directory; move the file, or write elsewhere: --output" in err


def test_compare_on_a_full_disk_is_one_line(project, monkeypatch, capsys):
    pytest.importorskip("safetensors")
    from recorded_runs import make_run

    from dancegrpo_npu.align import report

    make_run(project.runs_dir, "20260101-100000-cpu")
    b = make_run(project.runs_dir, "20260101-110000-npu")

    def full(result):
        raise OSError(errno.ENOSPC, "No space left on device", str(b / "compare.json"))

    monkeypatch.setattr(report, "write_reports", full)
    rc = main(["-C", str(project.root), "compare", "cpu", "npu"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert f"cannot write {b / 'compare.json'}: No space left on device" in err


def _quick_plan(project, tmp_path, code: str):
    """A launch plan whose command is a short Python program instead of torchrun."""
    run_dir = directory.create_run_dir(project.runs_dir, "flux")
    plan = build_plan(project, LaunchSpec("flux", nproc_per_node=8, device="cpu"), run_dir, cwd=tmp_path)
    return replace(plan, command=(sys.executable, "-c", code, str(plan.script_path)))


def test_first_files_that_cannot_be_written_leave_no_half_made_record(project, tmp_path, monkeypatch):
    plan = _quick_plan(project, tmp_path, "pass")

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(directory, "write_atomic", full)
    with pytest.raises(DancegrpoError) as e:
        runner.run_plan(project, plan)
    assert e.value.one_line().startswith(f"cannot write {plan.run_dir / 'launch.json'}: No space left on device")
    assert not plan.run_dir.exists()


def test_a_run_that_dies_on_a_full_disk_is_listed_as_failed_with_the_reason(project, tmp_path, monkeypatch, capsys):
    code = "import sys; print('writing a checkpoint', flush=True); sys.exit(1)"
    plan = _quick_plan(project, tmp_path, code)
    real = directory.write_atomic
    disk = {"full": False}

    def write_atomic(path, data):
        if disk["full"]:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    def fill_the_disk(proc, console):
        out = real_stream(proc, console)
        disk["full"] = True  # the job filled the disk: no new file can be written after it
        return out

    real_stream = runner._stream
    monkeypatch.setattr(directory, "write_atomic", write_atomic)
    monkeypatch.setattr(runner, "_stream", fill_the_disk)
    record = runner.run_plan(project, plan)
    assert record.returncode == 1
    summary = json.loads((plan.run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["record_errors"] == ["summary.json: No space left on device"]
    capsys.readouterr()
    assert main(["-C", str(project.root), "runs"]) == 0
    out = capsys.readouterr().out
    assert plan.run_dir.name in out and " failed " in out.splitlines()[1]
    assert "    failed: " in out and "could not write summary.json: No space left on device" in out


@pytest.mark.parametrize("argv", [["smoke"], ["runs"], ["plot", "a"], ["compare", "a", "b"], ["bench"]])
def test_every_verb_that_reads_or_writes_runs_takes_the_option(project, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(project.root)
    from dancegrpo_npu.cli import build_parser

    args = build_parser().parse_args([*argv, "--runs-dir", str(tmp_path / "r")])
    assert project_from_args(args, {}).runs_dir == tmp_path / "r"
    args = build_parser().parse_args(["--runs-dir", str(tmp_path / "r"), *argv])  # before the verb too
    assert project_from_args(args, {}).runs_dir == tmp_path / "r"
