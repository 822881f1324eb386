"""What the smoke tests of the diffusers-0.35 trainers share: a run's result read back (the set's
interpreter is depset_035's)."""

from __future__ import annotations

import json

from dancegrpo_npu.errors import DancegrpoError


def passed(result):
    if isinstance(result, DancegrpoError):
        raise AssertionError(f"the smoke failed: {result.message} ({result.hint})")
    return result


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
