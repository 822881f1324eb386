"""``dancegrpo-npu export NAME``: turn hand edits in the patched tree into a new patch.

A fix made while debugging on a cluster is never lost and never needs ``diff`` by
hand: the edits to upstream files (changed, new and deleted files) become
``patches/NAME.patch``, one line appended to ``series``, with a DEP-3 header stub, and
upstream.lock gains the hashes of the upstream files it newly touches.  Edits to
overlay files are copied back into ``overlay/``.  Afterwards the patched tree is
exactly lock + series + overlay again, so ``dancegrpo-npu verify`` passes.

The order of the series is the lines of ``series``, as quilt's and Debian's: file names carry
no numbers, and an export renames nothing.  A patch that belongs earlier in the series is
exported (appended), then its line is moved in ``series`` and ``apply`` checks it applies
there: one line and one file change, whatever the series' length.

Only files the series or the overlay owns are taken on their own: upstream's files and the
files patches create.  A new file that none of them has (a scratch script, a log) is listed
and left in the tree; ``--include PATH`` takes it into the patch.

The stub's ``Description:`` starts with ``TODO``.  It does not block ``apply``
(the fix must keep working), but it is the first thing to edit before committing.
"""

from __future__ import annotations

import collections
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.engine.apply import apply_worktree, check_head
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitutil import ls_tree
from dancegrpo_npu.vcs.gitcmd import Git, open_workdir_repo
from dancegrpo_npu.engine.lock import load_lock, save_lock
from dancegrpo_npu.files import write_atomic
from dancegrpo_npu.engine.lockfile import compute_files
from dancegrpo_npu.rebase.queue import (
    DEFAULT_CONTEXT, build_queue, changed_files, context_lines, diff_between, index_abbrev,
    patch_text, snapshot_worktree, today,
)
from dancegrpo_npu.project import Project
from dancegrpo_npu.rebase.finish import apply_with_engine, overlay_files
from dancegrpo_npu.engine.rebase_state import RebasePaths
from dancegrpo_npu.engine.series import (
    Patch, format_header, load_series, parse_header, patch_stem, read_series_names, split_patch,
)
from dancegrpo_npu.engine.stage import read_state
from dancegrpo_npu.engine.worktree import require_full_series, session

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class ExportResult:
    patch: Path | None  # None when only overlay files were copied back
    files: tuple[str, ...]  # "M path" lines of the new patch
    overlay: tuple[str, ...]  # overlay files copied back from the tree
    notes: tuple[str, ...]
    left_out: tuple[str, ...] = ()  # new files nothing owns, not asked for with --include


def patch_file_name(name: str, existing: list[str]) -> str:
    """``NAME`` as the file name of a new patch of the series ``existing``: ``name.patch``.
    A NAME given as a file name (``name.patch``) is that file name; a name the series already
    lists is refused."""
    slug = name.strip() if name.endswith(".patch") else re.sub(r"[^A-Za-z0-9._+-]+", "-", name.strip()).strip("-.").lower()
    slug = patch_stem(slug)
    if not slug:
        raise DancegrpoError(f"{name!r} gives no usable patch name", "use letters, digits and dashes, e.g. fix-hccl-timeout",
                             exit_code=2)
    base = f"{slug}.patch"
    if not _SAFE.match(base) or base == "series":
        raise DancegrpoError(f"{base!r} is not a plain patch file name", "use letters, digits, dots and dashes", exit_code=2)
    if base in existing:
        raise DancegrpoError(f"patches/series already lists {base}", "choose another NAME", exit_code=2)
    return base


def stub_header(project: Project, files: list[str], description: str | None) -> str:
    who = Git(project.root)
    name = who.run("config", "user.name", check=False).text
    mail = who.run("config", "user.email", check=False).text
    author = f"{name} <{mail}>" if name and mail else "TODO: Your Name <you@example.com>"
    first = description or "TODO: say in one line what this patch changes"
    why = "TODO: say why it is needed (upstream bug, NPU difference, ...); then delete the TODOs"
    fields = {
        "Description": f"{first}\n{why}\nExported by `dancegrpo-npu export` from edits in: {', '.join(files)}",
        "Author": author,
        "Forwarded": "not-needed\nTODO: why upstream does not need it (or `no` and why it is worth sending, "
                     "or the https:// URL it was sent to: docs/rebasing.md)",
        "Last-Update": today(),
    }
    return format_header(fields)


def series_context(patches: list[Patch]) -> int:
    """The context most patches of the series use (Debian's style: keep it uniform)."""
    counts = collections.Counter(context_lines(p) for p in patches)
    return counts.most_common(1)[0][0] if counts else DEFAULT_CONTEXT


def _included(path: str, include: tuple[str, ...]) -> bool:
    return any(path == inc or path.startswith(inc.rstrip("/") + "/") for inc in include)


def split_untracked(changes, include: tuple[str, ...]) -> tuple[list, list[str]]:
    """(the changes to export, the new files nothing owns that ``include`` does not name).

    A file the tip lacks ("A") is in neither upstream nor the series (overlay files are not
    in the snapshot at all): it is taken only when asked for.  Each ``include`` must name one."""
    include = tuple(inc.strip("/") for inc in include)
    for inc in include:
        if not any(c.status == "A" and _included(c.path, (inc,)) for c in changes):
            raise DancegrpoError(
                f"--include {inc}: the tree has no new file there that the series or the overlay does not own",
                "name a new file (or a directory of them) as `dancegrpo-npu export` lists it, relative to the tree",
                exit_code=2,
            )
    kept = [c for c in changes if c.status != "A" or _included(c.path, include)]
    return kept, [c.path for c in changes if c.status == "A" and not _included(c.path, include)]


def export_edits(
    project: Project,
    name: str,
    description: str | None = None,
    context: int | None = None,
    include: tuple[str, ...] = (),
) -> ExportResult:
    """Export the tree's edits as the patch NAME, appended to the series: see the module doc."""
    main = open_workdir_repo(project.workdir)
    if RebasePaths(main.git_dir(), project.workdir).state_dir.exists():
        raise DancegrpoError("a rebase is in progress", "finish it (`dancegrpo-npu rebase --continue`) or --abort it, then export")
    lock = load_lock(project.lock_path)
    patches = load_series(project.patches_dir)
    names = read_series_names(project.series_path)
    target = project.patches_dir / patch_file_name(name, names)
    overlay = overlay_files(project.overlay_dir)
    # In the engine's session: an interrupted apply is finished first, and none runs meanwhile.
    with session(project.workdir) as (wt, fetched), tempfile.TemporaryDirectory(prefix="dancegrpo-npu-export-") as tmp:
        base = check_head(wt, fetched, lock)  # the locked commit (a local commit for a tree made from an archive)
        require_full_series(wt, "export")
        git = main.with_objects(Path(tmp) / "objects", main.git_path("objects"))
        queue = build_queue(git, base, patches, Path(tmp) / "index")
        tip = queue[-1] if queue else base
        now = snapshot_worktree(git, overlay, Path(tmp) / "index")
        changes, left_out = split_untracked(changed_files(git, tip, now), tuple(include))
        if left_out:  # the patch is made from the tree without them
            now = snapshot_worktree(git, overlay + left_out, Path(tmp) / "index")
        copied, notes = overlay_edits(project, overlay)
        if not changes and not copied:
            untracked = f"; only new files nothing owns: {', '.join(left_out)}" if left_out else ""
            raise DancegrpoError(
                f"nothing to export: {project.workdir} is exactly upstream.lock + patches/series + overlay/{untracked}",
                "pass --include PATH to take a new file into the patch" if left_out
                else "edit files in the patched tree first; `dancegrpo-npu status` lists local edits",
            )
        if changes:
            written = write_patch(project, lock, patches, git, base, tip, now, changes, target, description, context)
        copy_overlay(project, copied)
    note = record_applied(project)  # outside the session: apply opens its own
    notes.append(note.replace("is clean", "lists only the new files left out") if left_out else note)
    files = tuple(f"{c.status} {c.path}" for c in changes)
    return ExportResult(written if changes else None, files, tuple(copied), tuple(notes), tuple(left_out))


def write_patch(
    project: Project, lock, patches: list[Patch], git: Git, base: str, tip: str, now: str, changes, target: Path,
    description: str | None, context: int | None,
) -> Path:
    """The patch from ``tip`` (series applied) to ``now`` (the tree), checked with the engine,
    then written with the lock and, last, its line in the series."""
    if target.exists():
        raise DancegrpoError(f"{target} already exists", "choose another NAME", exit_code=2)
    files = [c.path for c in changes]
    abbrev = collections.Counter(index_abbrev(p.diff) for p in patches).most_common(1)[0][0] if patches else 0
    diff = diff_between(git, tip, now, context if context is not None else series_context(patches), target.name, abbrev)
    data = patch_text(stub_header(project, files, description), diff)
    head, body = split_patch(data, target.name)
    new = Patch(target.name, target, parse_header(head, target.name), head, body)
    check_with_engine(git, base, patches + [new], project.workdir)
    hashes = compute_files(git.cwd, ls_tree(git.cwd, base), patches + [new])  # the engine's rule for [files]
    write_atomic(target, data)
    added = {rel: digest for rel, digest in hashes.items() if rel not in lock.files}
    if added:
        save_lock(lock.with_files({**lock.files, **added}), project.lock_path)
    text = project.series_path.read_text(encoding="utf-8")
    write_atomic(project.series_path, text + ("" if text.endswith("\n") or not text else "\n") + target.name + "\n")
    return target


def record_applied(project: Project) -> str:
    """Let the engine record the tree as applied with the new series (its files are already
    what the series makes), so `status` shows no local edits and `apply` is a no-op.

    A plain apply: files already equal to what it writes are no local edits to it, so it
    neither refuses nor saves a copy; any other edit (made meanwhile) keeps it refusing.
    """
    try:
        outcome = apply_worktree(project)
    except DancegrpoError as e:
        return f"the engine could not record the tree as applied ({e.one_line()})"
    if outcome.changed:  # cannot happen after check_with_engine; say so if it ever does
        return f"apply rewrote {', '.join(outcome.changed)} to what the series makes"
    return "the patched tree is recorded as applied with the new series (`dancegrpo-npu status` is clean)"


def overlay_edits(project: Project, overlay: list[str]) -> tuple[list[str], list[str]]:
    """Overlay files changed in the tree (to copy back), and notes on removed ones."""
    copied, notes = [], []
    for rel in overlay:
        there = project.workdir / rel
        if not there.is_file():
            notes.append(f"overlay/{rel} is missing from the tree; `dancegrpo-npu apply` restores it (delete it from overlay/ if you mean it)")
        elif there.read_bytes() != (project.overlay_dir / rel).read_bytes():
            copied.append(rel)
    return copied, notes


def copy_overlay(project: Project, rels: list[str]) -> None:
    for rel in rels:
        write_atomic(project.overlay_dir / rel, (project.workdir / rel).read_bytes())


def check_with_engine(git: Git, base: str, patches: list[Patch], workdir: Path) -> None:
    """The series with the new patch, applied by the engine to the locked files, must give the tree."""
    with tempfile.TemporaryDirectory(prefix="dancegrpo-npu-export-check-") as tmp:
        root = Path(tmp)
        touched = apply_with_engine(git, base, patches, None, root)
        for rel in touched:
            if read_state(root / rel) != read_state(workdir / rel):
                raise DancegrpoError(
                    f"the exported patch would not reproduce {rel} exactly when applied (nothing was written)",
                    "check the file for a missing final newline or CRLF line ends, which patches cannot carry reliably",
                )


__all__ = ["export_edits", "ExportResult", "patch_file_name"]
