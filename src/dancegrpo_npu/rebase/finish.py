"""The end of a rebase: regenerate the series, stage it with its lock, verify it from
scratch with the engine, then swap it in (the commit point) and clean up."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from dancegrpo_npu.engine.apply import apply_series_to_dir, apply_worktree
from dancegrpo_npu.engine.stage import touched_files
from dancegrpo_npu.engine.fetch import move_for_rebase
from dancegrpo_npu.engine.status import inspect
from dancegrpo_npu.engine.worktree import WorkTree, display_path, load_applied, load_fetched
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitutil import ls_tree
from dancegrpo_npu.engine.lockfile import compute_files
from dancegrpo_npu.vcs.gitcmd import Git, remove_tree
from dancegrpo_npu.engine.lock import Lock, dump_lock, parse_lock
from dancegrpo_npu.rebase.queue import (
    all_paths, bump_last_update, context_lines, diff_between, entries, files_at, index_abbrev, patch_text, today,
)
from dancegrpo_npu.rebase.imports import check_trainer_imports
from dancegrpo_npu.rebase.report import describe, short
from dancegrpo_npu.engine.rebase_state import (
    DONE_REF, ONTO_REF, ORIG_TREE_REF, REBASED_TREE_REF, RebasePaths, RebaseState, checkpoint, keep_orig, project_changes, save_state, swap_in,
)
from dancegrpo_npu.project import Project
from dancegrpo_npu.engine.series import Patch, load_series
from dancegrpo_npu.engine.stage import OVERLAY_SKIP_DIRS, OVERLAY_SKIP_SUFFIXES, read_state


@dataclass(frozen=True)
class Staged:
    """The regenerated series and lock, as files, before they replace the project's."""

    patches: tuple[tuple[str, bytes], ...]  # (file name, content) in series order
    series_text: str
    lock: Lock
    old_lock: Lock
    rewritten: tuple[str, ...] = ()  # the patches whose diff changed (the others keep their header)
    refreshed: tuple[str, ...] = ()  # kept: the same hunks, only their index lines' blob ids new


def overlay_files(overlay_dir: Path) -> list[str]:
    """Repository-relative paths of the overlay's files (those the engine copies: stage.read_overlay's skip rules)."""
    if not overlay_dir.is_dir():
        return []
    out = []
    for dirpath, dirnames, filenames in os.walk(overlay_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in OVERLAY_SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(OVERLAY_SKIP_SUFFIXES):
                out.append((Path(dirpath) / name).relative_to(overlay_dir).as_posix())
    return out


def new_series_text(old_text: str, dropped: set[str]) -> str:
    """The series file with the dropped patches' lines removed (comments kept)."""
    kept = [ln for ln in old_text.splitlines(keepends=True) if ln.split("#", 1)[0].strip() not in dropped]
    return "".join(kept)


def touched_by(patches: list[Patch]) -> list[str]:
    """Every path the series reads or writes (the engine's reading of the diffs)."""
    return sorted({path for p in patches for path in touched_files(p)})


def regenerate(tree: Git, state: RebaseState, backup: Path, old_lock: Lock) -> Staged:
    """Every kept patch as ``git diff`` between its commit and the one before, on the new base.

    A patch whose diff comes out the same keeps its file byte for byte (its
    ``Last-Update:`` too): a rebase that moves nothing leaves patches/ unchanged, and
    the review of a rebase shows only the patches it really changed.  One whose hunks are the
    same and only its ``index`` lines name other blobs (upstream changed the file elsewhere) is
    kept too: its index lines are refreshed, its header and ``Last-Update:`` stay."""
    old = {p.name: p for p in load_series(backup / "patches")}
    parent, texts, rewritten, refreshed, date = state.new_commit, [], [], [], today()
    for step in state.steps:
        if step.outcome == "skipped":
            continue
        patch = old[step.name]
        diff = diff_between(tree, parent, step.commit, context_lines(patch), patch.name, index_abbrev(patch.diff))
        if diff == patch.diff:
            texts.append((patch.path.name, patch.path.read_bytes()))
        elif without_index_lines(diff) == without_index_lines(patch.diff):
            # the same hunks; only the blob ids of its index lines moved with upstream's files
            texts.append((patch.path.name, patch_text(patch.header_text, diff)))
            refreshed.append(patch.name)
        else:
            texts.append((patch.path.name, patch_text(bump_last_update(patch.header_text, date), diff)))
            rewritten.append(patch.name)
        parent = step.commit
    dropped = {s.name for s in state.steps if s.outcome == "skipped"}  # series entries, as written
    series = new_series_text((backup / "patches" / "series").read_text(encoding="utf-8"), dropped)
    return Staged(tuple(texts), series, old_lock, old_lock, tuple(rewritten), tuple(refreshed))


def without_index_lines(diff: bytes) -> bytes:
    """A diff less its ``index`` lines (blob ids, which change with any change to the file)."""
    out, in_header = [], False
    for line in diff.splitlines(keepends=True):
        if line.startswith(b"diff --git "):
            in_header = True
        elif in_header and line.startswith(b"@@"):
            in_header = False
        if not (in_header and line.startswith(b"index ")):
            out.append(line)
    return b"".join(out)


def stage(paths: RebasePaths, staged: Staged, tree: Git, new_commit: str) -> Staged:
    """Write the new series beside the project (``rebase/new``), with the lock for it."""
    tmp = paths.state_dir / "new.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "patches").mkdir(parents=True)
    for name, data in staged.patches:
        (tmp / "patches" / name).write_bytes(data)
    (tmp / "patches" / "series").write_text(staged.series_text, encoding="utf-8")
    patches = load_series(tmp / "patches")  # checks every regenerated header parses
    files = compute_files(tree.cwd, ls_tree(tree.cwd, new_commit), patches)  # the engine's rule for [files]
    lock = staged.old_lock.with_commit(new_commit, files, None)
    text = dump_lock(lock)
    parse_lock(text, tmp / "upstream.lock")
    (tmp / "upstream.lock").write_text(text, encoding="utf-8")
    if paths.staged.exists():
        shutil.rmtree(paths.staged)
    os.replace(tmp, paths.staged)
    return replace(staged, lock=lock)


def overlay_collisions(tree: Git, state: RebaseState, overlay_dir: Path) -> list[str]:
    """Overlay paths that now exist upstream, each with the commit that added it."""
    upstream = all_paths(tree, state.new_commit)
    lines = []
    for rel in overlay_files(overlay_dir):
        if rel in upstream:
            added = tree.run(
                "log", "--diff-filter=A", "--max-count=1", "--date=short", "--format=%h %ad %s",
                f"{state.old_commit}..{state.new_commit}", "--", rel,
            ).text
            lines.append(f"  overlay/{rel}: now exists upstream" + (f" (added by {added})" if added else ""))
    return lines


def apply_with_engine(git: Git, commit: str, patches: list[Patch], overlay_dir: Path | None, root: Path) -> list[str]:
    """``commit``'s files that the series touches, written under ``root`` and patched there by
    the engine (with the overlay, if given); returns the touched paths."""
    touched = touched_by(patches)
    modes = entries(git, commit, touched)
    for rel, data in files_at(git, commit, touched).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        os.chmod(root / rel, 0o755 if modes[rel].mode == "100755" else 0o644)  # a patch may change the mode
    apply_series_to_dir(root, patches, overlay_dir, upstream_paths=all_paths(git, commit))
    return touched


def verify_staged(tree: Git, state: RebaseState, staged_dir: Path, overlay_dir: Path) -> str:
    """Apply the staged series with the engine to REF's files in a scratch tree; it must give the rebased tree."""
    patches = load_series(staged_dir / "patches")
    with tempfile.TemporaryDirectory(prefix="dancegrpo-npu-verify-") as tmp:
        root = Path(tmp) / "tree"
        root.mkdir()
        overlay = overlay_dir if overlay_dir.is_dir() else None
        touched = apply_with_engine(tree, state.new_commit, patches, overlay, root)
        expected = files_at(tree, state.tip, touched)
        modes = {p: int(e.mode, 8) for p, e in entries(tree, state.tip, touched).items()}
        for rel in touched:
            fs = read_state(root / rel)
            actual = None if fs is None else (fs.git_mode, fs.data)
            if actual != ((modes[rel], expected[rel]) if rel in expected else None):
                raise DancegrpoError(
                    f"verification failed: applying the regenerated series to {short(state.new_commit)} gives "
                    f"another {rel} than the rebased tree",
                    "this is a bug in patch regeneration or in the engine; --abort restores the old series",
                )
        for rel in overlay_files(overlay_dir):
            if (root / rel).read_bytes() != (overlay_dir / rel).read_bytes():
                raise DancegrpoError(f"verification failed: overlay/{rel} was not copied exactly", "report this bug; --abort restores the old series")
    return f"{len(patches)} patches apply exactly (no fuzz) to {short(state.new_commit)}'s files and give the rebased tree"


def lock_changes(old: Lock, new: Lock) -> list[str]:
    lines = [f"  commit {old.commit} -> {new.commit}"]
    for rel in sorted(set(old.files) | set(new.files)):
        a, b = old.files.get(rel), new.files.get(rel)
        if a and b:
            lines.append(f"  {rel}: {'unchanged' if a == b else 'changed upstream'}")
        elif b:
            lines.append(f"  {rel}: newly touched")
        else:
            lines.append(f"  {rel}: no longer touched (or gone upstream)")
    if old.archive_sha256:
        lines.append("  archive_sha256 dropped: it was for the old commit; add the new archive's hash if you use one")
    return lines


def same_repository(a: str, b: str) -> bool:
    """Whether two upstream URLs or directories name the same repository (``.git`` and a
    trailing slash aside)."""
    def norm(x: str) -> str:
        x = x.strip().rstrip("/")
        x = x[:-4] if x.endswith(".git") else x
        if "://" not in x and Path(x).expanduser().exists():
            return str(Path(x).expanduser().resolve())
        return x
    return norm(a) == norm(b)


def url_question(tree: Git, lock_url: str, state: RebaseState) -> list[str]:
    """One line when REF came from another repository than the lock's url, and that one may
    lack it: then `fetch` (on another machine, or after the work tree is gone) would not find
    the locked commit.  Nothing when the lock's repository surely has it: the same source, an
    ancestor of the commit it was locked at, or a local repository that holds it."""
    source, new = state.source, state.new_commit
    if not source or same_repository(source, lock_url):
        return []
    if tree.is_ancestor(new, state.old_commit):
        return []
    local = Path(lock_url).expanduser()
    if "://" not in lock_url and local.is_dir() and Git(local).commit_of(new) == new:
        return []
    where = f'url = "{source}"' if not Path(source).is_dir() else f"url to a repository that has it ({source} is a local one)"
    return [f"  url stays {lock_url}, but {short(new)} ({state.onto}) was fetched from {source}: "
            f"if {lock_url} lacks that commit, set {where} under [upstream] in upstream.lock (fetch reads it)"]


SMOKE_COMMAND = "dancegrpo-npu smoke --trainer {}"


def touched_trainers(root: Path, files: set[str]) -> list[str]:
    """The trainers smoke runs (the registry's, dancegrpo_npu.registry) that ``files`` can break:
    their script, their upstream recipes, or a module the script imports (followed through the tree)."""
    from fnmatch import fnmatch

    from dancegrpo_npu import registry
    found = []
    for name in registry.smoked():
        spec = registry.get(name)
        recipes = [f for f in files if spec.recipe_glob and fnmatch(f, spec.recipe_glob)]
        if recipes or files & imported_files(root, spec.relpath):
            found.append(name)
    return found


def imported_files(root: Path, script: str) -> set[str]:
    """``script`` and every file of the tree it imports, directly or not (packages' __init__.py
    too); what cannot be parsed is a dead end, not an error."""
    import ast

    seen: set[str] = set()
    todo = [script]
    while todo:
        rel = todo.pop()
        if rel in seen or not (root / rel).is_file():
            continue
        seen.add(rel)
        try:
            module = ast.parse((root / rel).read_bytes(), rel)
        except (SyntaxError, ValueError):
            continue
        package = rel.split("/")[:-1]
        for node in ast.walk(module):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1] if node.level <= len(package) + 1 else []
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                names = [prefix] + [f"{prefix}.{a.name}" if prefix else a.name for a in node.names]
            else:
                continue
            for name in filter(None, names):
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    path = "/".join(parts[:i])
                    todo += [f"{path}.py", f"{path}/__init__.py"]
    return seen


def smoke_advice(project: Project, state: RebaseState) -> str:
    """The last line after a rebase that 3-way merged or hand-resolved patches: the smoke of
    each trainer they touch (lines merged outside the conflicts are checked by nobody else)."""
    names = {s.name for s in state.steps if s.outcome in ("merged", "resolved")}
    if not names:
        return ""
    try:
        files = {f for p in load_series(project.patches_dir) if p.name in names for f in touched_files(p)}
    except DancegrpoError:
        return ""
    trainers = touched_trainers(project.workdir, files)
    if not trainers:
        return ""
    return ("next: the merged or hand-resolved patches touch what these trainers run; smoke them: "
            + "; ".join(f"`{SMOKE_COMMAND.format(t)}`" for t in trainers))


def gained_and_left(git: Git, old: str, new: str) -> tuple[str, str]:
    """How many commits ``new`` has that ``old`` lacks, and the other way round (one rev-list)."""
    left, right = git.out("rev-list", "--left-right", "--count", f"{old}...{new}").split()
    return right, left


def summary(state: RebaseState, old_lock: Lock, new_lock: Lock, verified: str, extra: list[str], tree: Git) -> str:
    ahead, behind = gained_and_left(tree, state.old_commit, state.new_commit)
    width = max((len(n) for n in state.names), default=0)
    lines = [
        f"dancegrpo-npu rebase: {short(state.old_commit)} -> {short(state.new_commit)} ({state.onto}: {state.onto_note})",
        f"  upstream: {ahead} commit(s) gained, {behind} commit(s) left behind",
        "Patches:",
        *[f"  {s.name:<{width}}  {describe(s)}" for s in state.steps],
        "upstream.lock:",
        *lock_changes(old_lock, new_lock),
        *url_question(tree, old_lock.url, state),
        f"verified: {verified}",
        *extra,
    ]
    return "\n".join(lines) + "\n"


ABSORBED = "already upstream (absorbed)"


def absorbed_lines(state: RebaseState) -> list[str]:
    """The patches upstream absorbed in part (merged, some hunks already upstream) or whole
    (no change left, dropped): their headers may describe what upstream now does."""
    part = [s.name for s in state.steps if ABSORBED in s.detail and s.outcome != "skipped"]
    whole = [s.name for s in state.steps if ABSORBED in s.detail and s.outcome == "skipped"]
    lines = []
    if part:
        lines.append(f"absorbed by upstream in part: {', '.join(part)}; review the header of each (its Description:"
                     " may still say it makes what upstream now makes)")
    if whole:
        lines.append(f"absorbed by upstream whole, dropped from the series: {', '.join(whole)}")
    return lines


def finish(project: Project, paths: RebasePaths, state: RebaseState, main: Git) -> tuple[RebaseState, str, str]:
    """From ``finishing`` to ``done``: returns the final state, the summary report and the one
    line of a trainer import that fails in the moved tree ("" when none).

    Raises DancegrpoError (after saving a ``stopped`` state and its report) when the
    project changed meanwhile, an overlay path collides, or verification fails;
    ``--continue`` then runs this again.
    """
    tree = Git(Path(state.tree))
    state = save_state(paths, replace(state, phase="finishing", stop=""))
    old_lock = parse_lock((paths.backup / "upstream.lock").read_text(encoding="utf-8"), paths.backup / "upstream.lock")
    changed = project_changes(project, paths.backup)
    if changed:
        raise _stop(paths, state, "changed", f"{', '.join(changed)} changed since the rebase started",
                    "restore them (the rebase's copy is in " + str(paths.backup) + ") and --continue, or --abort")
    collisions = overlay_collisions(tree, state, project.overlay_dir)
    if collisions:
        text = "Overlay files now exist upstream (the overlay only adds files):\n" + "\n".join(collisions) + (
            "\nMove each into a patch against upstream's version (or rename it), then `dancegrpo-npu rebase --continue`.\n"
        )
        paths.report.write_text(text, encoding="utf-8")
        print(text, end="")
        raise _stop(paths, state, "overlay", f"{len(collisions)} overlay path(s) now exist upstream", "see the report above, then --continue")
    staged = stage(paths, regenerate(tree, state, paths.backup, old_lock), tree, state.new_commit)
    checkpoint("finish:staged")
    try:
        verified = verify_staged(tree, state, paths.staged, project.overlay_dir)
    except DancegrpoError as e:
        raise _stop(paths, state, "verify", e.message, e.hint or "--abort restores the old series") from None
    checkpoint("finish:verified")
    kept = len(staged.patches) - len(staged.rewritten)
    extra = [
        f"patches/: {len(staged.rewritten)} rewritten (new diff, Last-Update: {today()})"
        + (f": {', '.join(staged.rewritten)}" if staged.rewritten else "")
        + (f"; {kept} kept byte for byte (same diff)" if not staged.refreshed else
           f"; {kept} kept (same diff and header): {kept - len(staged.refreshed)} byte for byte,"
           f" {len(staged.refreshed)} with only their index lines refreshed: {', '.join(staged.refreshed)}"),
        *absorbed_lines(state),
        f"overlay: {len(overlay_files(project.overlay_dir))} file(s), none exists upstream",
        f"replaced patches/ and upstream.lock; the previous ones are kept in {paths.orig}",
    ]
    report = summary(state, old_lock, staged.lock, verified, extra, tree)
    paths.report.write_text(report, encoding="utf-8")
    state = save_state(paths, replace(state, phase="swapping", orig_tree=orig_tree(main, project.workdir, state)))
    checkpoint("swap:begin")
    state, notes, problem = complete(project, paths, state, main)
    report += "".join(line + "\n" for line in notes)
    return state, report, problem


def orig_tree(main: Git, workdir: Path, state: RebaseState) -> str:
    """The work tree as the rebase found it, as a commit: the previous tree, kept until
    the next rebase as the previous series is."""
    return tree_commit(main, workdir, f"the patched tree before the rebase onto {state.onto}", state.old_commit)


def tree_commit(main: Git, workdir: Path, what: str, fallback_head: str) -> str:
    """The patched work tree (upstream HEAD + what the last apply wrote), as a commit on
    its upstream commit in the tree's repository; its blobs are already there (apply
    writes them), so only trees and a commit are added."""
    wt = WorkTree(workdir)
    fetched, applied = load_fetched(wt), load_applied(wt)
    head = fetched.head if fetched is not None else fallback_head
    lines = []
    for path, want in sorted((applied.files if applied else {}).items()):
        if want is None:
            lines.append(f"0 {'0' * 40}\t{path}")
        elif "link" in want:
            blob = main.out("hash-object", "-w", "--stdin", input=os.fsencode(want["link"]))
            lines.append(f"120000 {blob}\t{path}")
        else:
            lines.append(f"{'100755' if want['exec'] else '100644'} {want['blob']}\t{path}")
    with tempfile.TemporaryDirectory(prefix="dancegrpo-npu-orig-") as tmp:
        g = main.with_index(Path(tmp) / "index")
        g.run("read-tree", head)
        if lines:
            g.run("update-index", "--add", "--remove", "--replace", "--index-info", input=("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
        tree_id = g.out("write-tree", "--missing-ok")  # blobs a mirror lacks (assets/) are only referenced
    series = ", ".join(applied_names(applied)) or "no patches"
    without = f" (without {', '.join(applied.without)})" if applied and applied.without else ""
    message = f"dancegrpo-npu: {what}\n\nupstream {head}; series{without}: {series}\n"
    return main.out("commit-tree", tree_id, "-p", head, "-F", "-", input=message.encode("utf-8"))


def applied_names(applied) -> list[str]:
    return [name for name, _ in applied.patches] if applied else []


def complete(project: Project, paths: RebasePaths, state: RebaseState, main: Git) -> tuple[RebaseState, list[str], str]:
    """Past the commit point: swap the staged files in, keep the previous series and tree,
    move the work tree to the new commit with the new series applied, import every trainer's
    script in it (``rebase.imports``), clean up.  Every step is safe to re-run (``--continue``
    after a kill); returns notes for the report and the one line of a failed import ("")."""
    if state.phase == "swapping":
        swap_in(project, paths.staged, paths.backup)
        state = save_state(paths, replace(state, phase="done"))
        checkpoint("swap:done")
    keep_orig(paths)
    checkpoint("done:orig")
    notes = move_worktree(project, state.source or None)
    if state.orig_tree:
        rebased = tree_commit(main, project.workdir, f"the patched tree after the rebase onto {state.onto}", state.new_commit)
        main.run("update-ref", REBASED_TREE_REF, rebased)
        notes[-1:-1] = [
            f"previous tree: commit {short(state.orig_tree)} ({ORIG_TREE_REF}), kept until the next rebase;"
            f" what the rebase changed in the patched tree: git -C {display_path(project.workdir)} diff {ORIG_TREE_REF} {REBASED_TREE_REF}"
        ]
    imports = check_trainer_imports(project.workdir, load_series(project.patches_dir), main, state.old_commit,
                                    overlay_files(project.overlay_dir))
    notes[-1:-1] = imports.lines()
    smoke = smoke_advice(project, state)
    if smoke:
        notes.append(smoke)
    remove_tree(Path(state.tree))
    if state.orig_tree:
        main.run("update-ref", ORIG_TREE_REF, state.orig_tree)
    main.run("update-ref", DONE_REF, state.new_commit)
    main.run("update-ref", "-d", ONTO_REF, check=False)
    checkpoint("done:tree")
    remove_tree(paths.state_dir)
    return state, notes, imports.problem()


def move_worktree(project: Project, source: str | None = None) -> list[str]:
    """The work tree to the lock's commit, the series and overlay applied, then verified:
    the engine's fetch and apply (journaled, so a kill anywhere is finished by a re-run).
    Local edits are saved first, never lost.  ``source``: where the commit came from, for
    the tree's record.  Returns lines for the report."""
    moved = move_for_rebase(project, source, checkpoint=lambda step: checkpoint(f"move:{step}"))
    checkpoint("done:moved")
    applied = apply_worktree(project, force=True, checkpoint=lambda step: checkpoint(f"apply:{step}"), mid_swap_ok=True)
    checkpoint("done:applied")
    report = inspect(project, mid_swap_ok=True)
    where = display_path(project.workdir)
    lines = [
        f"work tree: {where} is at {short(report.lock.commit)} with {applied.patches} patch(es) and"
        f" {applied.overlay} overlay file(s) applied"
    ]
    for saved in (moved.saved, applied.saved):
        if saved is not None:
            lines.append(f"  local edits in it were saved first: {display_path(saved / 'local-edits.patch')} (copies in files/ beside it)")
    if moved.left_out:
        lines.append(f"  the source lacks {len(moved.left_out)} file(s) of the new commit that the series does not touch;"
                     f" left out of the tree: {', '.join(moved.left_out[:5])}{' ...' if len(moved.left_out) > 5 else ''}")
    if report.exact:
        lines.append(f"verified: {where} is exactly upstream.lock + patches/series + overlay/")
    else:
        why = report.problem or ", ".join(report.differences[:6])
        lines.append(f"NOT verified: {where} differs from upstream.lock + patches/series + overlay/ ({why});"
                     " `dancegrpo-npu status` says more")
    lines.append("next: review `git diff patches/ upstream.lock` and commit them")
    return lines


def _stop(paths: RebasePaths, state: RebaseState, why: str, message: str, hint: str) -> DancegrpoError:
    save_state(paths, replace(state, phase="stopped", stop=why))
    if not paths.report.exists() or why != "overlay":
        paths.report.write_text(f"dancegrpo-npu rebase: stopped before the swap: {message}\n  {hint}\n", encoding="utf-8")
    return DancegrpoError(f"rebase stopped: {message}", hint)

