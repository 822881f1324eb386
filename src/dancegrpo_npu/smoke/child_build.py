"""Fixtures built by a child process of another interpreter, swapped in whole.

Some fixtures need another dependency set's libraries than the tool's (a newer diffusers), and some
import the patched upstream tree, which the tool never imports: the tool starts
``python -m MODULE STAGING ARGS...`` in that interpreter, which writes everything into a
staging directory beside ``dest``; the stamp (what the build depended on) is written last, and
the staging directory replaces ``dest`` in one rename.  A directory whose stamp matches is reused.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

from dancegrpo_npu.smoke.fixtures import STAMP_NAME



def build_in_child(dest: Path, want: str, python: str, module: str, args: list[str], what: str,
                   hint: str = "run ./scripts/bootstrap.sh --deps-only --with diffusers-0.35 (docs/dependencies.md)") -> Path:
    """``dest`` (absolute) holding a build stamped ``want``: reused when current, else built by
    ``python -m module STAGING *args``.  ``what`` names the fixtures in errors, ``hint`` says
    what to do when the build fails (by default: install the diffusers-0.35 set)."""
    from dancegrpo_npu.errors import DancegrpoError

    dest = Path(os.path.abspath(dest))
    stamp = dest / STAMP_NAME
    if stamp.is_file() and stamp.read_text().strip() == want:
        return dest
    if dest.exists() and not stamp.is_file():
        raise DancegrpoError(f"{dest} exists and is not a {what} fixtures directory (no {STAMP_NAME}); not replacing it",
                             "remove it, or choose another directory for the fixtures")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.build-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    src = str(Path(__file__).resolve().parents[2])  # this tool, whatever the set's interpreter imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (src, os.environ.get("PYTHONPATH")))),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run([python, "-m", module, str(staging), *args],
                              env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise DancegrpoError(f"building the {what} fixtures with {python} failed: {last}", hint)
        (staging / STAMP_NAME).write_text(want + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest
