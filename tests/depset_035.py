"""The diffusers-0.35 set's interpreter for tests that need Qwen-Image's classes (the suite's
interpreter has diffusers 0.32): skipped with the reason where the set is not installed, failed
under CI (scripts/test.sh installs it)."""

from __future__ import annotations

import pytest
from conftest import in_ci


def diffusers_035_python() -> str:
    from dancegrpo_npu.errors import DancegrpoError
    from dancegrpo_npu.run import depsets

    try:
        return depsets.python_for("diffusers-0.35")
    except DancegrpoError as e:
        if in_ci():
            pytest.fail(f"CI: {e.message} (scripts/test.sh installs it)")
        pytest.skip(e.message)
