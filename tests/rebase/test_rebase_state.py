"""While a rebase swaps in a new series and lock (phases swapping/done) they may be half
old, half new: the engine verbs that read them refuse, and name what to run; status
reports a rebase in progress in every phase."""

from __future__ import annotations

import pytest

from dancegrpo_npu.engine.apply import apply_worktree
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import find_project
from dancegrpo_npu.rebase.session import start_rebase
from dancegrpo_npu.engine.rebase_state import describe_rebase, rebase_in_progress, refuse_mid_swap
from dancegrpo_npu.engine.status import inspect
from rebase_helpers import PatchSpec, base_history, make_project, project_state, run_cli, set_line, verified

DATE = {"SOURCE_DATE_EPOCH": "1767225600"}


SPECS = [
    PatchSpec("0001-train.patch", "train on the chosen device", {"fastvideo/train.py": set_line(10, "device = pick()")}),
    PatchSpec("0002-utils.patch", "lazy mochi", {"fastvideo/utils.py": set_line(20, "mochi = None")}),
]


def world(tmp_path):
    history, base = base_history(tmp_path / "upstream")
    root = make_project(tmp_path / "project", history, base, SPECS)
    return history, root


def test_engine_verbs_refuse_mid_swap_and_work_after_continue(tmp_path):
    history, root = world(tmp_path)
    history.insert_lines("fastvideo/train.py", 1, ["# moved"] * 3)
    history.commit("upstream moves")
    before = project_state(root)
    killed = run_cli(root, "rebase", "--onto", "main", env={**DATE, "DANCEGRPO_NPU_KILL_AT": "swap:lock"})
    assert killed.returncode == -9, killed.stderr
    assert project_state(root) != before  # the series and lock are (partly) the new ones
    project = find_project(root)
    assert rebase_in_progress(project.workdir).phase == "swapping"

    for verb in ("apply", "verify", "lock", "fetch"):  # fetch: the lock moved, so it would move the tree
        r = run_cli(root, verb)
        assert r.returncode == 1, (verb, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (verb, r.stderr)
        assert "rebase is replacing patches/ and upstream.lock" in r.stderr
        assert "dancegrpo-npu rebase --continue" in r.stderr and "rebase --abort" in r.stderr
    with pytest.raises(DancegrpoError, match="rebase is replacing"):
        apply_worktree(project)
    with pytest.raises(DancegrpoError, match="rebase is replacing"):
        inspect(project)

    r = run_cli(root, "status")
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("rebase     a rebase onto main") and "swapping" in first
    assert "rebase --continue" in first and "rebase --abort" in first

    r = run_cli(root, "rebase", "--continue", env=DATE)
    assert r.returncode == 0, r.stderr
    assert rebase_in_progress(project.workdir) is None
    refuse_mid_swap(project.workdir)  # no rebase: nothing refused
    for verb in ("fetch", "apply", "verify"):
        r = run_cli(root, verb)
        assert r.returncode == 0, (verb, r.stderr)
    assert "rebase " not in run_cli(root, "status").stdout.splitlines()[0]


def test_abort_mid_swap_also_unblocks(tmp_path):
    history, root = world(tmp_path)
    history.insert_lines("fastvideo/train.py", 1, ["# moved"] * 3)
    history.commit("upstream moves")
    before = project_state(root)
    assert run_cli(root, "rebase", "--onto", "main", env={**DATE, "DANCEGRPO_NPU_KILL_AT": "swap:series"}).returncode == -9
    assert run_cli(root, "apply").returncode == 1
    assert run_cli(root, "rebase", "--abort").returncode == 0
    assert project_state(root) == before
    assert run_cli(root, "apply").returncode == 0 and verified(root)


def test_a_stopped_rebase_blocks_nothing_but_status_says_what_to_run(tmp_path):
    history, root = world(tmp_path)
    history.edit_line("fastvideo/train.py", 10, "device = 'cuda'")
    history.commit("conflict")
    project = find_project(root)
    assert start_rebase(project, "main").status == "stopped"
    assert rebase_in_progress(project.workdir).phase == "stopped"
    refuse_mid_swap(project.workdir)  # before the swap the project is untouched
    assert apply_worktree(project).noop
    report = inspect(project)
    assert report.exact and report.rebase == describe_rebase(project.workdir)
    assert "stopped: conflict" in report.rebase and "rebase --continue" in report.rebase and "--skip" in report.rebase
    assert str(project.workdir) + ".rebase" in report.rebase  # where to resolve it
    r = run_cli(root, "status")
    assert r.returncode == 0 and r.stdout.startswith("rebase     a rebase onto main")


def test_no_rebase_no_line(tmp_path):
    history, root = world(tmp_path)
    project = find_project(root)
    assert describe_rebase(project.workdir) is None and inspect(project).rebase is None
    assert not run_cli(root, "status").stdout.startswith("rebase")
