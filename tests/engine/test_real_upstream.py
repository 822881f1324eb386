"""The engine against the real upstream DanceGRPO at the locked commit, with this
project's series and overlay (whatever they hold).  Skipped, with the reason, when
upstream cannot be fetched."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import copy_project
from synthetic_upstream import run_git, snapshot

from dancegrpo_npu.engine.apply import apply_series_to_dir, apply_worktree
from dancegrpo_npu.cli import main
from dancegrpo_npu.engine.fetch import fetch
from dancegrpo_npu.engine.lock import Lock, load_lock, save_lock, sha256_file
from dancegrpo_npu.engine.lockfile import refresh_lock
from dancegrpo_npu.project import find_project
from dancegrpo_npu.engine.series import load_series
from dancegrpo_npu.engine.status import inspect
from dancegrpo_npu.engine.worktree import WorkTree, load_fetched

pytestmark = pytest.mark.upstream


def test_fetch_at_the_locked_commit(upstream_source, tmp_path):
    project = find_project(copy_project(tmp_path / "project"))
    lock = load_lock(project.lock_path)
    out = fetch(project, source=upstream_source)
    assert out.fetched.commit == lock.commit
    tree = project.workdir
    if out.fetched.kind == "git":
        assert run_git(tree, "rev-parse", "HEAD").decode().strip() == lock.commit
        assert int(run_git(tree, "rev-list", "--count", "HEAD").decode()) > 1, "full history for rebase"
    assert (tree / "fastvideo" / "train_grpo_flux.py").is_file()
    assert (tree / "fastvideo" / "data_preprocess" / "preprocess_flux_embedding.py").is_file()
    assert not (tree / "assets").exists(), "assets/ is fetched only with --with-assets"
    assert run_git(tree, "status", "--porcelain").decode() == ""
    before = snapshot(tree)
    assert fetch(project, source=upstream_source).action == "up to date"
    assert snapshot(tree) == before


def test_patched_tree_is_exact(patched_tree):
    r = inspect(patched_tree.project)
    assert r.problem is None, r.problem
    assert r.exact, r.differences
    assert all(p.state == "applied" for p in r.patches), r.patches
    assert r.overlay in ("present", "none")


def test_reapply_is_a_noop(patched_tree):
    before = snapshot(patched_tree.tree)
    out = apply_worktree(patched_tree.project)
    assert out.noop
    assert snapshot(patched_tree.tree) == before


def test_cli_verify_and_status(patched_tree, capsys):
    root = os.fspath(patched_tree.project.root)
    assert main(["-C", root, "verify"]) == 0
    assert main(["-C", root, "status"]) == 0
    out = capsys.readouterr().out
    assert load_lock(patched_tree.project.lock_path).commit in out
    assert "exactly lock + series + overlay" in out


def test_lock_records_exactly_the_touched_files(patched_tree):
    refresh_lock(patched_tree.project, check=True)


def test_series_applies_to_a_scratch_checkout(patched_tree, tmp_path):
    """The rebase helper's entry point, on a plain checkout of the locked commit."""
    scratch = tmp_path / "scratch"
    run_git(tmp_path, "clone", "-q", "--no-checkout", os.fspath(patched_tree.tree), os.fspath(scratch))
    run_git(scratch, "sparse-checkout", "set", "--no-cone", "/*", "!/assets/")
    run_git(scratch, "checkout", "-q", "--detach", load_fetched(WorkTree(patched_tree.tree)).head)
    apply_series_to_dir(scratch, load_series(patched_tree.project.patches_dir), patched_tree.project.overlay_dir)
    for rel, (kind, data, _mode) in snapshot(patched_tree.tree).items():
        if kind == "file":
            assert (scratch / rel).read_bytes() == data, rel


def test_tarball_of_the_real_tree(patched_tree, tmp_path):
    """git archive of the locked commit, fetched as a .tar.gz checked against the lock."""
    lock = load_lock(patched_tree.project.lock_path)
    head = load_fetched(WorkTree(patched_tree.tree)).head
    archive = tmp_path / "DanceGRPO.tar.gz"
    subprocess.run(
        ["git", "-C", os.fspath(patched_tree.tree), "archive", "--format=tar.gz", f"--prefix=DanceGRPO-{lock.commit}/",
         "-o", os.fspath(archive), f"{head}^{{tree}}", "--", ":(exclude)assets"],
        check=True,
    )
    project = find_project(copy_project(tmp_path / "project"))
    save_lock(Lock(lock.url, lock.commit, lock.files, sha256_file(archive)), project.lock_path)
    out = fetch(project, source=os.fspath(archive))
    assert out.fetched.kind == "archive" and out.fetched.commit == lock.commit
    apply_worktree(project)
    assert inspect(project).exact
