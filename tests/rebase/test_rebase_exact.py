"""rebase moves onto exactly the commit named, from the source named, or refuses; and the
lock's url after a move onto another repository."""

from __future__ import annotations

import pytest

from dancegrpo_npu.engine.lock import load_lock
from dancegrpo_npu.engine.worktree import WorkTree, load_fetched
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import find_project
from dancegrpo_npu.rebase.dry_run import dry_run
from dancegrpo_npu.rebase.session import start_rebase
from rebase_helpers import base_history, error_of, git, make_project, project_state, run_cli, tree_state
from test_rebase import DATE, OVERLAY, SPECS


@pytest.fixture()
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", DATE)
    monkeypatch.delenv("DANCEGRPO_SOURCE", raising=False)
    history, base = base_history(tmp_path / "upstream")
    root = make_project(tmp_path / "project", history, base, SPECS, OVERLAY)
    return history, base, find_project(root)


def everything(project):
    """What a refused rebase must leave as it was: lock, series, the patched tree, the refs."""
    return project_state(project.root), tree_state(project.workdir), git(project.workdir, "for-each-ref")


def a_fork(tmp_path, history):
    """Another repository: upstream's history plus a commit of its own (README only)."""
    fork = tmp_path / "fork"
    git(tmp_path, "clone", "-q", str(history.path), str(fork))
    (fork / "README.md").write_text("# the fork\n")
    git(fork, "commit", "-qam", "fork: its own README")
    return fork, git(fork, "rev-parse", "HEAD")


@pytest.mark.parametrize("ref", ["main", "elsewhere"])
def test_a_failed_source_fetch_refuses_even_with_a_local_ref_of_that_name(world, tmp_path, ref):
    """`main` is a local branch of the work tree at the locked commit (once: "nothing to do",
    exit 0); `elsewhere` a local branch at another commit (once: a rebase onto it)."""
    history, base, project = world
    history.edit_line("fastvideo/utils.py", 5, "utils_value_5 = 5")
    other = history.commit("upstream moves on")
    git(project.workdir, "fetch", "-q", "origin")
    git(project.workdir, "branch", "-f", "elsewhere", other)
    assert git(project.workdir, "rev-parse", "main") == base
    nowhere = str(tmp_path / "no-such-repository")
    before = everything(project)

    for run in (start_rebase, dry_run):
        with pytest.raises(DancegrpoError) as e:
            run(project, ref, nowhere)
        assert e.value.message.startswith(f"cannot fetch '{ref}' from {nowhere}") and "nothing was changed" in e.value.message
    assert "is not used: to move onto it, name it by its full id" in error_of(start_rebase, project, ref, nowhere)
    r = run_cli(project.root, "rebase", "--onto", ref, "--source", nowhere)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert everything(project) == before
    assert not (project.workdir.parent / "DanceGRPO.rebase").exists()
    assert not (project.workdir / ".git/dancegrpo-npu/rebase").exists()


def test_a_revision_expression_is_resolved_on_the_source_s_ref(world, tmp_path):
    """`main~1` with --source FORK is the parent of the fork's main, not of a local main."""
    history, base, project = world
    history.edit_line("fastvideo/utils.py", 5, "utils_value_5 = 5")
    upstream_next = history.commit("upstream moves on")
    fork, fork_head = a_fork(tmp_path, history)
    result = start_rebase(project, "main~1", str(fork))
    assert result.status == "done", result.report
    assert load_lock(project.lock_path).commit == upstream_next == git(fork, "rev-parse", f"{fork_head}~1")


def test_a_short_id_with_a_remote_source_asks_for_the_full_id(world, tmp_path):
    history, base, project = world
    fork, fork_head = a_fork(tmp_path, history)
    before = everything(project)
    r = run_cli(project.root, "rebase", "--onto", fork_head[:10], "--source", f"file://{fork}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"'{fork_head[:10]}' is a short commit id" in r.stderr
    assert "give the full 40-hex commit id, or a branch or tag" in r.stderr
    assert everything(project) == before
    # a local repository can be asked: the short id is looked up there
    result = start_rebase(project, fork_head[:10], str(fork))
    assert result.status == "done" and load_lock(project.lock_path).commit == fork_head


def test_the_url_question_after_a_move_onto_another_repository(world, tmp_path):
    history, base, project = world
    fork, fork_head = a_fork(tmp_path, history)
    source = f"file://{fork}"
    old_url = load_lock(project.lock_path).url

    result = start_rebase(project, "main", source)

    assert result.status == "done", result.report
    lock = load_lock(project.lock_path)
    assert lock.commit == fork_head
    lines = [ln for ln in result.report.splitlines() if "url stays" in ln]
    assert lines == [
        f"  url stays {old_url}, but {fork_head[:12]} (main) was fetched from {source}: if {old_url} lacks that commit,"
        f' set url = "{source}" under [upstream] in upstream.lock (fetch reads it)'
    ]
    # the work tree records where its commit came from (status prints it)
    assert load_fetched(WorkTree(project.workdir)).source == source
    r = run_cli(project.root, "status")
    assert f"fetched from {source}" in r.stdout, r.stdout


def test_no_url_question_when_the_lock_s_repository_has_the_commit(world, tmp_path):
    history, base, project = world
    history.edit_line("fastvideo/utils.py", 5, "utils_value_5 = 5")
    new = history.commit("upstream moves on")
    mirror = tmp_path / "mirror"
    git(tmp_path, "clone", "-q", "--mirror", str(history.path), str(mirror))
    result = start_rebase(project, "main", str(mirror))
    assert result.status == "done" and load_lock(project.lock_path).commit == new
    assert "url stays" not in result.report
    # back to the locked commit, from the mirror: an ancestor, which the lock's repository has
    result = start_rebase(project, base, str(mirror))
    assert result.status == "done" and "url stays" not in result.report
