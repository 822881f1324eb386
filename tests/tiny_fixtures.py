"""``built``: the FLUX smoke's tiny-model fixtures (dancegrpo_npu.trainers.flux.fixtures), a pytest fixture to import.

test_fixtures, test_tiny_models, test_smoke and others import it: the test run's one build of
them (tests/shared_runs.py), which every project's copy of the FLUX fixtures comes from too.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def built(shared_runs):
    from shared_runs import flux_build

    return flux_build(shared_runs)
