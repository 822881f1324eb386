"""Imported by the per-patch tests (not a conftest: tests/conftest.py is imported by name).

Per-patch tests run the PATCHED upstream tree (``patched_tree`` from tests/conftest.py) in
fresh interpreters: ``run_in_tree`` puts the tree (and, for fake_npu tests, the FAKE
torch_npu) on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parents[1] / "fakes"


@pytest.fixture
def run_in_tree(patched_tree, tmp_path):
    def run(code: str, *, args=(), env=None, fake_npu=False, check=True, timeout=300):
        paths = [str(patched_tree.tree)] + ([str(FAKES)] if fake_npu else [])
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("DANCEGRPO_", "WANDB_"))}
        full_env.update({"PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
                         "DANCEGRPO_DEVICE": "cpu"})
        full_env.update(env or {})
        script = tmp_path / "snippet.py"
        script.write_text(textwrap.dedent(code))
        proc = subprocess.run([sys.executable, str(script), *args], env=full_env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        return proc

    return run
