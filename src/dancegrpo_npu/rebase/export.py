"""``dancegrpo-npu export NAME``: turn hand edits in the patched tree into a new patch.

A fix made while debugging on a cluster is never lost and never needs ``diff`` by
hand: the edits to upstream files (changed, new and deleted files) become
``patches/NNNN-NAME.patch``, appended to the series with a DEP-3 header stub, and
upstream.lock gains the hashes of the upstream files it newly touches.  Edits to
overlay files are copied back into ``overlay/``.  Afterwards the patched tree is
exactly lock + series + overlay again, so ``dancegrpo-npu verify`` passes.

Numbers follow the series' order, as ``gbp pq`` writes them (``'%04d-' % position``): a
numbered series (every patch has a number) is renumbered on every export, each patch whose
number is not its position renamed (its file and its line in ``series``; nothing else names
it: upstream.lock holds upstream's files only).  ``export --renumber`` renumbers the whole
series alone, and numbers one that was not numbered.

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
    Patch, format_header, is_numbered, load_series, parse_header, patch_stem, read_series_names, renumbering,
    split_patch,
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
    renamed: tuple[tuple[str, str], ...] = ()  # (old, new) file names of the patches renumbered


def patch_file_name(name: str, existing: list[str]) -> str:
    """``NAME`` as the file name of a patch appended to the series ``existing``: in a
    numbered series ``NNNN-name.patch``, NNNN its position; else ``name.patch``.  A NAME given
    as a file name (``name.patch``, ``NNNN-name.patch``) gives its name."""
    slug = name.strip() if name.endswith(".patch") else re.sub(r"[^A-Za-z0-9._+-]+", "-", name.strip()).strip("-.").lower()
    slug = patch_stem(slug)
    if not slug:
        raise DancegrpoError(f"{name!r} gives no usable patch name", "use letters, digits and dashes, e.g. fix-hccl-timeout",
                             exit_code=2)
    base = f"{len(existing) + 1:04d}-{slug}.patch" if is_numbered(existing) else f"{slug}.patch"
    if not _SAFE.match(base) or base == "series":
        raise DancegrpoError(f"{base!r} is not a plain patch file name", "use letters, digits, dots and dashes", exit_code=2)
    return base


def renumber_series(project: Project) -> tuple[tuple[str, str], ...]:
    """Rename every patch whose number is not its position in ``series`` (``gbp pq``'s
    ``'%04d-' % position``; an unnumbered patch gets its number): its file, then its line in
    ``series``, comments and layout kept.  The (old, new) names; nothing when none drifted.
    Refused, with nothing renamed, while a rebase is in progress (it holds the names) or
    when a new name is a file the series does not list."""
    if project.workdir.exists() and (project.workdir / ".git").exists():
        main = open_workdir_repo(project.workdir)
        if RebasePaths(main.git_dir(), project.workdir).state_dir.exists():
            raise DancegrpoError("a rebase is in progress", "finish it (`dancegrpo-npu rebase --continue`) or --abort it, then renumber")
    names = read_series_names(project.series_path)
    renames = renumbering(names)
    if not renames:
        return ()
    listed = set(names)
    for old, new in renames:
        if new not in listed and (project.patches_dir / new).exists():
            raise DancegrpoError(f"renumbering would rename {old} to {new}, which exists and is not in patches/series",
                                 f"move patches/{new} away (or list it in patches/series), then renumber", exit_code=1)
    load_series(project.patches_dir)  # every listed file is there and readable before any is moved
    for old, _ in renames:  # two steps: a new name may be another patch's old one
        (project.patches_dir / old).rename(project.patches_dir / f".renumber-{old}")
    for old, new in renames:
        (project.patches_dir / f".renumber-{old}").rename(project.patches_dir / new)
    mapping = dict(renames)
    lines = []
    for line in project.series_path.read_text(encoding="utf-8").splitlines(keepends=True):
        entry = line.split("#", 1)[0].strip()
        lines.append(line.replace(entry, mapping[entry], 1) if entry in mapping else line)
    write_atomic(project.series_path, "".join(lines))
    return tuple(renames)


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
    renumber: bool = False,
) -> ExportResult:
    """Export the tree's edits as the patch NAME; then renumber the series when it is numbered
    (or ``renumber``): see the module doc."""
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
    renamed = renumber_series(project) if renumber or is_numbered(read_series_names(project.series_path)) else ()
    if changes and renamed:
        written = project.patches_dir / dict(renamed).get(written.name, written.name)
    note = record_applied(project)  # outside the session: apply opens its own
    notes.append(note.replace("is clean", "lists only the new files left out") if left_out else note)
    files = tuple(f"{c.status} {c.path}" for c in changes)
    return ExportResult(written if changes else None, files, tuple(copied), tuple(notes), tuple(left_out), renamed)


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


__all__ = ["export_edits", "ExportResult", "patch_file_name", "renumber_series"]
