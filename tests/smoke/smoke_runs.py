"""What the smoke tests of the diffusers-0.35 trainers share: the set's interpreter, and reading
a run's result back."""

from __future__ import annotations

import json

import pytest
from conftest import in_ci

from dancegrpo_npu.errors import DancegrpoError


def layer_python() -> str:
    """The diffusers-0.35 set's interpreter; skipped without it (it fails under CI, where
    scripts/test.sh installs it)."""
    from dancegrpo_npu.run.depsets import python_for

    try:
        return python_for("diffusers-0.35")
    except DancegrpoError as e:
        if in_ci():
            pytest.fail(f"CI: {e.message}")
        pytest.skip(e.message)


def passed(result):
    if isinstance(result, DancegrpoError):
        raise AssertionError(f"the smoke failed: {result.message} ({result.hint})")
    return result


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
