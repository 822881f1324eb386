"""Files written in one step, and held against a second process.

Shared by the engine, the rebase, the run records and the smoke: the lowest layer
after ``errors``.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from dancegrpo_npu.errors import DancegrpoError


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace ``path`` in one step: a reader sees the old file or the new one."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


RUNS_HINT = "free space or fix the permissions there, or put the runs elsewhere: --runs-dir DIR or DANCEGRPO_RUNS=DIR"


def _file_in_the_way(path: Path) -> Path | None:
    """The first part of ``path`` that is a file where a directory is needed, if one is."""
    for part in reversed([path, *path.parents]):
        if part.exists() and not part.is_dir():
            return part
    return None


def cannot_write(path: Path, error: OSError, hint: str = RUNS_HINT) -> DancegrpoError:
    """An OSError while writing ``path`` (read-only, full, not a directory) as one line."""
    import errno

    reason = error.strerror or str(error)
    where = error.filename if error.filename and str(error.filename) != str(path) else None
    text = f"cannot write {path}: {reason}" + (f" ({where})" if where else "")
    blocker = _file_in_the_way(path) if error.errno in (errno.ENOTDIR, errno.EEXIST) else None
    if blocker is not None:  # not a matter of space or permissions
        text = f"cannot write {path}: {blocker} is a file, not a directory"
        elsewhere = hint.split(", or ", 1)[1] if ", or " in hint else "write elsewhere"
        hint = ("name a directory: --runs-dir DIR or DANCEGRPO_RUNS=DIR" if hint == RUNS_HINT
                else f"move the file, or {elsewhere}")
    return DancegrpoError(text, hint)


@contextmanager
def writing(path: Path, hint: str = RUNS_HINT) -> Iterator[None]:
    """Turn an OSError of the block into ``cannot_write(path, ...)``."""
    try:
        yield
    except OSError as e:
        raise cannot_write(path, e, hint) from None


@contextmanager
def exclusive(lock_file: Path, busy: str) -> Iterator[None]:
    """Hold an flock on ``lock_file`` (the kernel drops it if the process dies); if
    another process holds it, refuse at once with ``busy`` rather than wait."""
    import fcntl

    with open(lock_file, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DancegrpoError(busy, "wait for it to finish, then re-run") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie its parent has not reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        pass
    if Path("/proc/self/stat").exists():  # a /proc without the pid: no such process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True
