"""Thin helpers around the ``git`` command, used by fetch, apply, status and lock.

git is run as a subprocess with the user's own configuration (so mirrors set with
``url.<base>.insteadOf`` work), but with line-ending conversion switched off: the
engine compares bytes, and a ``core.autocrlf`` setting must not change them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError

_GIT_CONFIG = ("-c", "core.autocrlf=false", "-c", "core.safecrlf=false", "-c", "core.quotepath=false")


@dataclass(frozen=True)
class TreeEntry:
    """One file of a git tree: its mode ("100644", "100755", "120000", ...) and blob id."""

    mode: str
    blob: str


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"})
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    env.pop("GIT_INDEX_FILE", None)
    env.pop("GIT_OBJECT_DIRECTORY", None)  # e.g. inherited inside a git hook
    env.pop("GIT_ALTERNATE_OBJECT_DIRECTORIES", None)
    if extra:
        env.update(extra)
    return env


def git(
    cwd: Path | None,
    *args: str,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """Run git; on failure raise DancegrpoError with git's own last words."""
    if shutil.which("git") is None:
        raise DancegrpoError("git is not installed", "install git (apt-get install git) and re-run")
    cmd = ["git", *_GIT_CONFIG, *args]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, input=input, capture_output=True, env=git_env(env), timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise DancegrpoError(f"git {args[0]} timed out after {timeout:.0f} s", "check the network or the source") from None
    if check and proc.returncode != 0:
        raise DancegrpoError(f"git {' '.join(args[:2])} failed: {last_error_line(proc.stderr)}")
    return proc


def last_error_line(stderr: bytes) -> str:
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    fatal = [ln for ln in lines if ln.startswith(("fatal:", "error:"))]
    return fatal[0] if fatal else (lines or ["(no message)"])[-1]


def blob_id(data: bytes) -> str:
    """The git blob id of ``data`` (what ``git hash-object`` prints), without running git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def rev_parse(repo: Path, rev: str) -> str | None:
    proc = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def ls_tree(repo: Path, rev: str) -> dict[str, TreeEntry]:
    """Every file of ``rev`` (recursively): path -> TreeEntry.  Submodules are left out."""
    out = git(repo, "ls-tree", "-r", "-z", "--full-tree", rev).stdout
    entries: dict[str, TreeEntry] = {}
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, path = record.split(b"\t", 1)
        mode, kind, blob = meta.decode().split()
        if kind == "blob":
            entries[path.decode("utf-8", "surrogateescape")] = TreeEntry(mode, blob)
    return entries


def cat_blobs(repo: Path, blobs: list[str]) -> dict[str, bytes]:
    """Contents of many blobs in one ``git cat-file --batch`` call."""
    wanted = list(dict.fromkeys(blobs))
    if not wanted:
        return {}
    out = git(repo, "cat-file", "--batch", input="".join(b + "\n" for b in wanted).encode()).stdout
    result: dict[str, bytes] = {}
    pos = 0
    for blob in wanted:
        nl = out.index(b"\n", pos)
        header = out[pos:nl].decode().split()
        if len(header) < 3 or header[1] != "blob":
            raise DancegrpoError(
                f"git object {blob} is missing from the work tree's repository",
                "the upstream source lacks it; run dancegrpo-npu fetch again from a complete source",
            )
        size = int(header[2])
        result[blob] = out[nl + 1 : nl + 1 + size]
        pos = nl + 1 + size + 1
    return result


def missing_objects(repo: Path, ids: list[str]) -> list[str]:
    """The object ids ``repo`` does not have (a mirror may lack large blobs)."""
    if not ids:
        return []
    out = git(repo, "cat-file", "--batch-check", input="".join(i + "\n" for i in ids).encode()).stdout.decode()
    return [line.split()[0] for line in out.splitlines() if line.endswith(" missing")]


def missing_files(repo: Path, rev: str) -> list[str]:
    """The files of ``rev`` whose contents ``repo`` lacks (mirrors and partial clones
    often lack large blobs, e.g. DanceGRPO's dancegrpo.pdf), in path order."""
    tree = ls_tree(repo, rev)
    missing = set(missing_objects(repo, sorted({e.blob for e in tree.values()})))
    return sorted(p for p, e in tree.items() if e.blob in missing)


def sparse_pattern(path: str) -> str:
    """A sparse-checkout (gitignore-syntax) line that leaves out exactly ``path``."""
    escaped = "".join("\\" + c if c in "\\*?[" else c for c in path)
    if escaped.endswith(" "):
        escaped = escaped[:-1] + "\\ "
    return f"!/{escaped}\n"


def sparse_patterns_path(repo: Path) -> Path:
    out = git(repo, "rev-parse", "--git-path", "info/sparse-checkout").stdout.decode().strip()
    path = Path(out)
    return path if path.is_absolute() else Path(repo) / path


def leave_out_of_checkout(repo: Path, paths: list[str]) -> None:
    """Add ``paths`` to the sparse-checkout patterns of ``repo`` (turning a sparse checkout
    of everything on first), so that the next checkout neither writes nor reads them."""
    if not paths:
        return
    target = sparse_patterns_path(repo)
    enabled = git(repo, "config", "--bool", "core.sparseCheckout", check=False).stdout.decode().strip() == "true"
    text = target.read_text(encoding="utf-8") if enabled and target.is_file() else "/*\n"
    lines = set(text.splitlines(keepends=True))
    text += "".join(line for line in map(sparse_pattern, paths) if line not in lines)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    if not enabled:
        git(repo, "config", "core.sparseCheckout", "true")
        git(repo, "config", "core.sparseCheckoutCone", "false")


def hash_files(repo: Path, files: list[Path]) -> list[str]:
    """Write files' bytes (no filters) into ``repo``'s object database; returns their blob ids."""
    if not files:
        return []
    listing = "".join(f"{os.fspath(f)}\n" for f in files).encode("utf-8", "surrogateescape")
    out = git(repo, "hash-object", "-w", "--no-filters", "--stdin-paths", input=listing).stdout
    return out.decode().split()


def hash_data(repo: Path, data: bytes) -> str:
    """Write one blob into ``repo``'s object database; returns its id."""
    return git(repo, "hash-object", "-w", "--stdin", input=data).stdout.decode().strip()


def status_paths(repo: Path) -> dict[str, str]:
    """Paths that ``git status`` reports (index or work tree differing from HEAD, or
    untracked and not ignored): path -> two-letter porcelain code ("??" untracked)."""
    out = git(
        repo, "--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", "--ignore-submodules"
    ).stdout
    result: dict[str, str] = {}
    for record in out.split(b"\0"):
        if len(record) > 3:
            result[record[3:].decode("utf-8", "surrogateescape")] = record[:2].decode()
    return result


def is_git_repo(path: Path) -> bool:
    return (path / ".git").is_dir() and (path / ".git" / "HEAD").is_file()
