"""``dancegrpo-npu rebase``: move the patch series onto another upstream commit.

The series becomes a patch queue (one commit per patch on the locked commit, as
``gbp pq`` does) in a separate checkout, ``<workdir>.rebase``; the user's patched
tree is not touched until the end.  Each patch is re-applied on REF: as is (``git apply``,
which also finds context that moved), else by git's 3-way merge of its queue
commit, file by file, following files upstream renamed (merge3).  A conflict stops
the rebase with markers in that checkout and a report; ``--continue``,
``--skip`` and ``--abort`` go on from there, also after a crash.  At the end
every patch is regenerated against REF, the lock is rewritten, the new series is
verified by applying it from scratch with the engine, and only then are
``patches/`` and ``upstream.lock`` replaced (see rebase_state for the journal);
last, the work tree is moved to REF with the new series applied and verified.
"""

from __future__ import annotations

import datetime
from dataclasses import replace
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitcmd import Git, choose_source, fetch_commit, leave_out_missing, remove_tree, scratch_clone
from dancegrpo_npu.engine.apply import check_head, check_series_fits
from dancegrpo_npu.vcs.gitutil import ls_tree
from dancegrpo_npu.engine.lock import load_lock
from dancegrpo_npu.rebase.queue import (
    JUNK_PATHSPECS, build_queue,
)
from dancegrpo_npu.project import Project
from dancegrpo_npu.rebase.finish import ABSORBED, complete, finish, move_worktree
from dancegrpo_npu.rebase.report import conflict_report, conflicts_in, has_markers, python_problem, short
from dancegrpo_npu.engine.rebase_state import (
    ONTO_REF, RebasePaths, RebaseState, Step, checkpoint, create_state, exclusive, load_state, restore_backup, save_state,
)
from dancegrpo_npu.engine.series import load_series
from dancegrpo_npu.engine.worktree import require_full_series, session
from dancegrpo_npu.rebase.steps import RebaseResult, Stop, commit_step, local_edits, move_patch, paths_for, reset_tree


# --- the loop ---------------------------------------------------------------------


def run_loop(project: Project, paths: RebasePaths, state: RebaseState, main: Git) -> RebaseResult:
    tree = Git(Path(state.tree))
    patches = load_series(paths.backup / "patches")
    while state.current < len(state.names):
        i = state.current
        result = move_patch(tree, patches[i], state.queue[i], state.new_commit)
        if isinstance(result, Stop):
            state = save_state(paths, replace(state, phase="stopped", stop=result.why, conflicts=result.conflicts))
            report = conflict_report(
                tree, paths.index, state, patches[i], conflicts_in(tree), project.workdir, result.why == "empty"
            )
            paths.report.write_text(report, encoding="utf-8")
            what = "conflicts in " + ", ".join(result.conflicts) if result.conflicts else "it makes no change any more"
            return RebaseResult(
                "stopped", report, result.why,
                f"rebase stopped at {patches[i].name}: {what}; resolve in {tree.cwd}, then --continue (or --skip, --abort)",
            )
        checkpoint(f"patch:{i + 1}:committed")
        state = save_state(paths, state.with_step(result))
        checkpoint(f"patch:{i + 1}:recorded")
    state, report, problem = finish(project, paths, state, main)
    return done(project, report, problem)


def done(project: Project, report: str, problem: str) -> RebaseResult:
    """A completed rebase; one whose moved tree has a trainer that fails at import is not a
    silent success: the CLI ends with that line (exit 1)."""
    if not problem:
        return RebaseResult("done", report)
    return RebaseResult(
        "done", report, "imports", problem,
        f"fix it in {project.workdir} and save the fix as a patch (`dancegrpo-npu export NAME`); "
        f"the series before the rebase is kept in {paths_for(project)[1].orig}",
    )


def prepare(project: Project, paths: RebasePaths, state: RebaseState, main: Git) -> RebaseState:
    """``starting``: make the rebase tree and the patch queue (redone from scratch after a kill)."""
    remove_tree(Path(state.tree))
    tree = scratch_clone(main, Path(state.tree), state.old_commit)
    checkpoint("start:clone")
    patches = load_series(paths.backup / "patches")
    queue = build_queue(tree, state.old_commit, patches, paths.index)
    with session(project.workdir):  # an interrupted apply is finished first; no apply meanwhile
        edits = local_edits(main, tree, project, queue[-1] if queue else state.old_commit, state.old_commit, paths.index)
    if edits:
        discard(paths, state, main)
        raise DancegrpoError(
            f"{project.workdir} has edits that are in no patch: {', '.join(edits[:6])}{' ...' if len(edits) > 6 else ''}",
            "save them into the series with `dancegrpo-npu export NAME` (or discard them), then rebase",
        )
    leave_out_missing(tree, state.new_commit)
    tree.run("checkout", "--quiet", "--detach", state.new_commit)
    state = save_state(paths, replace(state, phase="applying", queue=tuple(queue), tip=state.new_commit))
    checkpoint("start:ready")
    return state


def discard(paths: RebasePaths, state: RebaseState, main: Git) -> None:
    """Forget a rebase: its tree, its refs, its state (the project is not touched here)."""
    remove_tree(Path(state.tree))
    main.run("update-ref", "-d", ONTO_REF, check=False)
    remove_tree(paths.state_dir)


def project_of_rebase_tree(directory: Path) -> Project | None:
    """The project whose rebase in progress has its rebase tree at or above ``directory``
    (``--continue``, ``--skip`` and ``--abort`` run from there, where the stop report says to
    resolve): the tree is a clone of the work tree, whose rebase state names the project."""
    top = Git(directory).run("rev-parse", "--show-toplevel", check=False)
    if top.returncode != 0 or not top.text:
        return None
    tree = Path(top.text).resolve()
    origin = Git(tree).run("config", "--get", "remote.origin.url", check=False).text
    workdir = Path(origin) if origin and "://" not in origin else None
    if workdir is None or not (workdir / ".git").exists():
        return None
    state = load_state(RebasePaths(Git(workdir).git_dir(), workdir))
    if state is None or Path(state.tree).resolve() != tree:
        return None
    return Project(root=Path(state.project_root), workdir=Path(state.workdir))


# --- the verbs --------------------------------------------------------------------


def start_rebase(project: Project, onto: str, source: str | None = None) -> RebaseResult:
    main, paths = paths_for(project)
    with exclusive(paths):
        if load_state(paths):
            raise DancegrpoError(
                f"a rebase is already in progress on {project.workdir}",
                "finish it with `dancegrpo-npu rebase --continue`, `--skip` or `--abort`",
            )
        lock = load_lock(project.lock_path)
        patches = load_series(project.patches_dir)
        with session(project.workdir) as (wt, fetched):
            if fetched.kind == "archive":
                raise DancegrpoError(
                    f"{project.workdir} was made from an archive, which has no upstream history",
                    "fetch upstream from git to rebase (`dancegrpo-npu fetch --source URL|DIR`)",
                )
            head = check_head(wt, fetched, lock)  # the work tree stands for the locked commit
            require_full_series(wt, "rebase")
            # a series that does not fit the locked commit cannot be moved from it: the engine's
            # error names the patch and hunk, and what fixes it
            check_series_fits(project, lock, wt.root, ls_tree(wt.root, head))
        if paths.tree.exists():
            raise DancegrpoError(f"{paths.tree} exists but no rebase is in progress", "move it away or delete it, then rebase")
        tree_source = fetched.source
        src = choose_source(source, lock.url)
        fetched = fetch_commit(main, src, onto, ONTO_REF, exact=True)
        if fetched.commit == lock.commit:
            main.run("update-ref", "-d", ONTO_REF, check=False)
            return RebaseResult("nothing", f"the series is already based on {short(lock.commit)} ({onto}); nothing to do\n")
        state = RebaseState(
            phase="starting", project_root=str(project.root), workdir=str(project.workdir), tree=str(paths.tree),
            onto=onto, onto_note=fetched.note, old_commit=lock.commit, new_commit=fetched.commit,
            names=tuple(p.name for p in patches), started=datetime.datetime.now().isoformat(timespec="seconds"),
            source=src, tree_source=tree_source,
        )
        create_state(project, paths, state)
        checkpoint("start:state")
        state = prepare(project, paths, state, main)
        return run_loop(project, paths, state, main)


def _require(paths: RebasePaths, project: Project, need_tree: bool = True) -> RebaseState:
    state = load_state(paths)
    if state is None:
        hint = "start one with `dancegrpo-npu rebase --onto REF`"
        if paths.orig.exists():
            hint += f"; the series before the last completed rebase is in {paths.orig}"
        raise DancegrpoError(f"no rebase is in progress on {project.workdir}", hint)
    if Path(state.project_root) != project.root:
        raise DancegrpoError(
            f"the rebase in progress on {project.workdir} belongs to the project {state.project_root}",
            f"run the command with -C {state.project_root}",
        )
    if need_tree and state.phase in ("applying", "stopped", "finishing") and not (Path(state.tree) / ".git").exists():
        raise DancegrpoError(
            f"the rebase tree {state.tree} is gone, and with it the patches moved so far",
            "run `dancegrpo-npu rebase --abort` (your series and lock are untouched), then start again",
        )
    return state


def resume(project: Project, paths: RebasePaths, state: RebaseState, main: Git) -> RebaseResult:
    """Go on from whatever phase a rebase was left in (after a stop or a kill)."""
    if state.phase == "starting":
        state = prepare(project, paths, state, main)
    elif state.phase == "applying":
        reset_tree(Git(Path(state.tree)), state.tip)
    if state.phase in ("swapping", "done"):
        report = paths.report.read_text(encoding="utf-8") if paths.report.exists() else "rebase completed\n"
        state, notes, problem = complete(project, paths, state, main)
        return done(project, report + "".join(line + "\n" for line in notes), problem)
    if state.phase == "stopped" and state.stop in ("overlay", "verify", "changed"):
        state = replace(state, phase="finishing")
    return run_loop(project, paths, state, main)


def continue_rebase(project: Project) -> RebaseResult:
    main, paths = paths_for(project)
    with exclusive(paths):
        state = _require(paths, project)
        if state.phase == "stopped" and state.stop in ("conflict", "empty"):
            state = take_resolution(paths, state)
        return resume(project, paths, state, main)


def take_resolution(paths: RebasePaths, state: RebaseState) -> RebaseState:
    """The rebase tree as the user left it becomes the current patch's commit."""
    tree = Git(Path(state.tree))
    name = state.names[state.current]
    marked = [f"{p}:{n}" for p in state.conflicts if (n := has_markers(tree.cwd / p))]
    if marked:
        raise DancegrpoError(
            f"conflict markers are still in {', '.join(marked)}",
            f"edit them away in {tree.cwd}, then run `dancegrpo-npu rebase --continue`",
        )
    broken = [p for rel in resolved_files(tree, state.tip) if (p := newly_broken(tree, state.tip, rel))]
    if broken:
        raise DancegrpoError(
            f"the resolution does not compile: {'; '.join(broken[:3])}{' ...' if len(broken) > 3 else ''}",
            f"fix it in {tree.cwd}, then run `dancegrpo-npu rebase --continue` (or --skip, --abort)",
        )
    head = tree.out("rev-parse", "HEAD")
    if head != state.tip:
        if not tree.is_ancestor(state.tip, head):
            raise DancegrpoError(
                f"the rebase tree's HEAD moved off the rebase (it is at {short(head)}, not after {short(state.tip)})",
                f"run `git -C {tree.cwd} reset --soft {state.tip}` to keep your files, then --continue; or --abort",
            )
        tree.run("reset", "--quiet", "--soft", state.tip)  # fold the user's own commits into this patch
    tree.run("add", "--all", "--", ".", *JUNK_PATHSPECS)
    if tree.ok("diff", "--cached", "--quiet", "HEAD"):
        raise DancegrpoError(
            f"the rebase tree holds no change for {name}",
            "make the change the patch should make and --continue, or drop the patch with `dancegrpo-npu rebase --skip`",
        )
    patch = {p.name: p for p in load_series(paths.backup / "patches")}[name]
    commit = commit_step(tree, patch)
    checkpoint(f"patch:{state.current + 1}:committed")
    state = save_state(paths, state.with_step(Step(name, "resolved", "", commit)))
    checkpoint(f"patch:{state.current}:recorded")
    return state


def resolved_files(tree: Git, tip: str) -> list[str]:
    """The files the user's resolution has changed from the last patch moved (tracked or new)."""
    changed = tree.run("diff", "--name-only", "-z", "--no-renames", tip, "--").stdout
    new = tree.run("ls-files", "-z", "--others", "--exclude-standard").stdout
    return sorted({p for p in (changed + new).decode("utf-8", "surrogateescape").split("\0") if p})


def newly_broken(tree: Git, tip: str, rel: str) -> str:
    """Why the resolved Python file ``rel`` does not compile ("" if it does, or is no Python
    file).  A file that did not compile before the resolution either (upstream code for
    another Python, say) is not the resolution's doing, and passes."""
    path = tree.cwd / rel
    if not rel.endswith(".py") or not path.is_file():
        return ""
    problem = python_problem(path.read_bytes(), rel)
    if problem:
        before = tree.run("show", f"{tip}:{rel}", check=False)
        if before.returncode == 0 and python_problem(before.stdout, rel):
            return ""
    return problem


def skip_patch(project: Project) -> RebaseResult:
    main, paths = paths_for(project)
    with exclusive(paths):
        state = _require(paths, project)
        if state.phase != "stopped" or state.stop not in ("conflict", "empty"):
            raise DancegrpoError(
                f"there is no stopped patch to skip (the rebase is {state.phase}{': ' + state.stop if state.stop else ''})",
                "run `dancegrpo-npu rebase --continue` or `--abort`",
            )
        name = state.names[state.current]
        reset_tree(Git(Path(state.tree)), state.tip)
        why = f"no change left: {ABSORBED}; by rebase --skip" if state.stop == "empty" else "by rebase --skip"
        state = save_state(paths, state.with_step(Step(name, "skipped", why)))
        checkpoint("skip:recorded")
        return resume(project, paths, state, main)


def abort_rebase(project: Project) -> RebaseResult:
    main, paths = paths_for(project)
    with exclusive(paths):
        state = _require(paths, project, need_tree=False)
        tree_note = f"{project.workdir} was never touched"
        if state.phase in ("swapping", "done"):
            restore_backup(project, paths.backup, paths.staged)
            checkpoint("abort:restored")
            # the work tree may have been moved already: back to the old commit and series
            moved = [line for line in move_worktree(project, state.tree_source or None) if not line.startswith("next:")]
            tree_note = "the work tree is back as it was:\n" + "".join(f"  {line}\n" for line in moved)
        discard(paths, state, main)
        return RebaseResult(
            "aborted",
            f"rebase aborted: patches/ and upstream.lock are as before (at {short(state.old_commit)}); {tree_note}"
            + ("" if tree_note.endswith("\n") else "\n"),
        )


__all__ = ["start_rebase", "continue_rebase", "skip_patch", "abort_rebase", "RebaseResult"]
