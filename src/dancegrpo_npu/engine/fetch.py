"""``dancegrpo-npu fetch``: upstream at the locked commit into the work tree.

Sources, first found wins: ``--source``, ``$DANCEGRPO_SOURCE``, the lock's url.  A
source is a git URL (git's own ``url.<base>.insteadOf`` mirrors apply), a local git
directory, or a ``.tar.gz`` of the tree whose sha256 must equal the lock's
``archive_sha256`` (it is committed locally with a fixed identity and date, and the
engine records that this commit stands for the locked one).

A new work tree is built in a staging directory beside it and renamed into place
only once its commit and every file hash of the lock are verified.  An existing work
tree at the locked commit is left alone (the applied series too).  When the lock has
moved, the tree is moved in place with a journal (so ignored run data in it is
kept), and only if it holds no local edits.  ``assets/`` (large media, prompt files)
is left out with a sparse checkout unless ``--with-assets``.  Files whose blobs the
source lacks are left out too, assets/' included: the rest is checked out, and the
outcome names them.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dancegrpo_npu.engine.edits import Edit, find_edits, save_edits
from dancegrpo_npu.engine.ignored import keep_ignored
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitutil import (
    git, is_git_repo, last_error_line, ls_tree, missing_files, rev_parse, sparse_pattern, sparse_patterns_path,
)
from dancegrpo_npu.engine.lock import Lock, load_lock, sha256_file
from dancegrpo_npu.engine.lockfile import verify_files
from dancegrpo_npu.project import Project
from dancegrpo_npu.engine.rebase_state import refuse_mid_swap
from dancegrpo_npu.engine.stage import parent_dirs
from dancegrpo_npu.files import exclusive
from dancegrpo_npu.engine.worktree import (
    Fetched,
    WorkTree,
    _no_checkpoint,
    commit_journal,
    load_applied,
    load_fetched,
    session,
    shorten,
    write_json,
)

SPARSE_WITHOUT_ASSETS = "/*\n!/assets/\n"
SOURCE_HINT = (
    "check the URL and the network, configure a mirror with git's url.<base>.insteadOf, or pass"
    " --source / DANCEGRPO_SOURCE (a git URL, a git directory or a .tar.gz of the tree)"
)
_IDENTITY = {
    "GIT_AUTHOR_NAME": "dancegrpo-npu", "GIT_AUTHOR_EMAIL": "dancegrpo-npu@localhost",
    "GIT_AUTHOR_DATE": "1970-01-01T00:00:00+0000", "GIT_COMMITTER_NAME": "dancegrpo-npu",
    "GIT_COMMITTER_EMAIL": "dancegrpo-npu@localhost", "GIT_COMMITTER_DATE": "1970-01-01T00:00:00+0000",
}


@dataclass(frozen=True)
class Source:
    kind: str  # "git" | "archive"
    location: str


@dataclass(frozen=True)
class FetchOutcome:
    action: str  # "fetched" | "up to date" | "moved" | "assets added"
    fetched: Fetched
    left_out: tuple[str, ...] = ()  # files the source lacks, left out of the checkout
    saved: Path | None = None  # where local edits were saved before a move (``save_edits``)


def resolve_source(lock: Lock, given: str | None) -> Source:
    location = given or os.environ.get("DANCEGRPO_SOURCE") or lock.url
    path = Path(location).expanduser()
    if location.endswith((".tar.gz", ".tgz")) and "://" not in location:
        if not path.is_file():
            raise DancegrpoError(f"source archive {location} does not exist", SOURCE_HINT, exit_code=2)
        return Source("archive", str(path.resolve()))
    if "://" not in location and not re.match(r"^[\w.-]+@[\w.-]+:", location) and path.exists():
        if not (path / ".git").exists() and not (path / "HEAD").is_file():
            raise DancegrpoError(f"source {location} is neither a git repository nor a .tar.gz", SOURCE_HINT, exit_code=2)
        return Source("git", str(path.resolve()))
    return Source("git", location)


def fetch(
    project: Project,
    source: str | None = None,
    with_assets: bool = False,
    checkpoint=_no_checkpoint,
    say: Callable[[str], None] = lambda line: None,
) -> FetchOutcome:
    """Make ``project.workdir`` upstream at the locked commit; ``say`` gets progress lines."""
    lock = load_lock(project.lock_path)
    src = resolve_source(lock, source)
    workdir = project.workdir
    if workdir.exists() and not (workdir.is_dir() and not any(workdir.iterdir())):
        if not is_git_repo(workdir) or not WorkTree(workdir).fetched_path.is_file():
            raise DancegrpoError(
                f"{workdir} exists and is not a work tree made by dancegrpo-npu fetch",
                "move it away, or pass another --workdir",
            )
        return _update(project, lock, src, with_assets, checkpoint, say)
    say(f"fetching upstream {lock.commit[:12]} from {src.location} ...")
    return _fresh(workdir, lock, src, with_assets)


def _fresh(workdir: Path, lock: Lock, src: Source, with_assets: bool) -> FetchOutcome:
    workdir.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(workdir.parent / f".{workdir.name}.fetch.lock", f"another fetch into {workdir.parent} is running"):
        if workdir.exists() and any(workdir.iterdir()):
            raise DancegrpoError(f"{workdir} appeared while fetching (another fetch?)", "re-run fetch")
        for stale in workdir.parent.glob(f".{workdir.name}.fetch-*"):  # left by a killed fetch
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{workdir.name}.fetch-", dir=workdir.parent))
        try:
            fetched, left_out = _populate(staging, lock, src, with_assets)
            if workdir.is_dir():
                workdir.rmdir()  # an empty directory stood there
            os.rename(staging, workdir)
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise DancegrpoError(f"cannot put the fetched tree at {workdir} ({e})", "check the directory and its permissions") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return FetchOutcome("fetched", fetched, tuple(left_out))


def _populate(staging: Path, lock: Lock, src: Source, with_assets: bool) -> tuple[Fetched, list[str]]:
    """Fill ``staging`` with the verified work tree; return what fetched.json records."""
    if src.kind == "archive":
        git(None, "init", "-q", os.fspath(staging))
        head = _import_archive(staging, Path(src.location), lock, with_assets)
    else:
        proc = git(None, "clone", "-q", "--no-checkout", src.location, os.fspath(staging), check=False)
        if proc.returncode != 0:
            raise DancegrpoError(f"cannot fetch upstream from {src.location}: {last_error_line(proc.stderr)}", SOURCE_HINT)
        head = _find_commit(staging, src, lock.commit)
    verify_files(staging, ls_tree(staging, head), lock)
    left_out = _checkout(staging, head, with_assets)
    fetched = Fetched(lock.commit, head, src.location, src.kind, with_assets, _archive_sha(src, lock))
    write_json(WorkTree(staging).fetched_path, fetched.to_json())
    return fetched, left_out


def _archive_sha(src: Source, lock: Lock) -> str | None:
    return lock.archive_sha256 if src.kind == "archive" else None


def _find_commit(repo: Path, src: Source, commit: str) -> str:
    """The locked commit in ``repo``, fetching it from the source if needed."""
    if rev_parse(repo, commit):
        return commit
    git(repo, "fetch", "-q", src.location, commit, check=False)
    if not rev_parse(repo, commit):
        git(repo, "fetch", "-q", "--tags", src.location, "+refs/heads/*:refs/remotes/origin/*", check=False)
    if not rev_parse(repo, commit):
        raise DancegrpoError(
            f"upstream commit {commit} is not in {src.location}",
            "check upstream.lock's commit, or pass --source with a repository that has it",
        )
    return commit


def set_sparse(repo: Path, rev: str, with_assets: bool) -> list[str]:
    """Write the sparse-checkout patterns for checking out ``rev``: assets/ left out unless
    ``with_assets``, and every file whose blob the source lacks (mirrors and partial
    clones often lack large files: git would check the commit out with errors and the
    file missing, which verify would then report as a local deletion).  Returns those,
    files of assets/ included when it is wanted: the rest of assets/ is checked out, and
    the outcome names what is not (``missing_assets``)."""
    missing = missing_files(repo, rev)
    left_out = [p for p in missing if with_assets or not is_asset(p)]
    sparse = git(repo, "config", "--bool", "core.sparseCheckout", check=False).stdout.decode().strip() == "true"
    if with_assets and not left_out and not sparse:
        return []  # a full checkout, as git makes by default
    git(repo, "config", "core.sparseCheckout", "true")
    git(repo, "config", "core.sparseCheckoutCone", "false")
    target = sparse_patterns_path(repo)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(("/*\n" if with_assets else SPARSE_WITHOUT_ASSETS) + "".join(map(sparse_pattern, left_out)))
    return left_out


def is_asset(path: str) -> bool:
    return path.split("/", 1)[0] == "assets"


def missing_assets(left_out) -> list[str]:
    """The files of assets/ among what a fetch left out because the source lacks them."""
    return [p for p in left_out if is_asset(p)]


def _checkout(repo: Path, rev: str, with_assets: bool) -> list[str]:
    left_out = set_sparse(repo, rev, with_assets)
    proc = git(repo, "checkout", "-q", "-f", "--detach", rev, check=False)
    if proc.returncode != 0 or rev_parse(repo, "HEAD") != rev:
        raise DancegrpoError(
            f"cannot check out upstream {rev[:12]}: {last_error_line(proc.stderr)}",
            "the source lacks some files (mirrors often lack large assets); fetch without --with-assets"
            if with_assets else SOURCE_HINT,
        )
    keep_ignored(repo, rev)  # the weights and run data the tree holds are no edits
    return left_out


def _import_archive(repo: Path, archive: Path, lock: Lock, with_assets: bool) -> str:
    """Commit the tree in ``archive`` into ``repo`` (fixed identity and date); its id."""
    digest = sha256_file(archive)
    if lock.archive_sha256 and digest != lock.archive_sha256:
        raise DancegrpoError(
            f"{archive.name} has sha256 {digest}, upstream.lock's archive_sha256 is {lock.archive_sha256}",
            "use the archive of the locked commit, or fetch from git",
        )
    with tempfile.TemporaryDirectory(prefix="extract-", dir=repo / ".git") as tmp:
        tree_dir = Path(tmp) / "tree"
        _extract(archive, tree_dir, lock, with_assets)
        if not lock.archive_sha256:
            _refuse_unrecorded_archive(archive, digest, tree_dir, lock)
        env = {"GIT_INDEX_FILE": os.fspath(Path(tmp) / "index"), **_IDENTITY}
        work = ["--git-dir", os.fspath(repo / ".git"), "--work-tree", os.fspath(tree_dir)]
        git(tree_dir, *work, "add", "-A", "-f", ".", env=env)
        tree = git(tree_dir, *work, "write-tree", env=env).stdout.decode().strip()
        message = f"upstream {lock.commit} from {archive.name}\n\nsha256 {digest}\n"
        return git(repo, "commit-tree", tree, input=message.encode(), env=env).stdout.decode().strip()


def _refuse_unrecorded_archive(archive: Path, digest: str, tree_dir: Path, lock: Lock) -> None:
    """A lock without archive_sha256 cannot vouch for an archive.  Its [files] can tell one that
    is not upstream at the locked commit at all (a file the series patches missing or
    different): that one is refused as such, since recording its hash would only make the
    lock vouch for the wrong tree.  Otherwise the advice is the hash to record."""
    for rel, want in sorted(lock.files.items()):
        path = tree_dir / rel
        got = sha256_file(path) if path.is_file() and not path.is_symlink() else None
        if got != want:
            what = f"it has no {rel}" if got is None else f"its {rel} is not the file upstream.lock records (sha256 differs)"
            raise DancegrpoError(
                f"{archive.name} is not upstream {lock.commit[:12]}: {what}",
                "use an archive of upstream at the locked commit (`git archive --format=tar.gz "
                f"{lock.commit[:12]}` in a clone), or fetch from git",
            )
    if lock.files:
        hint = (f"it holds the {len(lock.files)} file(s) the series patches as upstream {lock.commit[:12]} has them; "
                f"if it is that commit's archive, add archive_sha256 = \"{digest}\" under [upstream]")
    else:
        hint = f"if this archive is upstream {lock.commit[:12]}, add archive_sha256 = \"{digest}\" under [upstream]"
    raise DancegrpoError(f"upstream.lock has no archive_sha256, so {archive.name} cannot be checked", hint)


def _extract(archive: Path, dest: Path, lock: Lock, with_assets: bool) -> None:
    """Extract safely: no absolute paths, no '..', no links leaving the tree, no devices;
    a single top-level directory (GitHub's archives) is stripped."""
    bad = f"{archive.name} is not a safe archive of the tree"
    try:
        with tarfile.open(archive, "r:gz") as tar:
            comment = tar.pax_headers.get("comment", "")
            if re.fullmatch(r"[0-9a-f]{40}", comment) and comment != lock.commit:
                raise DancegrpoError(f"{archive.name} is an archive of upstream {comment[:12]}, not {lock.commit[:12]}", "use the archive of the locked commit")
            members = [m for m in tar.getmembers() if _member_name(m.name)]
            tops = {_member_name(m.name).split("/", 1)[0] for m in members}
            strip = len(tops) == 1 and all("/" in _member_name(m.name) or m.isdir() for m in members)
            chosen, links = [], set()
            for m in members:
                name = _member_name(m.name)
                if strip:
                    if "/" not in name:
                        continue
                    name = name.split("/", 1)[1]
                parts = name.split("/")
                if m.name.startswith("/") or ".." in parts or "" in parts or ".git" in parts:
                    raise DancegrpoError(f"{bad}: member {m.name!r}", "use a plain archive of the tree (git archive)")
                if not (m.isfile() or m.isdir() or m.issym()):
                    raise DancegrpoError(f"{bad}: {m.name!r} is a hard link or special file", "use a plain archive of the tree (git archive)")
                if any("/".join(parts[:i]) in links for i in range(1, len(parts))):
                    raise DancegrpoError(f"{bad}: {m.name!r} lies under a symlink", "use a plain archive of the tree (git archive)")
                if m.issym():
                    resolved = os.path.normpath(os.path.join(os.path.dirname(name), m.linkname))
                    if m.linkname.startswith("/") or resolved == ".." or resolved.startswith("../"):
                        raise DancegrpoError(f"{bad}: symlink {m.name!r} points out of the tree", "use a plain archive of the tree (git archive)")
                    links.add(name)
                if parts[0] == "assets" and not with_assets:
                    continue
                m.name = name
                m.mode = 0o755 if m.isdir() or (m.mode & 0o100) else 0o644
                m.uid = m.gid = 0
                m.uname = m.gname = ""
                chosen.append(m)
            dest.mkdir(parents=True)
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            for m in chosen:
                tar.extract(m, dest, **safe)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DancegrpoError(f"cannot read {archive.name} ({e})", "use a .tar.gz of the tree (git archive --format=tar.gz)") from None


def _member_name(name: str) -> str:
    """An archive member's path without leading "./" and trailing "/"."""
    while name.startswith("./"):
        name = name[2:]
    return "" if name == "." else name.rstrip("/")


def _update(project: Project, lock: Lock, src: Source, with_assets: bool, checkpoint, say, for_rebase: bool = False) -> FetchOutcome:
    with session(project.workdir, checkpoint, mid_swap_ok=True) as (wt, fetched):
        head = rev_parse(wt.root, "HEAD")
        if head != fetched.head:
            raise DancegrpoError(
                f"HEAD of {wt.root} was moved by hand (it is {str(head)[:12]}; fetch left {fetched.head[:12]})",
                f"check it out again (git -C {wt.root} checkout --detach {fetched.head[:12]}) or move the tree away",
            )
        if fetched.commit == lock.commit:
            verify_files(wt.root, ls_tree(wt.root, head), lock)
            if with_assets and not fetched.with_assets:
                return FetchOutcome("assets added", *_add_assets(wt, fetched))
            return FetchOutcome("up to date", fetched)
        if not for_rebase:
            refuse_mid_swap(wt.root)  # moving to a lock a rebase is still replacing
        say(f"moving the work tree to upstream {lock.commit[:12]} from {src.location} ...")
        if src.kind == "archive":
            new_head = _import_archive(wt.root, Path(src.location), lock, fetched.with_assets)
        else:
            new_head = _find_commit(wt.root, src, lock.commit)
        new_tree = ls_tree(wt.root, new_head)
        if not for_rebase:
            refuse_misfit_move(project, lock, fetched.commit, wt.root, new_tree)
        verify_files(wt.root, new_tree, lock)
        applied = load_applied(wt)
        tree = ls_tree(wt.root, head)
        edits = find_edits(wt, applied, tree, set(applied.files) if applied else set())
        # an untracked file where the new commit has a file (or a directory) would be overwritten
        # by the checkout: as much a local edit as a changed file
        taken = set(new_tree) | parent_dirs(new_tree)
        blocking = [e if e.blocking else Edit(e.path, "in the way", True) for e in edits if e.blocking or e.path in taken]
        saved = None
        if blocking and not for_rebase:
            raise DancegrpoError(
                f"the lock moved to {lock.commit[:12]}, but {wt.root} has local edits: {shorten(blocking)}",
                "turn them into patches (`dancegrpo-npu export`) or revert them, then re-run fetch",
            )
        if blocking:  # a rebase past its commit point moves the tree: keep the edits, as apply --force does
            saved = save_edits(wt, blocking, applied, head)
            checkpoint("edits saved")
        left_out = set_sparse(wt.root, new_head, fetched.with_assets)
        ours = [p for p in (applied.files if applied else {}) if p not in tree]  # files apply created
        ops = [{"path": p, "want": None} for p in sorted(ours, key=lambda p: -p.count("/"))]
        dirs = sorted(parent_dirs(ours), key=lambda d: -d.count("/"))
        moved = Fetched(lock.commit, new_head, src.location, src.kind, fetched.with_assets, _archive_sha(src, lock))
        commit_journal(wt, None, ops, None, dirs, checkpoint, checkout=moved)
        return FetchOutcome("moved", moved, tuple(left_out), saved)


def refuse_misfit_move(project: Project, lock: Lock, old: str, root: Path, new_tree: dict) -> None:
    """Refuse to move the tree to a lock whose commit the series does not fit (its commit
    changed by hand, the patches not moved with it), before anything moves: `apply` would
    then fail at every patch, and `rebase`, which moves a series from the commit it fits,
    would find nothing to do.  A lock that moved together with its series passes."""
    from dancegrpo_npu.engine.apply import check_series_fits

    try:
        check_series_fits(project, lock, root, new_tree, recorded=False)  # a lock moved before `lock` refreshes [files]
    except DancegrpoError as e:
        raise DancegrpoError(
            f"upstream.lock's commit moved from {old[:12]} to {lock.commit[:12]}, but the series is not moved with it "
            f"({e.message}); the work tree was not changed",
            f"to move the series, set upstream.lock's commit back to {old} and run "
            f"`dancegrpo-npu rebase --onto {lock.commit}` (it moves every patch and rewrites the lock)",
        ) from None


def move_for_rebase(project: Project, source: str | None = None, checkpoint=_no_checkpoint) -> FetchOutcome:
    """Move the work tree to the lock a rebase has just swapped in (its commit is already
    in the tree's repository: the rebase fetched it, from ``source``, which the tree then
    records as where it came from).  Unlike ``fetch``, local edits do
    not stop it (the series is already replaced): they are saved first, as
    ``apply --force`` saves them, and the outcome says where."""
    lock = load_lock(project.lock_path)
    fetched = load_fetched(WorkTree(project.workdir))
    source = Source("git", source or (fetched.source if fetched is not None else lock.url))
    return _update(project, lock, source, False, checkpoint, lambda line: None, for_rebase=True)


def _add_assets(wt: WorkTree, fetched: Fetched) -> tuple[Fetched, tuple[str, ...]]:
    """Check assets/ out into a tree fetched without it: what the source has of it (the files
    it lacks are left out, and returned with the other files left out)."""
    if fetched.kind == "archive":
        raise DancegrpoError("the work tree was made from an archive without assets/", "move it away and run `dancegrpo-npu fetch --with-assets`")
    left_out = set_sparse(wt.root, fetched.head, True)
    if left_out:  # files the source lacks (of assets/ too) stay left out
        proc = git(wt.root, "sparse-checkout", "reapply", check=False)
    else:
        proc = git(wt.root, "sparse-checkout", "disable", check=False)
    if proc.returncode != 0:
        raise DancegrpoError(f"cannot add assets/: {last_error_line(proc.stderr)}", "re-run fetch --with-assets")
    updated = Fetched(fetched.commit, fetched.head, fetched.source, fetched.kind, True, fetched.archive_sha256)
    write_json(wt.fetched_path, updated.to_json())
    return updated, tuple(left_out)
