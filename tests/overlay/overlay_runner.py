"""Imported by the overlay tests (not a conftest: tests/conftest.py is imported by name).

The overlay modules are tested on their own: overlay/ goes on sys.path (they are
self-contained; upstream is not needed).  Code that changes process-wide state
(device activation, strict mode for the whole process, the fake torch_npu's device
registration) runs in a subprocess through ``run_python``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from snippet import run_snippet

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
        if fake_npu:  # the fake as torch loads it, whatever this shell says (an Ascend host may set these)
            # the libraries transfer_to_npu imports and wraps are left alone: no snippet here looks
            # at them (tests/npu does), and importing transformers.trainer costs seconds a process
            env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1", "FAKE_TORCH_NPU_LIBRARIES": "skip", **(env or {})}
        drop = ("DANCEGRPO_",) + (("ASCEND_RT_VISIBLE_DEVICES", "FAKE_TORCH_NPU") if fake_npu else ())
        return run_snippet(code, tmp_path, paths, env or {}, cwd=cwd, check=check, drop=drop)

    return run
