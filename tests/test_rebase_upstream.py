"""rebase / upstream-log with the real upstream DanceGRPO and this project's own series.

Skipped with ``upstream unavailable: ...`` when the locked URL (or DANCEGRPO_SOURCE)
cannot be cloned.  Works for whatever series patches/series holds, empty included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rebase_helpers import TESTS, install_engine_standin, project_state, tree_state

install_engine_standin()

from dancegrpo_npu.apply import apply_series_to_dir, touched_files  # noqa: E402
from dancegrpo_npu.lock import load_lock  # noqa: E402
from dancegrpo_npu.project import find_project  # noqa: E402
from dancegrpo_npu.rebase import abort_rebase, start_rebase  # noqa: E402
from dancegrpo_npu.series import load_series  # noqa: E402
from dancegrpo_npu.upstream_log import format_log, upstream_log  # noqa: E402

pytestmark = pytest.mark.upstream
REPO = TESTS.parent
# The file the port patches first; stands in for "a patched file" while the series is empty.
FALLBACK_FILE = "fastvideo/train_grpo_flux.py"


def git(cwd, *args) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> Path:
    """A clone of upstream with its history (assets/ left out, as `fetch` does)."""
    lock = load_lock(REPO / "upstream.lock")
    source = os.environ.get("DANCEGRPO_SOURCE") or lock.url
    dest = tmp_path_factory.mktemp("upstream") / "DanceGRPO"
    r = subprocess.run(["git", "clone", "-q", "--no-checkout", source, str(dest)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"upstream unavailable: cannot clone {source}: {r.stderr.strip()[-200:]}")
    if subprocess.run(["git", "cat-file", "-e", f"{lock.commit}^{{commit}}"], cwd=dest).returncode != 0:
        pytest.skip(f"upstream unavailable: {source} has no commit {lock.commit}")
    git(dest, "sparse-checkout", "set", "--no-cone", "/*", "!/assets/")
    return dest


def make_real_project(tmp_path: Path, upstream: Path):
    """A copy of this project's lock, series and overlay, with its work tree fetched and applied."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy2(REPO / "upstream.lock", root / "upstream.lock")
    shutil.copytree(REPO / "patches", root / "patches")
    if (REPO / "overlay").is_dir():
        shutil.copytree(REPO / "overlay", root / "overlay")
    work = root / "build" / "DanceGRPO"
    work.parent.mkdir()
    git(tmp_path, "clone", "-q", "--no-checkout", str(upstream), str(work))
    git(work, "sparse-checkout", "set", "--no-cone", "/*", "!/assets/")
    subprocess.run(["git", "checkout", "-q", "--detach", load_lock(root / "upstream.lock").commit], cwd=work, capture_output=True)
    project = find_project(root)
    reapply(project, load_lock(project.lock_path).commit)
    return project


def reapply(project, commit: str) -> None:
    """What `dancegrpo-npu fetch && apply` does to the work tree for a lock at ``commit``."""
    work = project.workdir
    subprocess.run(["git", "checkout", "-q", "--force", "--detach", commit], cwd=work, capture_output=True)
    git(work, "clean", "-fdq")
    paths = set(git(work, "ls-tree", "-r", "--name-only", commit).splitlines())
    overlay = project.overlay_dir if project.overlay_dir.is_dir() else None
    apply_series_to_dir(work, load_series(project.patches_dir), overlay, upstream_paths=paths)


def patched_files(project) -> list[str]:
    files = sorted({f for p in load_series(project.patches_dir) for f in touched_files(p)})
    return files or [FALLBACK_FILE]


def test_round_trip_to_an_older_commit_and_back(tmp_path, upstream):
    project = make_real_project(tmp_path, upstream)
    locked = load_lock(project.lock_path).commit
    before_tree = tree_state(project.workdir)
    n_patches = len(load_series(project.patches_dir))
    # the oldest of the last 10 commits that leaves the patched files as they are
    older = locked
    for k in range(1, 11):
        candidate = git(upstream, "rev-parse", f"{locked}~{k}")
        if git(upstream, "log", "--format=%H", f"{candidate}..{locked}", "--", *patched_files(project)):
            break
        older = candidate
    assert older != locked, "the last commit touched a patched file; pick another rule"

    result = start_rebase(project, older)
    assert result.status == "done", result.report
    assert load_lock(project.lock_path).commit == older
    assert len(load_series(project.patches_dir)) == n_patches
    reapply(project, older)

    result = start_rebase(project, locked)
    assert result.status == "done", result.report
    assert load_lock(project.lock_path).commit == locked
    reapply(project, locked)  # the patches apply exactly at the locked commit ...
    assert tree_state(project.workdir) == before_tree  # ... and give the same patched tree


def test_onto_the_commit_before_a_change_to_a_patched_file(tmp_path, upstream):
    project = make_real_project(tmp_path, upstream)
    locked = load_lock(project.lock_path).commit
    before = project_state(project.root)
    before_tree = tree_state(project.workdir)
    change = git(upstream, "log", "-1", "--format=%H", locked, "--", *patched_files(project))
    subject = git(upstream, "log", "-1", "--format=%s", change)
    target = git(upstream, "rev-parse", f"{change}^")

    log = upstream_log(project, target)
    assert change in [c.commit for c in log.commits if not c.in_ref]
    if load_series(project.patches_dir):
        assert any(c.commit == change and c.touches_series for c in log.commits), format_log(log)

    result = start_rebase(project, target)
    if result.status == "stopped":  # a real conflict: the report must say where and why
        assert result.stop in ("conflict", "empty")
        assert subject in result.report or result.stop == "empty", result.report
        abort_rebase(project)
        assert project_state(project.root) == before
        assert tree_state(project.workdir) == before_tree
        return
    assert result.status == "done", result.report
    assert load_lock(project.lock_path).commit == target
    reapply(project, target)
    assert start_rebase(project, locked).status == "done"
    reapply(project, locked)
    assert tree_state(project.workdir) == before_tree
