"""Local edits in the patched work tree: finding them, and saving them before
``apply --force`` overwrites them.

An edit is any difference from what the last apply wrote (``applied.json``) or, for
a path it did not write, from upstream's HEAD: a changed, deleted, re-created or
re-moded file, a file replaced by a symlink or a directory.  Untracked files that
git does not ignore are edits only when they are in the way of a path apply writes;
otherwise apply leaves them alone (status lists them, verify fails on them).
Ignored files (upstream's .gitignore, and the run/data patterns fetch puts in
.git/info/exclude) are never looked at.

A path whose content is already exactly what apply is about to write there (the
``targets`` of ``find_edits``) is no edit: nothing of it would be lost.  This is the
tree after ``dancegrpo-npu export`` put the user's edits into the series, or after a
patch was changed to match the tree.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.vcs.gitutil import TreeEntry, blob_id, git, hash_data, hash_files, ls_tree, missing_objects, status_paths
from dancegrpo_npu.engine.stage import parent_dirs
from dancegrpo_npu.engine.worktree import Applied, WorkTree, file_state


@dataclass(frozen=True)
class Edit:
    path: str
    kind: str  # modified | deleted | added | mode changed | replaced by a symlink | replaced by a directory | untracked | in the way
    blocking: bool  # apply would overwrite or remove it

    def __str__(self) -> str:
        return f"{self.path} ({self.kind})"


def state_of(fs) -> tuple[str, object] | None:
    """A FileState (or None) in ``current_state``'s terms (links by the blob id of their target)."""
    if fs is None:
        return None
    return ("link", blob_id(fs.data)) if fs.link else ("file", (blob_id(fs.data), fs.executable))


def target_states(files: dict) -> dict[str, object]:
    """What apply will write (path -> FileState | None), in ``current_state``'s terms."""
    return {p: state_of(fs) for p, fs in files.items()}


def expected_state(path: str, applied: Applied | None, head: dict[str, TreeEntry]):
    """What should be at ``path``, in ``file_state``'s terms (links by blob id)."""
    if applied is not None and path in applied.files:
        want = applied.files[path]
        if want is None:
            return None
        if "link" in want:
            return ("link", blob_id(os.fsencode(want["link"])))
        return ("file", (want["blob"], bool(want["exec"])))
    entry = head.get(path)
    if entry is None:
        return None
    if entry.mode == "120000":
        return ("link", entry.blob)
    return ("file", (entry.blob, entry.mode == "100755"))


def current_state(root: Path, path: str):
    have = file_state(root / path)
    if have is not None and have[0] == "link":
        return ("link", blob_id(os.fsencode(have[1])))
    return have


def _kind(want, have, known: bool) -> str | None:
    if want == have:
        return None
    if have is None:
        return "deleted"
    if want is None:
        return "added" if known else "untracked"
    if have[0] == "dir":
        return "replaced by a directory"
    if have[0] == "link" and want[0] != "link":
        return "replaced by a symlink"
    if want[0] == have[0] == "file" and want[1][0] == have[1][0]:
        return "mode changed"
    return "modified"


def find_edits(
    wt: WorkTree,
    applied: Applied | None,
    head: dict[str, TreeEntry],
    will_write: set[str],
    targets: dict[str, object] | None = None,
    status: dict[str, str] | None = None,
) -> list[Edit]:
    """Every local edit, each marked blocking when apply would overwrite or remove it.

    ``targets``: what apply will make of paths (path -> ``file_state`` terms, None for
    deleted); a path already exactly so is not an edit, whatever the last apply wrote.
    ``status``: ``status_paths`` of the tree, when the caller has already run it."""
    targets = targets or {}
    known = set(applied.files) if applied else set()
    candidates = set(known) | set(status_paths(wt.root) if status is None else status)
    candidates |= will_write | parent_dirs(will_write)  # new paths and their parents may hold files git ignores
    edits: dict[str, Edit] = {}
    restore = set(will_write)
    while True:  # a path restored because of an edit may put untracked files in the way
        write_dirs = parent_dirs(restore)
        for path in sorted(candidates):
            edit = _edit_at(wt.root, path, applied, head, known, restore, write_dirs, targets)
            if edit is not None:
                edits[path] = edit
        grown = restore | {e.path for e in edits.values() if e.blocking}
        if grown == restore:
            return [edits[p] for p in sorted(edits)]
        restore = grown


def _edit_at(root: Path, path: str, applied, head, known, restore: set[str], write_dirs: set[str], targets: dict) -> Edit | None:
    if path in write_dirs and path not in head and path not in known:
        have = file_state(root / path)
        return Edit(path, "in the way", True) if have is not None and have[0] != "dir" else None
    have = current_state(root, path)
    if path in targets and have == targets[path]:
        return None  # already what apply writes: nothing to lose
    kind = _kind(expected_state(path, applied, head), have, path in known or path in head)
    if kind is None:
        return None
    if kind == "untracked" and (path in restore or parent_dirs([path]) & restore or path in write_dirs):
        kind = "in the way"
    return Edit(path, kind, kind != "untracked")


def _tree(wt: WorkTree, index: Path, base: str, lines: list[str]) -> str:
    env = {"GIT_INDEX_FILE": os.fspath(index)}
    git(wt.root, "read-tree", base, env=env)
    if lines:
        git(wt.root, "update-index", "--add", "--remove", "--replace", "--index-info", input="".join(lines).encode(), env=env)
    # --missing-ok: the clone may lack blobs the source lacked (files fetch left out); the
    # tree names them all the same, as HEAD's does
    return git(wt.root, "write-tree", "--missing-ok", env=env).stdout.decode().strip()


def _without_base(wt: WorkTree, edits: list[Edit], applied: Applied | None, head_rev: str) -> set[str]:
    """The edited paths whose base is upstream's file and whose blob the clone lacks (a file
    fetch left out because the source lacks it, later put in the tree by hand): git cannot
    diff them."""
    written = set(applied.files) if applied else set()
    paths = [e.path for e in edits if e.path not in written]
    if not paths:
        return set()
    base = {p: e for p, e in ls_tree(wt.root, head_rev).items() if p in set(paths)}
    missing = set(missing_objects(wt.root, sorted({e.blob for e in base.values()})))
    return {p for p, e in base.items() if e.blob in missing}


def save_edits(wt: WorkTree, edits: list[Edit], applied: Applied | None, head_rev: str) -> Path:
    """Write the edits as a git-format patch (binary-safe; ``git apply`` restores them)
    plus copies of the edited files, under ``saved/<time>/``; return that directory."""
    zero = "0" * 40
    base_lines = []
    for path, want in sorted((applied.files if applied else {}).items()):
        if want is None:
            base_lines.append(f"0 {zero}\t{path}\n")
        elif "link" in want:
            base_lines.append(f"120000 {hash_data(wt.root, os.fsencode(want['link']))}\t{path}\n")
        else:
            base_lines.append(f"{'100755' if want['exec'] else '100644'} {want['blob']}\t{path}\n")
    removals, additions, copies = [], [], []
    regular: list[tuple[str, bool]] = []  # edited files (path, executable), hashed in one git call
    undiffable = _without_base(wt, edits, applied, head_rev)
    for e in edits:
        if e.path in undiffable:  # kept as a copy only
            if (wt.root / e.path).is_file():
                copies.append((e.path, (wt.root / e.path).read_bytes()))
            continue
        full = wt.root / e.path
        have = file_state(full)
        if have is None or have[0] == "dir":
            removals.append(f"0 {zero}\t{e.path}\n")
            if have is not None:  # keep everything under it, ignored files too
                for f in sorted(p for p in full.rglob("*") if p.is_file() and not p.is_symlink()):
                    copies.append((f.relative_to(wt.root).as_posix(), f.read_bytes()))
        elif have[0] == "link":
            removals.append(f"0 {zero}\t{e.path}\n")
            additions.append(f"120000 {hash_data(wt.root, os.fsencode(have[1]))}\t{e.path}\n")
        else:
            removals.append(f"0 {zero}\t{e.path}\n")
            regular.append((e.path, have[1][1]))
            copies.append((e.path, full.read_bytes()))
    ids = hash_files(wt.root, [wt.root / p for p, _ in regular])
    additions += [f"{'100755' if executable else '100644'} {blob}\t{p}\n" for (p, executable), blob in zip(regular, ids)]
    wt.saved_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=wt.saved_dir))
    try:
        before = _tree(wt, tmp / "index", head_rev, base_lines)
        after = _tree(wt, tmp / "index", before, removals + additions)
        (tmp / "index").unlink()
        diff = git(wt.root, "diff", "--binary", "--full-index", "--no-renames", "--no-color", before, after).stdout
        note = (
            "Local edits saved by `dancegrpo-npu apply --force` before it re-applied the series.\n"
            f"Base: upstream {head_rev} + what the last apply wrote (tree {before}).\n"
            f"Edited tree: {after} (its objects are kept in the work tree's .git).\n"
            "Restore: git -C <workdir> apply <this file>   (copies of the files are in files/)\n"
            "Edits: " + ", ".join(str(e) for e in edits) + "\n"
            + (
                "Not in this patch (the clone lacks upstream's copy, which fetch left out, so there is no diff to make;"
                " the edited files are in files/): " + ", ".join(sorted(undiffable)) + "\n"
                if undiffable else ""
            )
            + "\n"
        )
        (tmp / "local-edits.patch").write_bytes(note.encode("utf-8", "replace") + diff)
        for rel, data in copies:
            dest = tmp / "files" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        final = wt.saved_dir / stamp
        n = 1
        while final.exists():
            n += 1
            final = wt.saved_dir / f"{stamp}-{n}"
        os.replace(tmp, final)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
