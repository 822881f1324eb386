"""Where a patch or the overlay may write: plain relative paths inside the upstream
tree, never into .git, never through a symlink; and where a symlink a patch creates
may point: inside the tree (resolved through the tree's other symlinks), not into .git.

Checked before anything is written: patch-ng strips ``../`` and absolute prefixes and
follows symlinks, so every path is decided here first.
"""

from __future__ import annotations

import posixpath
import re

from dancegrpo_npu.errors import DancegrpoError


def _refuse(patch: str, what: str, hint: str = "regenerate the patch with `git diff` or `dancegrpo-npu export`") -> DancegrpoError:
    return DancegrpoError(f"patch {patch}: {what}", hint)


def check_patch_path(name: str, patch: str, prefix: str = "") -> str:
    """The repo-relative path a patch names, or a refusal (before anything is written).

    ``prefix`` is git's "a/" or "b/", which git-style diffs carry and patch-ng strips."""
    shown = name
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name) or name.startswith("\\"):
        raise _refuse(patch, f"refusing absolute path {shown!r}", "patches may only change files inside the upstream tree")
    if prefix:
        if not name.startswith(prefix):
            raise _refuse(patch, f"git-style file name {shown!r} lacks its {prefix!r} prefix")
        name = name[len(prefix):]
    parts = name.split("/")
    if "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts):
        raise _refuse(patch, f"refusing path {shown!r}: it has '..', '.', empty or backslash parts", "patches may only change files inside the upstream tree, by plain relative paths")
    if ".git" in parts:
        raise _refuse(patch, f"refusing path {shown!r} inside .git", "patches may only change files of the upstream tree")
    return name


def check_symlinks(path: str, symlinks: dict[str, str], who: str) -> None:
    """Refuse a path that is, or goes through, a symlink of the upstream tree."""
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if prefix in symlinks:
            target = symlinks[prefix]
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(prefix), target))
            if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                raise DancegrpoError(
                    f"{who}: refusing {path}: it goes through the symlink {prefix} -> {target}, which leaves the tree",
                    "patches and the overlay may only change files inside the upstream tree",
                )
            real = posixpath.normpath(posixpath.join(resolved, *parts[i:]))
            raise DancegrpoError(
                f"{who}: refusing {path}: it goes through the symlink {prefix} -> {target}",
                f"write it against the real path {real}",
            )


def resolve_link(path: str, target: str, links: dict[str, str], depth: int = 0) -> str | None:
    """Where the symlink ``path`` -> ``target`` leads, as a tree path ("" for the top),
    following the tree's other symlinks; None when it leaves the tree (absolute, too
    many "..", through a link that leaves it), goes into .git, or loops."""
    if depth > 40 or not target or target.startswith("/") or "\0" in target:
        return None
    parts = path.split("/")[:-1]
    for name in target.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            if not parts:
                return None
            parts.pop()
            continue
        parts.append(name)
        prefix = "/".join(parts)
        if prefix in links:
            inner = resolve_link(prefix, links[prefix], links, depth + 1)
            if inner is None:
                return None
            parts = inner.split("/") if inner else []
    if parts and parts[0] == ".git":
        return None
    return "/".join(parts)
