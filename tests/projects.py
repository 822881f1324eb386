"""The tests' one project builder: a dancegrpo-npu project directory as a user has it.

``write_project`` lays out upstream.lock, patches/ (each patch and the series) and overlay/
in a directory.  The helpers that need a project build theirs with it, each around its own
upstream:

- ``synthetic_upstream``: a small synthetic upstream git repository (engine tests);
- ``rebase_helpers``: a synthetic upstream history, commit by commit (rebase tests);
- ``synthetic_tree``: a stand-in patched tree with a fake trainer and the real lock (launcher
  tests).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable


def write_file(root: Path, rel: str, content: bytes | str | None, executable: bool = False) -> None:
    """``root/rel`` with ``content`` (None: removed), making its parent directories."""
    dest = root / rel
    if content is None:
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(content.encode() if isinstance(content, str) else content)
    os.chmod(dest, 0o755 if executable else 0o644)


def write_series(root: Path, patches: dict[str, bytes | str], header: str = "") -> None:
    """patches/ holding exactly ``patches`` (name -> file content), in that order in series."""
    pdir = root / "patches"
    if pdir.exists():
        shutil.rmtree(pdir)
    pdir.mkdir(parents=True)
    for name, data in patches.items():
        write_file(pdir, name, data)
    (pdir / "series").write_text(header + "".join(f"{n}\n" for n in patches))


def write_project(
    root: Path,
    lock,
    patches: dict[str, bytes | str] | None = None,
    overlay: dict[str, bytes | str] | None = None,
    series_header: str = "",
) -> Path:
    """A project at ``root``: patches/ (``patches``, in order), overlay/ (unless None), then
    upstream.lock.

    ``lock``: a ``Lock`` to save, the path of a lock file to copy, or a function of the
    project root returning the Lock (for a lock whose [files] the engine computes from the
    series just written).
    """
    from dancegrpo_npu.engine.lock import save_lock

    root.mkdir(parents=True, exist_ok=True)
    write_series(root, patches or {}, series_header)
    if overlay is not None:  # None: no overlay/ at all
        (root / "overlay").mkdir(exist_ok=True)
        for rel, content in overlay.items():
            write_file(root / "overlay", rel, content)
    if isinstance(lock, (str, os.PathLike)):
        shutil.copy(lock, root / "upstream.lock")
    else:
        save_lock(lock(root) if isinstance(lock, Callable) else lock, root / "upstream.lock")
    return root
