"""The 3-way merge of one patch onto the rebase tree, file by file, with git.

What ``git cherry-pick`` would do, but without writing a whole-tree index: in a
sparse checkout of a mirror that lacks some large blobs (assets/), cherry-pick
refuses to run at all ("invalid object"), while these per-file steps never read
them.  For every file the patch changes:

* the base is the file before the patch (its queue commit's parent), "theirs" the
  file after it, "ours" the file in the rebase tree, found under its new name when
  upstream renamed it (``git diff -M`` from the base to our HEAD);
* contents are merged by ``git merge-file --diff3`` (git's own 3-way merge);
* a clean result is written and staged; a conflict leaves the markers in the file
  and stages 1/2/3 (base/upstream/patch) in the index, as git does, so that
  ``git status``, ``git diff`` and ``git mergetool`` work in the rebase tree.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitcmd import Git
from dancegrpo_npu.vcs.gitutil import TreeEntry, cat_blobs, missing_objects
from dancegrpo_npu.rebase.queue import changed_files, entries

_NULL = "0" * 40


@dataclass(frozen=True)
class MergeResult:
    conflicts: tuple[str, ...]  # paths left with conflict stages
    renamed: tuple[tuple[str, str], ...]  # (the patch's path, upstream's new path) followed


def upstream_renames(git: Git, base: str, ours: str, paths: list[str]) -> dict[str, str]:
    """Which of ``paths`` (at ``base``) upstream renamed on the way to ``ours``, and to what.

    Rename detection compares file contents, so it reads blobs; a mirror or a partial
    clone may lack large ones the series never touches (DanceGRPO's dancegrpo.pdf), and
    git fails on the first it cannot read.  So it runs only among the candidates: the
    files of ``paths`` that are gone at ``ours`` (found without reading any blob), and
    the files added on the way whose contents the repository has.
    """
    changes = changed_files(git, base, ours)  # --no-renames: trees only, no blob is read
    gone = [c.path for c in changes if c.status == "D" and c.path in set(paths)]
    if not gone:
        return {}
    added = entries(git, ours, [c.path for c in changes if c.status == "A"])
    missing = set(missing_objects(git.cwd, [e.blob for e in added.values()]))
    candidates = [p for p, e in sorted(added.items()) if e.blob not in missing]
    if not candidates:
        return {}
    specs = [f":(literal){p}" for p in gone + candidates]
    out = git.run("diff", "-z", "--name-status", "-M", "--diff-filter=R", base, ours, "--", *specs).stdout.decode("utf-8", "surrogateescape")
    parts = [p for p in out.split("\0") if p]
    renames = {}
    for i in range(0, len(parts) - 2, 3):
        old, new = parts[i + 1], parts[i + 2]
        if old in gone:
            renames[old] = new
    return renames


def merge_patch(tree: Git, base: str, theirs: str, labels: tuple[str, str, str]) -> MergeResult:
    """Merge the change ``base``..``theirs`` into the rebase tree's HEAD, in its work tree and index."""
    ours = tree.out("rev-parse", "HEAD")
    changes = changed_files(tree, base, theirs)
    paths = [c.path for c in changes]
    renames = upstream_renames(tree, base, ours, paths)
    before, after = entries(tree, base, paths), entries(tree, theirs, paths)
    targets = [renames.get(p, p) for p in paths]
    current = entries(tree, ours, targets)
    blobs = cat_blobs(tree.cwd, sorted({e.blob for d in (before, after, current) for e in d.values()}))
    index_lines: list[str] = []
    conflicts: list[str] = []
    for change in changes:
        src = change.path
        dst = renames.get(src, src)
        b, t, o = before.get(src), after.get(src), current.get(dst)
        if o is not None and b is not None and t is not None:  # changed on both sides: merge the contents
            merged, clean = merge_file(tree, blobs[o.blob], blobs[b.blob], blobs[t.blob], labels)
            write(tree, dst, merged, t.mode if o.mode == b.mode else o.mode)
            if clean:
                index_lines.append(stage0(tree, dst, t.mode if o.mode == b.mode else o.mode))
            else:
                index_lines += unmerged(dst, b, o, t)
                conflicts.append(dst)
        elif t is None and o is None:  # deleted by both
            continue
        elif t is None:  # the patch deletes the file
            if b is not None and o.blob == b.blob:
                (tree.cwd / dst).unlink()
                index_lines.append(f"0 {_NULL}\t{dst}")
            else:  # changed (or added) upstream, deleted by the patch
                index_lines += unmerged(dst, b, o, None)
                conflicts.append(dst)
        elif o is None:  # upstream deleted the file (and did not rename it), or the patch adds it
            write(tree, dst, blobs[t.blob], t.mode)
            if b is None:
                index_lines.append(stage0(tree, dst, t.mode))
            else:  # changed by the patch, deleted upstream: git's modify/delete conflict
                index_lines += unmerged(dst, b, None, t)
                conflicts.append(dst)
        elif o.blob == t.blob:  # added by both, the same
            continue
        else:  # added by both, differently: merge against an empty base
            merged, clean = merge_file(tree, blobs[o.blob], b"", blobs[t.blob], labels)
            write(tree, dst, merged, o.mode)
            index_lines += [stage0(tree, dst, o.mode)] if clean else unmerged(dst, None, o, t)
            if not clean:
                conflicts.append(dst)
    if index_lines:
        tree.run("update-index", "--index-info", input=("\n".join(index_lines) + "\n").encode("utf-8", "surrogateescape"))
        # --index-info records no stat data: refresh it, or the next `git apply --index` sees
        # "does not match index" for these files
        tree.run("update-index", "-q", "--refresh", check=False)
    return MergeResult(tuple(conflicts), tuple((s, d) for s, d in renames.items()))


def merge_file(tree: Git, ours: bytes, base: bytes, theirs: bytes, labels: tuple[str, str, str]) -> tuple[bytes, bool]:
    """git merge-file --diff3 on three contents: (result, clean)."""
    with tempfile.TemporaryDirectory(prefix="dancegrpo-npu-merge-") as tmp:
        files = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            (Path(tmp) / name).write_bytes(data)
            files.append(os.path.join(tmp, name))
        r = tree.run(
            "merge-file", "-p", "--diff3", "-L", labels[0], "-L", labels[1], "-L", labels[2], *files, check=False
        )
    if r.returncode < 0 or r.returncode > 127:
        raise DancegrpoError(f"git merge-file failed: {r.stderr.strip()}", "--abort restores everything")
    return r.stdout, r.returncode == 0


def write(tree: Git, rel: str, data: bytes, mode: str) -> None:
    dest = tree.cwd / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink():
        dest.unlink()
    dest.write_bytes(data)
    os.chmod(dest, 0o755 if mode == "100755" else 0o644)


def stage0(tree: Git, rel: str, mode: str) -> str:
    """Index lines that make ``rel`` merged, with the content now in the work tree."""
    blob = tree.out("hash-object", "-w", "--", rel)
    return f"0 {_NULL}\t{rel}\n{mode} {blob} 0\t{rel}"


def unmerged(rel: str, base: TreeEntry | None, ours: TreeEntry | None, theirs: TreeEntry | None) -> list[str]:
    """Index lines for a conflict: stage 1 base, 2 upstream, 3 the patch (absent sides left out)."""
    lines = [f"0 {_NULL}\t{rel}"]
    for stage, e in ((1, base), (2, ours), (3, theirs)):
        if e is not None:
            lines.append(f"{e.mode} {e.blob} {stage}\t{rel}")
    return lines
