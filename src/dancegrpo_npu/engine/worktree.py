"""The work tree (default build/DanceGRPO) and the engine's state in its .git.

Layout::

    <workdir>/                      upstream at the locked commit, patched in place
    <workdir>/.git/                 upstream's full history (rebase and upstream-log use it)
    <workdir>/.git/dancegrpo-npu/
        fetched.json                what fetch put there: the commit it stands for, source
        applied.json                what the last apply wrote: path -> git blob id (or deleted),
                                    and the patches it left out (apply --without)
        journal.json                present only while an apply is being swapped in
        staging-*/tree/             the staged files a journal moves into place
        saved/<time>/               local edits saved by ``apply --force``

Apply swaps files in with a write-ahead journal: the staged files and the journal are
written first, the journal is committed by one rename, then every file is moved into
place.  Each step is idempotent, so after a kill at any moment the next engine
command finishes the swap ("rolls the journal forward") and the result is the same.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitutil import blob_id, git, is_git_repo, last_error_line
from dancegrpo_npu.engine.ignored import keep_ignored
from dancegrpo_npu.engine.rebase_state import refuse_mid_swap
from dancegrpo_npu.files import exclusive, write_atomic

STATE_DIRNAME = "dancegrpo-npu"
Checkpoint = Callable[[str], None]


def _no_checkpoint(step: str) -> None:
    pass


@dataclass(frozen=True)
class WorkTree:
    root: Path

    @property
    def state_dir(self) -> Path:
        return self.root / ".git" / STATE_DIRNAME

    @property
    def fetched_path(self) -> Path:
        return self.state_dir / "fetched.json"

    @property
    def applied_path(self) -> Path:
        return self.state_dir / "applied.json"

    @property
    def journal_path(self) -> Path:
        return self.state_dir / "journal.json"

    @property
    def saved_dir(self) -> Path:
        return self.state_dir / "saved"


@dataclass(frozen=True)
class Fetched:
    """fetched.json: the locked commit the tree stands for, and its real HEAD (they
    differ only for a tree made from a .tar.gz, which is committed locally)."""

    commit: str
    head: str
    source: str
    kind: str  # "git" | "archive"
    with_assets: bool
    archive_sha256: str | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Applied:
    """applied.json: what the last apply wrote, to tell local edits from our own."""

    head: str
    series_sha256: str
    overlay_sha256: str
    patches: tuple[tuple[str, str], ...]  # (name, sha256) in order
    files: dict[str, dict | None]  # path -> {"blob": id, "exec": bool} or None (deleted)
    overlay: tuple[str, ...] = ()
    created: tuple[str, ...] = ()
    without: tuple[str, ...] = ()  # patches of the series left out (apply --without), in order

    def to_json(self) -> dict:
        return {
            "version": 1,
            "head": self.head,
            "series_sha256": self.series_sha256,
            "overlay_sha256": self.overlay_sha256,
            "patches": [list(p) for p in self.patches],
            "files": self.files,
            "overlay": list(self.overlay),
            "created": list(self.created),
            "without": list(self.without),
        }

    @staticmethod
    def from_json(data: dict) -> "Applied":
        return Applied(
            head=data["head"],
            series_sha256=data["series_sha256"],
            overlay_sha256=data["overlay_sha256"],
            patches=tuple((n, s) for n, s in data["patches"]),
            files=dict(data["files"]),
            overlay=tuple(data.get("overlay", ())),
            created=tuple(data.get("created", ())),
            without=tuple(data.get("without", ())),
        )


def display_path(path: Path) -> str:
    """A path for messages: relative to the current directory when inside it."""
    try:
        return os.fspath(Path(path).resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return os.fspath(path)


def shorten(items, limit: int = 8) -> str:
    """``items`` for a message: the first ``limit`` joined by commas, then "and N more"."""
    items = [str(i) for i in items]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise DancegrpoError(f"{path} is damaged ({e})", "remove the work tree and run `dancegrpo-npu fetch` again") from None


def write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def load_fetched(wt: WorkTree) -> Fetched | None:
    data = _read_json(wt.fetched_path)
    if data is None:
        return None
    try:
        return Fetched(**data)
    except TypeError:
        raise DancegrpoError(f"{wt.fetched_path} is damaged", "remove the work tree and run `dancegrpo-npu fetch` again") from None


def load_applied(wt: WorkTree) -> Applied | None:
    data = _read_json(wt.applied_path)
    if data is None:
        return None
    try:
        return Applied.from_json(data)
    except (KeyError, TypeError, ValueError):
        raise DancegrpoError(f"{wt.applied_path} is damaged", "run `dancegrpo-npu apply --force` to rewrite it") from None


@contextmanager
def session(
    workdir: Path, checkpoint: Checkpoint = _no_checkpoint, mid_swap_ok: bool = False
) -> Iterator[tuple[WorkTree, Fetched]]:
    """The fetched work tree, held against other engine commands, with any interrupted
    apply finished first (every engine command starts here).

    Refused while a rebase is swapping in a new series and lock (they may be mixed),
    unless ``mid_swap_ok``: for a command that does not read them (status reports the
    rebase instead; fetch checks only when it would move the tree to the lock)."""
    wt = WorkTree(workdir)
    if not is_git_repo(workdir):
        raise DancegrpoError(f"no upstream work tree at {workdir}", "run `dancegrpo-npu fetch` first")
    fetched = load_fetched(wt)
    if fetched is None:
        raise DancegrpoError(
            f"{workdir} is a git checkout that dancegrpo-npu fetch did not make",
            "move it away (or pass another --workdir) and run `dancegrpo-npu fetch`",
        )
    if not mid_swap_ok:
        refuse_mid_swap(workdir)
    with hold(wt):
        if roll_forward(wt, checkpoint):  # a finished move (fetch to a new lock) rewrote fetched.json
            fetched = load_fetched(wt) or fetched
        keep_ignored(wt.root)  # a tree fetched by an older tool gets what is ignored now
        yield wt, fetched


def require_full_series(wt: WorkTree, verb: str) -> None:
    """Refuse ``verb`` (rebase, export: they read the tree as the whole series) on a tree
    made by ``apply --without``: what the left-out patches change would look like edits."""
    applied = load_applied(wt)
    if applied is not None and applied.without:
        raise DancegrpoError(
            f"{display_path(wt.root)} is the series without {', '.join(applied.without)} (apply --without); {verb} needs the whole series",
            "run `dancegrpo-npu apply` there first (it restores the full series), or keep ablations in another --workdir",
        )


@contextmanager
def hold(wt: WorkTree) -> Iterator[None]:
    """An exclusive advisory lock on the work tree's engine state."""
    wt.state_dir.mkdir(parents=True, exist_ok=True)
    with exclusive(wt.state_dir / "lock", f"another dancegrpo-npu command is working on {wt.root}"):
        yield


# --- the journal -------------------------------------------------------------------


def file_state(path: Path) -> tuple[str, object] | None:
    """What is at ``path``: ("file", (blob id, executable)), ("link", target), ("dir", None) or None."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("dir", None)
    return ("file", (blob_id(path.read_bytes()), bool(st.st_mode & stat.S_IXUSR)))


def matches(path: Path, want: dict | None) -> bool:
    """Is ``path`` exactly ``want`` ({"blob", "exec"}, {"link": target}; None: absent)?"""
    have = file_state(path)
    if want is None:
        return have is None
    if "link" in want:
        return have == ("link", want["link"])
    return have == ("file", (want["blob"], bool(want["exec"])))


def _make_parents(root: Path, rel: str) -> None:
    """Make every parent of ``rel`` a real directory, removing a file or symlink in the
    way (only reached for paths the user's edits were saved for, or that we wrote)."""
    current = root
    for part in rel.split("/")[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
        if not current.exists():
            current.mkdir()


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def commit_journal(
    wt: WorkTree,
    staging: Path | None,
    ops: list[dict],
    applied: Applied | None,
    prune_dirs: list[str],
    checkpoint: Checkpoint,
    checkout: Fetched | None = None,
    left_out: list[str] | None = None,
) -> None:
    """Write the journal (the commit point), then carry it out.

    ``ops``: [{"path", "want"}] where want is {"blob", "exec"}, {"link"} or None (absent);
    ``applied``: the new applied.json (None: remove it); ``checkout``: move HEAD there
    (fetch to a new locked commit) and record it as fetched.json; ``left_out``: upstream
    files the ops remove because the clone lacks their blobs, marked left out of the
    checkout again (as fetch left them)."""
    journal = {
        "staging": staging.name if staging else None,
        "ops": ops,
        "applied": applied.to_json() if applied else None,
        "prune_dirs": prune_dirs,
        "checkout": checkout.to_json() if checkout else None,
    }
    if left_out:
        journal["left_out"] = left_out
    write_json(wt.journal_path, journal)
    checkpoint("journal written")
    roll_forward(wt, checkpoint)


def roll_forward(wt: WorkTree, checkpoint: Checkpoint = _no_checkpoint) -> bool:
    """Finish an interrupted apply or fetch (True if there was one); drop abandoned staging."""
    journal = _read_json(wt.journal_path)
    if journal is None:
        _drop_staging(wt)
        return False
    staging = wt.state_dir / journal["staging"] / "tree" if journal.get("staging") else None
    for i, op in enumerate(journal["ops"]):
        rel, want = op["path"], op["want"]
        dest = wt.root / rel
        if not matches(dest, want):
            if want is None:
                _remove(dest)
            elif "link" in want:
                _make_parents(wt.root, rel)
                _remove(dest)
                os.symlink(want["link"], dest)
            else:
                src = staging / rel if staging else None
                if src is None or not src.is_file():
                    raise DancegrpoError(
                        f"cannot finish the interrupted apply: the staged copy of {rel} is gone",
                        f"remove {wt.journal_path} and run `dancegrpo-npu apply --force`",
                    )
                _make_parents(wt.root, rel)
                if dest.is_dir() and not dest.is_symlink():
                    shutil.rmtree(dest)
                os.chmod(src, 0o755 if want["exec"] else 0o644)
                os.replace(src, dest)
        checkpoint(f"op {i} {rel}")
    for rel in journal["prune_dirs"]:  # directories only our files lived in
        try:
            (wt.root / rel).rmdir()
        except OSError:
            pass
    if journal.get("left_out"):  # absent as fetch left them: git status must not call them deleted
        git(wt.root, "update-index", "--skip-worktree", "--", *journal["left_out"])
        checkpoint("left out")
    if journal.get("checkout"):
        moved = Fetched(**journal["checkout"])
        proc = git(wt.root, "checkout", "-q", "-f", "--detach", moved.head, check=False)
        if proc.returncode != 0:
            raise DancegrpoError(
                f"cannot finish moving the work tree to {moved.head[:12]}: {last_error_line(proc.stderr)}",
                f"if no git command is running in {wt.root}, remove its .git/index.lock, then re-run",
            )
        checkpoint("checked out")
        write_json(wt.fetched_path, moved.to_json())
        checkpoint("fetched.json written")
    if journal["applied"] is None:
        wt.applied_path.unlink(missing_ok=True)
    else:
        write_json(wt.applied_path, journal["applied"])
    checkpoint("applied.json written")
    wt.journal_path.unlink()
    checkpoint("journal removed")
    _drop_staging(wt)
    return True


def new_staging(wt: WorkTree) -> Path:
    import tempfile

    wt.state_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=wt.state_dir))
    (staging / "tree").mkdir()
    return staging


def _drop_staging(wt: WorkTree) -> None:
    """Remove what a killed command left before its commit point: staging copies,
    half-written state files, half-saved edits (the saved ones are complete)."""
    if not wt.state_dir.is_dir():
        return
    leftovers = list(wt.state_dir.glob(".*.json.*"))
    if wt.saved_dir.is_dir():
        leftovers += list(wt.saved_dir.glob(".tmp-*"))
    for entry in leftovers:
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink()
    for entry in wt.state_dir.iterdir():
        if entry.name.startswith("staging-"):
            shutil.rmtree(entry, ignore_errors=True)
