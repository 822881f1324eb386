"""The series as a git patch queue (like ``gbp pq``): one commit per patch.

On top of an upstream commit, each patch of the series becomes a commit whose
message is the patch's DEP-3 header.  git can then move the queue with its 3-way
merge, and every patch is regenerated from two neighbouring commits with
``git diff``: fresh context and line numbers, the same amount of context as
before, the header kept and ``Last-Update:`` set to today when the diff changed
(``rebase.finish.regenerate`` keeps an unchanged patch byte for byte).
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitcmd import Git, last_line
from dancegrpo_npu.vcs.gitutil import TreeEntry, cat_blobs
from dancegrpo_npu.engine.diffs import parse_diff
from dancegrpo_npu.engine.series import Patch

DEFAULT_CONTEXT = 3
TRAILER = "Dancegrpo-Patch"
# Never part of a patch: what running the code leaves in the tree.
JUNK_PATHSPECS = (
    ":(exclude,glob)**/__pycache__/**",
    ":(exclude,glob)**/*.py[co]",
    ":(exclude,glob)**/.ipynb_checkpoints/**",
    ":(exclude,glob)**/.pytest_cache/**",
)


def today() -> str:
    """Today's date for Last-Update; SOURCE_DATE_EPOCH (reproducible builds) wins when set."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.isdigit():
        return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).date().isoformat()
    return datetime.date.today().isoformat()


def strip_level(diff: bytes) -> int:
    """1 for git-style ``a/`` ``b/`` paths, else 0 (what the engine's patch-ng does itself)."""
    for line in diff.splitlines():
        if line.startswith(b"diff --git a/") or line.startswith(b"+++ b/"):
            return 1
        if line.startswith(b"+++ "):
            return 1 if line.startswith(b"+++ /dev/null") else 0
    return 1


def context_lines(patch: Patch, default: int = DEFAULT_CONTEXT) -> int:
    """How many lines of context the patch was made with (``diff -U<n>``).

    A hunk that does not start at line 1 has exactly n lines of leading context
    (the start of the file did not cut it short); failing that, the longest run of
    leading or trailing context seen is the best lower bound.
    """
    exact, bound = [], 0
    for change in parse_diff(patch.diff, patch.name):
        for hunk in change.hunks:
            old_start, old_len = hunk.src_start, hunk.src_len
            kinds = [ln[:1] for ln in hunk.body if ln[:1] in (b" ", b"+", b"-")]
            if old_len == 0 or all(k == b" " for k in kinds):
                continue  # a new file, or no change: says nothing about context
            lead = next(k for k, c in enumerate(kinds) if c != b" ")
            trail = next(k for k, c in enumerate(reversed(kinds)) if c != b" ")
            if old_start > 1:
                exact.append(lead)
            bound = max(bound, lead, trail)
    if exact:
        return max(exact)
    return bound or default


def bump_last_update(header_text: str, date: str) -> str:
    """The header with ``Last-Update:`` set to ``date`` (added to the fields if absent)."""
    lines = header_text.splitlines(keepends=True)
    end = len(lines)
    started = False
    for i, line in enumerate(lines):
        if line.strip():
            started = True
        elif started:
            end = i  # DEP-3 fields are the first paragraph
            break
    for i in range(end):
        if re.match(r"^Last-Update:", lines[i]):
            lines[i] = f"Last-Update: {date}\n"
            return "".join(lines)
    if end and not lines[end - 1].endswith("\n"):
        lines[end - 1] += "\n"
    lines.insert(end, f"Last-Update: {date}\n")
    return "".join(lines)


def patch_text(header_text: str, diff: bytes) -> bytes:
    """A patch file: DEP-3 header, a ``---`` line, the diff (series.py's format)."""
    head = header_text if header_text.endswith("\n") or not header_text else header_text + "\n"
    return head.encode("utf-8") + b"---\n" + diff


def commit_message(patch: Patch) -> bytes:
    return f"{patch.name}: {patch.description}\n\n{patch.header_text.rstrip()}\n\n{TRAILER}: {patch.name}\n".encode("utf-8")


def apply_args(patch: Patch) -> list[str]:
    args = [f"-p{strip_level(patch.diff)}", "--whitespace=nowarn"]
    if context_lines(patch) == 0:
        args.append("--unidiff-zero")
    return args


def build_queue(git: Git, base: str, patches: list[Patch], index: Path) -> list[str]:
    """Commit each patch on top of ``base``, in order, without touching any work tree."""
    g = git.with_index(index)
    g.run("read-tree", base)
    parent, commits = base, []
    for patch in patches:
        r = g.run("apply", "--cached", *apply_args(patch), "-", input=patch.diff, check=False)
        if r.returncode != 0:
            raise DancegrpoError(
                f"patch {patch.name} does not apply to {base[:12]} ({last_line(r.stderr)})",
                "the series must apply at the locked commit first: run `dancegrpo-npu apply` to see the hunk",
            )
        tree = g.out("write-tree", "--missing-ok")  # blobs left out of a sparse checkout (assets/)
        parent = g.out("commit-tree", tree, "-p", parent, "-F", "-", input=commit_message(patch))
        commits.append(parent)
    index.unlink(missing_ok=True)
    return commits


def snapshot_worktree(git: Git, exclude: list[str], index: Path) -> str:
    """The tree object of the work tree as it is on disk (tracked and new files).

    Works on a copy of the real index (so sparse-checkout entries stay as they are);
    ``exclude`` (overlay files), run-time junk and what git ignores (the engine's
    info/exclude: data/, outputs/, ...) are left out, as ``verify`` leaves them out.
    """
    real = git.git_path("index")
    if real.exists():
        shutil.copyfile(real, index)
    g = git.with_index(index)
    if not real.exists():
        g.run("read-tree", "HEAD")
    specs = [f":(exclude,literal){p}" for p in exclude]
    g.run("add", "--all", "--", ".", *JUNK_PATHSPECS, *specs, hint="the work tree could not be read")
    tree = g.out("write-tree", "--missing-ok")  # blobs left out of a sparse checkout (assets/)
    index.unlink(missing_ok=True)
    return tree


@dataclass(frozen=True)
class FileChange:
    status: str  # A, M, D
    path: str


def changed_files(git: Git, a: str, b: str, pathspecs: tuple[str, ...] = ()) -> list[FileChange]:
    out = git.run("diff", "--no-renames", "--name-status", "-z", a, b, "--", *pathspecs).stdout.decode("utf-8")
    parts = out.split("\0")
    return [FileChange(parts[i][:1], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]


_INDEX_LINE = re.compile(rb"^index ([0-9a-f]+)\.\.[0-9a-f]+", re.M)


def index_abbrev(diff: bytes) -> int:
    """The length of the blob ids in the diff's ``index`` lines; 0 when it has none."""
    m = _INDEX_LINE.search(diff)
    return len(m.group(1)) if m else 0


def diff_between(git: Git, a: str, b: str, context: int, name: str, abbrev: int = 0) -> bytes:
    """``git diff -U<context>`` from ``a`` to ``b`` in the series' format: a/ b/ paths, and
    ``index`` lines only when ``abbrev`` says the patch had them (ids of that length).

    A patch keeps the style it was written in, so that a refresh changes what moved
    and nothing else; the engine ignores index lines, the rebase does not need them.
    """
    raw = git.run(
        "diff", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--diff-algorithm=myers",
        "--inter-hunk-context=0", f"-U{context}", "--src-prefix=a/", "--dst-prefix=b/",
        f"--abbrev={max(abbrev, 7)}", a, b,
    ).stdout
    out, in_header = [], False
    for line in raw.splitlines(keepends=True):
        if line.startswith(b"diff --git "):
            in_header = True
            if b'"' in line:
                raise DancegrpoError(
                    f"patch {name} touches a path git must quote ({line.decode('utf-8', 'replace').strip()})",
                    "keep patched paths to plain ASCII without spaces",
                )
        elif in_header and line.startswith((b"--- ", b"+++ ")):
            in_header = line.startswith(b"--- ")
        elif in_header and line.startswith(b"index ") and not abbrev:
            continue
        if in_header and (line.startswith(b"Binary files ") or line.startswith(b"GIT binary patch")):
            raise DancegrpoError(
                f"patch {name} would change a binary file ({line.decode('utf-8', 'replace').strip()})",
                "patches carry text diffs only; put new binary files in overlay/",
            )
        out.append(line)
    return b"".join(out)


def entries(git: Git, commit: str, paths: list[str]) -> dict[str, TreeEntry]:
    """The files among ``paths`` that exist at ``commit``: path -> mode and blob."""
    if not paths:
        return {}
    out = git.run("ls-tree", "-z", "--full-tree", commit, "--", *paths).stdout.decode("utf-8", "surrogateescape")
    found = {}
    for item in filter(None, out.split("\0")):
        meta, path = item.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind == "blob" and path in paths:
            found[path] = TreeEntry(mode, blob)
    return found


def files_at(git: Git, commit: str, paths: list[str]) -> dict[str, bytes]:
    """Contents of those ``paths`` that exist at ``commit``."""
    blobs = {p: e.blob for p, e in entries(git, commit, paths).items()}
    contents = cat_blobs(git.cwd, list(blobs.values()))  # the repository's own objects, not a scratch store
    return {p: contents[s] for p, s in blobs.items()}


def all_paths(git: Git, commit: str) -> set[str]:
    out = git.run("ls-tree", "-r", "-z", "--name-only", "--full-tree", commit).stdout.decode("utf-8")
    return set(filter(None, out.split("\0")))


@dataclass(frozen=True)
class Hunk:
    path: str
    number: int  # 1-based within the file
    of: int
    header: str  # the @@ line
    body: tuple[bytes, ...] = ()  # its lines after the @@ line


def hunks_by_file(patch: Patch) -> dict[str, list[Hunk]]:
    """Each file's hunks, by path (a file without hunks, a mode change, has none)."""
    out: dict[str, list[Hunk]] = {}
    for f in parse_diff(patch.diff, patch.name):
        n = len(f.hunks)
        if n:
            out.setdefault(f.path, []).extend(Hunk(f.path, h.number, n, h.header, h.body) for h in f.hunks)
    return out


def single_hunk_patch(patch: Patch, hunk: Hunk) -> bytes:
    """The file header of ``hunk.path`` plus that one hunk (to test hunks one by one)."""
    for f in parse_diff(patch.diff, patch.name):
        if f.path == hunk.path and len(f.hunks) >= hunk.number:
            h = f.hunks[hunk.number - 1]
            return b"".join(f.header) + (h.header + "\n").encode() + b"".join(h.body)
    return b""
