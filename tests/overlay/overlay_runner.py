"""Imported by the overlay tests (not a conftest: tests/conftest.py is imported by name).

The overlay modules are tested on their own: overlay/ goes on sys.path (they are
self-contained; upstream is not needed).  Code that changes process-wide state
(device activation, strict mode for the whole process, the fake torch_npu's device
registration) runs in a subprocess through ``run_python``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "overlay"
FAKES = ROOT / "tests" / "fakes"

if str(OVERLAY) not in sys.path:
    sys.path.insert(0, str(OVERLAY))


@pytest.fixture
def run_python(tmp_path):
    """Run ``code`` in a fresh interpreter with overlay/ (and, with fake_npu, the FAKE
    torch_npu) on the path; returns the CompletedProcess (text)."""

    def run(code: str, env: dict | None = None, fake_npu: bool = False, check: bool = True, cwd: Path | None = None):
        paths = [str(OVERLAY)] + ([str(FAKES)] if fake_npu else [])
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("DANCEGRPO_")}
        full_env.update({"PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"})
        full_env.update(env or {})
        script = tmp_path / "snippet.py"  # a file, so that multiprocessing can spawn it
        script.write_text(textwrap.dedent(code))
        proc = subprocess.run([sys.executable, str(script)], env=full_env, cwd=cwd or tmp_path,
                              capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    return run
