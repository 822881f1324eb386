"""One patch moved onto the new upstream commit, and the results the rebase and its
dry run share (``rebase.command`` drives the loop, ``rebase.dry_run`` rehearses it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.engine.rebase_state import RebasePaths, Step
from dancegrpo_npu.engine.series import Patch
from dancegrpo_npu.project import Project
from dancegrpo_npu.rebase.finish import ABSORBED, overlay_files
from dancegrpo_npu.rebase.merge import merge_patch
from dancegrpo_npu.rebase.queue import apply_args, changed_files, commit_message, hunks_by_file, single_hunk_patch, snapshot_worktree
from dancegrpo_npu.rebase.report import short
from dancegrpo_npu.vcs.gitcmd import Git, open_workdir_repo


@dataclass(frozen=True)
class RebaseResult:
    status: str  # done | stopped | aborted | nothing | dry-run
    report: str
    stop: str = ""  # conflict | empty (when stopped); imports (done, but a trainer fails at import)
    message: str = ""  # one line for the CLI when stopped, or done with a failed import
    hint: str | None = None


@dataclass(frozen=True)
class Stop:
    why: str  # conflict | empty
    conflicts: tuple[str, ...] = ()


def paths_for(project: Project) -> tuple[Git, RebasePaths]:
    main = open_workdir_repo(project.workdir)
    return main, RebasePaths(main.git_dir(), project.workdir)


# --- moving one patch ------------------------------------------------------------


def move_patch(tree: Git, patch: Patch, queued: str, onto: str) -> Step | Stop:
    """Apply ``patch`` on the rebase tree's HEAD and commit it, or stop."""
    r = tree.run("apply", "--index", "--verbose", *apply_args(patch), "-", input=patch.diff, check=False)
    if r.returncode == 0:
        offsets = [int(x) for x in re.findall(r"\(offset (-?\d+) lines?\)", r.stderr)]
        outcome, detail = ("moved", "by " + ", ".join(f"{o:+d}" for o in offsets) + " lines") if offsets else ("applied", "")
    else:
        labels = (f"upstream {short(onto)}", f"before {patch.name} (what it was written against)", patch.name)
        merged = merge_patch(tree, f"{queued}^", queued, labels)
        if merged.conflicts:
            return Stop("conflict", merged.conflicts)
        outcome = "merged"
        detail = "; ".join(f"{a} is now {b} upstream" for a, b in merged.renamed)
    if tree.ok("diff", "--cached", "--quiet", "HEAD"):
        return Stop("empty")
    if outcome == "merged":
        absorbed = absorbed_hunks(tree, patch)
        if absorbed:
            what = f"{', '.join(absorbed)} {ABSORBED}: review its header"
            detail = f"{detail}; {what}" if detail else what
    return Step(patch.name, outcome, detail, commit_step(tree, patch))


def absorbed_hunks(tree: Git, patch: Patch) -> list[str]:
    """The hunks of ``patch`` that upstream already made: each one, alone, applies in reverse to
    the rebase tree's HEAD (upstream and the patches before this one).  Asked only of a patch
    that did not apply as is, so only when git's 3-way merge took it."""
    index = tree.git_path("dancegrpo-npu-absorbed.index")
    g = tree.with_index(index)
    g.run("read-tree", "HEAD")
    found = []
    for path, hunks in hunks_by_file(patch).items():
        for hunk in hunks:
            if g.ok("apply", "--cached", "--check", "-R", *apply_args(patch), "-", input=single_hunk_patch(patch, hunk)):
                found.append(f"hunk {hunk.number}/{hunk.of} of {path}")
    index.unlink(missing_ok=True)
    return found


def commit_step(tree: Git, patch: Patch) -> str:
    """Commit the index as ``patch`` (plumbing: a sparse checkout lacks some blobs, which
    ``git commit`` would insist on reading; the trees holding them are reused as they are)."""
    staged = tree.out("write-tree", "--missing-ok")
    commit = tree.out("commit-tree", staged, "-p", "HEAD", "-F", "-", input=commit_message(patch))
    tree.run("update-ref", "-m", f"dancegrpo-npu rebase: {patch.name}", "HEAD", commit)
    return commit


def reset_tree(tree: Git, commit: str) -> None:
    """Back to ``commit`` with nothing else in the rebase tree (ours alone; no user work in it)."""
    lock = tree.git_path("index.lock")
    lock.unlink(missing_ok=True)  # left by a git killed with us; we hold the rebase lock
    tree.run("reset", "--quiet", "--hard", commit)
    tree.run("clean", "-fdq")


def local_edits(main: Git, tree: Git, project: Project, queue_tip: str, old_commit: str, index: Path) -> list[str]:
    """Files of the user's patched tree that are neither upstream nor series+overlay."""
    scratch = main.with_objects(tree.git_path("objects"), main.git_path("objects"))
    now = snapshot_worktree(scratch, overlay_files(project.overlay_dir), index)
    if now in (tree.out("rev-parse", f"{queue_tip}^{{tree}}"), tree.out("rev-parse", f"{old_commit}^{{tree}}")):
        return []
    return [f"{c.status} {c.path}" for c in changed_files(tree, queue_tip, now)]
