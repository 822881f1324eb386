"""Run a Python snippet in a fresh interpreter (for the overlay and per-patch tests).

Code that changes process-wide state (device activation, strict mode, the fake
torch_npu) or that must see a module's first import runs here, not in pytest's process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def run_snippet(code: str, tmp: Path, paths: list[str], env: dict, *, args=(), cwd: Path | None = None,
                drop=("DANCEGRPO_",), check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess:
    """``code`` (dedented) as ``tmp/snippet.py`` - a file, so that multiprocessing can spawn
    it - run in ``cwd`` (default ``tmp``) with only ``paths`` on PYTHONPATH, one OpenMP
    thread, variables starting with ``drop`` removed and ``env`` added; an AssertionError
    with its output when it fails and ``check``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(drop))}
    full_env.update({"PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"})
    full_env.update(env)
    script = tmp / "snippet.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.run([sys.executable, str(script), *args], env=full_env, cwd=cwd or tmp,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc
