"""``built``: the FLUX smoke's tiny-model fixtures (dancegrpo_npu.trainers.flux.fixtures), a pytest fixture to import.

test_fixtures, test_tiny_models and test_smoke import it; each module's copy builds at
the same path, so the first to ask builds and the others reuse that build.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    from dancegrpo_npu.trainers.flux.fixtures import build_fixtures

    return build_fixtures(tmp_path_factory.getbasetemp() / "session-fixtures" / "fixtures")
