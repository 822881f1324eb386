"""``rebase --onto REF --dry-run``: the whole rebase in a throw-away directory.

REF is fetched into a temporary clone (the work tree's repository gains nothing) exactly
as the rebase fetches it, every patch is moved with the rebase's own steps (``git apply``,
else the same 3-way merge), and a stop is recorded and then stood in for by the
patch's side of each conflict region, so that a later patch that builds on it is tried
as after a resolution that keeps the patch: the count of stops is the rebase's, not
inflated by patches that only fail because an earlier one was left out.  A rebase that
would go through is regenerated and verified too.  Nothing of the project changes.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.series import Patch, load_series
from dancegrpo_npu.vcs.gitcmd import Git, choose_source, fetch_commit, leave_out_missing, open_workdir_repo, scratch_clone
from dancegrpo_npu.engine.apply import check_head
from dancegrpo_npu.engine.lock import load_lock
from dancegrpo_npu.rebase.queue import build_queue
from dancegrpo_npu.project import Project
from dancegrpo_npu.rebase.steps import RebaseResult, Stop, commit_step, local_edits, move_patch, reset_tree
from dancegrpo_npu.rebase.finish import (
    gained_and_left, lock_changes, overlay_collisions, regenerate, stage, url_question, verify_staged,
)
from dancegrpo_npu.rebase.report import conflicts_in, describe, has_markers, short, why_stopped
from dancegrpo_npu.engine.rebase_state import RebasePaths, RebaseState, Step
from dancegrpo_npu.engine.worktree import require_full_series, session


def dry_run(project: Project, onto: str, source: str | None = None) -> RebaseResult:
    main = open_workdir_repo(project.workdir)
    lock = load_lock(project.lock_path)
    patches = load_series(project.patches_dir)
    with session(project.workdir) as (wt, fetched):
        check_head(wt, fetched, lock)
        require_full_series(wt, "rebase")
        if fetched.kind == "archive":
            raise DancegrpoError(f"{project.workdir} was made from an archive, which has no upstream history",
                                 "fetch upstream from git to rebase (`dancegrpo-npu fetch --source URL|DIR`)")
    with tempfile.TemporaryDirectory(prefix="dancegrpo-npu-rebase-dry-") as tmp:
        paths = RebasePaths(Path(tmp), project.workdir)
        paths.state_dir.mkdir(parents=True)
        (paths.backup / "patches").mkdir(parents=True)
        tree = scratch_clone(main, Path(tmp) / "tree", lock.commit)
        src = choose_source(source, lock.url)
        fetched = fetch_commit(tree, src, onto, "refs/dancegrpo-npu/dry-run", exact=True)
        if fetched.commit == lock.commit:
            return RebaseResult("nothing", f"the series is already based on {short(lock.commit)} ({onto}); nothing to do\n")
        queue = build_queue(tree, lock.commit, patches, paths.index)
        with session(project.workdir):
            edits = local_edits(main, tree, project, queue[-1] if queue else lock.commit, lock.commit, paths.index)
        leave_out_missing(tree, fetched.commit)
        tree.run("checkout", "--quiet", "--detach", fetched.commit)
        state = RebaseState(
            phase="applying", project_root=str(project.root), workdir=str(project.workdir), tree=str(tree.cwd),
            onto=onto, onto_note=fetched.note, old_commit=lock.commit, new_commit=fetched.commit,
            names=tuple(p.name for p in patches), queue=tuple(queue), tip=fetched.commit, source=src,
        )
        stops: list[str] = []
        for i, patch in enumerate(patches):
            result = move_patch(tree, patch, queue[i], fetched.commit)
            if isinstance(result, Stop):
                stopped = replace(state, stop=result.why, conflicts=result.conflicts)
                if not stops:
                    why = why_stopped(tree, paths.index, stopped, patch, conflicts_in(tree), project.workdir, result.why == "empty")
                    stops.append("\n".join(why))
                else:
                    what = ", ".join(result.conflicts) if result.conflicts else "no change left"
                    stops.append(f"  {patch.name}: {what}")
                result = stand_in_resolution(tree, patch, state.tip, result)
            state = state.with_step(result)
        width = max((len(p.name) for p in patches), default=0)
        gained, left = gained_and_left(tree, lock.commit, fetched.commit)
        lines = [
            f"dancegrpo-npu rebase --dry-run: {short(lock.commit)} -> {short(fetched.commit)} ({onto}: {fetched.note})",
            f"  upstream: {gained} commit(s) gained, {left} left behind",
            "Patches:" if not stops else "Patches (after a stop, the next ones are tried on the stopped patch's side of each conflict):",
            *[f"  {s.name:<{width}}  {describe(s) if s.outcome != 'skipped' else s.detail}" for s in state.steps],
        ]
        if not patches:
            lines.append("  (the series is empty)")
        if edits:
            lines.append(f"Your patched tree has edits in no patch ({', '.join(edits[:6])}): a rebase would refuse; export them first.")
        collisions = overlay_collisions(tree, state, project.overlay_dir)
        lines += ["Overlay:", *(collisions or ["  no overlay path exists upstream"])]
        url = url_question(tree, lock.url, state)
        if url:
            lines += ["upstream.lock's url:", *url]
        (paths.backup / "patches" / "series").write_bytes(project.series_path.read_bytes())
        for p in patches:
            (paths.backup / "patches" / p.path.name).write_bytes(p.path.read_bytes())
        if not stops:
            staged = stage(paths, regenerate(tree, state, paths.backup, lock), tree, fetched.commit)
            lines += ["upstream.lock would become:", *lock_changes(lock, staged.lock)]
            if not collisions:
                lines.append("verified: " + verify_staged(tree, state, paths.staged, project.overlay_dir))
        else:
            lines += ["", "Where it would stop first:", stops[0]]
            if len(stops) > 1:
                lines += ["", "Later patches that would stop too (each tried after the earlier stops were resolved",
                          "by keeping the patch's side of every conflict; your resolutions may differ):", *stops[1:]]
        ok = not stops and not collisions and not edits
        lines.append(("The rebase would go through. " if ok else "The rebase would stop (see above). ") + "Nothing was changed.")
        report = "\n".join(lines) + "\n"
        if ok:
            return RebaseResult("dry-run", report)
        return RebaseResult(
            "stopped", report, "dry-run",
            f"a rebase onto {onto} would stop at {len(stops)} of {len(patches)} patch(es) for you to resolve "
            f"(the same 3-way merge as the rebase; after each stop the patch's side was kept), "
            f"{len(collisions)} overlay collision(s)" + (", local edits" if edits else ""),
        )


def stand_in_resolution(tree: Git, patch: Patch, tip: str, stop: Stop) -> Step:
    """What the rest of the dry run builds on after a stop: the patch's side of every conflict
    region kept (upstream's lines merged cleanly around them stay), so that a later patch that
    builds on this one finds its lines, as after a real resolution that keeps the patch.  A
    patch that makes no change any more is left out, as ``--skip`` would."""
    label = "WOULD STOP: conflict" if stop.why == "conflict" else "WOULD STOP: no change left"
    if stop.why == "conflict":
        for rel in stop.conflicts:
            path = tree.cwd / rel
            if has_markers(path):
                path.write_bytes(patch_side(path.read_bytes()))
                tree.run("add", "--", rel)
            elif tree.ok("cat-file", "-e", f":3:{rel}"):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(tree.run("show", f":3:{rel}").stdout)
                tree.run("add", "--", rel)
            else:  # the patch deletes it
                tree.run("rm", "-q", "--cached", "--ignore-unmatch", "--", rel)
                path.unlink(missing_ok=True)
        if not tree.ok("diff", "--cached", "--quiet", "HEAD"):
            return Step(patch.name, "skipped", label, commit_step(tree, patch))
    reset_tree(tree, tip)
    return Step(patch.name, "skipped", label)


def patch_side(data: bytes) -> bytes:
    """A file with git's diff3 markers, each region replaced by its patch side."""
    out, side = [], None
    for line in data.splitlines(keepends=True):
        if line.startswith(b"<<<<<<< "):
            side = "upstream"
        elif side and line.startswith(b"||||||| "):
            side = "base"
        elif side and line.rstrip(b"\r\n") == b"=======":
            side = "patch"
        elif side and line.startswith(b">>>>>>> "):
            side = None
        elif side in (None, "patch"):
            out.append(line)
    return b"".join(out)


__all__ = ["dry_run"]
