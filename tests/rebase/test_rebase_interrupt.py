"""A rebase killed (SIGKILL) at every step: the project is the old or the new series+lock,
and ``rebase --continue`` / ``rebase --abort`` both work afterwards: continue leaves the
work tree at the new commit with the new series applied, abort as it was before."""

from __future__ import annotations

import re

import pytest

from rebase_helpers import PatchSpec, base_history, make_project, project_state, run_cli, set_line, tree_state

DATE = {"SOURCE_DATE_EPOCH": "1767225600"}


SPECS = [
    PatchSpec("0001-train.patch", "train on the chosen device", {"fastvideo/train.py": set_line(10, "device = pick()")}),
    PatchSpec("0002-utils.patch", "lazy mochi", {"fastvideo/utils.py": set_line(20, "mochi = None"), "fastvideo/new.py": lambda o: "NEW = 1\n"}),
]
CHECKPOINTS = [
    "start:backup", "start:state", "start:clone", "start:ready",
    "patch:1:committed", "patch:1:recorded", "patch:2:committed", "patch:2:recorded",
    "finish:staged", "finish:verified", "swap:begin", "swap:0001-train.patch", "swap:0002-utils.patch",
    "swap:series", "swap:lock", "swap:done", "done:orig",
    # moving the work tree (the engine's fetch and apply journals, prefixed), then cleanup
    "move:journal written", "move:op 0 fastvideo/new.py", "move:checked out", "done:moved",
    "apply:staged", "apply:journal written", "apply:op 0 fastvideo/new.py", "done:applied", "done:tree",
]
# Until here the user's work tree is untouched.
TREE_MOVES_AFTER = "done:orig"


def build(tmp_path, name):
    history, base = base_history(tmp_path / name / "upstream")
    root = make_project(tmp_path / name / "project", history, base, SPECS, {"fastvideo/ours.py": "OURS = 1\n"})
    history.insert_lines("fastvideo/train.py", 1, ["# moved"] * 3)  # context moves ...
    history.edit_line("fastvideo/utils.py", 22, "utils_value_22 = 22")  # ... and a 3-way merge
    history.commit("upstream moves")
    return history, root


def normalised(state: dict, root) -> dict:
    """Project files with the machine-specific upstream path taken out of the lock."""
    out = dict(state)
    out["upstream.lock"] = re.sub(rb'url = ".*"', b'url = "X"', out["upstream.lock"])
    return out


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    """What an uninterrupted rebase produces (same synthetic history, same date): the
    project files, and the work tree."""
    tmp = tmp_path_factory.mktemp("reference")
    history, root = build(tmp, "ref")
    r = run_cli(root, "rebase", "--onto", "main", env=DATE)
    assert r.returncode == 0, r.stderr
    assert "context moved" in r.stdout and "3-way merged" in r.stdout
    assert "verified: " in r.stdout
    return normalised(project_state(root), root), tree_state(root / "build" / "DanceGRPO")


@pytest.mark.parametrize("then", ["continue", "abort"])
@pytest.mark.parametrize("point", CHECKPOINTS)
def test_killed_rebase_recovers(tmp_path, expected, point, then):
    expected_project, expected_tree = expected
    history, root = build(tmp_path, "w")
    work = root / "build" / "DanceGRPO"
    before = project_state(root)
    work_before = tree_state(work)
    assert expected_tree != work_before

    killed = run_cli(root, "rebase", "--onto", "main", env={**DATE, "DANCEGRPO_NPU_KILL_AT": point})
    assert killed.returncode == -9, f"checkpoint {point} was not reached: {killed.stdout}{killed.stderr}"

    now = project_state(root)
    is_new = normalised(now, root) == expected_project
    swapping = point.startswith("swap:") and point not in ("swap:begin", "swap:done")
    assert now == before or is_new or swapping, "a kill outside the swap left a mixed series"
    if CHECKPOINTS.index(point) <= CHECKPOINTS.index(TREE_MOVES_AFTER):
        assert tree_state(work) == work_before

    r = run_cli(root, "rebase", f"--{then}", env=DATE)
    if point == "start:backup":  # killed before the rebase was recorded: nothing to continue or abort
        assert r.returncode == 1 and "no rebase is in progress" in r.stderr
        assert project_state(root) == before
        r = run_cli(root, "rebase", "--onto", "main", env=DATE)  # a fresh start works
        then = "continue"
    assert r.returncode == 0, r.stdout + r.stderr
    if then == "continue":
        assert normalised(project_state(root), root) == expected_project
        assert tree_state(work) == expected_tree
        assert run_cli(root, "verify").returncode == 0
    else:
        assert project_state(root) == before
        assert tree_state(work) == work_before
        assert run_cli(root, "verify").returncode == 0
    assert not (root / "build" / "DanceGRPO.rebase").exists()
    assert not (root / "build" / "DanceGRPO" / ".git" / "dancegrpo-npu" / "rebase").exists()


def test_killed_continue_after_resolution(tmp_path):
    history, base = base_history(tmp_path / "upstream")
    root = make_project(tmp_path / "project", history, base, SPECS)
    history.edit_line("fastvideo/train.py", 10, "device = 'cuda'")
    history.commit("conflicting upstream")
    before = project_state(root)
    assert run_cli(root, "rebase", "--onto", "main", env=DATE).returncode == 1
    tree = root / "build" / "DanceGRPO.rebase" / "fastvideo" / "train.py"
    tree.write_text(re.sub(r"<<<<<<< .*?>>>>>>> [^\n]*\n", "device = pick('cuda')\n", tree.read_text(), flags=re.S))

    killed = run_cli(root, "rebase", "--continue", env={**DATE, "DANCEGRPO_NPU_KILL_AT": "patch:1:committed"})
    assert killed.returncode == -9
    assert project_state(root) == before
    r = run_cli(root, "rebase", "--continue", env=DATE)
    assert r.returncode == 0, r.stderr
    assert "+device = pick('cuda')" in (root / "patches" / "0001-train.patch").read_text()
    assert "resolved by hand" in r.stdout


def test_killed_abort_can_be_rerun(tmp_path):
    history, root = build(tmp_path, "w")
    before = project_state(root)
    assert run_cli(root, "rebase", "--onto", "main", env={**DATE, "DANCEGRPO_NPU_KILL_AT": "swap:series"}).returncode == -9
    killed = run_cli(root, "rebase", "--abort", env={**DATE, "DANCEGRPO_NPU_KILL_AT": "abort:restored"})
    assert killed.returncode == -9
    assert project_state(root) == before
    assert run_cli(root, "rebase", "--abort", env=DATE).returncode == 0
    assert project_state(root) == before
