"""``dancegrpo-npu lock``: keep [files] of upstream.lock in step with the series.

[files] holds the sha256 of every upstream file the series touches, as it is at the
locked commit before patching.  fetch checks the fetched tree against it and apply
refuses a series touching a file it does not record, so it must be refreshed
whenever a patch starts (or stops) touching a file.  The hashes are computed from
the work tree's git objects at the locked commit, never from patched files.
"""

from __future__ import annotations


from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitutil import TreeEntry, cat_blobs, ls_tree, rev_parse
from dancegrpo_npu.engine.lock import Lock, load_lock, save_lock, sha256_bytes
from dancegrpo_npu.project import Project
from dancegrpo_npu.engine.series import Patch, load_series
from dancegrpo_npu.engine.stage import touched_files
from dancegrpo_npu.engine.worktree import session, shorten

_REFRESH = "run `dancegrpo-npu lock` to rewrite [files] for the locked commit"


def verify_files(repo, tree: dict[str, TreeEntry], lock: Lock) -> None:
    """Every file upstream.lock records is in ``tree`` with the recorded sha256."""
    for rel in lock.files:
        if rel not in tree:
            raise DancegrpoError(f"upstream.lock records {rel}, which upstream at {lock.commit[:12]} does not have", _REFRESH)
    blobs = cat_blobs(repo, [tree[r].blob for r in lock.files])
    for rel, digest in lock.files.items():
        actual = sha256_bytes(blobs[tree[rel].blob])
        if actual != digest:
            raise DancegrpoError(
                f"upstream file {rel} has sha256 {actual}, upstream.lock records {digest}",
                "the upstream fetched is not the one the series was written for: check the source"
                " (or run `dancegrpo-npu lock` if the lock is stale)",
            )


def check_series_against_lock(lock: Lock, patches: list[Patch], tree: dict[str, TreeEntry], repo) -> None:
    """``verify_files``, and every upstream file a patch touches is recorded."""
    for patch in patches:
        for rel in touched_files(patch):
            if rel in tree and rel not in lock.files:
                raise DancegrpoError(
                    f"patch {patch.name} changes {rel}, whose upstream sha256 upstream.lock does not record",
                    "run `dancegrpo-npu lock` to record the files the series touches",
                )
    verify_files(repo, tree, lock)


def compute_files(repo, tree: dict[str, TreeEntry], patches: list[Patch]) -> dict[str, str]:
    """sha256 of every upstream file the series touches (files it creates are not upstream's)."""
    paths = sorted({rel for p in patches for rel in touched_files(p) if rel in tree})
    blobs = cat_blobs(repo, [tree[r].blob for r in paths])
    return {rel: sha256_bytes(blobs[tree[rel].blob]) for rel in paths}


def locked_tree(project: Project, lock: Lock) -> tuple[object, dict[str, TreeEntry]]:
    """The work tree's repository and the file list of the locked commit in it."""
    with session(project.workdir) as (wt, fetched):
        if fetched.commit == lock.commit:
            rev = fetched.head
        elif rev_parse(wt.root, lock.commit):
            rev = lock.commit
        else:
            raise DancegrpoError(
                f"the work tree has no upstream commit {lock.commit[:12]} (it is at {fetched.commit[:12]})",
                "run `dancegrpo-npu fetch` first",
            )
        return wt.root, ls_tree(wt.root, rev)


def refresh_lock(project: Project, check: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """(old [files], new [files]); writes the lock unless ``check`` (then raises if stale)."""
    lock = load_lock(project.lock_path)
    repo, tree = locked_tree(project, lock)  # refused while a rebase swaps the series in
    patches = load_series(project.patches_dir)
    new = compute_files(repo, tree, patches)
    old = dict(lock.files)
    if check:
        if new != old:
            raise DancegrpoError(f"upstream.lock [files] is stale ({describe_change(old, new)})", "run `dancegrpo-npu lock`")
        return old, new
    if new != old:
        save_lock(lock.with_files(new), project.lock_path)
    return old, new


def describe_change(old: dict[str, str], new: dict[str, str]) -> str:
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    changed = sorted(r for r in set(old) & set(new) if old[r] != new[r])
    parts = [f"+{r}" for r in added] + [f"-{r}" for r in removed] + [f"~{r}" for r in changed]
    return shorten(parts) if parts else "no change"
