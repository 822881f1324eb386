"""``dancegrpo-npu upstream-log [REF]``: what changed upstream since the locked commit.

Lists the upstream commits between the locked commit and REF (default: the
remote's default branch), newest first, and marks those that touch a file the
series patches, naming the patches.  Read it before ``rebase --onto REF``: the
marked commits are where conflicts can come from.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.engine.stage import touched_files
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitcmd import Git, choose_source, default_branch, fetch_commit, open_workdir_repo
from dancegrpo_npu.engine.lock import load_lock
from dancegrpo_npu.project import Project
from dancegrpo_npu.engine.series import Patch, load_series

LOG_REF = "refs/dancegrpo-npu/upstream-log"
_SEP_COMMIT, _SEP_FIELD = "\x1e", "\x1f"


@dataclass(frozen=True)
class FileTouch:
    status: str  # A M D (renames show as D + A)
    path: str
    patches: tuple[str, ...]  # the patches of the series that touch this path


@dataclass(frozen=True)
class UpstreamCommit:
    commit: str
    date: str
    author: str
    subject: str
    in_ref: bool  # False: the lock has it and REF does not (REF is older, or diverged)
    files: tuple[FileTouch, ...]

    @property
    def touches_series(self) -> bool:
        return any(f.patches for f in self.files)


@dataclass(frozen=True)
class UpstreamLog:
    old: str
    new: str
    ref: str
    note: str
    commits: tuple[UpstreamCommit, ...]
    options: str = ""  # what the printed rebase command needs to reach the same commits (-C, --workdir, --source)


def patched_paths(patches: list[Patch]) -> dict[str, tuple[str, ...]]:
    """path -> the patches touching it, in series order (the engine's reading of the diffs)."""
    out: dict[str, list[str]] = {}
    for p in patches:
        for path in touched_files(p):
            out.setdefault(path, []).append(p.name)
    return {k: tuple(v) for k, v in out.items()}


def read_log(git: Git, old: str, new: str, touched: dict[str, tuple[str, ...]]) -> list[UpstreamCommit]:
    fmt = _SEP_COMMIT + _SEP_FIELD.join(("%m", "%H", "%ad", "%an", "%s")) + _SEP_FIELD
    out = git.run(
        "-c", "core.quotePath=false", "log", "--left-right", "--no-renames", "--name-status",
        "--date=short", f"--format={fmt}", f"{old}...{new}",
    ).stdout.decode("utf-8", "replace")
    commits = []
    for record in filter(None, out.split(_SEP_COMMIT)):
        side, commit, date, author, subject, rest = record.split(_SEP_FIELD, 5)
        files = []
        for line in rest.strip("\n").splitlines():
            if "\t" in line:
                status, path = line.split("\t", 1)
                files.append(FileTouch(status[:1], path, touched.get(path, ())))
        commits.append(UpstreamCommit(commit, date, author, subject, side == ">", tuple(files)))
    return commits


def upstream_log(project: Project, ref: str | None = None, source: str | None = None) -> UpstreamLog:
    main = open_workdir_repo(project.workdir)
    lock = load_lock(project.lock_path)
    patches = load_series(project.patches_dir)
    src = choose_source(source, lock.url)
    ref = ref or default_branch(main, src)
    # exactly as the rebase fetches it: a failed fetch is a refusal, never a local ref of that name
    fetched = fetch_commit(main, src, ref, LOG_REF, exact=True)
    if main.commit_of(lock.commit) is None:
        raise DancegrpoError(f"the locked commit {lock.commit[:12]} is not in {project.workdir}", "run `dancegrpo-npu fetch` first")
    commits = read_log(main, lock.commit, fetched.commit, patched_paths(patches))
    options = rerun_options(project, src if source or os.environ.get("DANCEGRPO_SOURCE") else "")
    return UpstreamLog(lock.commit, fetched.commit, ref, fetched.note, tuple(commits), options)


def rerun_options(project: Project, source: str) -> str:
    """The options a printed command needs to run as printed from the current directory: ``-C``
    when that is not the project, ``--workdir`` when the tree is not the default one, and
    ``--source`` when the commits came from another place than the lock's url."""
    from dancegrpo_npu.project import DEFAULT_WORKDIR

    parts = []
    if Path.cwd().resolve() != project.root:
        parts += ["-C", str(project.root)]
    if project.workdir != project.root / DEFAULT_WORKDIR:
        parts += ["--workdir", str(project.workdir)]
    out = " ".join(shlex.quote(p) for p in parts)
    if source:
        out += (" " if out else "") + "--source " + shlex.quote(source)
    return out


def format_log(log: UpstreamLog, touching_only: bool = False) -> str:
    new = [c for c in log.commits if c.in_ref]
    gone = [c for c in log.commits if not c.in_ref]
    hits = [c for c in log.commits if c.touches_series]
    lines = [
        f"upstream-log: {log.old[:12]} (locked) -> {log.new[:12]} ({log.ref}: {log.note})",
        f"{len(new)} new upstream commit(s)"
        + (f", {len(gone)} commit(s) of the locked history not in {log.ref}" if gone else "")
        + f"; {len(hits)} touch files the series patches (marked *)",
    ]
    if not log.commits:
        lines.append(f"nothing to do: {log.ref} is the locked commit")
        return "\n".join(lines) + "\n"
    width = max(len(c.author) for c in log.commits)
    for c in log.commits:
        if touching_only and not c.touches_series:
            continue
        mark = "*" if c.touches_series else " "
        side = "" if c.in_ref else "  [not in REF]"
        lines.append(f"{mark} {c.commit[:10]} {c.date} {c.author:<{width}}  {c.subject}{side}")
        for f in c.files:
            if f.patches:
                lines.append(f"      {f.status} {f.path}  <- {', '.join(f.patches)}")
    options = f" {log.options}" if log.options else ""
    lines.append(f"next: dancegrpo-npu rebase --onto {shlex.quote(log.ref)}{options} --dry-run")
    return "\n".join(lines) + "\n"
