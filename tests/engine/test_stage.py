"""The patch-ng wrapper and the strict diff reader: patch-ng writes, the engine checks."""

from __future__ import annotations

import os

import patch_ng
import pytest
from synthetic_upstream import refused, setup, snapshot

from dancegrpo_npu.engine.diffs import check_hunks, parse_diff, split_lines
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.series import Patch
from dancegrpo_npu.engine.stage import FileState, Upstream, build

TRAIN = "".join(f"line {i}\n" for i in range(1, 41))


def _upstream(files: dict[str, bytes]) -> Upstream:
    return Upstream(frozenset(files), {}, lambda paths: {p: FileState(files[p]) for p in paths if p in files})


def _patch(name: str, diff: bytes) -> Patch:
    return Patch(name, None, {"Description": name}, f"Description: {name}\n", diff)


EDIT = (
    b"diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
    b"diff --git a/n.txt b/n.txt\nnew file mode 100755\n--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1 @@\n+new\n"
)


def test_patch_ng_writes_every_file_and_never_fuzzes(tmp_path, monkeypatch):
    calls = []
    real = patch_ng.PatchSet.apply

    def spy(self, strip=0, root=None, fuzz=False):
        calls.append((strip, fuzz, [it.target for it in self.items]))
        return real(self, strip=strip, root=root, fuzz=fuzz)

    monkeypatch.setattr(patch_ng.PatchSet, "apply", spy)
    built = build(_upstream({"f.txt": b"a\nb\nc\n"}), [_patch("p", EDIT)], {}, tmp_path)
    assert calls == [(0, False, [b"f.txt"]), (0, False, [b"n.txt"])]
    assert built.files["f.txt"].data == b"a\nB\nc\n" and built.files["n.txt"] == FileState(b"new\n", True)
    assert (tmp_path / "n.txt").stat().st_mode & 0o111


def test_patch_ng_output_is_checked(tmp_path, monkeypatch):
    real = patch_ng.PatchSet.write_hunks

    def corrupt(self, srcname, tgtname, hunks):
        ok = real(self, srcname, tgtname, hunks)
        with open(tgtname, "ab") as f:
            f.write(b"garbage\n")
        return ok

    monkeypatch.setattr(patch_ng.PatchSet, "write_hunks", corrupt)
    refused(build, "patch-ng failed .*differs from the exact hunks", _upstream({"f.txt": b"a\nb\nc\n"}), [_patch("p", EDIT)], {}, tmp_path)


def test_patch_ng_stray_files_are_caught(tmp_path, monkeypatch):
    real = patch_ng.PatchSet.apply

    def stray(self, strip=0, root=None, fuzz=False):
        (tmp_path / "stray.orig").write_bytes(b"x")
        return real(self, strip=strip, root=root, fuzz=fuzz)

    monkeypatch.setattr(patch_ng.PatchSet, "apply", stray)
    refused(build, "unexpected file", _upstream({"f.txt": b"a\nb\nc\n"}), [_patch("p", EDIT)], {}, tmp_path)


def test_patch_ng_failure_on_a_real_tree_leaves_it_untouched(tmp_path, monkeypatch):
    s = setup(tmp_path)
    s.set_series({"0001.patch": s.patch("x", {"README.md": "# x\n", "fastvideo/train.py": TRAIN + "more\n"})})
    before = snapshot(s.tree)
    monkeypatch.setattr(patch_ng.PatchSet, "write_hunks", lambda self, a, b, h: False)
    refused(s.apply, "patch-ng failed")
    assert snapshot(s.tree) == before


def test_a_build_without_a_stage_applies_with_patch_ng_too(monkeypatch):
    """One applier: a build that only computes the tree (status, verify) runs patch-ng as well,
    in a directory of its own that goes."""
    calls = []
    real = patch_ng.PatchSet.apply
    monkeypatch.setattr(patch_ng.PatchSet, "apply", lambda self, **kw: calls.append(kw["root"]) or real(self, **kw))
    built = build(_upstream({"f.txt": b"a\nb\nc\n"}), [_patch("p", EDIT)], {}, None)
    assert built.files["f.txt"].data == b"a\nB\nc\n"
    assert built.created == {"n.txt"} and built.touched_by == {"p": ("f.txt", "n.txt")}
    assert len(calls) == 2 and not any(os.path.exists(root) for root in calls)


def test_split_lines_only_on_lf():
    assert split_lines(b"a\r\nb\rc\nlast") == [b"a\r\n", b"b\rc\n", b"last"]
    assert split_lines(b"") == []


def test_no_newline_markers_on_both_sides():
    diff = b"--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"
    (change,) = parse_diff(diff.replace(b"--- a/x\n+++ b/x", b"--- x\n+++ x"), "p")
    assert change.hunks[0].old == (b"a\n", b"b") and change.hunks[0].new == (b"a\n", b"c")
    plain = diff.replace(b"--- a/x\n+++ b/x", b"--- x\n+++ x")
    assert build(_upstream({"x": b"a\nb"}), [_patch("p", plain)], {}, None).files["x"].data == b"a\nc"  # patch-ng's gap
    with pytest.raises(DancegrpoError, match="final newline"):
        check_hunks(b"a\nb\n", change, "p")


def test_multiple_hunks_and_overlap():
    diff = (
        b"--- x\n+++ x\n@@ -1,2 +1,2 @@\n-1\n+one\n 2\n@@ -5,2 +5,3 @@\n 5\n-6\n+six\n+seven\n"
    )
    (change,) = parse_diff(diff, "p")
    text = b"".join(b"%d\n" % i for i in range(1, 8))
    assert build(_upstream({"x": text}), [_patch("p", diff)], {}, None).files["x"].data == b"one\n2\n3\n4\n5\nsix\nseven\n7\n"
    overlapping = diff.replace(b"@@ -5,2 +5,3 @@", b"@@ -2,2 +2,3 @@")
    with pytest.raises(DancegrpoError, match="overlaps"):
        check_hunks(b"1\n2\n6\n", parse_diff(overlapping, "p")[0], "p")


def test_deleting_a_file_needs_its_whole_content():
    (change,) = parse_diff(b"--- a\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x\n-y\n", "p")
    assert change.kind == "delete"
    built = build(_upstream({"a": b"x\ny\n"}), [_patch("p", b"--- a\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x\n-y\n")], {}, None)
    assert built.files["a"] is None
    with pytest.raises(DancegrpoError, match="do not cover the whole file"):
        check_hunks(b"x\ny\nz\n", change, "p")


def test_same_file_twice_in_one_patch_is_refused():
    one = b"--- x\n+++ x\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(DancegrpoError, match="changes x twice"):
        parse_diff(one + one, "p")


def test_hunk_without_file_names_is_refused():
    with pytest.raises(DancegrpoError, match="hunk without ---/\\+\\+\\+"):
        parse_diff(b"@@ -1 +1 @@\n-a\n+b\n", "p")


@pytest.mark.parametrize("diff, files", [
    (b"--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1,2 @@\n+new\n+file\n", {"n.txt": b"new\nfile\n"}),
    (b"--- a/a\n+++ b/a\n@@ -1 +1 @@\n-x\n+y\n", {"a": b"y\n"}),
    (b"--- a/a\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n", {"a": None}),
    (b"--- /dev/null\n+++ n.txt\n@@ -0,0 +1 @@\n+new\n", {"n.txt": b"new\n"}),  # plain -p0 names
])
def test_a_plain_diff_with_gits_names_applies_as_gits(diff, files):
    """A diff without git's header lines whose names are git's a/P and b/P (git's output trimmed,
    ``diff -ruN a b``) changes P, as patch-ng reads it: a new file too."""
    built = build(_upstream({"a": b"x\n"}), [_patch("p", diff)], {}, None)
    assert {k: (v.data if v else None) for k, v in built.files.items()} == files
