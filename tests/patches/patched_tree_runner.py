"""Imported by the per-patch tests (not a conftest: tests/conftest.py is imported by name).

Per-patch tests run the PATCHED upstream tree (``patched_tree`` from tests/conftest.py) in
fresh interpreters: ``run_in_tree`` puts the tree (and, for fake_npu tests, the FAKE
torch_npu) on PYTHONPATH."""

from __future__ import annotations

from pathlib import Path

import pytest
from snippet import run_snippet

FAKES = Path(__file__).resolve().parents[1] / "fakes"


@pytest.fixture
def run_in_tree(patched_tree, tmp_path):
    def run(code: str, *, args=(), env=None, fake_npu=False, check=True, timeout=300):
        paths = [str(patched_tree.tree)] + ([str(FAKES)] if fake_npu else [])
        return run_snippet(code, tmp_path, paths, {"WANDB_MODE": "disabled", "DANCEGRPO_DEVICE": "cpu", **(env or {})},
                           args=args, drop=("DANCEGRPO_", "WANDB_"), check=check, timeout=timeout)

    return run
