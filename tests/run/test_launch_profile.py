"""launch --profile STEPS: checked up front with the trainer's syntax, passed as --profile_steps to the
Flux trainers, kept in launch.json; refused for preprocess and for bad steps in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic_tree import make_project, trust_synthetic_tree
from test_launch_align import command_tail, dry_run

from dancegrpo_npu import registry
from dancegrpo_npu.project import find_project
from dancegrpo_npu.run.launch import build_plan
from dancegrpo_npu.run.plan import LaunchSpec
from dancegrpo_npu.run.runner import _launch_json



@pytest.fixture
def project(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    return find_project(make_project(tmp_path / "proj"))


@pytest.mark.parametrize("script", ["flux", "flux-lora"])
def test_profile_becomes_the_trainers_profile_steps(project, capsys, script):
    rc, out, err = dry_run(project, capsys, script, "--dry-run", "--profile", "2-4,7", "--", "--max_train_steps", "8")
    assert rc == 0, err
    tail = command_tail(out)
    assert " --max_train_steps 8 " in tail and tail.endswith(" --profile_steps 2-4,7")
    rc, out, _ = dry_run(project, capsys, "--profile", "3", script, "--dry-run")  # before the script too
    assert rc == 0 and command_tail(out).endswith(" --profile_steps 3")
    rc, out, _ = dry_run(project, capsys, script, "--dry-run")
    assert rc == 0 and "--profile_steps" not in out  # not asked: the trainer's command is unchanged


@pytest.mark.parametrize(
    "argv, message",
    [
        (["preprocess", "--profile", "1"], f"--profile: only the GRPO trainers ({', '.join(registry.aligning())}) time and profile"),
        (["flux", "--profile", "x"], "--profile 'x': 'x' is not understood"),
        (["flux", "--profile", "0"], "--profile '0': '0' is not a step or an increasing range"),
        (["flux", "--profile", "4-2"], "'4-2' is not a step or an increasing range"),
        (["flux", "--profile", ""], "--profile '': '' is not understood"),
        (["flux", "--profile", "1", "--", "--profile_steps", "2"], "--profile_steps given after -- as well as"),
    ],
)
def test_bad_profile_input_is_one_line(project, capsys, argv, message):
    rc, _, err = dry_run(project, capsys, argv[0], "--dry-run", *argv[1:])
    assert rc == 2 and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_profile_steps_are_kept_in_launch_json(project, tmp_path):
    run_dir = tmp_path / "run"
    traced = _launch_json(build_plan(project, LaunchSpec("flux", profile_steps="1,3"), run_dir))
    plain = _launch_json(build_plan(project, LaunchSpec("flux"), run_dir))
    assert traced["profile_steps"] == "1,3" and plain["profile_steps"] is None
    json.dumps(traced)


@pytest.mark.parametrize("where, refused", [("plain_dir", False), ("proj+1", True), ("a@b", True), ("c:d", True)])
def test_an_npu_profile_is_refused_where_torch_npu_would_write_no_trace(tmp_path, monkeypatch, capsys, where, refused):
    """torch_npu's profiler checks the REAL absolute path of each trace folder and swallows its own
    error: a project under a path with '+', '@' or ':' would lose every trace without a word."""
    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / where / "proj"))
    rc, out, err = dry_run(project, capsys, "flux", "--dry-run", "--device", "npu", "--profile", "1")
    if not refused:  # (the dry run still says this host has no NPU)
        assert rc != 2 and "the real path of the traces" not in out + err, err
        return
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"--profile: the real path of the traces, {tmp_path / where}/proj/runs/" in err
    assert "torch_npu's profiler would write no trace and raise nothing (so does 2.7.1; " in err and "--runs-dir DIR" in err
    assert "this job has torch_npu not installed here" in err
    rc, _, err = dry_run(project, capsys, "flux", "--dry-run", "--device", "cpu", "--profile", "1")
    assert rc == 0, err  # torch.profiler has no such rule


@pytest.mark.parametrize("wheel, refused", [("2.10.0.post6", False), ("2.7.1.post10", False), ("2.7.1", True),
                                            ("2.9.0", True)])
def test_the_wheels_that_write_a_refused_path_with_a_warning_are_not_refused(tmp_path, monkeypatch, capsys, wheel,
                                                                              refused):
    """2.7.1.post10 and 2.10.0.post6 (the wheels bootstrap installs on CANN 9.1.x) warn and write
    the trace; plain 2.7.1 writes none, and a wheel not read is taken to write none."""
    from dancegrpo_npu.run import launch as launch_module

    monkeypatch.setattr(launch_module, "_torch_npu_version", lambda python: f"{wheel}+cpu")
    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / "proj+1" / "proj"))
    rc, out, err = dry_run(project, capsys, "flux", "--dry-run", "--device", "npu", "--profile", "1")
    assert (rc == 2 and f"this job has torch_npu {wheel})" in err) if refused else (
        rc != 2 and "the real path of the traces" not in out + err), err


def test_a_symlinked_runs_dir_is_judged_by_its_real_path(tmp_path, monkeypatch, capsys):
    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / "ok" / "proj"))
    (tmp_path / "bad+runs").mkdir()
    (project.root / "runs").symlink_to(tmp_path / "bad+runs")
    rc, _, err = dry_run(project, capsys, "flux", "--dry-run", "--device", "npu", "--profile", "1")
    assert rc == 2 and f"the real path of the traces, {tmp_path / 'bad+runs'}/" in err
