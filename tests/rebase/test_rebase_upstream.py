"""rebase / upstream-log with the real upstream DanceGRPO and this project's own series.

Uses conftest's ``upstream_source`` (skipped with ``upstream unavailable: ...`` when
neither the locked URL nor DANCEGRPO_SOURCE can be fetched); the work tree is made by
the engine (fetch + apply) in a copy of the project.  Works for whatever series
patches/series holds, the empty one included.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
from pathlib import Path

import pytest

from dancegrpo_npu.engine.apply import apply_worktree
from dancegrpo_npu.engine.stage import touched_files
from dancegrpo_npu.rebase.export import export_edits
from dancegrpo_npu.engine.fetch import fetch
from dancegrpo_npu.engine.lock import load_lock
from dancegrpo_npu.engine.lockfile import refresh_lock
from dancegrpo_npu.project import find_project
from dancegrpo_npu.rebase.session import abort_rebase, start_rebase
from dancegrpo_npu.engine.series import load_series
from dancegrpo_npu.engine.status import inspect
from dancegrpo_npu.rebase.upstream_log import format_log, upstream_log
from conftest import copy_project
from rebase_helpers import TESTS, git, project_state, tree_state, verified

pytestmark = pytest.mark.upstream
REPO = TESTS.parent
# The file the port patches first; stands in for "a patched file" while the series is empty.
FALLBACK_FILE = "fastvideo/train_grpo_flux.py"


@pytest.fixture()
def no_import_check(monkeypatch):
    """The trainers' import check stood in for by a note: it takes seconds a rebase (torch and
    diffusers imported once a dependency set), and the round trip below runs it for real."""
    from dancegrpo_npu.rebase import finish
    from dancegrpo_npu.rebase.imports import ImportCheck

    monkeypatch.setattr(finish, "check_trainer_imports", lambda *a, **k: ImportCheck((), (), ("not imported in this test",)))


def real_project(tmp_path: Path, source: str):
    """A copy of this project's lock, series and overlay; its work tree fetched and patched."""
    if source.endswith((".tar.gz", ".tgz")):
        pytest.skip(f"upstream unavailable: {source} is an archive, which has no history to rebase across")
    project = find_project(copy_project(tmp_path / "project"))
    refetch(project, source)
    return project


def refetch(project, source: str) -> None:
    fetch(project, source=source)
    apply_worktree(project)
    assert verified(project.root)


def patched_files(project) -> list[str]:
    files = sorted({f for p in load_series(project.patches_dir) for f in touched_files(p)})
    return files or [FALLBACK_FILE]


def test_round_trip_to_an_older_commit_and_back(tmp_path, upstream_source, monkeypatch):
    """Onto an older commit and back: the series and the patched tree come back as they were, and
    on the way back every trainer imports in the real patched tree (the import check runs for real
    there; on the way out it is stood in for, as no_import_check does: nothing here reads it)."""
    from dancegrpo_npu.rebase import finish
    from dancegrpo_npu.rebase.imports import ImportCheck

    project = real_project(tmp_path, upstream_source)
    locked = load_lock(project.lock_path).commit
    before = project_state(project.root)
    before_tree = tree_state(project.workdir)
    # the oldest of the last 10 commits that leaves the patched files as they are
    older = locked
    for k in range(1, 11):
        candidate = git(project.workdir, "rev-parse", f"{locked}~{k}")
        if git(project.workdir, "log", "--format=%H", f"{candidate}..{locked}", "--", *patched_files(project)):
            break
        older = candidate
    assert older != locked, "the last commit touched a patched file; pick another rule"

    with monkeypatch.context() as m:
        m.setattr(finish, "check_trainer_imports", lambda *a, **k: ImportCheck((), (), ("not imported on the way out",)))
        result = start_rebase(project, older, source=upstream_source)
    assert result.status == "done", result.report
    assert load_lock(project.lock_path).commit == older
    assert len(load_series(project.patches_dir)) == len(load_series(REPO / "patches"))
    refetch(project, upstream_source)

    result = start_rebase(project, locked, source=upstream_source)
    assert result.status == "done", result.report
    # every trainer of the registry imports in the real patched tree, under its dependency set
    assert not result.message and re.search(r"trainer imports: (\d+) of \1 trainer script", result.report), result.report
    after = project_state(project.root)
    assert after["upstream.lock"] == before["upstream.lock"]
    assert after.keys() == before.keys()
    refetch(project, upstream_source)  # the patches apply exactly at the locked commit ...
    assert tree_state(project.workdir) == before_tree  # ... and give the same patched tree


def test_onto_the_commit_before_a_change_to_a_patched_file(tmp_path, upstream_source, no_import_check):
    project = real_project(tmp_path, upstream_source)
    locked = load_lock(project.lock_path).commit
    before = project_state(project.root)
    before_tree = tree_state(project.workdir)
    change = git(project.workdir, "log", "-1", "--format=%H", locked, "--", *patched_files(project))
    subject = git(project.workdir, "log", "-1", "--format=%s", change)
    target = git(project.workdir, "rev-parse", f"{change}^")

    log = upstream_log(project, target, source=upstream_source)
    assert change in [c.commit for c in log.commits if not c.in_ref]
    if load_series(project.patches_dir):
        assert any(c.commit == change and c.touches_series for c in log.commits), format_log(log)

    result = start_rebase(project, target, source=upstream_source)
    if result.status == "stopped":  # a real conflict: the report must say where and why
        assert result.stop in ("conflict", "empty")
        assert subject in result.report or result.stop == "empty", result.report
        abort_rebase(project)
        assert project_state(project.root) == before
        assert tree_state(project.workdir) == before_tree
        return
    assert result.status == "done", result.report
    assert load_lock(project.lock_path).commit == target
    refetch(project, upstream_source)
    assert start_rebase(project, locked, source=upstream_source).status == "done"
    assert project_state(project.root)["upstream.lock"] == before["upstream.lock"]
    refetch(project, upstream_source)
    assert tree_state(project.workdir) == before_tree


def test_export_then_three_way_merge_in_the_real_tree(tmp_path, upstream_source, no_import_check):
    """A hand fix in the real patched tree is exported; an upstream change inside its
    context then makes the rebase 3-way merge it (in the sparse, assets-less checkout)."""
    project = real_project(tmp_path, upstream_source)
    rel = FALLBACK_FILE
    work = project.workdir
    locked = load_lock(project.lock_path).commit
    path = work / rel
    lines = path.read_text().splitlines(keepends=True)
    upstream_text = subprocess.run(["git", "show", f"{locked}:{rel}"], cwd=work, capture_output=True, text=True,
                                   check=True).stdout.split("\n")  # exactly, final newline included
    # the middle of the longest stretch the series leaves alone, far from every hunk of it
    same = difflib.SequenceMatcher(None, [ln.rstrip("\n") for ln in lines], upstream_text, autojunk=False)
    block = max(same.get_matching_blocks(), key=lambda b: b.size)
    assert block.size > 20
    n, u = block.a + block.size // 2, block.b + block.size // 2  # the same line, patched tree / upstream
    lines[n] = lines[n].rstrip("\n") + "  # hand fix\n"
    path.write_text("".join(lines))
    before = project_state(project.root)
    series = project.series_path.read_text()

    result = export_edits(project, "hand-fix", description="A hand fix made on the cluster")
    assert result.files == (f"M {rel}",) and result.patch == project.patches_dir / "hand-fix.patch"
    assert verified(project.root) and not inspect(project).edits
    # the real series renames nothing: one new file, one line appended, every other file as it was
    after = project_state(project.root)
    assert set(after) - set(before) == {"patches/hand-fix.patch"}
    assert [k for k in before if after[k] != before[k]] == ["patches/series"]
    assert project.series_path.read_text() == series + "hand-fix.patch\n"

    # upstream moves: the line two below the fix changes (inside the patch's context)
    upstream_text[u + 2] += "  # upstream change"
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=work, input="\n".join(upstream_text),
                          capture_output=True, text=True, check=True).stdout.strip()
    env = dict(os.environ, GIT_INDEX_FILE=str(tmp_path / "index"), GIT_AUTHOR_NAME="up", GIT_AUTHOR_EMAIL="up@x",
               GIT_COMMITTER_NAME="up", GIT_COMMITTER_EMAIL="up@x")
    subprocess.run(["git", "read-tree", locked], cwd=work, env=env, check=True)
    subprocess.run(["git", "update-index", "--cacheinfo", f"100644,{blob},{rel}"], cwd=work, env=env, check=True)
    tree = subprocess.run(["git", "write-tree", "--missing-ok"], cwd=work, env=env, capture_output=True, text=True, check=True).stdout.strip()
    moved = subprocess.run(["git", "commit-tree", tree, "-p", locked, "-m", "upstream: a change near the fix"], cwd=work,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()

    result = start_rebase(project, moved)
    assert result.status == "done", result.report
    assert re.search(r"hand-fix.patch\s+3-way merged", result.report)
    assert "verified:" in result.report
    text = (project.patches_dir / result_patch_name(project)).read_text()
    assert "+" + lines[n].rstrip("\n") in text and "  # upstream change" in text
    assert "Description: A hand fix made on the cluster" in text


def result_patch_name(project) -> str:
    return next(p.path.name for p in load_series(project.patches_dir) if "hand-fix" in p.name)


def test_the_series_is_what_the_tool_writes(tmp_path, upstream_source):
    """Each patch is the diff the tool itself writes for it (``export``, a rebase's refresh): its
    commit in the patch queue against the one before, with the patch's context, ``index`` lines
    of the blobs it really goes between and git's function context in the hunk headers.  So a
    rebase rewrites a patch only when upstream changed the lines it is made of."""
    from dancegrpo_npu.rebase.queue import build_queue, context_lines, diff_between, index_abbrev
    from dancegrpo_npu.vcs.gitcmd import Git

    project = real_project(tmp_path, upstream_source)
    locked = load_lock(project.lock_path).commit
    patches = load_series(project.patches_dir)
    repo = Git(project.workdir)
    parent, stale = locked, []
    for patch, commit in zip(patches, build_queue(repo, locked, patches, tmp_path / "queue-index")):
        assert index_abbrev(patch.diff), f"{patch.name} has no index lines"
        if diff_between(repo, parent, commit, context_lines(patch), patch.name, index_abbrev(patch.diff)) != patch.diff:
            stale.append(patch.name)
        parent = commit
    assert not stale, f"not what export writes (re-export them): {stale}"


def test_a_rebase_rewrites_only_the_patches_of_files_upstream_changed(tmp_path, upstream_source, no_import_check):
    """1d510ba9 differs from the locked commit in files the series does not touch, in one line
    of fastvideo/utils/load.py, and by lacking the Wan2.1 trainer, added after it: with the
    series of the files it has (each patch's sections of the Wan2.1 trainer's files taken out, as
    a concern patch spans every trainer; patches left empty out; `lock` refreshed), every patch
    of another file comes out byte for byte."""
    project = real_project(tmp_path, upstream_source)
    other = "1d510ba946f3d0e3bd2d131cb7b032741f3794d4"
    if subprocess.run(["git", "cat-file", "-e", f"{other}^{{commit}}"], cwd=project.workdir).returncode:
        pytest.skip(f"upstream unavailable: the source lacks commit {other[:12]}")
    present = set(git(project.workdir, "ls-tree", "-r", "--name-only", other).split())
    gone = {f for p in load_series(project.patches_dir) for f in touched_files(p)} - present
    assert gone and all("wan" in f for f in gone), gone
    absent = []
    for patch in load_series(project.patches_dir):
        if not set(touched_files(patch)) & gone:
            continue
        head, sep, diff = patch.path.read_text().partition("\n---\ndiff --git ")
        sections = [sec.rstrip("\n") + "\n" for sec in diff.split("\ndiff --git ")]  # each without its "diff --git "
        kept = [sec for sec in sections if sec.split(" b/", 1)[1].split("\n", 1)[0] not in gone]
        if kept:
            patch.path.write_text(head + "\n---\n" + "".join("diff --git " + sec for sec in kept))
        else:
            absent.append(patch.path.name)
    series = project.patches_dir / "series"
    series.write_text("".join(ln for ln in series.read_text().splitlines(True) if ln.strip() not in absent))
    for name in absent:
        (project.patches_dir / name).unlink()
    refresh_lock(project)
    refetch(project, upstream_source)
    changed = set(git(project.workdir, "diff", "--name-only", load_lock(project.lock_path).commit, other).split())
    may_change = {p.path.name for p in load_series(project.patches_dir) if set(touched_files(p)) & changed}
    before = {p.name: p.read_bytes() for p in project.patches_dir.iterdir()}
    result = start_rebase(project, other, source=upstream_source)
    assert result.status == "done", result.report
    after = {p.name: p.read_bytes() for p in project.patches_dir.iterdir()}
    assert after.keys() == before.keys()
    rewritten = {name for name in before if after[name] != before[name]}
    assert rewritten <= may_change, (rewritten, may_change)
