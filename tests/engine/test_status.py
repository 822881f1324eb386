"""status and verify: what the tree is, patch by patch and file by file."""

from __future__ import annotations

import os

from synthetic_upstream import add_commit, refused, run_git, setup

from dancegrpo_npu.cli import main
from dancegrpo_npu.engine.lock import load_lock, save_lock
from dancegrpo_npu.engine.status import inspect

TRAIN = "".join(f"line {i}\n" for i in range(1, 41))


def _series(s):
    return {
        "0001-train.patch": s.patch("make train npu-ready", {"fastvideo/train.py": TRAIN.replace("line 9\n", "line 9 npu\n")}),
        "0002-readme.patch": s.patch("say so in the readme", {"README.md": "# NPU\n"}),
    }


def _states(r):
    return {p.name: p.state for p in r.patches}


def _cli(s, *args, capsys):
    rc = main(["-C", os.fspath(s.project.root), *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_fresh_tree_is_not_applied(tmp_path, capsys):
    s = setup(tmp_path, _series, overlay={"fastvideo/npu_compat.py": "X = 1\n"})
    r = inspect(s.project)
    assert _states(r) == {"0001-train.patch": "not applied", "0002-readme.patch": "not applied"}
    assert r.overlay == "missing" and not r.exact
    assert "fastvideo/train.py (not patched)" in r.differences
    rc, out, err = _cli(s, "verify", capsys=capsys)
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert "fastvideo/train.py (not patched)" in err and "fastvideo/npu_compat.py (missing)" in err


def test_applied_tree(tmp_path, capsys):
    s = setup(tmp_path, _series, overlay={"fastvideo/npu_compat.py": "X = 1\n"})
    s.apply()
    r = inspect(s.project)
    assert _states(r) == {"0001-train.patch": "applied", "0002-readme.patch": "applied"}
    assert r.overlay == "present" and r.exact and not r.edits
    rc, out, _ = _cli(s, "status", capsys=capsys)
    assert rc == 0
    assert s.up.commit in out
    assert "applied      0001-train.patch   make train npu-ready" in out
    assert "overlay    present" in out and "local edits none" in out
    rc, out, _ = _cli(s, "verify", capsys=capsys)
    assert rc == 0 and "exactly upstream" in out


def test_drifted_patches_and_modified_overlay(tmp_path, capsys):
    s = setup(tmp_path, _series, overlay={"fastvideo/npu_compat.py": "X = 1\n", "fastvideo/npu_more.py": "Y = 1\n"})
    s.apply()
    (s.tree / "README.md").write_text("# edited\n")
    (s.tree / "fastvideo/npu_compat.py").write_text("X = 2\n")
    (s.tree / "fastvideo/npu_more.py").unlink()
    series = _series(s)
    series["0001-train.patch"] = s.patch("other change", {"fastvideo/train.py": TRAIN.replace("line 30\n", "line 30 npu\n")})
    s.set_series(series)
    r = inspect(s.project)
    states = {p.name: (p.state, p.detail) for p in r.patches}
    assert states["0001-train.patch"] == ("drifted", "the patch changed since it was applied")
    assert states["0002-readme.patch"] == ("drifted", "edited since: README.md")
    assert r.overlay == "modified"
    assert set(r.overlay_detail) == {"fastvideo/npu_compat.py (modified)", "fastvideo/npu_more.py (missing)"}
    assert {str(e) for e in r.edits} == {"README.md (modified)", "fastvideo/npu_compat.py (modified)", "fastvideo/npu_more.py (deleted)"}
    rc, out, _ = _cli(s, "status", capsys=capsys)
    assert "modified     README.md" in out and "deleted      fastvideo/npu_more.py" in out
    assert "NOT exactly" in out


def test_dropped_patch_and_untracked(tmp_path, capsys):
    s = setup(tmp_path, _series)
    s.apply()
    s.set_series({"0001-train.patch": _series(s)["0001-train.patch"]})
    (s.tree / "notes.txt").write_text("mine\n")
    r = inspect(s.project)
    assert r.dropped == ("0002-readme.patch",)
    assert r.untracked == ("notes.txt",)
    assert "README.md (modified)" in r.differences and "notes.txt (untracked)" in r.differences
    rc, out, _ = _cli(s, "status", capsys=capsys)
    assert "dropped" in out and "notes.txt" in out


def test_verify_fails_on_an_edit_of_an_untouched_file(tmp_path, capsys):
    s = setup(tmp_path, _series)
    s.apply()
    with open(s.tree / "fastvideo/utils/load.py", "a") as f:
        f.write("# edit\n")
    rc, _, err = _cli(s, "verify", capsys=capsys)
    assert rc == 1 and "fastvideo/utils/load.py (modified)" in err
    os.chmod(s.tree / "scripts/run.sh", 0o644)
    (s.tree / "fastvideo/utils/load.py").write_text(s.up.blob("fastvideo/utils/load.py").decode())
    rc, _, err = _cli(s, "verify", capsys=capsys)
    assert rc == 1 and "scripts/run.sh (modified)" in err


def test_verify_does_not_trust_applied_json(tmp_path):
    s = setup(tmp_path, _series)
    s.apply()
    (s.tree / "fastvideo/train.py").write_text(TRAIN)  # reverted by hand
    (s.tree / ".git/dancegrpo-npu/applied.json").unlink()
    r = inspect(s.project)
    assert "fastvideo/train.py (not patched)" in r.differences


def test_verify_at_another_commit(tmp_path, capsys):
    s = setup(tmp_path, _series)
    new = add_commit(s.up, {"NEW.md": "x\n"})
    lock = load_lock(s.project.lock_path)
    save_lock(lock.with_commit(new.commit, lock.files), s.project.lock_path)
    rc, _, err = _cli(s, "verify", capsys=capsys)
    assert rc == 1 and "run `dancegrpo-npu fetch`" in err and err.count("\n") == 1
    rc, out, _ = _cli(s, "status", capsys=capsys)
    assert rc == 0 and "problem" in out


def test_series_that_does_not_apply_is_reported(tmp_path, capsys):
    s = setup(tmp_path)
    bad = s.patch("bad", {"README.md": "# x\n"}).decode().replace("-A tiny", "-A huge")
    s.set_series({"0001-bad.patch": bad.encode()})
    r = inspect(s.project)
    assert r.problem and "0001-bad.patch" in r.problem and not r.exact
    rc, _, err = _cli(s, "verify", capsys=capsys)
    assert rc == 1 and "hunk #1" in err


def test_status_without_work_tree(tmp_path, capsys):
    s = setup(tmp_path, fetch=False)
    for verb in ("status", "verify", "apply", "lock"):
        rc, out, err = _cli(s, verb, capsys=capsys)
        assert rc == 1 and "run `dancegrpo-npu fetch` first" in err and "Traceback" not in err, verb
        assert err.count("\n") == 1
    refused(inspect, "no upstream work tree", s.project)


def test_status_rolls_an_interrupted_apply_forward(tmp_path):
    import pytest

    s = setup(tmp_path, _series)

    class Killed(BaseException):
        pass

    def kill(step):
        if step.startswith("op 0"):
            raise Killed

    with pytest.raises(Killed):
        s.apply(checkpoint=kill)
    assert inspect(s.project).exact
    assert run_git(s.tree, "rev-parse", "HEAD").decode().strip() == s.up.commit


def test_todo_description_is_a_warning_in_status(tmp_path, capsys):
    from synthetic_upstream import dep3

    s = setup(tmp_path, _series)
    series = _series(s)
    series["0003-stub.patch"] = dep3("TODO: say in one line what this patch changes", s.diff({"scripts/run.sh": "#!/bin/sh\necho npu\n"}))
    s.set_series(series)
    s.apply()  # a TODO does not stop apply
    r = inspect(s.project)
    assert r.exact and "0003-stub.patch" in r.todo and "0001" not in r.todo
    rc, out, _ = _cli(s, "status", capsys=capsys)
    assert rc == 0
    line = next(l for l in out.splitlines() if "0003-stub.patch" in l)
    assert line.lstrip().startswith("applied") and line.endswith("[TODO: write its Description:]")
    assert "warning: 1 patch(es) still have a TODO Description: 0003-stub.patch" in out
    assert "verdict    exactly lock + series + overlay" in out
    s.set_series(_series(s))
    assert inspect(s.project).todo is None
