"""Killing apply (or a lock-moving fetch) at any moment, then re-running any engine
command, gives the same final tree; before the journal's commit point the tree is
untouched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from synthetic_upstream import add_commit, setup, snapshot

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.lock import load_lock, save_lock
from dancegrpo_npu.engine.status import inspect
from dancegrpo_npu.engine.worktree import WorkTree, hold

TRAIN = "".join(f"line {i}\n" for i in range(1, 41))


class Killed(BaseException):
    """Stands for the process dying: not an Exception, so nothing catches it."""


def _series(s):
    return {
        "0001-train.patch": s.patch("train", {"fastvideo/train.py": TRAIN.replace("line 9\n", "line 9 npu\n")}),
        "0002-files.patch": s.patch("files", {"fastvideo/npu/dev.py": "D = 1\n", "fastvideo/utils/old.py": None, "README.md": "# NPU\n"}),
    }


OVERLAY = {"fastvideo/npu_compat.py": "X = 1\n", "fastvideo/npu/extra/more.py": "Y = 2\n"}


def _steps(make, run) -> tuple[list[str], dict]:
    """The checkpoints one uninterrupted run passes, and its final tree."""
    s = make("probe")
    seen: list[str] = []
    run(s, seen.append)
    return seen, snapshot(s.tree)


def _kill_at(step):
    def checkpoint(name):
        if name == step:
            raise Killed(name)

    return checkpoint


def _check_every_step(tmp_path, make, run, finish, status_first=True):
    """``status_first``: after a kill, run status before ``finish`` (else ``finish`` is the
    next command, and must roll the journal forward itself)."""
    steps, final = _steps(make, run)
    assert "journal written" in steps and any(x.startswith("op ") for x in steps)
    for i, step in enumerate(steps):
        s = make(f"k{i}")
        before = snapshot(s.tree)
        with pytest.raises(Killed):
            run(s, _kill_at(step))
        if steps.index(step) < steps.index("journal written"):
            assert snapshot(s.tree) == before, f"killed at {step!r} before the commit point: tree must be untouched"
        elif status_first:
            inspect(s.project)  # any engine command, even a read-only one, finishes the swap
            assert snapshot(s.tree) == final, f"killed at {step!r}, then status"
        finish(s)  # re-running the command gives the same final tree
        assert snapshot(s.tree) == final, f"killed at {step!r}"
        assert not (WorkTree(s.tree).journal_path).exists()
        assert not [p for p in WorkTree(s.tree).state_dir.iterdir() if p.name.startswith("staging-")]


def _apply(s, checkpoint):
    s.apply(checkpoint=checkpoint)


def _apply_again_exact(s):
    s.apply()
    assert s.apply().noop
    assert inspect(s.project).exact


def test_first_apply_killed_at_every_step(tmp_path):
    def make(name):
        return setup(tmp_path / name, _series, overlay=OVERLAY)

    _check_every_step(tmp_path, make, _apply, _apply_again_exact)


def test_reapply_of_changed_series_killed_at_every_step(tmp_path):
    def make(name):
        s = setup(tmp_path / name, _series, overlay=OVERLAY)
        s.apply()
        series = _series(s)
        series["0001-train.patch"] = s.patch("train", {"fastvideo/train.py": TRAIN.replace("line 30\n", "line 30 npu\n")})
        del series["0002-files.patch"]
        s.set_series(series)
        s.set_overlay({"fastvideo/npu_compat.py": "X = 2\n"})
        return s

    _check_every_step(tmp_path, make, _apply, _apply_again_exact)


def test_forced_apply_over_edits_killed_at_every_step(tmp_path):
    def make(name):
        s = setup(tmp_path / name, _series, overlay=OVERLAY)
        s.apply()
        (s.tree / "README.md").write_text("an edit of an untouched file\n")
        (s.tree / "fastvideo/npu_compat.py").write_text("X = 'edited overlay'\n")
        (s.tree / ".git/dancegrpo-npu/saved").mkdir()
        (s.tree / ".git/dancegrpo-npu/saved/.tmp-half").mkdir()  # as if a save was killed
        (s.tree / ".git/dancegrpo-npu/.applied.json.half").write_text("{")  # a killed atomic write
        return s

    def run(s, checkpoint):
        s.apply(force=True, checkpoint=checkpoint)

    def finish(s):
        s.apply(force=True)
        assert inspect(s.project).exact
        saved = sorted((s.tree / ".git/dancegrpo-npu/saved").iterdir())
        assert saved and all("an edit of an untouched file" in (d / "local-edits.patch").read_text() for d in saved)
        assert not list((s.tree / ".git/dancegrpo-npu").glob(".*.json.*"))

    _check_every_step(tmp_path, make, run, finish)


def test_lock_moving_fetch_killed_at_every_step(tmp_path):
    def make(name):
        s = setup(tmp_path / name, _series, overlay=OVERLAY)
        s.apply()
        (s.tree / "data").mkdir()
        (s.tree / "data" / "weights.bin").write_bytes(b"run data, ignored")
        new = add_commit(s.up, {"fastvideo/train.py": TRAIN + "line 41\n"})
        lock = load_lock(s.project.lock_path)
        save_lock(lock.with_commit(new.commit, {}), s.project.lock_path)
        return s

    def run(s, checkpoint):
        s.fetch(checkpoint=checkpoint)

    def finish(s):
        s.fetch()
        assert s.fetch().action == "up to date"
        assert (s.tree / "data" / "weights.bin").read_bytes() == b"run data, ignored"

    _check_every_step(tmp_path, make, run, finish)
    # fetch again right after the kill: it finishes the move and sees the tree where the
    # journal left it (not "HEAD moved by hand" from the fetched.json read before that)
    _check_every_step(tmp_path, lambda name: make(f"direct-{name}"), run, finish, status_first=False)


def test_apply_sigkilled_at_every_step(tmp_path):
    """A real SIGKILL in a child process, at each checkpoint; then the CLI finishes."""
    steps, final = _steps(lambda n: setup(tmp_path / n, _series, overlay=OVERLAY), _apply)
    src = Path(__file__).resolve().parents[2] / "src"
    for i, step in enumerate(steps):
        s = setup(tmp_path / f"kill{i}", _series, overlay=OVERLAY)
        child = textwrap.dedent(
            f"""
            import os, signal
            from dancegrpo_npu.engine.apply import apply_worktree
            from dancegrpo_npu.project import find_project
            def checkpoint(name):
                if name == {step!r}:
                    os.kill(os.getpid(), signal.SIGKILL)
            apply_worktree(find_project({os.fspath(s.project.root)!r}), checkpoint=checkpoint)
            """
        )
        env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        before = snapshot(s.tree)
        proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
        cli = [sys.executable, "-m", "dancegrpo_npu", "-C", os.fspath(s.project.root)]
        if steps.index(step) < steps.index("journal written"):
            assert snapshot(s.tree) == before, f"SIGKILL at {step!r} before the commit point"
        else:
            verify = subprocess.run(cli + ["verify"], env=env, capture_output=True)
            assert verify.returncode == 0, verify.stderr.decode()
        again = subprocess.run(cli + ["apply"], env=env, capture_output=True)
        assert again.returncode == 0, again.stderr.decode()
        assert snapshot(s.tree) == final, f"SIGKILL at {step!r}"


def test_a_second_command_waits_its_turn(tmp_path):
    s = setup(tmp_path, _series)
    with hold(WorkTree(s.tree)):
        with pytest.raises(DancegrpoError, match="another dancegrpo-npu command is working"):
            s.apply()
    s.apply()
