"""What a rebase tells a person: where it stopped, why, and what upstream changed there."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.vcs.gitcmd import Git
from dancegrpo_npu.rebase.queue import apply_args, hunks_by_file, single_hunk_patch
from dancegrpo_npu.engine.rebase_state import RebaseState, Step
from dancegrpo_npu.engine.series import Patch

OUTCOMES = {
    "applied": "applied as is",
    "moved": "applied, context moved",
    "merged": "3-way merged",
    "resolved": "resolved by hand",
    "skipped": "SKIPPED (dropped from the series)",
}
MARKERS = ("<<<<<<<", "|||||||", ">>>>>>>")  # git's, found anywhere in a line (a stray one mid-line too)


@dataclass(frozen=True)
class Conflict:
    path: str
    kind: str  # a sentence
    regions: tuple[Region, ...]  # the marked regions in the rebase tree


def short(commit: str) -> str:
    return commit[:12]


def describe(step: Step) -> str:
    text = OUTCOMES.get(step.outcome, step.outcome)
    return f"{text} ({step.detail})" if step.detail else text


@dataclass(frozen=True)
class Region:
    """One conflict: the line range of its markers and the text of each side."""

    first: int
    last: int
    upstream: tuple[str, ...]  # between <<<<<<< and ||||||| (or =======)
    base: tuple[str, ...]  # between ||||||| and ======= (what the patch was written against)
    patch: tuple[str, ...]  # between ======= and >>>>>>>


def marker_regions(path: Path) -> tuple[Region, ...]:
    """The conflict regions of a file (empty if none or unreadable)."""
    try:
        lines = path.read_bytes().decode("utf-8", "replace").splitlines()
    except OSError:
        return ()
    regions, start, side, parts = [], None, "", {"u": [], "b": [], "p": []}
    for n, line in enumerate(lines, 1):
        if line.startswith("<<<<<<< "):
            start, side, parts = n, "u", {"u": [], "b": [], "p": []}
        elif start is not None and line.startswith("||||||| "):
            side = "b"
        elif start is not None and line == "=======":
            side = "p"
        elif start is not None and line.startswith(">>>>>>> "):
            regions.append(Region(start, n, tuple(parts["u"]), tuple(parts["b"]), tuple(parts["p"])))
            start = None
        elif start is not None:
            parts[side].append(line)
    return tuple(regions)


def locate(chunks: list[tuple[str, ...]], lines: list[str]) -> list[tuple[int, int] | None]:
    """Each chunk's 1-based line span in ``lines``, searched in order: one side of a conflict
    region is a contiguous piece of that side's file, and the regions follow the file's order.
    None for an empty chunk (a side that has no lines there) or one not found."""
    spans: list[tuple[int, int] | None] = []
    pos = 0
    for chunk in chunks:
        span = None
        n = len(chunk)
        if n:
            for i in range(pos, len(lines) - n + 1):
                if lines[i] == chunk[0] and tuple(lines[i : i + n]) == chunk:
                    span, pos = (i + 1, i + n), i + n
                    break
        spans.append(span)
    return spans


@dataclass(frozen=True)
class Sides:
    """The file as the patch found it (base) and as the patch left it (theirs), as lines:
    a hunk's line numbers count in these, and so do the regions' base and patch sides."""

    base: list[str]
    theirs: list[str]


def changed_lines(hunk) -> tuple[set[int], set[int]]:
    """(line numbers in the base the hunk removes, line numbers in theirs it adds)."""
    m = re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)", hunk.header)
    if not m:
        return set(), set()
    old, new = int(m.group(1)), int(m.group(2))
    removed, added = set(), set()
    for ln in hunk.body:
        if ln.startswith(b"-"):
            removed.add(old)
            old += 1
        elif ln.startswith(b"+"):
            added.add(new)
            new += 1
        elif ln.startswith(b" "):
            old, new = old + 1, new + 1
    return removed, added


def hunk_verdict(hunk, regions: tuple[Region, ...], applies: bool, sides: Sides | None = None) -> str:
    """Where a hunk of the patch ended up after the 3-way merge: the regions whose base or patch
    side holds the very lines the hunk removes or adds (found by position in the file as the
    patch found and left it; by shared lines only when the sides cannot be read)."""
    if applies:
        return "still applies as is"
    hit: list[Region] = []
    if sides is not None:
        removed, added = changed_lines(hunk)
        base_spans = locate([r.base for r in regions], sides.base)
        patch_spans = locate([r.patch for r in regions], sides.theirs)
        for r, b, p in zip(regions, base_spans, patch_spans):
            if (b and any(b[0] <= n <= b[1] for n in removed)) or (p and any(p[0] <= n <= p[1] for n in added)):
                hit.append(r)
    if not hit:  # the sides were not found: the region sharing the most of the hunk's lines
        added_text = {ln[1:].decode("utf-8", "replace").rstrip("\r\n") for ln in hunk.body if ln.startswith(b"+")}
        removed_text = {ln[1:].decode("utf-8", "replace").rstrip("\r\n") for ln in hunk.body if ln.startswith(b"-")}
        scored = [(len(added_text & set(r.patch)) + len(removed_text & set(r.base)), -i, r) for i, r in enumerate(regions)]
        best = max(scored, default=None, key=lambda t: t[:2])
        if best and best[0]:
            hit = [best[2]]
    if hit:
        return "CONFLICT, lines " + ", ".join(f"{r.first}-{r.last}" for r in hit)
    return "merged by git (upstream changed its context)"


def has_markers(path: Path) -> int:
    """First line number holding a conflict marker anywhere in it, or 0."""
    try:
        lines = path.read_bytes().decode("utf-8", "replace").splitlines()
    except OSError:
        return 0
    return next((n for n, line in enumerate(lines, 1) if any(m in line for m in MARKERS)), 0)


def python_problem(data: bytes, rel: str) -> str:
    """``rel:LINE: why`` when ``data``, the Python file ``rel``, does not compile, else ""."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings (escapes) are upstream's business
            compile(data, rel, "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"{rel}:{e.lineno or 1}: {e.msg}"
    except ValueError as e:  # null bytes
        return f"{rel}:1: {e}"
    return ""


def conflicts_in(tree: Git) -> list[Conflict]:
    """The unmerged files of the rebase tree, with what kind of conflict each is."""
    out = tree.run("ls-files", "--unmerged", "-z").stdout.decode("utf-8", "replace")
    stages: dict[str, set[int]] = {}
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        stages.setdefault(path, set()).add(int(meta.split()[2]))
    kinds = {
        frozenset({1, 2, 3}): "changed both upstream and by the patch",
        frozenset({1, 3}): "deleted or renamed upstream, changed by the patch",
        frozenset({1, 2}): "changed upstream, deleted by the patch",
        frozenset({2, 3}): "added both upstream and by the patch",
        frozenset({3}): "the patch's file has no counterpart upstream",
    }
    return [
        Conflict(p, kinds.get(frozenset(s), "conflict"), marker_regions(tree.cwd / p))
        for p, s in sorted(stages.items())
    ]


def upstream_commits(git: Git, old: str, new: str, paths: list[str], limit: int = 15) -> list[str]:
    """Upstream commits between the lock and REF that touched ``paths``, newest first.

    Marked ``+`` when REF has them and the lock did not, ``-`` when going back to
    REF undoes them (REF older than the lock).
    """
    if not paths:
        return []
    out = git.run(
        "log", "--left-right", f"--max-count={limit + 1}", "--date=short",
        "--format=%m %h %ad %an: %s", f"{old}...{new}", "--", *paths,
    ).text
    lines = [("+" if ln.startswith(">") else "-") + ln[1:] for ln in out.splitlines() if ln]
    if len(lines) > limit:
        lines = lines[:limit] + ["  ... (more: see the command below)"]
    return lines


def file_sides(tree: Git, queued: str, path: str) -> Sides | None:
    """``path`` before and after the patch, from its commit in the patch queue."""
    if not queued:
        return None
    def lines(rev: str) -> list[str]:
        r = tree.run("show", f"{rev}:{path}", check=False)
        return r.stdout.decode("utf-8", "replace").splitlines() if r.returncode == 0 else []
    return Sides(lines(f"{queued}^"), lines(queued))


def hunk_lines(
    tree: Git, index: Path, tip: str, patch: Patch, paths: list[str], regions: tuple[Region, ...], queued: str = ""
) -> list[str]:
    """Each hunk of ``patch`` in ``paths``: does it still apply on its own to the rebased tree?"""
    by_file = hunks_by_file(patch)
    g = tree.with_index(index)
    g.run("read-tree", tip)
    lines = []
    for path in paths:
        exists = tree.ok("cat-file", "-e", f"{tip}:{path}")
        sides = file_sides(tree, queued, path) if regions else None
        for hunk in by_file.get(path, []):
            if not exists:
                lines.append(f"    hunk {hunk.number}/{hunk.of} {hunk.header}  -- its file is gone from the new upstream")
                continue
            piece = single_hunk_patch(patch, hunk)
            ok = g.ok("apply", "--cached", "--check", *apply_args(patch), "-", input=piece)
            verdict = hunk_verdict(hunk, regions, ok, sides)
            lines.append(f"    hunk {hunk.number}/{hunk.of} {hunk.header}  -- {verdict}")
    index.unlink(missing_ok=True)
    return lines


def progress(state: RebaseState, total_names: tuple[str, ...], stopped_at: int | None = None) -> list[str]:
    lines = []
    width = max((len(n) for n in total_names), default=0)
    n = len(total_names)
    for i, name in enumerate(total_names):
        if i < len(state.steps):
            what = describe(state.steps[i])
        elif i == stopped_at:
            what = "<- STOPPED HERE"
        else:
            what = "pending"
        lines.append(f"  {i + 1:>{len(str(n))}}/{n} {name:<{width}}  {what}")
    return lines


def why_stopped(
    tree: Git, index: Path, state: RebaseState, patch: Patch, conflicts: list[Conflict], workdir: Path, empty: bool
) -> list[str]:
    """Which patch, why it stopped, and for each file: its hunks and the upstream commits there."""
    lines = [
        f"dancegrpo-npu rebase: stopped at patch {state.current + 1} of {len(state.names)}, {patch.name}",
        f"  {patch.description}",
        f"  moving {short(state.old_commit)} (locked) -> {short(state.new_commit)} ({state.onto})",
        "",
    ]
    if empty:
        return lines + ["The patch makes no change on the new upstream: upstream seems to already do what it did",
                        "(absorbed). Drop it with --skip (the summary names it as absorbed), or make the change it",
                        "should still make and --continue, then review its header."]
    lines.append(f"It does not apply to {short(state.new_commit)}, and git's 3-way merge left conflicts:")
    patch_paths = list(hunks_by_file(patch))
    for c in conflicts:
        where = ", ".join(f"lines {r.first}-{r.last}" for r in c.regions) or "no markers (a whole-file conflict)"
        lines += ["", f"  {c.path}: {c.kind}; {where}"]
        related = [c.path] if c.path in patch_paths else gone_upstream(tree, state.tip, patch_paths) or [c.path]
        queued = state.queue[state.current] if state.current < len(state.queue) else ""
        lines += hunk_lines(tree, index, state.tip, patch, related, c.regions, queued)
        paths = " ".join(sorted({c.path, *related}))
        commits = upstream_commits(tree, state.old_commit, state.new_commit, sorted({c.path, *related}))
        if commits:
            lines.append("    upstream commits touching it (+ new in REF, - not in REF):")
            lines += [f"      {ln}" for ln in commits]
        lines.append(f"    see them: git -C {workdir} log -p {short(state.old_commit)}...{short(state.new_commit)} -- {paths}")
    return lines


def conflict_report(
    tree: Git, index: Path, state: RebaseState, patch: Patch, conflicts: list[Conflict], workdir: Path, empty: bool
) -> str:
    body = why_stopped(tree, index, state, patch, conflicts, workdir, empty)
    body += ["", "What to do:", f"  cd {tree.cwd}"]
    if empty:
        body.append("  make the change the patch should make by hand, or drop the patch; then run one of:")
    else:
        body += [
            "  edit the files above until they are what the patch should make of the new upstream",
            "  (remove the <<<<<<< ||||||| ======= >>>>>>> markers; the ||||||| part is what the patch",
            "  was written against)",
        ]
        if any(not c.regions for c in conflicts):
            body += [
                "  for a file gone upstream: `git rm FILE` there drops the patch's change to it; leaving",
                "  it in place keeps it (the patch then adds the whole file)",
            ]
        body.append("  then run one of:")
    body += [
        "  dancegrpo-npu rebase --continue   take the tree as this patch, go on",
        "  dancegrpo-npu rebase --skip       drop this patch from the series, go on",
        "  dancegrpo-npu rebase --abort      back to exactly where you started",
        "",
        "Progress:",
        *progress(state, state.names, stopped_at=state.current),
    ]
    return "\n".join(body) + "\n"


def gone_upstream(tree: Git, commit: str, paths: list[str]) -> list[str]:
    """Those of ``paths`` that do not exist at ``commit`` (deleted or renamed upstream)."""
    return [p for p in paths if not tree.ok("cat-file", "-e", f"{commit}:{p}")]
