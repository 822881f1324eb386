"""``dancegrpo-npu bench`` end to end: the tiny preset on the CPU, through the patched trainer.

Runs in a child process (the bench imports the trainer from the tree and sets the device for
its process).  One OpenMP thread: on a shared machine two spinning threads per process slow
a tiny model's many small ops tenfold; timings are not asserted anyway.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("hpsv2")

RESULT_KEYS = {"sample_batch_size", "rollout_samples_per_s", "step_samples_per_s", "phases_s", "peak_memory_bytes"}
PHASES = {"rollout", "decode", "reward", "train"}


def bench(project_root, *args, timeout=1200):
    return subprocess.run(
        [sys.executable, "-m", "dancegrpo_npu", "-C", str(project_root), "bench", *args],
        capture_output=True, text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


@pytest.mark.slow
@pytest.mark.upstream
def test_tiny_preset_on_cpu_writes_the_results(patched_tree, tmp_path):
    out = tmp_path / "bench.json"
    r = bench(patched_tree.project.root, "--preset", "tiny", "--device", "cpu", "--sample-batch-sizes", "1,2",
              "--steps", "1", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    document = json.loads(out.read_text())
    assert set(document) == {"results", "fingerprint"}
    results = document["results"]
    assert [x["sample_batch_size"] for x in results] == [1, 2]
    for x in results:
        assert set(x) == RESULT_KEYS
        assert set(x["phases_s"]) == PHASES and set(x["peak_memory_bytes"]) == PHASES
        numbers = [x["rollout_samples_per_s"], x["step_samples_per_s"], *x["phases_s"].values(), *x["peak_memory_bytes"].values()]
        assert all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in numbers), x
        # rollout means sampling, decode and reward: G over their seconds; a step is all four
        s = x["phases_s"]
        assert math.isclose(x["rollout_samples_per_s"], 4 / (s["rollout"] + s["decode"] + s["reward"]))
        assert math.isclose(x["step_samples_per_s"], 4 / sum(s.values()))
    fingerprint = document["fingerprint"]
    assert {"host", "devices", "packages"} <= set(fingerprint)
    facts = fingerprint["bench"]
    assert (facts["preset"], facts["device_kind"], facts["dtype"]) == ("tiny", "cpu", "float32")
    assert (facts["height"], facts["width"], facts["sampling_steps"], facts["generations"]) == (64, 64, 4, 4)
    assert facts["sample_batch_sizes"] == [1, 2] and facts["train_timesteps"] == 1
    assert facts["tree"]["state"] == "verified"
    # the table: a row per N and the ratio line
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [row[0] for row in rows] == ["1", "2"]
    assert "rollout samples/s against N=1: N=2 " in r.stdout
