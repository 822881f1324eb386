"""rebase --onto / --continue / --skip / --abort / --dry-run on synthetic upstream histories."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from dancegrpo_npu.engine.apply import apply_series_to_dir, apply_worktree
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.lock import load_lock
from dancegrpo_npu.project import find_project
from dancegrpo_npu.rebase.session import abort_rebase, continue_rebase, skip_patch, start_rebase
from dancegrpo_npu.rebase.dry_run import dry_run
from dancegrpo_npu.engine.series import load_series
from rebase_helpers import (
    PatchSpec, base_history, code_file, error_of, git, make_project, project_state, refetch, run_cli, set_line,
    tree_state, verified,
)

DATE = "1767225600"  # 2026-01-01, via SOURCE_DATE_EPOCH


def chain(*edits):
    def edit(old):
        for e in edits:
            old = e(old)
        return old

    return edit


SPECS = [
    PatchSpec("0001-train-device.patch", "Pick the device from DANCEGRPO_DEVICE",
              {"fastvideo/train.py": chain(set_line(10, "device = pick_device()"), set_line(40, "use_npu = True"))}),
    PatchSpec("0002-utils.patch", "Import mochi lazily",
              {"fastvideo/utils.py": set_line(20, "mochi = None  # lazy"), "fastvideo/npu_helper.py": lambda o: "HELPER = 1\n"}),
    PatchSpec("0003-flux-rope.patch", "Build RoPE in float32",
              {"fastvideo/models/flux.py": set_line(15, "dtype = torch.float32")}),
]
OVERLAY = {"fastvideo/npu_device.py": "# our module\n"}


@pytest.fixture()
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", DATE)
    history, base = base_history(tmp_path / "upstream")
    root = make_project(tmp_path / "project", history, base, SPECS, OVERLAY)
    return history, base, find_project(root)


def snapshot(project):
    """Everything a rebase must never lose: lock, series, the user's patched tree."""
    return project_state(project.root), tree_state(project.workdir)


def patched_tree_at(tmp_path, history, commit, project, name="check"):
    """A fresh checkout of ``commit`` with the project's series and overlay applied by the engine."""
    dest = tmp_path / name
    git(tmp_path, "clone", "-q", str(history.path), str(dest))
    git(dest, "checkout", "-q", "--detach", commit)
    shutil.rmtree(dest / ".git")
    apply_series_to_dir(dest, load_series(project.patches_dir), project.overlay_dir)
    return dest


def diff_of(project, name):
    text = (project.patches_dir / name).read_text()
    return text.split("\n---\n", 1)[1]


def test_clean_move_regenerates_series_and_lock(world, tmp_path):
    history, base, project = world
    history.write("README.md", "# upstream\n\nNew words.\n")
    new = history.commit("docs")
    patches_before = {p.name: p.read_bytes() for p in project.patches_dir.iterdir()}
    tree_before = tree_state(project.workdir)
    head_before = git(project.workdir, "rev-parse", "HEAD")

    result = start_rebase(project, "main")

    assert result.status == "done"
    assert "applied as is" in result.report
    lock = load_lock(project.lock_path)
    assert lock.commit == new
    assert set(lock.files) == {"fastvideo/train.py", "fastvideo/utils.py", "fastvideo/models/flux.py"}
    # every patch applies as is: patches/ is byte-identical (Last-Update: kept too)
    assert {p.name: p.read_bytes() for p in project.patches_dir.iterdir()} == patches_before
    assert "patches/: 0 rewritten" in result.report and "3 kept byte for byte" in result.report
    assert not (project.workdir.parent / "DanceGRPO.rebase").exists()
    assert not (project.workdir / ".git" / "dancegrpo-npu" / "rebase").exists()
    orig = project.workdir / ".git" / "dancegrpo-npu" / "rebase-orig"
    assert (orig / "upstream.lock").read_text().count(base) == 1 and (orig / "report.txt").exists()
    patched_tree_at(tmp_path, history, new, project)  # the new series applies exactly
    # as git rebase does: the work tree is at REF with the new series applied and verified
    assert git(project.workdir, "rev-parse", "HEAD") == new
    assert verified(project.root)
    assert "verified: " in result.report and "is exactly upstream.lock + patches/series + overlay/" in result.report
    assert tree_state(project.workdir) == {**tree_before, "README.md": b"# upstream\n\nNew words.\n"}
    # the previous patched tree is kept as a commit until the next rebase
    kept = git(project.workdir, "rev-parse", "refs/dancegrpo-npu/rebase-orig")
    assert git(project.workdir, "rev-parse", f"{kept}^") == head_before
    assert git(project.workdir, "show", f"{kept}:fastvideo/train.py").encode() + b"\n" == tree_before["fastvideo/train.py"]
    assert git(project.workdir, "show", f"{kept}:fastvideo/npu_device.py") == "# our module"  # the overlay too
    # ... and the new one beside it: their diff is what the rebase changed in the patched tree
    assert git(project.workdir, "diff", "--name-only", "refs/dancegrpo-npu/rebase-orig", "refs/dancegrpo-npu/rebased-tree") == "README.md"
    assert "diff refs/dancegrpo-npu/rebase-orig refs/dancegrpo-npu/rebased-tree" in result.report
    apply_worktree(project)  # nothing left for the user to do
    assert apply_worktree(project).noop


def test_moved_context_gets_fresh_line_numbers(world, tmp_path):
    history, base, project = world
    history.insert_lines("fastvideo/train.py", 1, [f"# licence line {i}" for i in range(5)])
    new = history.commit("add a licence header")
    before = {p.name: p.read_bytes() for p in project.patches_dir.iterdir()}

    result = start_rebase(project, "main")

    assert result.status == "done"
    assert "context moved (by +5, +5 lines)" in result.report
    assert "@@ -12,7 +12,7 @@" in diff_of(project, "0001-train-device.patch")
    # only the patch whose diff changed is re-dated; the others keep their bytes
    moved = (project.patches_dir / "0001-train-device.patch").read_text()
    assert "Last-Update: 2026-01-01\n" in moved and "Last-Update: 2025-01-01" not in moved
    assert moved.split("\n---\n")[0].replace("2026-01-01", "2025-01-01") == before["0001-train-device.patch"].decode().split("\n---\n")[0]
    after = {p.name: p.read_bytes() for p in project.patches_dir.iterdir()}
    assert {n for n in after if after[n] != before[n]} == {"0001-train-device.patch"}
    assert "patches/: 1 rewritten (new diff, Last-Update: 2026-01-01): 0001-train-device.patch; 2 kept" in result.report
    tree = patched_tree_at(tmp_path, history, new, project)
    assert "device = pick_device()" in (tree / "fastvideo/train.py").read_text()


def test_three_way_merge_when_context_changed(world, tmp_path):
    history, base, project = world
    history.edit_line("fastvideo/train.py", 12, "train_value_12 = compute('train', 12, fast=True)")
    new = history.commit("speed up line 12")

    result = start_rebase(project, "main")

    assert result.status == "done", result.report
    assert re.search(r"0001-train-device.patch\s+3-way merged", result.report)
    diff = diff_of(project, "0001-train-device.patch")
    assert " train_value_12 = compute('train', 12, fast=True)" in diff  # upstream's line is now context
    text = (patched_tree_at(tmp_path, history, new, project) / "fastvideo/train.py").read_text()
    assert "device = pick_device()" in text and "fast=True" in text


def conflicting_upstream(history):
    history.edit_line("fastvideo/train.py", 40, "use_cuda = True")
    return history.commit("Force CUDA (conflicts with 0001)")


def test_conflict_stops_with_report_and_project_untouched(world):
    history, base, project = world
    conflicting_upstream(history)
    before = snapshot(project)

    result = start_rebase(project, "main")

    assert result.status == "stopped" and result.stop == "conflict"
    report = result.report
    assert "stopped at patch 1 of 3, 0001-train-device.patch" in report
    assert "fastvideo/train.py: changed both upstream and by the patch" in report
    assert "hunk 2/2 @@ -37,7 +37,7 @@" in report and "CONFLICT" in report
    assert "hunk 1/2" in report and "still applies as is" in report
    assert "Force CUDA (conflicts with 0001)" in report
    rebase_tree = project.workdir.parent / "DanceGRPO.rebase"
    assert "<<<<<<< " in (rebase_tree / "fastvideo/train.py").read_text()
    assert snapshot(project) == before
    state_dir = project.workdir / ".git" / "dancegrpo-npu" / "rebase"
    assert (state_dir / "report.txt").read_text() == report


def resolve(project, path, text_fn):
    tree = project.workdir.parent / "DanceGRPO.rebase"
    p = tree / path
    p.write_text(text_fn(p.read_text()))


def take_both(text):
    return re.sub(r"<<<<<<< .*?\n(.*?)\|\|\|\|\|\|\| .*?\n.*?=======\n(.*?)>>>>>>> [^\n]*\n", r"\1\2", text, flags=re.S)


def test_continue_after_resolving(world, tmp_path):
    history, base, project = world
    new = conflicting_upstream(history)
    assert start_rebase(project, "main").status == "stopped"
    with pytest.raises(DancegrpoError, match="conflict markers are still in fastvideo/train.py:40"):
        continue_rebase(project)
    resolve(project, "fastvideo/train.py", take_both)

    result = continue_rebase(project)

    assert result.status == "done"
    assert re.search(r"0001-train-device.patch\s+resolved by hand", result.report)
    diff = diff_of(project, "0001-train-device.patch")
    assert "+use_npu = True" in diff and " use_cuda = True" in diff
    text = (patched_tree_at(tmp_path, history, new, project) / "fastvideo/train.py").read_text()
    assert "use_cuda = True\nuse_npu = True\n" in text


def test_continue_with_nothing_changed_points_to_skip(world):
    history, base, project = world
    conflicting_upstream(history)
    start_rebase(project, "main")
    resolve(project, "fastvideo/train.py", lambda t: history.read("fastvideo/train.py"))
    assert re.search("no change for 0001-train-device.patch.*--skip", error_of(continue_rebase, project))


def test_user_commits_in_rebase_tree_are_folded_into_the_patch(world):
    history, base, project = world
    conflicting_upstream(history)
    start_rebase(project, "main")
    resolve(project, "fastvideo/train.py", take_both)
    tree = project.workdir.parent / "DanceGRPO.rebase"
    git(tree, "commit", "-qam", "my resolution")
    assert continue_rebase(project).status == "done"
    assert "+use_npu = True" in diff_of(project, "0001-train-device.patch")


def test_skip_drops_the_patch_and_records_it(world, tmp_path):
    history, base, project = world
    new = conflicting_upstream(history)
    assert start_rebase(project, "main").status == "stopped"

    result = skip_patch(project)

    assert result.status == "done"
    assert "0001-train-device.patch  SKIPPED" in result.report
    series = (project.series_path).read_text()
    assert "0001-train-device.patch" not in series and "# test series" in series
    assert not (project.patches_dir / "0001-train-device.patch").exists()
    assert "fastvideo/train.py" not in load_lock(project.lock_path).files
    patched_tree_at(tmp_path, history, new, project)


def test_abort_restores_everything_exactly(world):
    history, base, project = world
    conflicting_upstream(history)
    before = snapshot(project)
    refs_before = git(project.workdir, "for-each-ref")
    start_rebase(project, "main")
    resolve(project, "fastvideo/train.py", take_both)

    result = abort_rebase(project)

    assert result.status == "aborted"
    assert snapshot(project) == before
    assert git(project.workdir, "for-each-ref") == refs_before
    assert not (project.workdir.parent / "DanceGRPO.rebase").exists()
    with pytest.raises(DancegrpoError, match="no rebase is in progress"):
        abort_rebase(project)


def test_patched_file_deleted_upstream(world, tmp_path):
    history, base, project = world
    history.delete("fastvideo/utils.py")
    new = history.commit("Remove utils.py")

    result = start_rebase(project, "main")

    assert result.status == "stopped"
    assert "fastvideo/utils.py: deleted or renamed upstream, changed by the patch" in result.report
    assert "its file is gone from the new upstream" in result.report and "Remove utils.py" in result.report
    tree = project.workdir.parent / "DanceGRPO.rebase"
    git(tree, "rm", "-q", "fastvideo/utils.py")  # drop the patch's change to the deleted file
    result = continue_rebase(project)
    assert result.status == "done"
    diff = diff_of(project, "0002-utils.patch")
    assert "fastvideo/utils.py" not in diff and "+HELPER = 1" in diff
    assert "fastvideo/utils.py" not in load_lock(project.lock_path).files
    patched_tree_at(tmp_path, history, new, project)


def test_patched_file_renamed_upstream_is_followed(world, tmp_path):
    history, base, project = world
    history.rename("fastvideo/utils.py", "fastvideo/common/utils.py")
    new = history.commit("Move utils")

    result = start_rebase(project, "main")

    assert result.status == "done", result.report
    assert "fastvideo/utils.py is now fastvideo/common/utils.py upstream" in result.report
    diff = diff_of(project, "0002-utils.patch")
    assert "+++ b/fastvideo/common/utils.py" in diff and "b/fastvideo/utils.py" not in diff
    lock = load_lock(project.lock_path)
    assert "fastvideo/common/utils.py" in lock.files and "fastvideo/utils.py" not in lock.files
    tree = patched_tree_at(tmp_path, history, new, project)
    assert "mochi = None  # lazy" in (tree / "fastvideo/common/utils.py").read_text()


def test_patch_already_upstream_stops_as_empty(world):
    history, base, project = world
    history.edit_line("fastvideo/models/flux.py", 15, "dtype = torch.float32")
    history.commit("upstream fixes RoPE dtype itself")

    result = start_rebase(project, "main")

    assert result.status == "stopped" and result.stop == "empty"
    assert "upstream seems to already do what it did" in result.report
    assert skip_patch(project).status == "done"
    assert "0003-flux-rope.patch" not in project.series_path.read_text()


def test_overlay_path_now_upstream_stops_until_moved(world):
    history, base, project = world
    history.write("fastvideo/npu_device.py", "# upstream's own\n")
    history.commit("upstream adds npu_device.py")
    before = snapshot(project)

    with pytest.raises(DancegrpoError, match="overlay path"):
        start_rebase(project, "main")
    assert snapshot(project) == before
    report = (project.workdir / ".git/dancegrpo-npu/rebase/report.txt").read_text()
    assert "overlay/fastvideo/npu_device.py: now exists upstream (added by" in report
    (project.overlay_dir / "fastvideo/npu_device.py").rename(project.overlay_dir / "fastvideo/npu_device_ours.py")
    assert continue_rebase(project).status == "done"


def test_project_edited_during_rebase_is_not_overwritten(world):
    history, base, project = world
    conflicting_upstream(history)
    start_rebase(project, "main")
    resolve(project, "fastvideo/train.py", take_both)
    series = project.series_path.read_text()
    project.series_path.write_text(series + "# my note\n")
    with pytest.raises(DancegrpoError, match="patches/series changed since the rebase started"):
        continue_rebase(project)
    assert project.series_path.read_text().endswith("# my note\n")
    project.series_path.write_text(series)
    assert continue_rebase(project).status == "done"


def test_refuses_local_edits_and_leaves_nothing_behind(world):
    history, base, project = world
    history.commit("empty upstream commit")
    (project.workdir / "fastvideo/utils.py").write_text("edited by hand\n")
    before = snapshot(project)
    assert re.search(r"edits that are in no patch: M fastvideo/utils.py.*export", error_of(start_rebase, project, "main"))
    assert snapshot(project) == before
    assert not (project.workdir / ".git/dancegrpo-npu/rebase").exists()
    assert not (project.workdir.parent / "DanceGRPO.rebase").exists()


def test_second_rebase_refused_while_one_is_in_progress(world):
    history, base, project = world
    conflicting_upstream(history)
    start_rebase(project, "main")
    with pytest.raises(DancegrpoError, match="already in progress"):
        start_rebase(project, "main")


def test_already_based_on_ref(world):
    history, base, project = world
    before = snapshot(project)
    assert start_rebase(project, base).status == "nothing"
    assert snapshot(project) == before


def test_unknown_ref_is_a_clear_error(world):
    history, base, project = world
    with pytest.raises(DancegrpoError, match="cannot fetch 'no-such-branch' from .*nothing was changed"):
        start_rebase(project, "no-such-branch")


def test_dry_run_reports_and_changes_nothing(world):
    history, base, project = world
    history.edit_line("fastvideo/train.py", 12, "train_value_12 = compute('train', 12, fast=True)")
    conflicting_upstream(history)
    history.rename("fastvideo/utils.py", "fastvideo/common/utils.py")
    history.commit("Move utils")
    before = snapshot(project)
    refs = git(project.workdir, "for-each-ref")
    objects = git(project.workdir, "count-objects", "-v")

    result = dry_run(project, "main")

    assert result.status == "stopped"
    assert re.search(r"0001-train-device.patch\s+WOULD STOP: conflict", result.report)
    assert "Force CUDA" in result.report
    assert re.search(r"0002-utils.patch\s+3-way merged", result.report)
    assert "Nothing was changed." in result.report
    assert snapshot(project) == before
    assert git(project.workdir, "for-each-ref") == refs
    assert git(project.workdir, "count-objects", "-v") == objects


def test_dry_run_clean(world):
    history, base, project = world
    history.insert_lines("fastvideo/models/flux.py", 3, ["import math"])
    history.commit("import math")
    before = snapshot(project)
    result = dry_run(project, "main")
    assert result.status == "dry-run", result.report
    assert "The rebase would go through." in result.report and "fastvideo/models/flux.py: changed upstream" in result.report
    assert snapshot(project) == before


def test_round_trip_older_and_back(tmp_path, monkeypatch):
    """Lock at B; rebase onto an older A (conflict-free), then back onto B: same patched tree."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", DATE)
    history, a = base_history(tmp_path / "upstream")
    history.insert_lines("fastvideo/train.py", 1, ["import os", "import sys"])
    history.edit_line("fastvideo/utils.py", 35, "utils_value_35 = 35")
    history.write("fastvideo/extra.py", code_file("extra", 5))
    b = history.commit("upstream moves on")
    root = make_project(tmp_path / "project", history, b, SPECS, OVERLAY)
    project = find_project(root)
    tree_before = tree_state(project.workdir)
    patched_before = tree_state(patched_tree_at(tmp_path, history, b, project, "before"))

    assert start_rebase(project, a).status == "done"
    assert load_lock(project.lock_path).commit == a
    patched_tree_at(tmp_path, history, a, project, "at-a")
    assert verified(project.root)  # the rebase moved the work tree to A itself ...
    assert git(project.workdir, "rev-parse", "HEAD") == a
    assert start_rebase(project, b).status == "done"  # ... so the next rebase needs no fetch && apply

    assert load_lock(project.lock_path).commit == b
    assert tree_state(patched_tree_at(tmp_path, history, b, project, "after")) == patched_before
    assert verified(project.root)
    assert tree_state(project.workdir) == tree_before


def test_cli_stop_continue_and_errors(world):
    history, base, project = world
    conflicting_upstream(history)
    r = run_cli(project.root, "rebase", "--onto", "main")
    assert r.returncode == 1
    assert "stopped at patch 1 of 3" in r.stdout
    assert r.stderr.count("\n") == 1 and "rebase stopped at 0001-train-device.patch" in r.stderr
    r = run_cli(project.root, "rebase", "--skip")
    assert r.returncode == 0, r.stderr
    r = run_cli(project.root, "rebase", "--continue")
    assert r.returncode == 1 and "no rebase is in progress" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(project.root, "rebase", "--continue", "--dry-run")
    assert r.returncode == 2 and "--dry-run goes with --onto" in r.stderr


def test_cli_without_work_tree(tmp_path):
    root = tmp_path / "p"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "series").write_text("")
    (root / "upstream.lock").write_text('[upstream]\nurl = "x"\ncommit = "%s"\n' % ("a" * 40))
    r = run_cli(root, "rebase", "--onto", "main")
    assert r.returncode == 1 and "run `dancegrpo-npu fetch` first" in r.stderr and "Traceback" not in r.stderr


def test_rebase_tree_is_independent_of_user_repo(world):
    history, base, project = world
    conflicting_upstream(history)
    head = git(project.workdir, "rev-parse", "HEAD")
    status = subprocess.run(["git", "status", "--porcelain"], cwd=project.workdir, capture_output=True, text=True).stdout
    start_rebase(project, "main")
    assert git(project.workdir, "rev-parse", "HEAD") == head
    assert subprocess.run(["git", "status", "--porcelain"], cwd=project.workdir, capture_output=True, text=True).stdout == status


def test_rebase_tree_removed_by_hand(world):
    history, base, project = world
    conflicting_upstream(history)
    before = snapshot(project)
    start_rebase(project, "main")
    shutil.rmtree(project.workdir.parent / "DanceGRPO.rebase")
    assert "is gone" in error_of(continue_rebase, project) and "--abort" in error_of(skip_patch, project)
    assert abort_rebase(project).status == "aborted"
    assert snapshot(project) == before


def test_archive_made_tree_cannot_be_rebased(world, tmp_path):
    from synthetic_upstream import Upstream, make_archive

    from dancegrpo_npu.engine.fetch import fetch
    from dancegrpo_npu.engine.lock import save_lock, sha256_file

    history, base, project = world
    archive = make_archive(Upstream(history.path, base), tmp_path / "upstream.tar.gz")
    lock = load_lock(project.lock_path)
    save_lock(lock.with_commit(base, lock.files, sha256_file(archive)), project.lock_path)
    shutil.rmtree(project.workdir)
    fetch(project, source=str(archive))
    assert "made from an archive" in error_of(start_rebase, project, "main")


def test_patch_after_a_merged_one_on_the_same_file_applies_as_is(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", DATE)
    history, base = base_history(tmp_path / "upstream")
    specs = [
        PatchSpec("0001-a.patch", "a", {"fastvideo/train.py": set_line(10, "a = 1")}),
        PatchSpec("0002-b.patch", "b", {"fastvideo/train.py": set_line(50, "b = 2")}),
    ]
    project = find_project(make_project(tmp_path / "project", history, base, specs))
    history.edit_line("fastvideo/train.py", 12, "near_a = True")
    history.commit("near a")
    result = start_rebase(project, "main")
    assert re.search(r"0001-a.patch\s+3-way merged", result.report)
    assert re.search(r"0002-b.patch\s+applied as is", result.report)  # the index was left fresh


def test_delete_and_add_conflicts(tmp_path, monkeypatch):
    """A patch deleting a file upstream changed, and one adding a file upstream added too."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", DATE)
    history, base = base_history(tmp_path / "upstream")
    specs = [
        PatchSpec("0001-drop-flux.patch", "drop", {"fastvideo/models/flux.py": None}),
        PatchSpec("0002-add-npu.patch", "add", {"fastvideo/npu.py": lambda o: "NPU = 'ours'\n"}),
    ]
    project = find_project(make_project(tmp_path / "project", history, base, specs))
    history.edit_line("fastvideo/models/flux.py", 3, "changed = True")
    history.write("fastvideo/npu.py", "NPU = 'upstream'\n")
    history.commit("upstream changes flux.py and adds npu.py")
    tree = project.workdir.parent / "DanceGRPO.rebase"

    result = start_rebase(project, "main")
    assert "fastvideo/models/flux.py: changed upstream, deleted by the patch" in result.report
    git(tree, "rm", "-q", "fastvideo/models/flux.py")  # still drop it
    result = continue_rebase(project)
    assert result.status == "stopped"
    assert "fastvideo/npu.py: added both upstream and by the patch" in result.report
    text = (tree / "fastvideo/npu.py").read_text()
    assert "<<<<<<< upstream" in text and "NPU = 'upstream'" in text and ">>>>>>> 0002-add-npu.patch" in text
    (tree / "fastvideo/npu.py").write_text("NPU = 'upstream'\nNPU_OURS = 'ours'\n")
    assert continue_rebase(project).status == "done"
    assert "+++ /dev/null" in diff_of(project, "0001-drop-flux.patch")
    assert "+NPU_OURS = 'ours'" in diff_of(project, "0002-add-npu.patch")
    refetch(project.root)
    assert verified(project.root)


def test_overlay_files_are_those_the_engine_copies(tmp_path):
    """The rebase excludes and verifies the overlay files the engine copies, no more: editor
    backups and caches the engine skips must not make the verification look for them."""
    from dancegrpo_npu.rebase.finish import overlay_files
    from dancegrpo_npu.engine.stage import read_overlay

    for rel in ("pkg/mod.py", "pkg/mod.py~", "pkg/.mod.py.swp", "pkg/__pycache__/mod.pyc", ".pytest_cache/x", "top.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x\n")
    assert sorted(overlay_files(tmp_path)) == sorted(read_overlay(tmp_path)) == ["pkg/mod.py", "top.txt"]


def drop_blob(repo, rev, rel):
    """Remove ``rel``'s blob at ``rev`` from a repository (loose objects): a mirror or a
    partial clone lacks large files (the mirror here lacks dancegrpo.pdf, of 2149f36)."""
    blob = git(repo, "rev-parse", f"{rev}:{rel}")
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    assert subprocess.run(["git", "cat-file", "-e", blob], cwd=repo).returncode != 0


def test_rebase_needs_no_blob_the_series_does_not_touch(tmp_path, monkeypatch):
    """`rebase --onto 2149f36` here: the older commit has a file whose blob the mirror
    lacks, and rename detection (a 3-way merge follows upstream renames) used to read it:
    `git diff -z --name-status failed ... unable to read`."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", DATE)
    history, base = base_history(tmp_path / "upstream")
    history.write("paper.pdf", "%PDF-1.5 a large paper\n" * 2000)
    a = history.commit("add the paper")
    history.delete("paper.pdf")
    history.write("fastvideo/extra.py", code_file("extra", 30))  # a file gone going back: rename candidate
    history.edit_line("fastvideo/train.py", 12, "train_value_12 = compute('train', 12, fast=True)")
    b = history.commit("delete paper, add extra, speed up line 12")
    drop_blob(history.path, a, "paper.pdf")
    project = find_project(make_project(tmp_path / "project", history, b, SPECS, OVERLAY))
    assert verified(project.root)

    result = start_rebase(project, a)

    assert result.status == "done", result.report
    assert re.search(r"0001-train-device.patch\s+3-way merged", result.report)
    assert " train_value_12 = compute('train', 12)" in diff_of(project, "0001-train-device.patch")
    assert load_lock(project.lock_path).commit == a
    # the work tree is at the older commit, without the file the source lacks, and exact
    assert git(project.workdir, "rev-parse", "HEAD") == a
    assert not (project.workdir / "paper.pdf").exists()
    assert "left out of the tree: paper.pdf" in result.report
    assert verified(project.root)


def test_upstream_rename_is_followed_when_an_unrelated_blob_is_missing(world, tmp_path):
    history, base, project = world
    history.write("paper.pdf", "%PDF-1.5 a large paper\n" * 2000)
    history.rename("fastvideo/utils.py", "fastvideo/common/helpers.py")
    history.edit_line("fastvideo/common/helpers.py", 2, "utils_value_2 = 2  # moved and changed: an inexact rename")
    new = history.commit("Move utils, add the paper")
    git(project.workdir, "fetch", "-q", str(history.path), "main")  # the tree's repository has the commit ...
    drop_blob(project.workdir, new, "paper.pdf")  # ... but not the paper (a clone shares the loose object)

    result = start_rebase(project, new)

    assert result.status == "done", result.report
    assert "fastvideo/utils.py is now fastvideo/common/helpers.py upstream" in result.report
    assert "+++ b/fastvideo/common/helpers.py" in diff_of(project, "0002-utils.patch")
    assert verified(project.root) and not (project.workdir / "paper.pdf").exists()


def test_edits_made_while_stopped_are_saved_when_the_tree_moves(world):
    """The rebase refuses to start over local edits; edits made in the patched tree while
    it waits for a resolution are saved (as apply --force saves them) before it moves."""
    history, base, project = world
    new = conflicting_upstream(history)
    assert start_rebase(project, "main").status == "stopped"
    (project.workdir / "fastvideo/models/flux.py").write_text("edited while the rebase waited\n")
    resolve(project, "fastvideo/train.py", take_both)

    result = continue_rebase(project)

    assert result.status == "done", result.report
    m = re.search(r"local edits in it were saved first: (\S+local-edits.patch)", result.report)
    assert m, result.report
    saved = (project.workdir / ".git/dancegrpo-npu/saved")
    [kept] = [d for d in saved.iterdir()]
    assert (kept / "files/fastvideo/models/flux.py").read_text() == "edited while the rebase waited\n"
    assert "+edited while the rebase waited" in (kept / "local-edits.patch").read_text()
    assert git(project.workdir, "rev-parse", "HEAD") == new and verified(project.root)


def test_status_and_verify_while_the_tree_is_being_moved(world):
    history, base, project = world
    history.write("README.md", "# upstream\n\nNew words.\n")
    history.commit("docs")
    killed = run_cli(project.root, "rebase", "--onto", "main", env={"DANCEGRPO_NPU_KILL_AT": "done:moved"})
    assert killed.returncode == -9
    status = run_cli(project.root, "status")
    assert "the work tree is being moved to the new commit" in status.stdout
    assert "rebase --continue" in status.stdout
    verify = run_cli(project.root, "verify")
    assert verify.returncode == 1 and "the work tree is being moved" in verify.stderr
    assert run_cli(project.root, "rebase", "--continue").returncode == 0
    assert run_cli(project.root, "verify").returncode == 0
