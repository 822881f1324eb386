"""Helpers for the rebase / upstream-log / export tests.

* ``History``: a synthetic upstream git repository built commit by commit.
* ``make_project``: a project (lock, series, overlay) around it, and its work tree
  made by the engine itself (``fetch`` + ``apply``), as a user would have it.
* ``refetch``: what the user does after a rebase (``fetch`` + ``apply``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from projects import write_project

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Upstream Dev", "GIT_AUTHOR_EMAIL": "dev@example.com",
    "GIT_COMMITTER_NAME": "Upstream Dev", "GIT_COMMITTER_EMAIL": "dev@example.com",
    "GIT_AUTHOR_DATE": "2025-08-01T00:00:00Z", "GIT_COMMITTER_DATE": "2025-08-01T00:00:00Z",
}


def run_cli(project: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``dancegrpo-npu -C project ARGS`` in a subprocess."""
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = str(SRC)
    return subprocess.run(
        [sys.executable, "-m", "dancegrpo_npu", "-C", str(project), *args], capture_output=True, text=True, env=full_env
    )


# --- synthetic upstream history -------------------------------------------------------


def git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    env = dict(os.environ, **GIT_ENV)
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(var, None)
    r = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {r.stderr.decode()}")
    return r.stdout.decode().strip()


def code_file(name: str, lines: int) -> str:
    """Text that looks like code, every line distinct."""
    return "".join(f"{name}_value_{i} = compute('{name}', {i})\n" for i in range(1, lines + 1))


class History:
    """A synthetic upstream repository; ``commit`` returns the new commit id."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True)
        git(path, "init", "-q", "-b", "main")

    def write(self, rel: str, text: str) -> "History":
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return self

    def read(self, rel: str) -> str:
        return (self.path / rel).read_text()

    def edit_line(self, rel: str, lineno: int, new: str) -> "History":
        lines = self.read(rel).splitlines(keepends=True)
        lines[lineno - 1] = new + "\n"
        return self.write(rel, "".join(lines))

    def insert_lines(self, rel: str, before: int, new: list[str]) -> "History":
        lines = self.read(rel).splitlines(keepends=True)
        lines[before - 1 : before - 1] = [n + "\n" for n in new]
        return self.write(rel, "".join(lines))

    def delete(self, rel: str) -> "History":
        git(self.path, "rm", "-q", rel)
        return self

    def rename(self, old: str, new: str) -> "History":
        (self.path / new).parent.mkdir(parents=True, exist_ok=True)
        git(self.path, "mv", old, new)
        return self

    def commit(self, message: str) -> str:
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "--allow-empty", "-m", message)
        return git(self.path, "rev-parse", "HEAD")


def base_history(path: Path) -> tuple[History, str]:
    h = History(path)
    h.write("README.md", "# upstream\n\nSome words.\n")
    h.write("fastvideo/train.py", code_file("train", 60))
    h.write("fastvideo/utils.py", code_file("utils", 40))
    h.write("fastvideo/models/flux.py", code_file("flux", 30))
    return h, h.commit("initial upstream")


# --- a project on top of it -------------------------------------------------------------


def set_line(n, text):
    """An edit for PatchSpec: line ``n`` (1-based) becomes ``text``."""

    def edit(old):
        lines = old.splitlines(keepends=True)
        lines[n - 1] = text + "\n"
        return "".join(lines)

    return edit


@dataclass(frozen=True)
class PatchSpec:
    name: str
    description: str
    edits: dict  # path -> callable(old text or None) -> new text, or None to delete


def make_series(history: History, base: str, specs: list[PatchSpec], scratch: Path, context: int = 3) -> dict[str, str]:
    """Each spec as a patch (made with git diff in ``scratch``, DEP-3 header): name -> text."""
    git(scratch.parent, "clone", "-q", str(history.path), str(scratch))
    git(scratch, "checkout", "-q", "--detach", base)
    patches = {}
    for spec in specs:
        for rel, fn in spec.edits.items():
            p = scratch / rel
            if fn is None:
                p.unlink()
            else:
                old = p.read_text() if p.exists() else None
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(fn(old))
        git(scratch, "add", "-A")
        diff = git(scratch, "diff", "--cached", f"-U{context}", "--src-prefix=a/", "--dst-prefix=b/", "--no-renames")
        diff = "\n".join(ln for ln in diff.splitlines() if not ln.startswith("index ")) + "\n"
        git(scratch, "commit", "-q", "-m", spec.name)
        header = (
            f"Description: {spec.description}\n Why: tests.\nAuthor: Test <t@example.com>\n"
            "Forwarded: not-needed\nLast-Update: 2025-01-01\n"
        )
        patches[spec.name] = header + "---\n" + diff
    shutil.rmtree(scratch)
    return patches


def sha256_at(history: History, commit: str, rel: str) -> str | None:
    r = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=history.path, capture_output=True)
    return hashlib.sha256(r.stdout).hexdigest() if r.returncode == 0 else None


def make_project(root: Path, history: History, commit: str, specs: list[PatchSpec], overlay: dict | None = None,
                 context: int = 3) -> Path:
    """Project at ``root`` (lock, patches, overlay: ``projects.write_project``) and its work tree
    ``root/build/DanceGRPO``, fetched and patched by the engine."""
    from dancegrpo_npu.engine.lock import Lock

    root.mkdir(parents=True)
    patches = make_series(history, commit, specs, root / "patches.scratch", context)
    write_project(root, lambda root: Lock(str(history.path), commit, lock_files(root, history, commit)), patches,
                  overlay, series_header="# test series\n")
    refetch(root)
    return root


def lock_files(root: Path, history: History, commit: str) -> dict[str, str]:
    """[files] for the series in ``root/patches`` at ``commit`` (the engine's rule)."""
    from dancegrpo_npu.vcs.gitutil import ls_tree
    from dancegrpo_npu.engine.lockfile import compute_files
    from dancegrpo_npu.engine.series import load_series

    return compute_files(history.path, ls_tree(history.path, commit), load_series(root / "patches"))


def refetch(root: Path) -> None:
    """What a user runs after changing the lock: ``dancegrpo-npu fetch`` then ``apply``."""
    from dancegrpo_npu.engine.apply import apply_worktree
    from dancegrpo_npu.engine.fetch import fetch
    from dancegrpo_npu.project import find_project

    project = find_project(root)
    fetch(project)
    apply_worktree(project)


def verified(root: Path) -> bool:
    """``dancegrpo-npu verify``: the work tree is exactly lock + series + overlay."""
    from dancegrpo_npu.project import find_project
    from dancegrpo_npu.engine.status import inspect

    report = inspect(find_project(root))
    return report.exact


def tree_state(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` except .git, as bytes (to compare trees exactly)."""
    out = {}
    for dirpath, dirnames, files in os.walk(path):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in files:
            p = Path(dirpath) / name
            out[p.relative_to(path).as_posix()] = p.read_bytes()
    return out


def project_state(root: Path) -> dict[str, bytes]:
    """The project files a rebase may change: upstream.lock and patches/."""
    out = {"upstream.lock": (root / "upstream.lock").read_bytes()}
    for p in sorted((root / "patches").iterdir()):
        out[f"patches/{p.name}"] = p.read_bytes()
    return out


def error_of(fn, *args) -> str:
    """The one line the CLI would print for the DancegrpoError ``fn(*args)`` raises."""
    import pytest

    from dancegrpo_npu.errors import DancegrpoError

    with pytest.raises(DancegrpoError) as e:
        fn(*args)
    return e.value.one_line()


def run_as_printed(command: str, cwd) -> subprocess.CompletedProcess:
    """A printed ``dancegrpo-npu ...`` line run by the shell in ``cwd``, the tool as this checkout's."""
    command = command.strip()
    assert command.startswith("dancegrpo-npu "), command
    env = dict(os.environ, PYTHONPATH=str(SRC))
    return subprocess.run(f"{sys.executable} -m dancegrpo_npu {command[len('dancegrpo-npu '):]}", shell=True,
                          cwd=cwd, capture_output=True, text=True, env=env)
