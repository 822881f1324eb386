"""Build the patched files in a staging directory: the series with patch-ng, each
file checked against the exact hunks (``diffs.apply_exact``), then the overlay.

Nothing here touches the work tree.  The result is the content of every path the
series or the overlay decides (None for a deleted file); ``apply`` swaps it in.

patch-ng 1.19.1 is wrapped, not trusted: paths are checked before it runs, it runs
one file at a time in a scratch directory holding only the files of the series, its
output is compared with the exact result, and its two known gaps are corrected and
nothing else: a missing final newline gains one, and an empty file cannot be patched.
"""

from __future__ import annotations

import logging
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from dancegrpo_npu.engine.diffs import FileChange, apply_exact, check_symlinks, parse_diff
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.series import Patch

# Files in overlay/ that are never part of it (byte-code caches, editor droppings).
OVERLAY_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
OVERLAY_SKIP_SUFFIXES = (".pyc", ".pyo", "~", ".swp")


@dataclass(frozen=True)
class FileState:
    data: bytes
    executable: bool = False

    @property
    def mode(self) -> int:
        return 0o755 if self.executable else 0o644


@dataclass(frozen=True)
class Upstream:
    """The tree a series applies to: every file path, its symlinks, and a batch reader
    of regular files (path -> FileState; a path it does not return is absent)."""

    paths: frozenset[str]
    symlinks: dict[str, str]
    read: Callable[[list[str]], dict[str, FileState]]

    @property
    def dirs(self) -> frozenset[str]:
        return frozenset(parent_dirs(self.paths))


def parent_dirs(paths) -> set[str]:
    """Every directory above the given repo-relative paths ("a/b/c" -> "a", "a/b")."""
    return {p.rsplit("/", i)[0] for p in paths for i in range(1, p.count("/") + 1)}


@dataclass(frozen=True)
class Built:
    """What the series and overlay make of the upstream tree."""

    files: dict[str, FileState | None]  # every path decided (None: deleted)
    pristine: dict[str, FileState]  # upstream content of the touched files that exist upstream
    created: frozenset[str]  # paths the patches create
    overlay: frozenset[str]  # paths the overlay adds
    touched_by: dict[str, tuple[str, ...]] = field(default_factory=dict)  # patch name -> its paths



def parse_patch(patch: Patch) -> list[FileChange]:
    return parse_diff(patch.diff, patch.name)


def touched_files(patch: Patch) -> list[str]:
    """Repo-relative paths a patch reads or writes (modified, created, deleted)."""
    return [c.path for c in parse_patch(patch)]


def read_overlay(overlay_dir: Path | None) -> dict[str, FileState]:
    """Every file of overlay/ by relative path (symlinks and special files refused)."""
    files: dict[str, FileState] = {}
    if overlay_dir is None or not overlay_dir.exists():
        return files
    for dirpath, dirnames, filenames in os.walk(overlay_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in OVERLAY_SKIP_DIRS)
        base = Path(dirpath)
        for d in dirnames:
            if (base / d).is_symlink():
                raise DancegrpoError(f"overlay/{(base / d).relative_to(overlay_dir).as_posix()} is a symlink", "the overlay holds only regular files; copy the file instead")
        for name in sorted(filenames):
            if name.endswith(OVERLAY_SKIP_SUFFIXES):
                continue
            full = base / name
            rel = full.relative_to(overlay_dir).as_posix()
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode):
                raise DancegrpoError(f"overlay/{rel} is not a regular file (a symlink?)", "the overlay holds only regular files; copy the file instead")
            if ".git" in rel.split("/"):
                raise DancegrpoError(f"overlay/{rel} is inside a .git directory", "remove it from overlay/")
            files[rel] = FileState(full.read_bytes(), bool(st.st_mode & stat.S_IXUSR))
    return files


def build(
    upstream: Upstream,
    patches: list[Patch],
    overlay: dict[str, FileState],
    stage_dir: Path | None,
) -> Built:
    """Apply the series then the overlay.  With ``stage_dir`` (an empty directory), the
    files are written there by patch-ng and checked; without, only computed exactly."""
    parsed = [(p, parse_patch(p)) for p in patches]
    touched: list[str] = []
    for patch, changes in parsed:
        for c in changes:
            check_symlinks(c.path, upstream.symlinks, f"patch {patch.name}")
            if c.path not in touched:
                touched.append(c.path)
    pristine = upstream.read([t for t in touched if t in upstream.paths])
    updirs = upstream.dirs
    state: dict[str, FileState | None] = {t: pristine.get(t) for t in touched}
    if stage_dir is not None:
        for path, fs in pristine.items():
            write_file(stage_dir, path, fs)
    created: set[str] = set()
    for patch, changes in parsed:
        ng_items = _patch_ng_items(patch) if stage_dir is not None else {}
        results: list[tuple[FileChange, FileState | None]] = []
        for c in changes:  # check the whole patch before any of it is written
            before = state[c.path]
            if c.kind == "create":
                _check_new_path(c.path, state, upstream.paths, updirs, f"patch {patch.name}")
            data = apply_exact(before.data if before else None, c, patch.name)
            mode = (c.new_mode or 0o644) if before is None else before.mode
            results.append((c, None if data is None else FileState(data, bool(mode & 0o100))))
        for c, after in results:
            if stage_dir is not None:
                _patch_ng_one(stage_dir, patch.name, ng_items.get(c.path), c, state[c.path], after)
            state[c.path] = after
            if c.kind == "create":
                created.add(c.path)
    for rel, fs in overlay.items():
        if rel in upstream.paths or rel in updirs:
            raise DancegrpoError(
                f"overlay/{rel} exists in upstream", "the overlay only adds files; change upstream files with a patch"
            )
        if rel in state:
            raise DancegrpoError(f"overlay/{rel} is also created by a patch of the series", "keep the file in one place: the overlay or the patch")
        check_symlinks(rel, upstream.symlinks, "overlay")
        _check_new_path(rel, state, upstream.paths, updirs, f"overlay/{rel}")
        state[rel] = fs
        if stage_dir is not None:
            write_file(stage_dir, rel, fs)
    if stage_dir is not None:
        _check_stage(stage_dir, state)
    return Built(
        files=state,
        pristine=pristine,
        created=frozenset(created),
        overlay=frozenset(overlay),
        touched_by={p.name: tuple(c.path for c in ch) for p, ch in parsed},
    )


def _check_new_path(path: str, state: dict[str, FileState | None], paths: frozenset[str], dirs: frozenset[str], who: str) -> None:
    """A new file may not sit under an existing file, nor replace a directory."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if (parent in paths and parent not in state) or state.get(parent) is not None:
            raise DancegrpoError(f"{who}: cannot create {path}: {parent} is a file", "choose another path")
    if path in dirs or any(p.startswith(path + "/") and s is not None for p, s in state.items()):
        raise DancegrpoError(f"{who}: cannot create {path}: it is a directory upstream", "choose another path")


def write_file(root: Path, rel: str, fs: FileState) -> None:
    """Write ``fs`` at ``root/rel`` with its mode, making parent directories."""
    dest = root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(fs.data)
    os.chmod(dest, fs.mode)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _quiet_patch_ng() -> Iterator[_Collect]:
    """patch-ng logs to the root logger and chdirs; keep both to ourselves."""
    logger = logging.getLogger("patch_ng")
    handler = _Collect()
    saved = (logger.propagate, logger.level)
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    cwd = os.getcwd()
    try:
        yield handler
    finally:
        os.chdir(cwd)
        logger.removeHandler(handler)
        logger.propagate, level = saved
        logger.setLevel(level)


def _patch_ng_items(patch: Patch) -> dict[str, object]:
    """patch-ng's reading of a patch: its per-file items by path."""
    import patch_ng

    with _quiet_patch_ng() as log:
        patchset = patch_ng.fromstring(patch.diff)
    if not patchset:
        raise DancegrpoError(
            f"patch {patch.name}: patch-ng cannot parse it ({'; '.join(log.messages[-2:])})", "regenerate it with `git diff`"
        )
    return {_ng_path(it): it for it in patchset.items}


def _patch_ng_one(stage: Path, name: str, item, change: FileChange, before: FileState | None, after: FileState | None) -> None:
    """Let patch-ng apply one file's part of a patch in ``stage``; check what it wrote."""
    import patch_ng

    where = f"patch {name}: {change.path}"
    if item is None or len(item.hunks) != len(change.hunks) or any(
        (h.startsrc, h.linessrc) != (mine.src_start, mine.src_len) for h, mine in zip(item.hunks, change.hunks)
    ):
        raise DancegrpoError(f"{where}: patch-ng reads this file's diff differently from the engine", "regenerate the patch with `git diff`")
    with _quiet_patch_ng() as log:
        single = patch_ng.PatchSet()
        single.items = [item]
        try:
            ok = single.apply(strip=0, root=os.fspath(stage))
        except Exception as e:  # patch-ng raises on what it cannot handle (e.g. non-UTF-8 new files)
            ok = False
            log.messages.append(f"{type(e).__name__}: {e}")
    dest = stage / change.path
    if after is None:
        if not ok or dest.exists() or dest.is_symlink():
            raise DancegrpoError(f"{where}: patch-ng did not delete the file", "report this as an engine bug; the work tree is unchanged")
        return
    got = dest.read_bytes() if dest.is_file() else None
    known_gap = (
        # patch-ng drops "\ No newline at end of file" and always ends the file with one
        (got is not None and change.no_newline and got in (after.data + b"\n", after.data + b"\r\n"))
        # patch-ng cannot patch an empty file ("premature end of source file")
        or (before is not None and before.data == b"" and got == b"")
    )
    if not known_gap and (not ok or got != after.data):
        detail = "; ".join(log.messages[-2:]) if not ok else "its output differs from the exact hunks"
        raise DancegrpoError(f"{where}: patch-ng failed ({detail})", "report this as an engine bug; the work tree is unchanged")
    if got != after.data:
        write_file(stage, change.path, after)
    os.chmod(dest, after.mode)


def _ng_path(item) -> str:
    name = item.target if item.target != b"/dev/null" else item.source
    return name.decode("utf-8", "surrogateescape")


def _check_stage(stage: Path, state: dict[str, FileState | None]) -> None:
    """The staging directory holds exactly the expected files, byte for byte."""
    found = set()
    for dirpath, _dirs, files in os.walk(stage):
        for name in files:
            found.add((Path(dirpath) / name).relative_to(stage).as_posix())
    expected = {p for p, s in state.items() if s is not None}
    stray = sorted(found - expected)
    if stray:
        raise DancegrpoError(f"patch-ng wrote unexpected file(s) while staging: {', '.join(stray[:5])}", "report this as an engine bug; the work tree is unchanged")
    for path in expected:
        if (stage / path).read_bytes() != state[path].data:  # type: ignore[union-attr]
            raise DancegrpoError(f"staged {path} differs from the exact result", "report this as an engine bug; the work tree is unchanged")
