"""git, run as a subprocess, for the history verbs (upstream-log, rebase, export).

Every call gets a fixed identity and neutral settings for what changes git's
output (prefixes, colours, whitespace fixing, hooks, signing), so that the user's
own git configuration cannot leak into a generated patch.  The global
configuration is still read: ``url.<base>.insteadOf`` is how mirrors are used.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.vcs import gitutil
from dancegrpo_npu.errors import DancegrpoError

# gitutil.git runs git (LC_ALL=C, no prompts, GIT_DIR & co. cleared, no CRLF conversion);
# this module adds a fixed identity and the settings below.
IDENTITY = {
    "GIT_AUTHOR_NAME": "dancegrpo-npu",
    "GIT_AUTHOR_EMAIL": "dancegrpo-npu@localhost",
    "GIT_COMMITTER_NAME": "dancegrpo-npu",
    "GIT_COMMITTER_EMAIL": "dancegrpo-npu@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
# Settings that would otherwise change what git writes or run user code.
NEUTRAL_CONFIG = (
    "core.quotepath=true",  # gitutil turns it off; patchqueue.diff_between refuses quoted paths
    "commit.gpgSign=false",
    "apply.whitespace=nowarn",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.external=",
    "color.ui=false",
    "advice.detachedHead=false",
    "merge.conflictStyle=diff3",
    "gc.auto=0",
)
_HEX = re.compile(r"[0-9a-fA-F]{7,40}")


@dataclass(frozen=True)
class GitResult:
    returncode: int
    stdout: bytes
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace").strip()


@dataclass(frozen=True)
class Git:
    """git in one repository; ``index`` selects a private index file (GIT_INDEX_FILE)."""

    cwd: Path
    index: Path | None = None
    objects: Path | None = None  # write new objects here (GIT_OBJECT_DIRECTORY) ...
    alternates: Path | None = None  # ... while reading this repository's as well

    def with_index(self, index: Path | None) -> "Git":
        return Git(self.cwd, index, self.objects, self.alternates)

    def with_objects(self, objects: Path, alternates: Path | None = None) -> "Git":
        """The same repository, but new objects go to ``objects`` (a scratch store)."""
        (objects / "info").mkdir(parents=True, exist_ok=True)
        (objects / "pack").mkdir(exist_ok=True)
        return Git(self.cwd, self.index, objects, alternates)

    def run(self, *args: str, input: bytes | None = None, check: bool = True, hint: str | None = None) -> GitResult:
        extra = dict(IDENTITY)
        if self.index is not None:
            extra["GIT_INDEX_FILE"] = str(self.index)
        if self.objects is not None:
            extra["GIT_OBJECT_DIRECTORY"] = str(self.objects)
            if self.alternates is not None:
                extra["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(self.alternates)
        config = [arg for setting in NEUTRAL_CONFIG for arg in ("-c", setting)]
        proc = gitutil.git(self.cwd, *config, *args, input=input, env=extra, check=False)
        result = GitResult(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))
        if check and proc.returncode != 0:
            raise DancegrpoError(
                f"git {' '.join(args[:3])} failed in {self.cwd}: {last_line(result.stderr) or 'exit ' + str(proc.returncode)}",
                hint or "see the git message; the project was not changed",
            )
        return result

    def out(self, *args: str, input: bytes | None = None, hint: str | None = None) -> str:
        return self.run(*args, input=input, hint=hint).text

    def ok(self, *args: str, input: bytes | None = None) -> bool:
        return self.run(*args, input=input, check=False).returncode == 0

    def commit_of(self, rev: str) -> str | None:
        """The full commit id ``rev`` names here, or None."""
        r = self.run("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False)
        return r.text if r.returncode == 0 and r.text else None

    def git_dir(self) -> Path:
        return Path(self.out("rev-parse", "--absolute-git-dir"))

    def git_path(self, name: str) -> Path:
        p = Path(self.out("rev-parse", "--git-path", name))
        return p if p.is_absolute() else self.cwd / p

    def is_ancestor(self, a: str, b: str) -> bool:
        return self.ok("merge-base", "--is-ancestor", a, b)


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("hint:")]
    errors = [ln for ln in lines if ln.startswith(("error:", "fatal:"))]
    return (errors or lines or [""])[-1]


def open_workdir_repo(workdir: Path) -> Git:
    """The git repository of the upstream work tree, or a clear error."""
    if not workdir.is_dir():
        raise DancegrpoError(
            f"the upstream work tree {workdir} does not exist",
            "run `dancegrpo-npu fetch` first (it brings upstream with its history)",
        )
    git = Git(workdir)
    top = git.run("rev-parse", "--show-toplevel", check=False)
    if top.returncode != 0 or Path(top.text).resolve() != workdir.resolve():
        raise DancegrpoError(
            f"{workdir} is not a git checkout of upstream",
            "run `dancegrpo-npu fetch` to make it one (move the directory aside first if it holds your work)",
        )
    return git


def choose_source(cli_source: str | None, lock_url: str) -> str:
    """Where upstream history comes from: --source, then DANCEGRPO_SOURCE, then the lock's URL."""
    source = cli_source or os.environ.get("DANCEGRPO_SOURCE") or lock_url
    if source.endswith((".tar.gz", ".tgz")):
        raise DancegrpoError(
            f"the upstream source {source} is an archive, which has no history",
            "pass a git URL or a local git directory with --source (or DANCEGRPO_SOURCE)",
        )
    if "://" not in source and not re.match(r"^[\w.-]+@[\w.-]+:", source):
        path = Path(source).expanduser()
        if path.exists():
            return str(path.resolve())
    return source


def default_branch(git: Git, source: str) -> str:
    """The remote's default branch (what its HEAD points to), e.g. ``main``."""
    r = git.run("ls-remote", "--symref", source, "HEAD", check=False)
    if r.returncode == 0:
        for line in r.stdout.decode("utf-8", "replace").splitlines():
            m = re.match(r"ref:\s+refs/heads/(\S+)\s+HEAD", line)
            if m:
                return m.group(1)
    local = git.run("symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD", check=False)
    if local.returncode == 0 and local.text:
        return local.text
    raise DancegrpoError(
        f"cannot tell the default branch of {source}: {last_line(r.stderr) or 'no HEAD'}",
        "name the upstream branch, tag or commit explicitly (e.g. `main`), or pass --source URL|DIR",
    )


@dataclass(frozen=True)
class Fetched:
    commit: str
    ref: str  # what was asked for
    note: str  # how it was found, for the report


def fetch_commit(git: Git, source: str, ref: str, keep_as: str, exact: bool = False) -> Fetched:
    """Bring upstream ``ref`` into ``git``'s repository and hold it under ``keep_as``.

    A full commit id already present is used as is (works offline; a full id names one
    commit wherever it is); a short one only where the source holds it.  Otherwise the ref is fetched from ``source``; if that fails, a local
    ref of that name is the fallback, unless ``exact``: a rebase must move onto what the
    source has under that name, so a failed fetch is a refusal, and a revision expression
    (``main~3``) is resolved on the ref fetched from the source, not on a local branch.
    A short commit id is looked up in a source that is a local repository; a remote one
    cannot be asked for it (git fetches a commit only by its full id).
    """
    if _HEX.fullmatch(ref) and len(ref) == 40:  # a short id is only looked up where the source holds it (below)
        commit = git.commit_of(ref)
        if commit:
            git.run("update-ref", keep_as, commit)
            return Fetched(commit, ref, "already present")
    if ref.startswith("-") or not ref.strip():
        raise DancegrpoError(f"{ref!r} is not a branch, tag or commit name", "name an upstream branch, tag or commit id",
                             exit_code=2)
    if any(c in ref for c in " \t\n:~^?*[\\@"):
        if exact:
            return _fetch_expression(git, source, ref, keep_as)
        # A revision expression (main~3, HEAD^) names something local, not a remote ref.
        commit = git.commit_of(ref)
        if not commit:
            raise DancegrpoError(
                f"{ref!r} is not a commit in {git.cwd}",
                "name an upstream branch, tag or commit id (revision expressions are resolved locally)",
            )
        git.run("update-ref", keep_as, commit)
        return Fetched(commit, ref, "resolved locally")
    short = _HEX.fullmatch(ref) and len(ref) < 40
    if short and Path(source).is_dir():
        full = Git(Path(source)).commit_of(ref)
        if full:
            fetched = fetch_commit(git, source, full, keep_as, exact)
            return Fetched(fetched.commit, ref, fetched.note)
    r = git.run("fetch", "--quiet", "--no-tags", source, f"+{ref}:{keep_as}", check=False)
    if r.returncode == 0:
        commit = git.commit_of(keep_as)
        if commit:
            return Fetched(commit, ref, f"fetched from {source}")
    if short:
        raise DancegrpoError(
            f"{ref!r} is a short commit id, which cannot be fetched from {source} (git fetches a commit only by its full id)",
            "give the full 40-hex commit id, or a branch or tag that points to it",
            exit_code=2,
        )
    commit = git.commit_of(ref)
    why = last_line(r.stderr)
    if exact:
        local = (f"; the local {ref!r} ({commit[:12]}) is not used: to move onto it, name it by its full id {commit}"
                 if commit else "")
        raise DancegrpoError(
            f"cannot fetch {ref!r} from {source} ({why}); nothing was changed",
            "check the name (an upstream branch, tag or commit), the source and your network or mirror" + local,
        )
    if commit:
        git.run("update-ref", keep_as, commit)
        return Fetched(commit, ref, f"local ref (fetching it from {source} failed: {why})")
    raise DancegrpoError(
        f"cannot find upstream {ref!r}: fetching it from {source} failed ({why}) "
        f"and it is not a commit in {git.cwd}",
        "check the name (an upstream branch, tag or commit), your network or mirror, or pass --source URL|DIR",
    )


def _fetch_expression(git: Git, source: str, ref: str, keep_as: str) -> Fetched:
    """``NAME~N`` / ``NAME^``...: NAME fetched from ``source``, the rest resolved on it."""
    m = re.fullmatch(r"([^\s:~^?*\[\\@]+)([~^][~^0-9]*)", ref)
    if not m:
        raise DancegrpoError(
            f"{ref!r} is not a branch, tag or commit of {source}",
            "name an upstream branch, tag or commit id, optionally followed by ~N or ^",
            exit_code=2,
        )
    name, suffix = m.groups()
    fetched = fetch_commit(git, source, name, keep_as, exact=True)
    commit = git.commit_of(f"{fetched.commit}{suffix}")
    if not commit:
        raise DancegrpoError(f"{ref!r}: {name} ({fetched.commit[:12]}) has no such ancestor",
                             "name an existing commit", exit_code=2)
    git.run("update-ref", keep_as, commit)
    return Fetched(commit, ref, f"{suffix} of {name}, {fetched.note}")


def copy_sparse_settings(src: Git, dest: Git) -> None:
    """Give ``dest`` the same sparse-checkout patterns as ``src`` (e.g. assets/ left out)."""
    enabled = src.run("config", "--bool", "core.sparseCheckout", check=False).text == "true"
    if not enabled:
        return
    patterns = src.git_path("info/sparse-checkout")
    target = dest.git_path("info/sparse-checkout")
    target.parent.mkdir(parents=True, exist_ok=True)
    if patterns.is_file():
        shutil.copyfile(patterns, target)
    cone = src.run("config", "--bool", "core.sparseCheckoutCone", check=False).text or "false"
    dest.run("config", "core.sparseCheckout", "true")
    dest.run("config", "core.sparseCheckoutCone", cone)


def scratch_clone(src: Git, dest: Path, commit: str) -> Git:
    """A separate checkout of ``commit`` at ``dest`` sharing ``src``'s objects.

    ``clone --shared`` borrows the objects (instant, no copy); the clone has its own
    HEAD, index and configuration, so nothing done in it touches the user's tree.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    Git(dest.parent).run("clone", "--quiet", "--shared", "--no-checkout", str(src.cwd), str(dest))
    clone = Git(dest)
    hooks = clone.git_path("dancegrpo-npu-no-hooks")
    hooks.mkdir(exist_ok=True)
    clone.run("config", "core.hooksPath", str(hooks))
    copy_sparse_settings(src, clone)
    leave_out_missing(clone, commit)
    clone.run("checkout", "--quiet", "--detach", commit)
    return clone


def leave_out_missing(git: Git, commit: str) -> list[str]:
    """Leave the files of ``commit`` whose blobs the repository lacks out of ``git``'s
    checkouts (sparse patterns), before it checks ``commit`` out: git checks such a
    commit out with errors and the files missing, and ``reset --hard`` refuses it.
    The series never touches them (the lock's hashes need their blobs)."""
    missing = gitutil.missing_files(git.cwd, commit)
    gitutil.leave_out_of_checkout(git.cwd, missing)
    return missing


def remove_tree(path: Path) -> None:
    """Remove a directory we created; a rename first so a kill leaves no half-deleted tree in place."""
    if not path.exists() and not path.is_symlink():
        return
    trash = path.with_name(path.name + ".deleting")
    if trash.exists():
        shutil.rmtree(trash)
    os.replace(path, trash)
    shutil.rmtree(trash)
