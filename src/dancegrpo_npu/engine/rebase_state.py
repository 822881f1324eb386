"""A rebase in progress, on disk, so that it survives a crash or a kill.

Layout, under the work tree's git directory (``<workdir>/.git/dancegrpo-npu/``)::

    rebase.lock          flock: one rebase command at a time on this work tree
    rebase/              exists exactly while a rebase is in progress
      state.json         phase, commits, one step per patch done (rewritten atomically)
      backup/            the series and lock as they were, byte for byte:
        upstream.lock      what --abort restores
        patches/series, patches/<name>.patch ...
      new/               the regenerated series and lock, staged before the swap
      report.txt         the last report shown (the stop reason, or the summary)
    rebase-orig/         after a completed rebase: the previous series and lock
    refs/dancegrpo-npu/rebase-orig   (in the work tree's repository) the previous
                         patched tree as a commit: upstream + series + overlay as the
                         work tree had it before the rebase moved it
    refs/dancegrpo-npu/rebased-tree  the patched tree the rebase left, likewise (so
                         `git diff rebase-orig rebased-tree` reviews a rebase)

The patches are moved in a separate checkout, ``<workdir>.rebase`` (the rebase
tree), where conflicts are resolved; the user's patched tree is not touched until
the series is replaced.  Then, as ``git rebase`` leaves the branch at its new base,
the work tree is moved to the new commit and the new series applied (the engine's
own fetch and apply, with their journals; local edits made meanwhile are saved
first, as ``apply --force`` saves them).

Phases: ``starting`` (tree being made) -> ``applying`` (patch by patch) <->
``stopped`` (waiting for the user) -> ``finishing`` (regenerate, stage, verify)
-> ``swapping`` (the commit point: staged files replace the project's) -> ``done``
(keep the previous series and tree, move the work tree, apply, clean up).  Before
``swapping`` the project and the work tree are untouched; from it on,
``--continue`` rolls forward and ``--abort`` restores the backup (and moves the
work tree back, re-applying the old series).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.files import exclusive as hold, write_atomic
from dancegrpo_npu.project import Project
from dancegrpo_npu.engine.series import load_series

STATE_VERSION = 1
REBASE_PHASES = ("starting", "applying", "stopped", "finishing", "swapping", "done")
ONTO_REF = "refs/dancegrpo-npu/rebase/onto"
DONE_REF = "refs/dancegrpo-npu/rebased-onto"
ORIG_TREE_REF = "refs/dancegrpo-npu/rebase-orig"
REBASED_TREE_REF = "refs/dancegrpo-npu/rebased-tree"


@dataclass(frozen=True)
class Step:
    """What happened to one patch."""

    name: str
    outcome: str  # applied | moved | merged | resolved | skipped
    detail: str = ""
    commit: str = ""  # its commit in the rebase tree ("" when skipped)


@dataclass(frozen=True)
class RebaseState:
    phase: str
    project_root: str
    workdir: str
    tree: str  # the rebase tree (a separate checkout)
    onto: str  # REF as the user gave it
    onto_note: str  # how it was found
    old_commit: str
    new_commit: str
    names: tuple[str, ...]  # the series being moved
    queue: tuple[str, ...] = ()  # its commits on old_commit, one per patch
    tip: str = ""  # the last commit done in the rebase tree
    steps: tuple[Step, ...] = ()
    stop: str = ""  # why it stopped: conflict | empty | overlay | verify | changed
    conflicts: tuple[str, ...] = ()  # files with conflict markers at the stop
    started: str = ""
    orig_tree: str = ""  # the work tree before the rebase, as a commit (set when finishing)
    source: str = ""  # where REF was fetched from (the moved work tree records it)
    tree_source: str = ""  # where the work tree had been fetched from (an abort moves it back)
    version: int = STATE_VERSION

    @property
    def current(self) -> int:
        """Index of the next patch to move."""
        return len(self.steps)

    def with_step(self, step: Step) -> "RebaseState":
        tip = step.commit or self.tip
        return replace(self, steps=self.steps + (step,), tip=tip, stop="", conflicts=(), phase="applying")


@dataclass(frozen=True)
class RebasePaths:
    git_dir: Path
    workdir: Path

    @property
    def base(self) -> Path:
        return self.git_dir / "dancegrpo-npu"

    @property
    def state_dir(self) -> Path:
        return self.base / "rebase"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def backup(self) -> Path:
        return self.state_dir / "backup"

    @property
    def staged(self) -> Path:
        return self.state_dir / "new"

    @property
    def report(self) -> Path:
        return self.state_dir / "report.txt"

    @property
    def index(self) -> Path:
        return self.state_dir / "index"

    @property
    def lock_file(self) -> Path:
        return self.base / "rebase.lock"

    @property
    def orig(self) -> Path:
        return self.base / "rebase-orig"

    @property
    def tree(self) -> Path:
        return self.workdir.with_name(self.workdir.name + ".rebase")


def checkpoint(name: str) -> None:
    """A point where a test may kill the process (DANCEGRPO_NPU_KILL_AT=name): crash testing."""
    if os.environ.get("DANCEGRPO_NPU_KILL_AT") == name:
        os.kill(os.getpid(), 9)


def exclusive(paths: RebasePaths):
    """Hold the rebase lock (released by the kernel if the process dies)."""
    paths.base.mkdir(parents=True, exist_ok=True)
    return hold(paths.lock_file, f"another dancegrpo-npu rebase is running on {paths.workdir}")


def load_state(paths: RebasePaths) -> RebaseState | None:
    if not paths.state_dir.exists():
        return None
    try:
        data = json.loads(paths.state_file.read_text(encoding="utf-8"))
        if data.get("version") != STATE_VERSION or data.get("phase") not in REBASE_PHASES:
            raise ValueError(f"version {data.get('version')}, phase {data.get('phase')}")
        data["steps"] = tuple(Step(**s) for s in data.get("steps", ()))
        for key in ("names", "queue", "conflicts"):
            data[key] = tuple(data.get(key, ()))
        return RebaseState(**data)
    except (OSError, ValueError, TypeError) as e:
        raise DancegrpoError(
            f"the rebase state in {paths.state_dir} cannot be read ({e})",
            f"the series before the rebase is in {paths.backup}; restore it by hand and delete {paths.state_dir}",
        ) from None


def save_state(paths: RebasePaths, state: RebaseState) -> RebaseState:
    data = asdict(state)
    write_atomic(paths.state_file, json.dumps(data, indent=1) + "\n")
    return state


def _series_files(patches_dir: Path) -> list[str]:
    """``series`` and the files of the patches it names (file names under patches/)."""
    return ["series"] + [p.path.name for p in load_series(patches_dir)]


def _backup_files(backup: Path) -> list[str]:
    return sorted(os.listdir(backup / "patches"))


def create_state(project: Project, paths: RebasePaths, state: RebaseState) -> None:
    """Back up the series and lock, and record the rebase, in one rename."""
    tmp = paths.base / "rebase.new"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "backup" / "patches").mkdir(parents=True)
    shutil.copy2(project.lock_path, tmp / "backup" / "upstream.lock")
    for name in _series_files(project.patches_dir):
        shutil.copy2(project.patches_dir / name, tmp / "backup" / "patches" / name)
    write_atomic(tmp / "state.json", json.dumps(asdict(state), indent=1) + "\n")
    checkpoint("start:backup")
    os.replace(tmp, paths.state_dir)


def project_changes(project: Project, backup: Path) -> list[str]:
    """Project files (lock, series, patches) that differ from the backup."""
    changed = []
    if project.lock_path.read_bytes() != (backup / "upstream.lock").read_bytes():
        changed.append("upstream.lock")
    try:
        current = set(_series_files(project.patches_dir))
    except DancegrpoError:
        current = {"series"}
    for name in sorted(set(_backup_files(backup)) | current):
        a, b = backup / "patches" / name, project.patches_dir / name
        if not b.exists() or not a.exists() or a.read_bytes() != b.read_bytes():
            changed.append(f"patches/{name}")
    return changed


def swap_in(project: Project, staged: Path, backup: Path) -> None:
    """Replace the project's series and lock with the staged ones (idempotent: re-run after a kill)."""
    new_files = _series_files(staged / "patches")[1:]
    for name in new_files:
        write_atomic(project.patches_dir / name, (staged / "patches" / name).read_bytes())
        checkpoint(f"swap:{name}")
    write_atomic(project.series_path, (staged / "patches" / "series").read_bytes())
    checkpoint("swap:series")
    write_atomic(project.lock_path, (staged / "upstream.lock").read_bytes())
    checkpoint("swap:lock")
    for name in _backup_files(backup):
        if name != "series" and name not in new_files:
            (project.patches_dir / name).unlink(missing_ok=True)


def restore_backup(project: Project, backup: Path, staged: Path) -> None:
    """Put the series and lock back exactly as they were before the rebase."""
    old_files = _backup_files(backup)
    for name in old_files:
        write_atomic(project.patches_dir / name, (backup / "patches" / name).read_bytes())
    write_atomic(project.lock_path, (backup / "upstream.lock").read_bytes())
    if (staged / "patches").is_dir():
        for name in os.listdir(staged / "patches"):
            if name not in old_files:
                (project.patches_dir / name).unlink(missing_ok=True)


def keep_orig(paths: RebasePaths) -> None:
    """Save the replaced series, lock and the report as ``rebase-orig`` (like git's ORIG_HEAD)."""
    tmp = paths.base / "rebase-orig.new"
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(paths.backup, tmp)
    if paths.report.exists():
        shutil.copy2(paths.report, tmp / "report.txt")
    if paths.orig.exists():
        shutil.rmtree(paths.orig)
    os.replace(tmp, paths.orig)


# --- what the engine's other verbs need to know ------------------------------------

SWAP_PHASES = ("swapping", "done")


def rebase_in_progress(workdir: Path) -> RebaseState | None:
    """The rebase in progress on the work tree ``workdir`` (no lock taken; read only)."""
    return load_state(RebasePaths(Path(workdir) / ".git", Path(workdir)))


def what_to_run(state: RebaseState) -> str:
    """The rebase commands that go on from ``state``."""
    if state.phase == "stopped" and state.stop in ("conflict", "empty"):
        return f"resolve it in {state.tree}, then `dancegrpo-npu rebase --continue` (or `--skip` the patch, or `--abort`)"
    return "run `dancegrpo-npu rebase --continue` to finish it, or `dancegrpo-npu rebase --abort` to undo it"


def describe_rebase(workdir: Path) -> str | None:
    """One line for ``status``: the rebase in progress and what to run (None: none)."""
    try:
        state = rebase_in_progress(workdir)
    except DancegrpoError as e:
        return f"a rebase is in progress but its state is damaged ({e.message}); {e.hint}"
    if state is None:
        return None
    where = f"{state.phase}: {state.stop}" if state.stop else state.phase
    if state.phase == "swapping":
        where += ", patches/ and upstream.lock are being replaced"
    elif state.phase == "done":
        where += ", patches/ and upstream.lock are replaced; the work tree is being moved to the new commit"
    return f"a rebase onto {state.onto} ({state.new_commit[:12]}) is in progress ({where}); {what_to_run(state)}"


def refuse_mid_swap(workdir: Path) -> None:
    """Raise while a rebase is replacing the series and lock (its swap phases): they may
    be half old, half new, so no engine verb may read them until it is finished or
    undone.  Before the swap the project is untouched, and nothing is refused."""
    state = rebase_in_progress(workdir)
    if state is not None and state.phase in SWAP_PHASES:
        what = (
            "the series may be half old, half new" if state.phase == "swapping"
            else "the work tree is being moved to the new commit"
        )
        raise DancegrpoError(
            f"a rebase is replacing patches/ and upstream.lock (it is {state.phase}); {what}",
            "run `dancegrpo-npu rebase --continue` to finish it, or `dancegrpo-npu rebase --abort` to undo it",
        )
