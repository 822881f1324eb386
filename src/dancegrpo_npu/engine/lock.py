"""``upstream.lock``: which upstream the series is written for.

A TOML file::

    [upstream]
    url = "https://github.com/XueZeyue/DanceGRPO"
    commit = "<40 hex>"
    archive_sha256 = "<64 hex>"      # optional: a .tar.gz of the tree at that commit

    [files]                           # every upstream file the series touches,
    "fastvideo/utils/load.py" = "<sha256 before patching>"

Loading checks every field and names the one that is wrong; nothing is ever
written from a lock that did not load.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.files import write_atomic

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")

HEADER = (
    "# upstream.lock: the upstream DanceGRPO commit this patch series is written for,\n"
    "# and the sha256 of every upstream file the series touches, before patching.\n"
    "# Written by `dancegrpo-npu`; edit by hand only to change url.\n"
)


@dataclass(frozen=True)
class Lock:
    url: str
    commit: str
    files: dict[str, str] = field(default_factory=dict)
    archive_sha256: str | None = None

    def with_files(self, files: dict[str, str]) -> "Lock":
        return Lock(self.url, self.commit, dict(sorted(files.items())), self.archive_sha256)

    def with_commit(self, commit: str, files: dict[str, str], archive_sha256: str | None = None) -> "Lock":
        return Lock(self.url, commit, dict(sorted(files.items())), archive_sha256)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_RESTORE = "fix upstream.lock by hand, or restore the committed one with `git checkout -- upstream.lock`"


def _bad(path: Path, what: str, hint: str = _RESTORE) -> DancegrpoError:
    return DancegrpoError(f"{path}: {what}", hint)


def check_relpath(rel: str) -> str:
    """A repository-relative POSIX path, or ValueError saying why not."""
    if not rel or "\\" in rel or "\0" in rel:
        raise ValueError("is not a relative POSIX path")
    p = PurePosixPath(rel)
    if p.is_absolute() or any(part in ("", ".", "..") for part in rel.split("/")):
        raise ValueError("must be relative to the tree, without '.' or '..' parts")
    return str(p)


def parse_lock(text: str, path: Path) -> Lock:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _bad(path, f"is not valid TOML ({e})") from None
    up = data.get("upstream")
    if not isinstance(up, dict):
        raise _bad(path, "has no [upstream] table")
    url = up.get("url")
    if not isinstance(url, str) or not url.strip():
        raise _bad(path, "field upstream.url is missing or not a string")
    commit = up.get("commit")
    if not isinstance(commit, str) or not _HEX40.fullmatch(commit):
        raise _bad(path, f"field upstream.commit must be a full 40-hex git commit id, not {commit!r}")
    archive = up.get("archive_sha256")
    if archive is not None and (not isinstance(archive, str) or not _HEX64.fullmatch(archive)):
        raise _bad(path, f"field upstream.archive_sha256 must be 64 lowercase hex digits, not {archive!r}")
    unknown = set(up) - {"url", "commit", "archive_sha256"}
    if unknown:
        raise _bad(path, f"unknown field(s) in [upstream]: {', '.join(sorted(unknown))}")
    files_raw = data.get("files", {})
    if not isinstance(files_raw, dict):
        raise _bad(path, "[files] must be a table of path = sha256")
    files: dict[str, str] = {}
    for rel, digest in files_raw.items():
        try:
            norm = check_relpath(rel)
        except ValueError as e:
            raise _bad(path, f"files.{rel!r} {e}") from None
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise _bad(path, f"files.{rel!r} must be a sha256 (64 lowercase hex digits), not {digest!r}")
        files[norm] = digest
    unknown = set(data) - {"upstream", "files"}
    if unknown:
        raise _bad(path, f"unknown table(s): {', '.join(sorted(unknown))}")
    return Lock(url=url.strip(), commit=commit, files=files, archive_sha256=archive)


def load_lock(path: Path) -> Lock:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DancegrpoError(f"{path} does not exist", "run in the project directory or pass -C DIR") from None
    except (OSError, UnicodeDecodeError) as e:
        raise _bad(path, f"cannot be read ({e})") from None
    return parse_lock(text, path)


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dump_lock(lock: Lock) -> str:
    lines = [HEADER, "[upstream]", f"url = {_toml_str(lock.url)}", f"commit = {_toml_str(lock.commit)}"]
    if lock.archive_sha256:
        lines.append(f"archive_sha256 = {_toml_str(lock.archive_sha256)}")
    lines += ["", "[files]"]
    lines += [f"{_toml_str(rel)} = {_toml_str(d)}" for rel, d in sorted(lock.files.items())]
    return "\n".join(lines) + "\n"


def save_lock(lock: Lock, path: Path) -> None:
    text = dump_lock(lock)
    parse_lock(text, path)  # never write a lock we could not read back
    write_atomic(path, text)
