"""Builders for engine tests: small synthetic upstream git repositories, patches made
with git itself, and dancegrpo-npu project directories around them (``projects``).

Everything is built in temporary directories; nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.engine.lock import Lock, save_lock, sha256_bytes
from dancegrpo_npu.project import Project, find_project
from projects import write_file, write_project, write_series

IDENTITY = {
    "GIT_AUTHOR_NAME": "Upstream",
    "GIT_AUTHOR_EMAIL": "upstream@example.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "Upstream",
    "GIT_COMMITTER_EMAIL": "upstream@example.invalid",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+0000",
}

DEFAULT_FILES = {
    "README.md": "# Upstream\n\nA tiny stand-in for DanceGRPO.\n",
    "fastvideo/__init__.py": "",
    "fastvideo/train.py": "".join(f"line {i}\n" for i in range(1, 41)),
    "fastvideo/utils/load.py": "import os\n\n\ndef load(path):\n    return open(path).read()\n",
    "fastvideo/utils/old.py": "OLD = 1\nGONE = 2\n",
    "scripts/run.sh": "#!/bin/sh\necho run\n",
    "assets/prompts.txt": "a cat\na dog\n",
}
EXECUTABLE = {"scripts/run.sh"}


def run_git(cwd: Path, *args: str, input: bytes | None = None) -> bytes:
    env = dict(os.environ, **IDENTITY)
    proc = subprocess.run(["git", "-c", "core.autocrlf=false", *args], cwd=cwd, input=input, capture_output=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.decode()}")
    return proc.stdout


@dataclass
class Upstream:
    path: Path
    commit: str

    def url(self) -> str:
        return os.fspath(self.path)

    def blob(self, rel: str, rev: str | None = None) -> bytes:
        return run_git(self.path, "show", f"{rev or self.commit}:{rel}")


def make_upstream(
    root: Path,
    files: dict[str, bytes | str] | None = None,
    symlinks: dict[str, str] | None = None,
    executable: set[str] | None = None,
) -> Upstream:
    """A git repository with one commit holding ``files`` (default: a small DanceGRPO look-alike)."""
    root.mkdir(parents=True)
    run_git(root, "init", "-q", "-b", "main")
    files = DEFAULT_FILES if files is None else files
    executable = EXECUTABLE if executable is None else executable
    for rel, content in files.items():
        write_file(root, rel, content, rel in executable)
    for rel, target in (symlinks or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / rel)
    run_git(root, "add", "-A")
    run_git(root, "commit", "-q", "-m", "upstream: first")
    return Upstream(root, run_git(root, "rev-parse", "HEAD").decode().strip())


def add_commit(up: Upstream, changes: dict[str, bytes | str | None], message: str = "upstream: next") -> Upstream:
    for rel, content in changes.items():
        write_file(up.path, rel, content)
    run_git(up.path, "add", "-A")
    run_git(up.path, "commit", "-q", "-m", message)
    return Upstream(up.path, run_git(up.path, "rev-parse", "HEAD").decode().strip())


def diff_of(up: Upstream, changes: dict[str, bytes | str | None], scratch: Path, rev: str | None = None, context: int = 3) -> bytes:
    """The git diff that turns ``rev`` (default: up.commit) into ``rev`` + ``changes``."""
    if scratch.exists():
        shutil.rmtree(scratch)
    run_git(up.path.parent, "clone", "-q", os.fspath(up.path), os.fspath(scratch))
    run_git(scratch, "checkout", "-q", "--detach", rev or up.commit)
    for rel, content in changes.items():
        write_file(scratch, rel, content, os.access(scratch / rel, os.X_OK) if (scratch / rel).exists() else False)
    run_git(scratch, "add", "-A")
    out = run_git(scratch, "diff", "--cached", "--no-renames", f"-U{context}")
    shutil.rmtree(scratch)
    return out


def dep3(description: str, diff: bytes, author: str = "Test <test@example.invalid>") -> bytes:
    header = f"Description: {description}\nAuthor: {author}\nForwarded: not-needed\nLast-Update: 2026-01-01\n---\n"
    return header.encode() + diff


def make_project(
    root: Path,
    up: Upstream,
    patches: dict[str, bytes] | None = None,
    overlay: dict[str, bytes | str] | None = None,
    lock_files: dict[str, str] | None = None,
    commit: str | None = None,
    archive_sha256: str | None = None,
) -> Project:
    """A project directory (``projects.write_project``): upstream.lock (files: the touched
    upstream files' hashes unless given), patches/series and overlay/."""
    commit = commit or up.commit
    if lock_files is None:
        lock_files = touched_hashes(up, patches or {}, commit)
    write_project(root, Lock(up.url(), commit, lock_files, archive_sha256), patches, overlay or {})
    return find_project(root)


def touched_hashes(up: Upstream, patches: dict[str, bytes], commit: str) -> dict[str, str]:
    from dancegrpo_npu.engine.diffs import parse_diff
    from dancegrpo_npu.errors import DancegrpoError
    from dancegrpo_npu.engine.series import split_patch

    tracked = set(run_git(up.path, "ls-tree", "-r", "--name-only", commit).decode().split("\n"))
    files = {}
    for name, data in patches.items():
        try:
            changes = parse_diff(split_patch(data, name)[1], name)
        except DancegrpoError:
            continue  # a deliberately bad patch: the test sets up what it needs (an engine crash still fails)
        for c in changes:
            if c.path in tracked:
                files[c.path] = sha256_bytes(up.blob(c.path, commit))
    return files


def make_archive(up: Upstream, dest: Path, rev: str | None = None, prefix: str | None = None) -> Path:
    rev = rev or up.commit
    prefix = f"DanceGRPO-{rev}/" if prefix is None else prefix
    run_git(up.path, "archive", "--format=tar.gz", f"--prefix={prefix}", "-o", os.fspath(dest), rev)
    return dest


def snapshot(root: Path) -> dict[str, tuple[str, bytes | str, int]]:
    """Every entry under ``root`` (except .git): kind, content or link target, mode."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root and ".git" in dirnames:
            dirnames.remove(".git")
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            st = os.lstat(full)
            if full.is_symlink():
                out[rel] = ("link", os.readlink(full), 0)
            elif full.is_dir():
                out[rel] = ("dir", b"", 0)
            else:
                out[rel] = ("file", full.read_bytes(), st.st_mode & 0o777)
    return out


@dataclass
class Setup:
    """A synthetic upstream, a project around it and (after ``fetch``) its work tree."""

    tmp: Path
    up: Upstream
    project: Project

    @property
    def tree(self) -> Path:
        return self.project.workdir

    def diff(self, changes: dict[str, bytes | str | None], **kw) -> bytes:
        return diff_of(self.up, changes, self.tmp / "scratch", **kw)

    def patch(self, description: str, changes: dict[str, bytes | str | None], **kw) -> bytes:
        return dep3(description, self.diff(changes, **kw))

    def set_series(self, patches: dict[str, bytes], refresh_lock: bool = True) -> None:
        from dancegrpo_npu.engine.lock import load_lock

        write_series(self.project.root, patches)
        if refresh_lock:
            lock = load_lock(self.project.lock_path)
            save_lock(lock.with_files(touched_hashes(self.up, patches, lock.commit)), self.project.lock_path)

    def set_overlay(self, files: dict[str, bytes | str]) -> None:
        shutil.rmtree(self.project.overlay_dir, ignore_errors=True)
        self.project.overlay_dir.mkdir()
        for rel, content in files.items():
            write_file(self.project.overlay_dir, rel, content)

    def fetch(self, **kw):
        from dancegrpo_npu.engine.fetch import fetch

        kw.setdefault("source", self.up.url())
        return fetch(self.project, **kw)

    def apply(self, **kw):
        from dancegrpo_npu.engine.apply import apply_worktree

        return apply_worktree(self.project, **kw)


def setup(
    tmp: Path,
    patches: dict[str, bytes] | None = None,
    overlay: dict[str, bytes | str] | None = None,
    files: dict[str, bytes | str] | None = None,
    symlinks: dict[str, str] | None = None,
    fetch: bool = True,
) -> Setup:
    """Upstream + project (+ fetched work tree); ``patches`` may be a callable(Setup)->dict."""
    up = make_upstream(tmp / "upstream", files, symlinks)
    project = make_project(tmp / "project", up, overlay=overlay)
    s = Setup(tmp, up, project)
    if patches:
        s.set_series(patches(s) if callable(patches) else patches)
    if fetch:
        s.fetch()
    return s


def refused(fn, pattern: str, *args, **kwargs):
    """Call ``fn``; it must raise DancegrpoError whose one-line text (message and
    hint, as the CLI prints it) matches ``pattern``.  Returns that text."""
    import re

    from dancegrpo_npu.errors import DancegrpoError

    try:
        fn(*args, **kwargs)
    except DancegrpoError as e:
        text = e.one_line()
        assert re.search(pattern, text), f"{pattern!r} not in {text!r}"
        return text
    raise AssertionError(f"expected a DancegrpoError matching {pattern!r}")
