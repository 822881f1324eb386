"""``bench`` of a trainer it cannot drive in process (the row's ``bench.short_run``: SD's loop has no
``train_one_step``): a short run of the trainer's smoke, timed by the seam's phases in the run's
metrics.jsonl, and the table saying so."""

from __future__ import annotations

import json
import math

import pytest
from bench_runs import PHASES, bench

from dancegrpo_npu import registry
from dancegrpo_npu.throughput import presets
from dancegrpo_npu.throughput.bench import format_table
from dancegrpo_npu.throughput.short_run import result_of_run

SHORT = [s.name for s in registry.benched() if s.bench.short_run]


def step(n: int, rollout: float, train: float, peak: int, **more) -> dict:
    return {"step": n, "reward_mean": 0.3, "time_rollout": rollout, "time_decode": 0.5, "time_reward": 0.25,
            "time_train": train, "peak_memory_bytes": {"rollout": peak, "decode": None, "reward": peak, "train": peak},
            **more}


def test_the_timed_steps_of_a_short_run_are_its_metrics_less_the_warm_up(tmp_path):
    lines = [step(1, 9.0, 9.0, 900), step(2, 2.0, 4.0, 100), step(3, 0.0, 2.0, 300)]
    del lines[2]["time_rollout"]  # a step that samples nothing (an epoch's later update): 0 s
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = result_of_run(tmp_path, 2, presets.ShortRun(generations=4, steps=2, warmup_steps=1))
    assert result.phases_s == {"rollout": 1.0, "decode": 0.5, "reward": 0.25, "train": 3.0}
    assert result.peak_memory_bytes == {"rollout": 300, "decode": None, "reward": 300, "train": 300}
    assert result.sample_batch_size == 2 and math.isclose(result.rollout_samples_per_s, 4 / 1.75)
    with pytest.raises(Exception) as err:  # fewer timed steps than asked: one line, not a wrong mean
        result_of_run(tmp_path, 2, presets.ShortRun(generations=4, steps=3, warmup_steps=1))
    assert "holds 2 timed step(s), not 3" in str(err.value)


@pytest.mark.parametrize("name", SHORT)
def test_the_table_of_a_short_run_says_what_was_timed_and_why(name):
    config = presets.resolve({"trainer": name, "size": "tiny"})
    facts = {**config.describe(), "device_kind": "cpu", "dtype": "the smoke's", "peak_memory": "the seam's",
             "torch_threads": 1, "torch_threads_from": "OMP_NUM_THREADS=1, yours"}
    first, second = format_table([], facts).splitlines()[:2]
    assert first.startswith(f"{name} at size tiny on cpu: a short run of its smoke")
    assert first.endswith("1 CPU thread(s) (OMP_NUM_THREADS=1, yours)")
    assert second.endswith(f"not a train_one_step called in process: {registry.get(name).bench.short_run}")


@pytest.mark.slow
@pytest.mark.upstream
def test_sd_is_timed_by_a_short_run_of_its_smoke(patched_tree, tmp_path):
    """The SD trainer has no train_one_step: bench launches its smoke (its tiny pipeline and
    arguments) and reads the phase times its seam wrote."""
    out = tmp_path / "bench.json"
    r = bench(patched_tree.project.root, "--runs-dir", str(tmp_path / "runs"), "--trainer", "sd", "--size", "tiny",
              "--device", "cpu", "--steps", "1", "--warmup-steps", "1", "--json", str(out), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    why = registry.get("sd").bench.short_run
    assert f"not a train_one_step called in process: {why}" in r.stdout
    document = json.loads(out.read_text())
    [result], facts = document["results"], document["fingerprint"]["bench"]
    assert result["sample_batch_size"] == 1 and set(result["phases_s"]) == PHASES
    assert result["phases_s"]["rollout"] > 0 and result["phases_s"]["train"] > 0
    assert (facts["row"], facts["size"], facts["short_run"]) == ("sd", "tiny", why)
    assert facts["torch_threads_from"] == "OMP_NUM_THREADS=1, yours"  # set for the job and said
    [run_dir] = facts["run_dirs"]
    assert run_dir.endswith("-bench-sd-tiny-n1")
    lines = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl").read().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]  # the warm-up step, then the timed one
    assert result["phases_s"]["train"] == lines[1]["time_train"]
