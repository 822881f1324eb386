"""``dancegrpo-npu apply``: the series, then the overlay, onto the fetched work tree,
atomically.

The series is applied to a staging copy (pristine files from git HEAD) by
``stage.build``; only when every patch and the overlay succeeded are the files
swapped into the work tree, through the write-ahead journal of ``worktree``.  On any
failure the work tree is byte-identical to before.  Local edits are never lost:
apply refuses while there are any, and ``--force`` saves them first.

For the rebase helper: ``apply_series_to_dir`` (exact, path-checked, in place, on a
scratch tree) and ``touched_files``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.engine.edits import Edit, find_edits, save_edits, target_states
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitutil import TreeEntry, cat_blobs, hash_files, ls_tree, missing_objects, rev_parse
from dancegrpo_npu.engine.lock import Lock, load_lock, sha256_bytes
from dancegrpo_npu.engine.lockfile import check_series_against_lock, verify_files
from dancegrpo_npu.project import Project
from dancegrpo_npu.engine.series import Patch, load_series, select_without, series_sha256
from dancegrpo_npu.engine.stage import (
    Built,
    FileState,
    Upstream,
    build,
    parent_dirs,
    read_overlay,
    read_state,
    write_file,
)
from dancegrpo_npu.engine.worktree import (
    Applied,
    Checkpoint,
    Fetched,
    WorkTree,
    _no_checkpoint,
    commit_journal,
    load_applied,
    matches,
    new_staging,
    session,
    shorten,
)

__all__ = ["apply_series_to_dir", "touched_files", "apply_worktree", "ApplyOutcome"]


@dataclass(frozen=True)
class ApplyOutcome:
    noop: bool
    changed: tuple[str, ...]  # paths written or removed in the work tree
    patches: int
    overlay: int
    saved: Path | None  # where local edits were saved (--force)
    untracked: tuple[str, ...]  # untracked files left alone
    without: tuple[str, ...] = ()  # patches of the series left out (--without)
    moved: tuple[str, ...] = ()  # hunks of later patches placed off their stated lines (--without)


# --- what the series applies to -------------------------------------------------------


def upstream_from_git(root: Path, tree: dict[str, TreeEntry]) -> Upstream:
    """Upstream as git HEAD of the work tree has it (never the possibly patched files)."""
    links = {p: e.blob for p, e in tree.items() if e.mode == "120000"}
    targets = cat_blobs(root, list(links.values()))
    symlinks = {p: targets[b].decode("utf-8", "surrogateescape") for p, b in links.items()}

    def read(paths: list[str]) -> dict[str, FileState]:
        regular = [p for p in paths if p in tree and tree[p].mode != "120000"]
        blobs = cat_blobs(root, [tree[p].blob for p in regular])
        return {p: FileState(blobs[tree[p].blob], tree[p].mode == "100755") for p in regular}

    return Upstream(frozenset(tree), symlinks, read)


def check_series_fits(project: Project, lock: Lock, root: Path, tree: dict[str, TreeEntry], recorded: bool = True) -> None:
    """The series and the overlay build exactly on ``tree`` (a commit in the work tree's
    repository, whose files ``lock`` records: with ``recorded``, every file the series touches),
    else the engine's error naming the patch."""
    patches = load_series(project.patches_dir)
    if recorded:
        check_series_against_lock(lock, patches, tree, root)
    else:
        verify_files(root, tree, lock)
    build(upstream_from_git(root, tree), patches, read_overlay(project.overlay_dir), None)


def upstream_from_dir(root: Path, upstream_paths: set[str] | None = None) -> Upstream:
    """Upstream as the files of a directory (a scratch checkout); .git is skipped."""
    paths: set[str] = set()
    symlinks: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        if base == root and ".git" in dirnames:
            dirnames.remove(".git")
        for name in dirnames + filenames:
            full = base / name
            rel = full.relative_to(root).as_posix()
            if full.is_symlink():
                symlinks[rel] = os.readlink(full)
                paths.add(rel)
            elif name in filenames:
                paths.add(rel)
    if upstream_paths is not None:
        paths |= set(upstream_paths)

    def read(wanted: list[str]) -> dict[str, FileState]:
        out = {}
        for p in wanted:
            fs = read_state(root / p)
            if fs is not None and not fs.link:
                out[p] = fs
        return out

    return Upstream(frozenset(paths), symlinks, read)


def overlay_sha256(overlay: dict[str, FileState]) -> str:
    h = hashlib.sha256()
    for rel in sorted(overlay):
        h.update(f"{rel}\0{int(overlay[rel].executable)}\0{sha256_bytes(overlay[rel].data)}\n".encode())
    return h.hexdigest()


def check_head(wt: WorkTree, fetched: Fetched, lock: Lock) -> str:
    """HEAD of the work tree, which must stand for the locked commit."""
    head = rev_parse(wt.root, "HEAD")
    if fetched.commit != lock.commit or head != fetched.head:
        at = fetched.commit if head == fetched.head else head
        raise DancegrpoError(
            f"the work tree is at upstream {str(at)[:12]}, upstream.lock is at {lock.commit[:12]}",
            "run `dancegrpo-npu fetch` to move it to the locked commit",
        )
    return head


def check_assets(fetched: Fetched, paths) -> None:
    if fetched.with_assets:
        return
    for rel in paths:
        if rel.split("/", 1)[0] == "assets":
            raise DancegrpoError(
                f"the series or overlay writes {rel}, but the work tree was fetched without assets/",
                "run `dancegrpo-npu fetch --with-assets`",
            )


# --- apply onto the work tree ----------------------------------------------------------


def apply_worktree(
    project: Project,
    force: bool = False,
    checkpoint: Checkpoint = _no_checkpoint,
    mid_swap_ok: bool = False,
    without: tuple[str, ...] = (),
) -> ApplyOutcome:
    """Apply the series and overlay to the work tree.  ``without``: patches of the series
    to leave out (an ablation; the lock's hashes still apply; a plain apply restores the
    full series).  ``mid_swap_ok``: for the rebase itself, which applies the new series
    once it has replaced the old one."""
    lock = load_lock(project.lock_path)  # written atomically: whole even mid-rebase
    with session(project.workdir, checkpoint, mid_swap_ok) as (wt, fetched):  # refused mid-rebase-swap, before the series is read
        series = load_series(project.patches_dir)
        patches, left_out = select_without(series, without)  # an unknown name: refused, nothing touched
        overlay = read_overlay(project.overlay_dir)
        head = check_head(wt, fetched, lock)
        tree = ls_tree(wt.root, head)
        check_series_against_lock(lock, series, tree, wt.root)
        applied = load_applied(wt)
        signature = (head, series_sha256(patches), overlay_sha256(overlay))
        if applied is not None and (applied.head, applied.series_sha256, applied.overlay_sha256) == signature and applied.without == left_out:
            edits = find_edits(wt, applied, tree, set(applied.files))
            if not any(e.blocking for e in edits):
                return ApplyOutcome(True, (), len(patches), len(overlay), None, _untracked(edits), left_out)
        staging = new_staging(wt)
        try:
            return _stage_and_swap(
                wt, fetched, lock, patches, overlay, tree, applied, head, signature, staging, force, checkpoint, left_out, series
            )
        finally:
            if not wt.journal_path.exists():  # failed before the commit point: drop the staging copy
                shutil.rmtree(staging, ignore_errors=True)


def _stage_and_swap(
    wt: WorkTree,
    fetched: Fetched,
    lock: Lock,
    patches: list[Patch],
    overlay: dict[str, FileState],
    tree: dict[str, TreeEntry],
    applied: Applied | None,
    head: str,
    signature: tuple[str, str, str],
    staging: Path,
    force: bool,
    checkpoint: Checkpoint,
    left_out: tuple[str, ...] = (),
    series: list[Patch] | None = None,
) -> ApplyOutcome:
    """Build the series in ``staging``, check for local edits, then swap it in.
    ``series``: the whole series, when ``patches`` leaves ``left_out`` out of it."""
    upstream = upstream_from_git(wt.root, tree)
    try:
        built = build(upstream, patches, overlay, staging / "tree", place=bool(left_out))
    except DancegrpoError as e:
        if not left_out or _fails(upstream, series or [], overlay):
            raise  # the whole series fails too: not for want of the patches left out
        raise needs_left_out(upstream, patches, left_out, e) from None
    check_assets(fetched, built.files)
    old = set(applied.files) if applied else set()
    edits = find_edits(wt, applied, tree, set(built.files) | old, target_states(built.files))
    blocking = [e for e in edits if e.blocking]
    if blocking and not force:
        raise _edits_error(blocking, wt)
    saved = save_edits(wt, blocking, applied, head) if blocking else None
    if saved:
        checkpoint("edits saved")
    targets = _targets(wt, tree, built, staging / "tree", old | {e.path for e in blocking})
    ops = [{"path": p, "want": w} for p, w in targets.items() if not matches(wt.root / p, w)]
    # removals first, deepest first; then writes
    ops.sort(key=lambda op: (op["want"] is not None, -op["path"].count("/") if op["want"] is None else 0, op["path"]))
    record = Applied(
        head=head,
        series_sha256=signature[1],
        overlay_sha256=signature[2],
        patches=tuple((p.name, p.sha256) for p in patches),
        files={p: targets[p] for p in built.files},
        overlay=tuple(sorted(built.overlay)),
        created=tuple(sorted(built.created)),
        without=left_out,
    )
    checkpoint("staged")
    lacking = sorted(p for p, want in targets.items() if want is None and p in tree and p not in built.files)
    commit_journal(wt, staging, ops, record, _prune_dirs(targets, tree), checkpoint, left_out=lacking)
    return ApplyOutcome(
        False, tuple(op["path"] for op in ops), len(patches), len(overlay), saved, _untracked(edits), left_out, built.moved
    )


def _fails(upstream: Upstream, patches: list[Patch], overlay, place: bool = False) -> bool:
    try:
        build(upstream, patches, overlay, None, place)
    except DancegrpoError:
        return True
    return False


def needs_left_out(upstream: Upstream, patches: list[Patch], left_out: tuple[str, ...], error: DancegrpoError) -> DancegrpoError:
    """Why the series without ``left_out`` does not apply: the first patch (or the overlay)
    that no longer applies without them, named, with the engine's own reason."""
    names = ", ".join(left_out)
    culprit = next((p.name for k, p in enumerate(patches) if _fails(upstream, patches[: k + 1], {}, True)), "the overlay")
    leave = f"leave it out too (--without {culprit})" if culprit != "the overlay" else "keep it"
    return DancegrpoError(
        f"apply --without {names}: {culprit} no longer applies without it ({error.message})",
        f"{culprit} needs what {names} changes: {leave}, or apply the full series; nothing was changed",
    )


def _untracked(edits: list[Edit]) -> tuple[str, ...]:
    return tuple(e.path for e in edits if not e.blocking)


def _edits_error(blocking: list[Edit], wt: WorkTree) -> DancegrpoError:
    return DancegrpoError(
        f"local edits in {wt.root} that apply would overwrite: {shorten(blocking)}",
        "keep them by turning them into a patch, revert them, or run `dancegrpo-npu apply --force`"
        " (it saves them as a patch file first)",
    )


def _targets(wt: WorkTree, tree: dict[str, TreeEntry], built: Built, stage: Path, restore: set[str]) -> dict[str, dict | None]:
    """What each path must become: the built files (blobs written to .git), and upstream
    HEAD for paths the last apply or a local edit changed that the series no longer does."""
    present = sorted(p for p, fs in built.files.items() if fs is not None and not fs.link)
    ids = hash_files(wt.root, [stage / p for p in present])
    targets: dict[str, dict | None] = {p: None for p, fs in built.files.items() if fs is None}
    targets.update({p: {"link": os.fsdecode(fs.data)} for p, fs in built.files.items() if fs is not None and fs.link})
    targets.update({p: {"blob": b, "exec": built.files[p].executable} for p, b in zip(present, ids)})  # type: ignore[union-attr]
    back = sorted(p for p in restore if p not in targets)
    lacking = set(missing_objects(wt.root, sorted({tree[p].blob for p in back if p in tree})))
    blobs = cat_blobs(wt.root, [tree[p].blob for p in back if p in tree and tree[p].blob not in lacking])
    for p in back:
        entry = tree.get(p)
        if entry is None or entry.blob in lacking:  # a file fetch left out (the source lacks it): left out again
            targets[p] = None
        elif entry.mode == "120000":
            targets[p] = {"link": blobs[entry.blob].decode("utf-8", "surrogateescape")}
        else:
            dest = stage / p
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(blobs[entry.blob])
            targets[p] = {"blob": entry.blob, "exec": entry.mode == "100755"}
    return targets


def _prune_dirs(targets: dict[str, dict | None], tree: dict[str, TreeEntry]) -> list[str]:
    """Directories that only removed files of ours lived in (deepest first)."""
    dirs = parent_dirs(p for p, want in targets.items() if want is None)
    return sorted(dirs - parent_dirs(tree), key=lambda d: (-d.count("/"), d))


# --- apply onto a scratch tree (for rebase) ----------------------------------------


def apply_series_to_dir(root: Path, patches: list[Patch], overlay_dir: Path | None, upstream_paths: set[str] | None = None) -> None:
    """Apply ``patches`` then ``overlay_dir`` to the files of ``root`` in place: exactly
    (no fuzz), every path checked, nothing written unless all of it applies.  Raises
    DancegrpoError naming the patch, file and hunk.  ``upstream_paths`` adds paths that
    count as upstream's (for the overlay's only-adds rule) beyond the files in ``root``."""
    root = Path(root)
    upstream = upstream_from_dir(root, upstream_paths)
    with tempfile.TemporaryDirectory(prefix="dancegrpo-npu-stage-") as tmp:
        built = build(upstream, patches, read_overlay(overlay_dir), Path(tmp))
    for rel, fs in sorted(built.files.items()):
        dest = root / rel
        if fs is None:
            if dest.is_symlink() or dest.exists():
                dest.unlink()
        else:
            write_file(root, rel, fs)
