"""Local edits: apply refuses and names them; --force saves them first; none is lost."""

from __future__ import annotations

import os
import shutil
import subprocess

from synthetic_upstream import refused, run_git, setup, snapshot

from dancegrpo_npu.engine.status import inspect

TRAIN = "".join(f"line {i}\n" for i in range(1, 41))
OVERLAY = {"fastvideo/npu_compat.py": "X = 1\n"}


def _series(s):
    return {
        "0001-train.patch": s.patch("train", {"fastvideo/train.py": TRAIN.replace("line 9\n", "line 9 npu\n")}),
        "0002-gone.patch": s.patch("gone", {"fastvideo/utils/old.py": None}),
    }


def _applied(tmp_path):
    s = setup(tmp_path, _series, overlay=OVERLAY)
    s.apply()
    return s


def _edit(s):
    with open(s.tree / "fastvideo/train.py", "a") as f:
        f.write("patched-file edit\n")
    (s.tree / "README.md").write_text("edited an untouched upstream file\n")
    (s.tree / "fastvideo/npu_compat.py").write_text("X = 2  # overlay edit\n")
    (s.tree / "fastvideo/utils/load.py").unlink()
    (s.tree / "fastvideo/utils/old.py").write_text("re-created a deleted file\n")
    os.chmod(s.tree / "scripts/run.sh", 0o644)


EXPECTED = {
    "fastvideo/train.py (modified)",
    "README.md (modified)",
    "fastvideo/npu_compat.py (modified)",
    "fastvideo/utils/load.py (deleted)",
    "fastvideo/utils/old.py (added)",
    "scripts/run.sh (mode changed)",
}


def test_apply_refuses_and_names_every_edit(tmp_path):
    s = _applied(tmp_path)
    _edit(s)
    before = snapshot(s.tree)
    text = refused(s.apply, "local edits in .* that apply would overwrite")
    for item in EXPECTED:
        assert item in text
    assert "apply --force" in text
    assert snapshot(s.tree) == before
    # also when the series changed (not only on a no-op re-apply)
    s.set_series({"0001-train.patch": _series(s)["0001-train.patch"]})
    refused(s.apply, "fastvideo/train.py \\(modified\\)")
    assert snapshot(s.tree) == before


def test_force_saves_edits_then_reapplies(tmp_path):
    s = _applied(tmp_path)
    exact = snapshot(s.tree)
    _edit(s)
    edited = snapshot(s.tree)
    out = s.apply(force=True)
    assert out.saved is not None and out.saved.is_dir()
    assert out.saved.parent == s.tree / ".git/dancegrpo-npu/saved"
    assert snapshot(s.tree) == exact
    assert inspect(s.project).exact
    patch = out.saved / "local-edits.patch"
    text = patch.read_text()
    for item in EXPECTED:
        assert item in text
    assert (out.saved / "files/fastvideo/train.py").read_text().endswith("patched-file edit\n")
    # the saved patch restores every edit, byte for byte (git apply on the re-applied tree)
    run_git(s.tree, "apply", os.fspath(patch))
    assert snapshot(s.tree) == edited


def test_untracked_files_do_not_block_and_are_left_alone(tmp_path):
    s = _applied(tmp_path)
    (s.tree / "scratch.txt").write_text("mine\n")
    (s.tree / "fastvideo/experiment.py").write_text("mine too\n")
    (s.tree / "data").mkdir()
    (s.tree / "data/big.bin").write_bytes(b"ignored")
    out = s.apply()
    assert out.noop and set(out.untracked) == {"scratch.txt", "fastvideo/experiment.py"}
    s.set_series({})
    out = s.apply()
    assert not out.noop
    assert (s.tree / "scratch.txt").read_text() == "mine\n"
    assert (s.tree / "data/big.bin").read_bytes() == b"ignored"
    r = inspect(s.project)
    assert not r.exact and set(r.untracked) == {"scratch.txt", "fastvideo/experiment.py"}


def test_untracked_file_in_the_way_blocks_and_is_saved(tmp_path):
    s = setup(tmp_path, _series, overlay=OVERLAY)
    (s.tree / "fastvideo/npu_compat.py").write_text("my own file at the overlay's path\n")
    refused(s.apply, r"fastvideo/npu_compat.py \(in the way\)")
    out = s.apply(force=True)
    assert (out.saved / "files/fastvideo/npu_compat.py").read_text() == "my own file at the overlay's path\n"
    assert (s.tree / "fastvideo/npu_compat.py").read_text() == "X = 1\n"


def test_ignored_file_in_the_way_is_not_silently_overwritten(tmp_path):
    s = setup(tmp_path, fetch=False)
    s.set_overlay({"data/npu_defaults.json": "{}\n"})  # a path fetch's info/exclude ignores
    s.fetch()
    (s.tree / "data").mkdir()
    (s.tree / "data/npu_defaults.json").write_text("user's data\n")
    refused(s.apply, r"data/npu_defaults.json \(in the way\)")


def test_file_replaced_by_directory_and_symlink(tmp_path):
    s = _applied(tmp_path)
    exact = snapshot(s.tree)
    (s.tree / "README.md").unlink()
    (s.tree / "README.md").mkdir()
    (s.tree / "README.md/inside.txt").write_text("x\n")
    (s.tree / "fastvideo/train.py").unlink()
    os.symlink("/etc/hostname", s.tree / "fastvideo/train.py")
    text = refused(s.apply, "local edits")
    assert "README.md (deleted)" in text or "README.md (replaced by a directory)" in text
    assert "fastvideo/train.py (replaced by a symlink)" in text
    out = s.apply(force=True)
    assert snapshot(s.tree) == exact
    assert (out.saved / "files/README.md/inside.txt").exists()


def test_edits_after_force_are_saved_again_separately(tmp_path):
    s = _applied(tmp_path)
    (s.tree / "README.md").write_text("one\n")
    first = s.apply(force=True).saved
    (s.tree / "README.md").write_text("two\n")
    second = s.apply(force=True).saved
    assert first != second and first.exists() and second.exists()
    shutil.rmtree(first)  # the user may clean up; the second set is intact
    assert "+two" in (second / "local-edits.patch").read_text()


def test_cli_force_prints_where_edits_went(tmp_path, capsys):
    from dancegrpo_npu.cli import main

    s = _applied(tmp_path)
    (s.tree / "README.md").write_text("edit\n")
    assert main(["-C", os.fspath(s.project.root), "apply"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "README.md (modified)" in err and "Traceback" not in err
    assert main(["-C", os.fspath(s.project.root), "apply", "--force"]) == 0
    out = capsys.readouterr().out
    assert "saved local edits to" in out and "local-edits.patch" in out
    assert subprocess.run(["git", "-C", os.fspath(s.tree), "status", "--porcelain"], capture_output=True).returncode == 0


def test_files_upstream_gitignore_ignores_never_block(tmp_path):
    files = {".gitignore": "*.log\noutputs_local/\n", "README.md": "x\n", "a.py": "A = 1\n"}
    s = setup(tmp_path, files=files)
    s.set_series({"0001.patch": s.patch("a", {"a.py": "A = 2\n"})})
    (s.tree / "train.log").write_text("log\n")
    (s.tree / "outputs_local").mkdir()
    (s.tree / "outputs_local/ckpt.pt").write_bytes(b"x")
    s.apply()
    assert s.apply().noop
    assert inspect(s.project).exact
    assert (s.tree / "train.log").read_text() == "log\n"


def _edit_then_put_in_series(s):
    """The user edits train.py and creates new.py by hand, then the series is changed to
    make exactly those files (what `dancegrpo-npu export` does)."""
    edited = TRAIN.replace("line 9\n", "line 9 npu\n").replace("line 30\n", "line 30 hand fix\n")
    (s.tree / "fastvideo/train.py").write_text(edited)
    (s.tree / "fastvideo/new.py").write_text("NEW = 1\n")
    series = _series(s)
    series["0003-hand.patch"] = s.patch("hand", {"fastvideo/train.py": edited, "fastvideo/new.py": "NEW = 1\n"})
    series["0001-train.patch"] = s.patch("train", {"fastvideo/utils/load.py": "changed\n"})  # train.py now only in 0003
    s.set_series(series)
    return edited


def test_file_already_as_apply_would_write_it_is_no_edit(tmp_path):
    s = _applied(tmp_path)
    edited = _edit_then_put_in_series(s)
    r = inspect(s.project)
    assert not [e for e in r.edits if e.blocking]  # status: no local edits, only patches to apply
    out = s.apply()  # no --force needed, and nothing saved
    assert out.saved is None and not (s.tree / ".git/dancegrpo-npu/saved").exists()
    assert set(out.changed) == {"fastvideo/utils/load.py"}  # the rest was already so
    assert (s.tree / "fastvideo/train.py").read_text() == edited
    assert inspect(s.project).exact and s.apply().noop


def test_genuine_edits_are_still_refused_and_saved_beside_ones_that_match(tmp_path):
    s = _applied(tmp_path)
    _edit_then_put_in_series(s)
    (s.tree / "README.md").write_text("a genuine edit\n")
    (s.tree / "fastvideo/utils/load.py").write_text("not what the new 0001 writes\n")
    text = refused(s.apply, "local edits")
    assert "README.md (modified)" in text and "fastvideo/utils/load.py (modified)" in text
    assert "train.py" not in text and "new.py" not in text
    blocking = {e.path for e in inspect(s.project).edits if e.blocking}
    assert blocking == {"README.md", "fastvideo/utils/load.py"}
    out = s.apply(force=True)
    saved = out.saved / "local-edits.patch"
    assert "a genuine edit" in saved.read_text() and "not what the new 0001" in saved.read_text()
    assert not (out.saved / "files/fastvideo/train.py").exists()  # nothing to save: the series makes it
    assert inspect(s.project).exact
