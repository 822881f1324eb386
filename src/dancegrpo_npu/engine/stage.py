"""Build the patched files in a staging directory: the series with patch-ng, the one
applier, then the overlay.

Nothing here touches the work tree.  The result is the content of every path the
series or the overlay decides (None for a deleted file); ``apply`` swaps it in.

patch-ng 1.19.1 is wrapped, not trusted: paths and hunks are checked before it runs
(``diffs.check_hunks``: exact, no fuzz, no offset), it runs one file at a time in a
scratch directory holding only the files of the series, and what it wrote is checked
(``diffs.check_result``).  Its known gaps are handled here, in ``_patch_ng_gaps``, and
nothing else: it ends a file whose patch says "\\ No newline at end of file" with one,
cannot patch an empty file, and ignores modes; symlinks, mode changes and empty files it
finds nothing in are the engine's to write.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from dancegrpo_npu.engine.diffs import (
    EXECUTABLE, REGULAR, SYMLINK, FileChange, check_hunks, check_result, misfit_hint, mode_name, parse_diff, place_hunks,
)
from dancegrpo_npu.engine.treepaths import check_symlinks, resolve_link
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.series import Patch

# Files in overlay/ that are never part of it (byte-code caches, editor droppings).
OVERLAY_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
OVERLAY_SKIP_SUFFIXES = (".pyc", ".pyo", "~", ".swp")


@dataclass(frozen=True)
class FileState:
    """A file as the series leaves it: its bytes and executable bit, or a symlink (``data``
    is then its target)."""

    data: bytes
    executable: bool = False
    link: bool = False

    @property
    def mode(self) -> int:
        """Permission bits of a regular file."""
        return 0o755 if self.executable else 0o644

    @property
    def git_mode(self) -> int:
        return SYMLINK if self.link else EXECUTABLE if self.executable else REGULAR


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
    moved: tuple[str, ...] = ()  # hunks placed off their stated line (``place``): "patch: path hunk #n by +k lines"



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
    place: bool = False,
) -> Built:
    """Apply the series then the overlay.  The files are written by patch-ng into
    ``stage_dir`` (an empty directory), or without one into a temporary directory that goes.

    ``place``: for a series with patches left out (``apply --without``), a hunk whose
    lines are not at its stated line is placed at the nearest line where they all are
    (``diffs.place_hunks``; never fuzz), and ``Built.moved`` lists it.  The series as
    written is always applied at its stated lines."""
    if stage_dir is None:
        with tempfile.TemporaryDirectory(prefix="dancegrpo-npu-build-") as tmp:
            return build(upstream, patches, overlay, Path(tmp), place)
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
    links = dict(upstream.symlinks)  # upstream's, then those the series creates
    for path, fs in pristine.items():
        write_file(stage_dir, path, fs)
    created: set[str] = set()
    moved: list[str] = []
    for patch, changes in parsed:
        if place:
            changes = _placed(patch.name, changes, state, moved)
        # patch-ng only for what it does: hunks of regular files (it finds nothing in a
        # patch of mode lines and empty files, and would write a symlink as a file)
        needs_ng = any(c.hunks and not c.is_link for c in changes)
        ng_items = _patch_ng_items(patch) if needs_ng else {}
        for c in changes:  # check the whole patch before any of it is written
            who = f"patch {patch.name}"
            check_symlinks(c.path, links, who)  # not through a symlink an earlier patch created
            if c.kind == "create":
                _check_new_path(c.path, state, upstream.paths, updirs, who)
            _check(state[c.path], c, patch.name, links)
        for c in changes:
            before = state[c.path]
            if c.hunks and not c.is_link:
                _shift_ng_hunks(ng_items.get(c.path), c)
                after = _patch_ng_one(stage_dir, patch.name, ng_items.get(c.path), c, before)
            else:  # a symlink, a mode change or an empty file: nothing for patch-ng to do
                after = _without_hunks(before, c)
                _write_or_remove(stage_dir, c.path, after)
            state[c.path] = after
            if after is not None and after.link:
                links[c.path] = after.data.decode("utf-8", "surrogateescape")
            if c.kind == "create":
                created.add(c.path)
    for rel, fs in overlay.items():
        if rel in upstream.paths or rel in updirs:
            raise DancegrpoError(
                f"overlay/{rel} exists in upstream", "the overlay only adds files; change upstream files with a patch"
            )
        if rel in state:
            raise DancegrpoError(f"overlay/{rel} is also created by a patch of the series", "keep the file in one place: the overlay or the patch")
        check_symlinks(rel, links, "overlay")
        _check_new_path(rel, state, upstream.paths, updirs, f"overlay/{rel}")
        state[rel] = fs
        write_file(stage_dir, rel, fs)
    _check_stage(stage_dir, state)
    return Built(
        files=state,
        pristine=pristine,
        created=frozenset(created),
        overlay=frozenset(overlay),
        touched_by={p.name: tuple(c.path for c in ch) for p, ch in parsed},
        moved=tuple(moved),
    )


def _placed(name: str, changes: list[FileChange], state: dict[str, FileState | None], moved: list[str]) -> list[FileChange]:
    """``changes`` with their hunks placed in the files as the series so far left them."""
    out = []
    for c in changes:
        before = state[c.path]
        if c.kind == "modify" and c.hunks and before is not None and not before.link:
            c, shifted = place_hunks(before.data, c)
            moved += [f"{name}: {c.path} hunk #{h.number} by {k:+d} line(s)" for h, k in shifted]
        out.append(c)
    return out


def _shift_ng_hunks(item, change: FileChange) -> None:
    """Move patch-ng's hunks where ``place_hunks`` placed the engine's (no-op otherwise)."""
    if item is None or len(item.hunks) != len(change.hunks):
        return
    for h, mine in zip(item.hunks, change.hunks):
        shift = mine.src_start - h.startsrc
        if shift and mine.tgt_start - h.starttgt == shift:
            h.startsrc += shift
            h.starttgt += shift


def _check(before: FileState | None, change: FileChange, patch: str, links: dict[str, str]) -> None:
    """Refused, naming the patch and the path, where the tree is not what the patch says it
    changes from: its mode, its lines (``check_hunks``), a new symlink's target."""
    path = change.path
    if before is not None and change.old_mode is not None and change.old_mode != before.git_mode:
        already = " (already applied?)" if change.new_mode == before.git_mode else ""
        raise DancegrpoError(
            f"patch {patch}: {path} is mode {mode_name(before.git_mode)}, the patch expects {mode_name(change.old_mode)}{already}",
            misfit_hint(patch),
        )
    check_hunks(before.data if before else None, change, patch)
    if change.kind == "create" and change.is_link:
        target = change.hunks[0].new[0].decode("utf-8", "surrogateescape")
        if resolve_link(path, target, links) is None:
            raise DancegrpoError(
                f"patch {patch}: refusing to create the symlink {path} -> {target}: its target does not resolve inside the tree",
                "a patch may add a symlink only to a path inside the upstream tree (relative, not into .git)",
            )


def _mode(before: FileState | None, change: FileChange) -> bool:
    """Whether the file is executable after ``change``: as the patch states it, else as it was."""
    mode = change.new_mode if change.new_mode is not None else before.git_mode if before else REGULAR
    return mode == EXECUTABLE


def _without_hunks(before: FileState | None, change: FileChange) -> FileState | None:
    """What a change patch-ng has nothing to do for leaves: a new symlink (its one line is the
    target), a new empty file, a deleted one, or a mode change."""
    if change.kind == "delete":
        return None
    if change.is_link:
        return FileState(change.hunks[0].new[0], link=True)
    return FileState(before.data if before else b"", _mode(before, change))


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
    """Write ``fs`` at ``root/rel`` with its mode (or as a symlink), making parent directories."""
    dest = root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    if fs.link:
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        os.symlink(os.fsdecode(fs.data), dest)
        return
    if dest.is_symlink():
        dest.unlink()
    dest.write_bytes(fs.data)
    os.chmod(dest, fs.mode)


def _write_or_remove(root: Path, rel: str, fs: FileState | None) -> None:
    if fs is not None:
        write_file(root, rel, fs)
    elif (root / rel).is_symlink() or (root / rel).exists():
        (root / rel).unlink()


def read_state(path: Path) -> FileState | None:
    """What is at ``path`` as a FileState (None: nothing, or a directory)."""
    if path.is_symlink():
        return FileState(os.fsencode(os.readlink(path)), link=True)
    if not path.is_file():
        return None
    return FileState(path.read_bytes(), bool(path.stat().st_mode & stat.S_IXUSR))


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


def _patch_ng_one(stage: Path, name: str, item, change: FileChange, before: FileState | None) -> FileState | None:
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
    if change.kind == "delete":
        if not ok or dest.exists() or dest.is_symlink():
            raise DancegrpoError(f"{where}: patch-ng did not delete the file", "report this as an engine bug; the work tree is unchanged")
        return None
    got = _patch_ng_gaps(dest.read_bytes() if dest.is_file() else None, change, before)
    why = check_result(got, before.data if before else b"", change) if got is not None else "it wrote no file"
    if not ok and not (before is not None and before.data == b""):
        why = "; ".join(log.messages[-2:])
    if why:
        detail = why if not ok else f"its output differs from the exact hunks: {why}"
        raise DancegrpoError(f"{where}: patch-ng failed ({detail})", "report this as an engine bug; the work tree is unchanged")
    after = FileState(got, _mode(before, change))
    write_file(stage, change.path, after)
    return after


def _patch_ng_gaps(got: bytes | None, change: FileChange, before: FileState | None) -> bytes | None:
    """patch-ng's output with its known gaps made good, and nothing else:

    - it cannot patch an empty file ("premature end of source file"): the file is then the
      hunks' new lines, which is all a patch of an empty file can say;
    - it drops "\\ No newline at end of file" and ends the file with a newline: where the
      patch leaves the last line without one, that newline goes.
    """
    if before is not None and before.data == b"":
        return b"".join(line for h in change.hunks for line in h.new)
    if got is None:
        return None
    last = change.hunks[-1].new if change.hunks else ()
    if change.no_newline and last and not last[-1].endswith(b"\n"):
        for ending in (b"\r\n", b"\n"):
            if got.endswith(ending):
                return got[: -len(ending)]
    return got


def _ng_path(item) -> str:
    """The repo-relative path of patch-ng's item, by the engine's reading of its names
    (``diffs.dvcs_names``: a plain diff's a/ and b/ are git's)."""
    from dancegrpo_npu.engine.diffs import dvcs_names

    old, new = (None if n == b"/dev/null" else n.decode("utf-8", "surrogateescape") for n in (item.source, item.target))
    name = new if new is not None else old
    if item.type != "git" and dvcs_names(old, new):
        return name[2:]
    return name


def _check_stage(stage: Path, state: dict[str, FileState | None]) -> None:
    """The staging directory holds exactly the expected files and symlinks, byte for byte,
    with their modes."""
    found = set()
    for dirpath, dirs, files in os.walk(stage):
        for name in files + [d for d in dirs if (Path(dirpath) / d).is_symlink()]:
            found.add((Path(dirpath) / name).relative_to(stage).as_posix())
    expected = {p for p, s in state.items() if s is not None}
    stray = sorted(found - expected)
    if stray:
        raise DancegrpoError(f"patch-ng wrote unexpected file(s) while staging: {', '.join(stray[:5])}", "report this as an engine bug; the work tree is unchanged")
    for path in sorted(expected):
        if read_state(stage / path) != state[path]:
            raise DancegrpoError(f"staged {path} differs from the exact result", "report this as an engine bug; the work tree is unchanged")
