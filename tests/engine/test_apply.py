"""apply: exact, atomic, path-checked application of the series and the overlay."""

from __future__ import annotations

import os
import subprocess

import pytest
from synthetic_upstream import dep3, setup, snapshot

from dancegrpo_npu.engine.apply import apply_series_to_dir
from dancegrpo_npu.engine.stage import touched_files
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.series import load_series
from dancegrpo_npu.engine.status import inspect

TRAIN = "".join(f"line {i}\n" for i in range(1, 41))


def _basic(s):
    return {
        "0001-train.patch": s.patch("change train", {"fastvideo/train.py": TRAIN.replace("line 20\n", "line 20 npu\n")}),
        "0002-new-and-gone.patch": s.patch(
            "add a module, drop an old one",
            {"fastvideo/npu/device.py": "DEVICE = 'npu'\n", "fastvideo/utils/old.py": None},
        ),
    }


def test_apply_series_and_overlay(tmp_path):
    s = setup(tmp_path, _basic, overlay={"fastvideo/npu_compat.py": "X = 1\n", "bin/tool.sh": "#!/bin/sh\n"})
    os.chmod(s.project.overlay_dir / "bin/tool.sh", 0o755)
    out = s.apply()
    assert not out.noop and out.patches == 2 and out.overlay == 2
    assert (s.tree / "fastvideo/train.py").read_text() == TRAIN.replace("line 20\n", "line 20 npu\n")
    assert (s.tree / "fastvideo/npu/device.py").read_text() == "DEVICE = 'npu'\n"
    assert not (s.tree / "fastvideo/utils/old.py").exists()
    assert (s.tree / "fastvideo/npu_compat.py").read_text() == "X = 1\n"
    assert os.stat(s.tree / "bin/tool.sh").st_mode & 0o111
    assert os.stat(s.tree / "scripts/run.sh").st_mode & 0o111  # untouched upstream mode kept
    assert inspect(s.project).exact


def test_reapply_is_a_noop(tmp_path):
    s = setup(tmp_path, _basic, overlay={"fastvideo/npu_compat.py": "X = 1\n"})
    s.apply()
    before = snapshot(s.tree)
    mtimes = {p: os.stat(s.tree / p).st_mtime_ns for p in before}
    out = s.apply()
    assert out.noop and out.changed == ()
    assert snapshot(s.tree) == before
    assert {p: os.stat(s.tree / p).st_mtime_ns for p in before} == mtimes


def test_empty_series_and_overlay(tmp_path):
    s = setup(tmp_path)
    before = snapshot(s.tree)
    out = s.apply()
    assert not out.noop and out.changed == ()
    assert snapshot(s.tree) == before
    assert s.apply().noop


def _assert_refused(s, match):
    before = snapshot(s.tree)
    with pytest.raises(DancegrpoError, match=match) as e:
        s.apply()
    assert snapshot(s.tree) == before, "a failed apply must leave the work tree byte-identical"
    assert not any(p.name.startswith("staging-") for p in (s.tree / ".git/dancegrpo-npu").iterdir())
    return e.value


def test_moved_hunk_is_refused_naming_patch_file_and_hunk(tmp_path):
    s = setup(tmp_path)
    # the same change, but stated 5 lines further down (as if written for a longer file)
    moved = s.patch("moved", {"fastvideo/train.py": TRAIN.replace("line 30\n", "line 30 npu\n")}).decode()
    assert "@@ -27,7 +27,7 @@" in moved
    moved = moved.replace("@@ -27,7 +27,7 @@", "@@ -32,7 +32,7 @@")
    s.set_series({"0001-moved.patch": moved.encode()})
    text = _assert_refused(s, "0001-moved.patch").one_line()
    assert "does not apply to fastvideo/train.py" in text
    assert "hunk #1 (@@ -32,7 +32,7 @@" in text
    assert "fix its hunk in patches/0001-moved.patch" in text and "rebase" not in text  # rebase moves a series that fits


def test_fuzzed_context_is_refused(tmp_path):
    s = setup(tmp_path)
    p = s.patch("fuzzy", {"fastvideo/train.py": TRAIN.replace("line 20\n", "line 20 npu\n")}).decode()
    p = p.replace(" line 18\n", " line eighteen\n")
    s.set_series({"0001-fuzzy.patch": p.encode()})
    err = _assert_refused(s, "does not apply")
    assert "line 18 of fastvideo/train.py is 'line 18', the patch expects 'line eighteen'" in err.one_line()


def test_second_patch_failing_leaves_tree_untouched(tmp_path):
    """patch-ng is not atomic across files or patches; the engine is."""
    s = setup(tmp_path)
    good = s.patch("good", {"README.md": "# Changed\n", "fastvideo/new.py": "x = 1\n", "fastvideo/utils/old.py": None})
    bad = s.patch("bad", {"fastvideo/train.py": TRAIN.replace("line 3\n", "line 3!\n")}).decode().replace(" line 1\n", " line one\n")
    s.set_series({"0001-good.patch": good, "0002-bad.patch": bad.encode()})
    _assert_refused(s, "0002-bad.patch")
    assert not (s.tree / "fastvideo/new.py").exists()


def test_already_applied_patch_is_reported(tmp_path):
    s = setup(tmp_path)
    p = s.patch("twice", {"README.md": "# Changed\n"})
    s.set_series({"0001-a.patch": p, "0002-b.patch": p})
    err = _assert_refused(s, "0002-b.patch")
    assert "already applied" in err.one_line()


def test_already_applied_new_and_deleted_files(tmp_path):
    s = setup(tmp_path)
    new = s.patch("new", {"fastvideo/new.py": "x = 1\n"})
    gone = s.patch("gone", {"fastvideo/utils/old.py": None})
    s.set_series({"0001-new.patch": new, "0002-new-again.patch": new})
    assert "already applied" in _assert_refused(s, "0002-new-again").one_line()
    s.set_series({"0001-gone.patch": gone, "0002-gone-again.patch": gone})
    assert "already applied" in _assert_refused(s, "0002-gone-again").one_line()


def test_new_file_over_existing_is_refused(tmp_path):
    s = setup(tmp_path)
    p = s.patch("new", {"fastvideo/new.py": "x = 1\n"}).decode().replace("fastvideo/new.py", "README.md")
    s.set_series({"0001-clobber.patch": p.encode()})
    assert "creates README.md, which already exists" in _assert_refused(s, "0001-clobber").one_line()


@pytest.mark.parametrize(
    "old,new,why",
    [
        ("a/README.md", "b/../outside.txt", "'..'"),
        ("a/README.md", "b//etc/passwd", "empty"),
        ("/etc/passwd", "/etc/passwd", "absolute"),
        ("a/README.md", "b/.git/config", ".git"),
    ],
)
def test_unsafe_paths_are_refused_before_anything_is_written(tmp_path, old, new, why):
    s = setup(tmp_path)
    p = s.patch("readme", {"README.md": "# Changed\n"}).decode()
    p = p.replace("--- a/README.md", f"--- {old}").replace("+++ b/README.md", f"+++ {new}")
    if old.startswith("/"):
        p = p.replace("diff --git a/README.md b/README.md\n", "")
    s.set_series({"0001-unsafe.patch": p.encode()})
    (tmp_path / "outside.txt").write_text("precious\n")
    assert why in _assert_refused(s, "0001-unsafe").one_line()
    assert (tmp_path / "outside.txt").read_text() == "precious\n"


def test_dotdot_plain_patch_is_refused(tmp_path):
    s = setup(tmp_path)
    p = b"Description: escape\n---\n--- ../x.txt\n+++ ../x.txt\n@@ -0,0 +1 @@\n+evil\n"
    s.set_series({"0001-escape.patch": p}, refresh_lock=False)
    assert "'..'" in _assert_refused(s, "0001-escape").one_line()
    assert not (s.tree.parent / "x.txt").exists()


def test_symlink_leaving_the_tree_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("safe\n")
    files = {"README.md": "hi\n", "lib/real.py": "a = 1\n"}
    s = setup(tmp_path, files=files, symlinks={"escape": "../../outside", "inside": "lib"})
    p = b"Description: through a symlink\n---\n--- escape/victim.py\n+++ escape/victim.py\n@@ -1 +1 @@\n-safe\n+pwned\n"
    s.set_series({"0001-escape.patch": p}, refresh_lock=False)
    assert "leaves the tree" in _assert_refused(s, "0001-escape").one_line()
    assert (outside / "victim.py").read_text() == "safe\n"
    p = b"Description: inside symlink\n---\n--- inside/real.py\n+++ inside/real.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
    s.set_series({"0001-inside.patch": p}, refresh_lock=False)
    assert "write it against the real path lib/real.py" in _assert_refused(s, "0001-inside").one_line()
    s.set_series({}, refresh_lock=False)
    s.set_overlay({"escape/new.py": "x\n"})
    assert "leaves the tree" in _assert_refused(s, "overlay").one_line()


def test_crlf_target_with_lf_patch_is_refused_clearly(tmp_path):
    s = setup(tmp_path, files={"win.txt": "a\r\nb\r\nc\r\n"})
    p = b"Description: lf patch\n---\n--- a/win.txt\n+++ b/win.txt\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
    p = p.replace(b"---\n--- a/", b"---\ndiff --git a/win.txt b/win.txt\n--- a/")
    s.set_series({"0001-lf.patch": p})
    assert "line endings differ at line 1: win.txt has CRLF, the patch LF" in _assert_refused(s, "0001-lf").one_line()


def test_crlf_patch_for_crlf_file_applies_exactly(tmp_path):
    s = setup(tmp_path, files={"win.txt": "a\r\nb\r\nc\r\n", "unix.txt": "x\n"})
    s.set_series({"0001-crlf.patch": s.patch("crlf", {"win.txt": "a\r\nB\r\nc\r\nd\r\n"})})
    s.apply()
    assert (s.tree / "win.txt").read_bytes() == b"a\r\nB\r\nc\r\nd\r\n"


def test_crlf_patch_for_lf_file_is_refused(tmp_path):
    s = setup(tmp_path)
    p = s.patch("dos", {"README.md": "# Changed\n"}).replace(b"\n", b"\r\n")
    s.set_series({"0001-dos.patch": p})
    assert "the patch CRLF" in _assert_refused(s, "0001-dos").one_line()


def test_binary_patch_is_refused(tmp_path):
    s = setup(tmp_path, files={"img.bin": b"\x00\x01\x02", "README.md": "x\n"})
    p = s.diff({"img.bin": b"\x00\x01\x03\x04"})
    assert b"Binary files" in p
    s.set_series({"0001-bin.patch": dep3("binary", p)}, refresh_lock=False)
    assert "binary change is not supported" in _assert_refused(s, "0001-bin").one_line()
    (s.up.path / "img.bin").write_bytes(b"\x00\x09")
    gitbin = subprocess.run(["git", "-C", os.fspath(s.up.path), "diff", "--binary"], capture_output=True).stdout
    assert b"GIT binary patch" in gitbin
    s.set_series({"0001-bin.patch": dep3("binary", gitbin)}, refresh_lock=False)
    assert "binary patch is not supported" in _assert_refused(s, "0001-bin").one_line()


def test_rename_and_a_section_saying_nothing_are_refused(tmp_path):
    """Mode changes and empty new files are applied (tests/engine/test_modes.py); a rename,
    and a git section with neither hunks nor mode lines, are refused naming the patch."""
    s = setup(tmp_path)
    rename = b"diff --git a/README.md b/DOC.md\nsimilarity index 100%\nrename from README.md\nrename to DOC.md\n"
    nothing = b"diff --git a/README.md b/README.md\nindex 1111111..2222222\n"
    half = b"diff --git a/README.md b/README.md\nold mode 100644\n"
    for diff, what in ((rename, "a rename"), (nothing, "has no hunks and no mode line"), (half, "without the other")):
        s.set_series({"0001-x.patch": dep3("x", diff)}, refresh_lock=False)
        assert what in _assert_refused(s, "0001-x").one_line()


def test_missing_final_newline_is_kept_exactly(tmp_path):
    s = setup(tmp_path, files={"nonl.txt": "a\nb", "nl.txt": "x\ny\n", "empty.py": ""})
    s.set_series(
        {
            "0001-nonl.patch": s.patch(
                "newlines",
                {"nonl.txt": "a\nB", "nl.txt": "x\ny", "fresh.txt": "no newline", "empty.py": "import os\n"},
            )
        }
    )
    s.apply()
    assert (s.tree / "nonl.txt").read_bytes() == b"a\nB"
    assert (s.tree / "nl.txt").read_bytes() == b"x\ny"
    assert (s.tree / "fresh.txt").read_bytes() == b"no newline"
    assert (s.tree / "empty.py").read_bytes() == b"import os\n"
    assert inspect(s.project).exact


def test_file_without_final_newline_gains_one(tmp_path):
    s = setup(tmp_path, files={"nonl.txt": "a\nb"})
    s.set_series({"0001.patch": s.patch("add newline", {"nonl.txt": "a\nb\nc\n"})})
    s.apply()
    assert (s.tree / "nonl.txt").read_bytes() == b"a\nb\nc\n"


def test_zero_context_hunk_is_refused(tmp_path):
    s = setup(tmp_path)
    s.set_series({"0001-u0.patch": s.patch("u0", {"fastvideo/train.py": TRAIN.replace("line 5\n", "line 5\nnew\n")}, context=0)})
    assert "no context lines" in _assert_refused(s, "0001-u0").one_line()


def test_malformed_hunk_and_quoted_path(tmp_path):
    s = setup(tmp_path)
    p = s.patch("readme", {"README.md": "# Changed\n"}).decode().replace("@@ -1,3 +1 @@", "@@ -1,4 +1 @@")
    assert "@@ -1,4 +1 @@" in p
    s.set_series({"0001-bad.patch": p.encode()})
    assert "malformed" in _assert_refused(s, "0001-bad").one_line()
    q = b'Description: q\n---\ndiff --git "a/sp ace" "b/sp ace"\n--- "a/sp\\tace"\n+++ "b/sp\\tace"\n@@ -0,0 +1 @@\n+x\n'
    s.set_series({"0001-q.patch": q}, refresh_lock=False)
    assert "quoted file name" in _assert_refused(s, "0001-q").one_line()


def test_overlay_only_adds(tmp_path):
    s = setup(tmp_path, overlay={"README.md": "mine\n"})
    assert "overlay/README.md exists in upstream" in _assert_refused(s, "README.md").one_line()
    s.set_overlay({"fastvideo/utils": "a file where upstream has a directory\n"})
    assert "exists in upstream" in _assert_refused(s, "utils").one_line()
    s.set_overlay({"README.md/inner.py": "x\n"})
    assert "README.md is a file" in _assert_refused(s, "inner").one_line()
    s.set_overlay({"fastvideo/new.py": "x\n"})
    s.set_series({"0001-new.patch": s.patch("new", {"fastvideo/new.py": "y\n"})})
    assert "also created by a patch" in _assert_refused(s, "new.py").one_line()


def test_patch_touching_file_missing_from_lock(tmp_path):
    s = setup(tmp_path)
    s.set_series({"0001.patch": s.patch("readme", {"README.md": "# Changed\n"})}, refresh_lock=False)
    assert "upstream.lock does not record" in _assert_refused(s, "README.md").one_line()


def test_lock_hash_mismatch_is_refused(tmp_path):
    from dancegrpo_npu.engine.lock import load_lock, save_lock

    s = setup(tmp_path, _basic)
    lock = load_lock(s.project.lock_path)
    save_lock(lock.with_files({**lock.files, "fastvideo/train.py": "0" * 64}), s.project.lock_path)
    assert "upstream file fastvideo/train.py has sha256" in _assert_refused(s, "train").one_line()


def test_series_touching_assets_needs_with_assets(tmp_path):
    s = setup(tmp_path)
    s.set_series({"0001.patch": s.patch("prompts", {"assets/prompts.txt": "a bird\n"})})
    assert "--with-assets" in _assert_refused(s, "assets").one_line()


def test_series_change_restores_what_it_no_longer_touches(tmp_path):
    s = setup(tmp_path, _basic, overlay={"fastvideo/extra/deep/mod.py": "X = 1\n"})
    s.apply()
    s.set_series({})
    s.set_overlay({})
    s.apply()
    assert (s.tree / "fastvideo/train.py").read_text() == TRAIN
    assert (s.tree / "fastvideo/utils/old.py").exists()
    assert not (s.tree / "fastvideo/npu").exists()
    assert not (s.tree / "fastvideo/extra").exists()
    assert inspect(s.project).exact


def test_touched_files():
    from dancegrpo_npu.engine.series import Patch

    diff = (
        b"diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
        b"diff --git a/n.py b/n.py\nnew file mode 100644\n--- /dev/null\n+++ b/n.py\n@@ -0,0 +1 @@\n+n\n"
        b"diff --git a/d.py b/d.py\ndeleted file mode 100644\n--- a/d.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-d\n"
    )
    patch = Patch("p", None, {"Description": "x"}, "Description: x\n", diff)
    assert touched_files(patch) == ["x.py", "n.py", "d.py"]


def test_apply_series_to_dir(tmp_path):
    s = setup(tmp_path, _basic, fetch=False)
    scratch = tmp_path / "scratch"
    subprocess.run(["git", "clone", "-q", os.fspath(s.up.path), os.fspath(scratch)], check=True)
    (tmp_path / "ov" / "fastvideo").mkdir(parents=True)
    (tmp_path / "ov" / "fastvideo" / "npu_compat.py").write_text("X = 1\n")
    patches = load_series(s.project.patches_dir)
    apply_series_to_dir(scratch, patches, tmp_path / "ov")
    assert "line 20 npu" in (scratch / "fastvideo/train.py").read_text()
    assert not (scratch / "fastvideo/utils/old.py").exists()
    assert (scratch / "fastvideo/npu_compat.py").exists()
    before = snapshot(scratch)
    with pytest.raises(DancegrpoError, match="already applied"):
        apply_series_to_dir(scratch, patches, None)
    assert snapshot(scratch) == before
    with pytest.raises(DancegrpoError, match="exists in upstream"):
        apply_series_to_dir(tmp_path / "ov", [], tmp_path / "ov", upstream_paths={"fastvideo/npu_compat.py"})


def test_overlay_symlink_is_refused(tmp_path):
    s = setup(tmp_path)
    s.set_overlay({"fastvideo/real.py": "x\n"})
    os.symlink("real.py", s.project.overlay_dir / "fastvideo/link.py")
    assert "is not a regular file" in _assert_refused(s, "overlay").one_line()


def test_git_format_patch_output_applies(tmp_path):
    """What `git format-patch` writes (mail header, diffstat, signature) is a valid patch."""
    s = setup(tmp_path, fetch=False)
    # an identity of its own: the test must not depend on the user's git configuration
    git = ["git", "-c", "user.name=Dev", "-c", "user.email=dev@example.invalid", "-C", os.fspath(s.up.path)]
    run = lambda *a: subprocess.run([*git, *a], check=True, capture_output=True).stdout
    (s.up.path / "README.md").write_text("# Changed upstream-style\n")
    run("commit", "-qam", "Say it differently", "--author", "Dev <dev@example.invalid>")
    mail = run("format-patch", "-1", "--stdout", "HEAD")
    run("reset", "-q", "--hard", "HEAD~1")
    assert mail.startswith(b"From ") and b"\n-- \n" in mail
    s.set_series({"0001-format-patch.patch": mail})
    s.fetch()
    s.apply()
    assert (s.tree / "README.md").read_text() == "# Changed upstream-style\n"
    assert inspect(s.project).patches[0].description == "[PATCH] Say it differently"
