"""The bench's step takes its features from the seam's table (dancegrpo_port/hooks.py
FEATURES), as a run's run_start does: a row added there reaches the bench with no other edit,
in the table's order, and only the rows a bench step takes (row.bench) are made."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

OVERLAY = Path(__file__).resolve().parents[2] / "overlay"
if str(OVERLAY) not in sys.path:
    sys.path.insert(0, str(OVERLAY))

from dancegrpo_port import alignment, feature, hooks  # noqa: E402  (overlay/ is on sys.path)

from dancegrpo_npu.throughput import phases  # noqa: E402

SIZES = SimpleNamespace(height=64, width=64, sampling_steps=4, eta=0.3, shift=3.0, generations=4,
                        timestep_fraction=0.6, gradient_accumulation_steps=2)


def test_a_bench_step_makes_its_features_from_the_seams_table(monkeypatch):
    class Probe(feature.Feature):
        def __init__(self, sample_batch_size):
            self.sample_batch_size = sample_batch_size

    def never(context):
        raise AssertionError("a row without bench= was made for a bench step")

    rows = (feature.FeatureRow(name="probe", create=lambda c: Probe(c.args.sample_batch_size),
                               bench=feature.BENCH_EVERY_STEP),
            feature.FeatureRow(name="not-benched", create=never))
    monkeypatch.setattr(hooks, "FEATURES", hooks.FEATURES + rows)
    run, timer = alignment.start(phases.trainer_args(SIZES, 1, 1), 0, 1), object()
    bench = SimpleNamespace(sizes=SIZES, device=torch.device("cpu"), alignment_run=run, timer=timer)

    warm_up = phases.Bench.features(bench, 2, logged=False)
    timed = phases.Bench.features(bench, 2, logged=True)
    # the SDE window comes before the noise source (it sees a step's SDE call first)
    assert [type(f).__name__ for f in warm_up] == ["SdeWindow", "Alignment", "Batching", "PhaseTimes", "Probe"]
    assert [type(f).__name__ for f in timed] == ["SdeWindow", "Alignment", "Batching", "PhaseTimes", "MetricsLog",
                                                 "Probe"]
    _, aligned, batching, times, metrics, probe = timed
    assert aligned.run is run and times.timer is timer  # every step shares the bench's run and timer
    assert batching.size == 2 and probe.sample_batch_size == 2
    assert metrics.path == "./metrics.jsonl"  # the step runs in the run directory
    monkeypatch.setattr(hooks, "_FEATURES", [])
    hooks.install(timed)  # each is a Feature with events only
