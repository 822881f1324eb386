"""Every hint of the engine's and launch's refusals names a command that does the next step.

Each case brings a synthetic project into a state the engine refuses, runs the refused
command, takes the commands its hint names (`dancegrpo-npu ...`, `git ...`), does first what
the hint asks to do by hand (``by_hand``), runs the first named command, and checks that it
does not fail the same way: a hint naming a command that refuses with the same message (as
`rebase` answering "nothing to do", or `apply` failing on the lock it was sent to fix) fails.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from typing import Callable

import pytest
from synthetic_upstream import add_commit, run_git, setup

from dancegrpo_npu.cli import main
from dancegrpo_npu.engine.lock import Lock, load_lock, save_lock
from dancegrpo_npu.errors import DancegrpoError

TRAIN = "".join(f"line {i}\n" for i in range(1, 41))
TRAINER = "fastvideo/train_grpo_flux.py"  # what launch runs (its tree check)
FILES = {"README.md": "# Upstream\n", "fastvideo/train.py": TRAIN, TRAINER: "print('train')\n"}
PLACEHOLDERS = {"NAME": "remade", "REF": "main"}


def _patched(s):
    return {"0001-train.patch": s.patch("train", {"fastvideo/train.py": TRAIN.replace("line 5\n", "line five\n")})}


@dataclass
class Case:
    make: Callable  # (setup) -> None: the state that is refused
    argv: list[str]  # the refused command (None: launch's tree check, as launch calls it)
    by_hand: Callable | None = None  # (setup) -> None: what the hint says to do before its command
    goal: Callable | None = None  # (setup) -> bool: what the user was after, reached by the hint


def _edit_patch(s):
    p = s.project.patches_dir / "0001-train.patch"
    p.write_text(p.read_text().replace(" line 4\n", " line four\n"))


def _drop_from_series(s):
    (s.project.patches_dir / "series").write_text("")


def _lock_moved_by_hand(s):
    s.old_commit = s.up.commit
    new = add_commit(s.up, {"fastvideo/train.py": TRAIN.replace("line 7\n", "line 7 upstream\n")})
    s.up_commit_now = new.commit
    lock = load_lock(s.project.lock_path)
    save_lock(Lock(lock.url, new.commit, lock.files), s.project.lock_path)


def _series_moved(s) -> bool:
    return load_lock(s.project.lock_path).commit == s.up_commit_now


def _lock_back(s):
    lock = load_lock(s.project.lock_path)
    save_lock(Lock(lock.url, s.old_commit, lock.files), s.project.lock_path)


def _applied_twice(s):
    # a second patch makes the change the first one already made (as when upstream takes a patch)
    patches = s.project.patches_dir
    (patches / "0002-train-again.patch").write_bytes((patches / "0001-train.patch").read_bytes())
    (patches / "series").write_text("0001-train.patch\n0002-train-again.patch\n")


def _drop_second(s):
    (s.project.patches_dir / "series").write_text("0001-train.patch\n")


def _broken_lock(s):
    root = s.project.root
    run_git(root, "init", "-q")
    run_git(root, "add", "upstream.lock")
    run_git(root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "lock")
    s.project.lock_path.write_text("[upstream\n")


def _edit_tree(s):
    (s.tree / "fastvideo" / "train.py").write_text("edited\n")


def _stale_files(s):
    lock = load_lock(s.project.lock_path)
    save_lock(lock.with_files({k: "0" * 64 for k in lock.files}), s.project.lock_path)


def _unrecorded(s):
    s.set_series({"0001-readme.patch": s.patch("readme", {"README.md": "# Patched\n"})}, refresh_lock=False)


def _no_tree(s):
    import shutil

    shutil.rmtree(s.tree)


CASES = {
    "a patch edited by hand: apply": Case(_edit_patch, ["apply"], _drop_from_series),
    "a patch edited by hand: verify": Case(_edit_patch, ["verify"], _drop_from_series),
    "a patch edited by hand: rebase": Case(_edit_patch, ["rebase", "--onto", "main"], _drop_from_series),
    "a patch edited by hand: launch": Case(_edit_patch, None, _drop_from_series),
    "the lock's commit moved by hand: fetch": Case(_lock_moved_by_hand, ["fetch"], _lock_back, _series_moved),
    "a patch already applied: apply": Case(_applied_twice, ["apply"], _drop_second),
    "a broken lock: verify": Case(_broken_lock, ["verify"]),
    "a broken lock: apply": Case(_broken_lock, ["apply"]),
    "a broken lock: launch": Case(_broken_lock, None),
    "local edits: verify": Case(_edit_tree, ["verify"]),
    "local edits: apply": Case(_edit_tree, ["apply"]),
    "local edits: launch": Case(_edit_tree, None),
    "a stale lock [files]: apply": Case(_stale_files, ["apply"]),
    "a file the lock does not record: apply": Case(_unrecorded, ["apply"]),
    "no work tree: verify": Case(_no_tree, ["verify"]),
    "no work tree: launch": Case(_no_tree, None),
    "no rebase in progress: rebase --continue": Case(lambda s: None, ["rebase", "--continue"]),
    "nothing to export: export": Case(lambda s: None, ["export", "x"]),
}


def _refusal(s, argv, capsys) -> str:
    """The refused command's one error line (launch: the tree check launch makes first)."""
    if argv is None:
        from dancegrpo_npu.engine import treecheck

        with pytest.raises(DancegrpoError) as e:
            treecheck.require_tree(s.project, TRAINER)
        return f"dancegrpo-npu: error: {e.value.one_line()}"
    rc = main(["-C", str(s.project.root), *argv])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("\n") == 1, (argv, rc, err)
    return err.strip()


def _same_failure(err: str, line: str) -> bool:
    """Whether the hinted command's error is the refusal's own problem again (its start, less
    verify's "verify: <tree>: " prefix, is in the refusal's line: launch wraps verify's error)."""
    core = re.sub(r"^verify: \S+: ", "", err.removeprefix("dancegrpo-npu: error: "))
    return bool(core) and core[:60] in line


def _run(s, command: str, capsys) -> tuple[int, str]:
    words = [PLACEHOLDERS.get(w, w) for w in shlex.split(command)]
    if words[0] == "git":
        r = subprocess.run(words, cwd=s.project.root, capture_output=True, text=True)
        return r.returncode, r.stderr
    rc = main(["-C", str(s.project.root), *words[1:]])
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("case", list(CASES))
def test_the_hint_of_each_refusal_works(tmp_path, capsys, monkeypatch, case):
    c = CASES[case]
    s = setup(tmp_path, patches=_patched, files=FILES)
    monkeypatch.setenv("DANCEGRPO_SOURCE", s.up.url())
    s.apply()
    c.make(s)
    line = _refusal(s, c.argv, capsys)
    hint_commands = re.findall(r"`((?:dancegrpo-npu|git) [^`]*)`", line)
    assert hint_commands, f"the hint names no command: {line}"
    assert "run `dancegrpo-npu rebase`" not in line  # rebase with no REF does nothing
    if c.by_hand:
        c.by_hand(s)
    rc, err = _run(s, hint_commands[0], capsys)
    assert rc == 0 or not _same_failure(err, line), (line, hint_commands[0], err)
    if c.argv is not None and c.argv[0] in ("apply", "verify", "fetch"):  # and then the refused command goes through
        assert main(["-C", str(s.project.root), "fetch"]) == 0 and main(["-C", str(s.project.root), "apply", "--force"]) == 0, capsys.readouterr().err
    assert c.goal is None or c.goal(s), (line, hint_commands[0], err)
