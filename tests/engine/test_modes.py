"""The mode lines of a git patch: a new executable keeps its bit, a mode change is made
(or refused when the tree is not what the patch changes from), a new symlink is made a
symlink only when its target stays inside the tree; and verify sees a wrong mode or type.

Patches are made by git itself (``git diff``) in a clone of the synthetic upstream.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from synthetic_upstream import dep3, run_git, setup, snapshot

from dancegrpo_npu.engine.diffs import EXECUTABLE, SYMLINK, parse_diff
from dancegrpo_npu.engine.status import inspect, verify_tree
from dancegrpo_npu.errors import DancegrpoError


def git_patch(s, description: str, change) -> bytes:
    """The DEP-3 patch git writes for ``change(scratch)`` made in a checkout of upstream."""
    scratch = s.tmp / "scratch"
    if scratch.exists():
        shutil.rmtree(scratch)
    run_git(s.up.path.parent, "clone", "-q", os.fspath(s.up.path), os.fspath(scratch))
    change(scratch)
    run_git(scratch, "add", "-A")
    diff = run_git(scratch, "diff", "--cached", "--no-renames")
    shutil.rmtree(scratch)
    return dep3(description, diff)


def link(rel: str, target: str):
    def change(root: Path) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / rel)

    return change


def refused_untouched(s, pattern: str) -> str:
    """apply must refuse (message matching ``pattern``) and leave the tree byte-identical."""
    before = snapshot(s.tree)
    with pytest.raises(DancegrpoError, match=pattern) as e:
        s.apply()
    assert snapshot(s.tree) == before, "a refused apply must write nothing"
    return e.value.one_line()


def test_new_symlink_inside_the_tree_is_a_symlink(tmp_path):
    s = setup(tmp_path)
    patch = git_patch(s, "a link to the loader", link("fastvideo/loader.py", "utils/load.py"))
    assert b"new file mode 120000" in patch
    s.set_series({"0001-link.patch": patch})
    s.apply()
    made = s.tree / "fastvideo/loader.py"
    assert made.is_symlink() and os.readlink(made) == "utils/load.py"
    assert made.read_text() == (s.tree / "fastvideo/utils/load.py").read_text()
    report = inspect(s.project)
    assert report.exact and not report.edits
    verify_tree(s.project)
    assert s.apply().noop
    # verify sees a symlink replaced by a file with the same bytes, or pointing elsewhere
    made.unlink()
    made.write_text("utils/load.py")
    with pytest.raises(DancegrpoError, match=r"fastvideo/loader.py \(should be a symlink to utils/load.py\)"):
        verify_tree(s.project)
    made.unlink()
    os.symlink("utils/other.py", made)
    with pytest.raises(DancegrpoError, match=r"fastvideo/loader.py \(should be a symlink"):
        verify_tree(s.project)
    s.apply(force=True)
    verify_tree(s.project)


@pytest.mark.parametrize("target", ["/etc", "../..", "../../../etc", "fastvideo/../../x", ".git/config"])
def test_new_symlink_leaving_the_tree_is_refused_before_anything_is_written(tmp_path, target):
    s = setup(tmp_path)
    ok = s.patch("an ordinary change first", {"README.md": "# changed\n"})
    bad = git_patch(s, "a link out of the tree", link("etc", target))
    s.set_series({"0001-ok.patch": ok, "0002-escape.patch": bad})
    text = refused_untouched(s, "0002-escape.patch")
    assert f"refusing to create the symlink etc -> {target}" in text and "inside the tree" in text
    assert not (s.tree / "etc").is_symlink()


def test_new_symlink_through_upstream_symlinks(tmp_path):
    """The target resolves through the tree's own symlinks: out through one is refused,
    in through one is fine."""
    files = {"README.md": "x\n", "lib/real.py": "a = 1\n"}
    s = setup(tmp_path, files=files, symlinks={"out": "../..", "inside": "lib"})
    s.set_series({"0001-link.patch": git_patch(s, "via out", link("sneaky", "out/etc"))}, refresh_lock=False)
    assert "sneaky -> out/etc" in refused_untouched(s, "0001-link.patch")
    s.set_series({"0001-link.patch": git_patch(s, "via inside", link("alias.py", "inside/real.py"))}, refresh_lock=False)
    s.apply()
    assert (s.tree / "alias.py").read_text() == "a = 1\n"
    verify_tree(s.project)


def test_a_later_patch_may_not_write_through_a_symlink_the_series_made(tmp_path):
    s = setup(tmp_path)
    first = git_patch(s, "a link to a directory", link("fv", "fastvideo"))
    later = dep3("through it", b"--- fv/train.py\n+++ fv/train.py\n@@ -1 +1 @@\n-line 1\n+line one\n")
    s.set_series({"0001-link.patch": first, "0002-through.patch": later}, refresh_lock=False)
    assert "goes through the symlink fv -> fastvideo" in refused_untouched(s, "0002-through.patch")


def test_new_executable_keeps_its_bit_and_verify_sees_it_removed(tmp_path):
    s = setup(tmp_path)

    def new_script(root: Path) -> None:
        (root / "scripts/npu_run.sh").write_text("#!/bin/sh\necho npu\n")
        os.chmod(root / "scripts/npu_run.sh", 0o755)

    patch = git_patch(s, "a launcher", new_script)
    assert b"new file mode 100755" in patch
    s.set_series({"0001-script.patch": patch})
    s.apply()
    script = s.tree / "scripts/npu_run.sh"
    assert os.stat(script).st_mode & 0o111 == 0o111
    verify_tree(s.project)
    os.chmod(script, 0o644)  # the bit removed by hand
    with pytest.raises(DancegrpoError, match=r"scripts/npu_run.sh \(mode differs: should be 100755\)"):
        verify_tree(s.project)
    assert [e.kind for e in inspect(s.project).edits] == ["mode changed"]
    s.apply(force=True)
    verify_tree(s.project)


def test_mode_change_of_an_existing_file(tmp_path):
    """old mode/new mode: alone (git writes no hunk) or with hunks; honoured exactly, and
    refused, naming patch and path, when the file does not have the old mode."""
    s = setup(tmp_path)

    def chmod_x(root: Path) -> None:
        os.chmod(root / "fastvideo/train.py", 0o755)

    def chmod_and_edit(root: Path) -> None:
        os.chmod(root / "scripts/run.sh", 0o644)
        (root / "scripts/run.sh").write_text("#!/bin/sh\necho run on npu\n")

    only = git_patch(s, "train.py is a script", chmod_x)
    assert b"old mode 100644\nnew mode 100755\n" in only and b"@@" not in only
    with_hunks = git_patch(s, "run.sh is sourced, not run", chmod_and_edit)
    assert b"old mode 100755\nnew mode 100644\n" in with_hunks and b"@@" in with_hunks
    [change] = parse_diff(only.split(b"---\n", 1)[1], "x")
    assert (change.kind, change.old_mode, change.new_mode, change.hunks) == ("modify", 0o100644, EXECUTABLE, ())
    s.set_series({"0001-x.patch": only, "0002-sourced.patch": with_hunks})
    s.apply()
    assert os.stat(s.tree / "fastvideo/train.py").st_mode & 0o111
    assert not os.stat(s.tree / "scripts/run.sh").st_mode & 0o111
    assert (s.tree / "scripts/run.sh").read_text() == "#!/bin/sh\necho run on npu\n"
    verify_tree(s.project)
    assert s.apply().noop
    os.chmod(s.tree / "fastvideo/train.py", 0o644)  # its only change undone: upstream's file again
    with pytest.raises(DancegrpoError, match=r"fastvideo/train.py \(not patched\)"):
        verify_tree(s.project)
    s.apply(force=True)
    # a patch written against another mode than upstream's is refused, not applied differently
    s.set_series({"0001-x.patch": only, "0002-again.patch": only}, refresh_lock=False)
    text = refused_untouched(s, "0002-again.patch")
    assert "changes fastvideo/train.py twice" in text or "fastvideo/train.py is mode 100755" in text
    s.set_series({"0001-again.patch": only.replace(b"old mode 100644\nnew mode 100755", b"old mode 100755\nnew mode 100644")})
    assert "fastvideo/train.py is mode 100644 (a regular file), the patch expects 100755" in refused_untouched(s, "0001-again.patch")


def test_empty_new_file_and_unsupported_modes(tmp_path):
    s = setup(tmp_path)

    def empty(root: Path) -> None:
        (root / "fastvideo/npu/__init__.py").parent.mkdir()
        (root / "fastvideo/npu/__init__.py").write_text("")

    patch = git_patch(s, "a package", empty)
    assert b"@@" not in patch
    s.set_series({"0001-pkg.patch": patch})
    s.apply()
    assert (s.tree / "fastvideo/npu/__init__.py").read_bytes() == b""
    verify_tree(s.project)
    for mode_diff, why in (
        (b"diff --git a/sub b/sub\nnew file mode 160000\nindex 0000000..1111111\n--- /dev/null\n+++ b/sub\n@@ -0,0 +1 @@\n+Subproject commit 1111111\n", "file mode 160000 is not supported"),
        (b"diff --git a/README.md b/README.md\nold mode 100644\nnew mode 120000\n", "turns a file into a symlink"),
        (b"diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+target\n", "not one target line without a final newline"),
    ):
        s.set_series({"0002-bad.patch": dep3("bad", mode_diff)}, refresh_lock=False)
        assert why in refused_untouched(s, "0002-bad.patch")


def test_symlink_mode_is_parsed_as_a_symlink(tmp_path):
    s = setup(tmp_path, fetch=False)
    patch = git_patch(s, "a link", link("etc", "/etc"))
    [change] = parse_diff(patch.split(b"---\n", 1)[1], "x")
    assert change.is_link and change.new_mode == SYMLINK and change.hunks[0].new == (b"/etc",)
