"""``rebase --onto REF --dry-run``: the whole rebase in a throw-away directory.

REF is fetched into a temporary clone (the work tree's repository gains nothing),
exactly as the rebase fetches it,
every patch is moved as a real rebase would, a conflict is recorded and the patch
set aside so that later patches are still tried, and a rebase that would go
through is regenerated and verified too.  Nothing of the project changes.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.series import load_series
from dancegrpo_npu.vcs.gitcmd import choose_source, fetch_commit, leave_out_missing, open_workdir_repo, scratch_clone
from dancegrpo_npu.engine.apply import check_head
from dancegrpo_npu.engine.lock import load_lock
from dancegrpo_npu.rebase.queue import build_queue
from dancegrpo_npu.project import Project
from dancegrpo_npu.rebase.steps import RebaseResult, Stop, local_edits, move_patch, reset_tree
from dancegrpo_npu.rebase.finish import (
    gained_and_left, lock_changes, overlay_collisions, regenerate, stage, url_question, verify_staged,
)
from dancegrpo_npu.rebase.report import conflicts_in, describe, short, why_stopped
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
                reset_tree(tree, state.tip)
                result = Step(patch.name, "skipped", f"WOULD STOP: {'conflict' if result.why == 'conflict' else 'no change left'}")
            state = state.with_step(result)
        width = max((len(p.name) for p in patches), default=0)
        gained, left = gained_and_left(tree, lock.commit, fetched.commit)
        lines = [
            f"dancegrpo-npu rebase --dry-run: {short(lock.commit)} -> {short(fetched.commit)} ({onto}: {fetched.note})",
            f"  upstream: {gained} commit(s) gained, {left} left behind",
            "Patches:",
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
                lines += ["", "Later patches that would stop too (tried with the stopped ones left out, so",
                          "some may only conflict because of them):", *stops[1:]]
        ok = not stops and not collisions and not edits
        lines.append(("The rebase would go through. " if ok else "The rebase would stop (see above). ") + "Nothing was changed.")
        report = "\n".join(lines) + "\n"
        if ok:
            return RebaseResult("dry-run", report)
        return RebaseResult(
            "stopped", report, "dry-run",
            f"a rebase onto {onto} would stop: {len(stops)} conflicting patch(es), {len(collisions)} overlay collision(s)"
            + (", local edits" if edits else ""),
        )


__all__ = ["dry_run"]
