"""Interpreters of other Python versions on this machine, for the tests that need one."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess


def runnable(name: str) -> str | None:
    """An interpreter ``name`` (e.g. python3.12) that runs: on PATH, or one of pyenv's versions
    (pyenv's shims run only the versions selected)."""
    found = [shutil.which(name), *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/*/bin/{name}")))]
    for path in filter(None, found):
        if subprocess.run([path, "-c", "pass"], capture_output=True).returncode == 0:
            return path
    return None
