"""The batched rollout (batched-rollout.patch and rewards-in-batches.patch) and the phase times (the seam's) in the real trainers, at
the smoke's settings (2 steps, 64x64, 4 sampling steps, 2 generations, HPSv2-shaped reward, strict mode, --rng cpu
--record) on the tiny fixtures:

- a bad --sample_batch_size, and bad --profile_steps text, is refused at start, one line, no traceback
  (each refusal's message is tested in tests/overlay/test_rollout.py and test_alignment.py; here the
  trainer's refusal at start, once for each of the two checks);
- --sample_batch_size 1 is the series without those two, bit for bit (records, metrics, PNG files);
- --sample_batch_size 2 (= G) is aligned with it: the same records bit for bit, so
  `dancegrpo-npu compare` exits 0 and clip_frac_first is 0 on every step;
- the LoRA trainer takes the flag too, with the same result;
- every step's metrics.jsonl record has the phase times and peak memory, and
  --profile_steps writes a trace of that step; bad step text is refused at start.
"""

from __future__ import annotations

import pytest
from conftest import copy_project
from shared_runs import flux_fixtures, flux_spec, private_copy
from test_alignment_patches import WALL, assert_same_records, images, metrics, ok

pytest.importorskip("torch")
pytest.importorskip("diffusers")

pytestmark = [pytest.mark.slow, pytest.mark.upstream]

G = 2  # the smoke's generations: the batch of G is the whole group, as G = 4's is
ALIGNED = ("--rng", "cpu", "--record")
BATCHED = (*ALIGNED, "--sample_batch_size", str(G), "--profile_steps", "2")
PHASES = ("rollout", "decode", "reward", "train")


ROLLOUT_PATCHES = ("batched-rollout.patch", "rewards-in-batches.patch")


@pytest.fixture(scope="session")
def tree_without_batching(upstream_source, tmp_path_factory):
    """The project applied with `apply --without batched-rollout --without rewards-in-batches` (the overlay modules
    stay: the seam's features are there, the trainer samples one at a time)."""
    from dancegrpo_npu.engine.apply import apply_worktree
    from dancegrpo_npu.engine.fetch import fetch
    from dancegrpo_npu.project import find_project

    project = find_project(copy_project(tmp_path_factory.mktemp("without-batching") / "project"))
    fetch(project, source=upstream_source)
    apply_worktree(project, without=ROLLOUT_PATCHES)
    return project


class Runs:
    """Launches at the smoke's settings, each distinct one once a test run (tests/shared_runs.py)."""

    def __init__(self, shared, projects):
        self.shared, self.projects = shared, projects

    def __call__(self, *extra: str, lora: bool = False, tree: str = "patched"):
        project = self.projects[tree]
        return self.shared.launch(project, flux_spec(flux_fixtures(self.shared, project), *extra, lora=lora,
                                                     generations=G))


@pytest.fixture(scope="module")
def runs(patched_tree, tree_without_batching, shared_runs):
    return Runs(shared_runs, {"patched": patched_tree.project, "without": tree_without_batching})


@pytest.mark.parametrize("extra, line", [
    (("--sample_batch_size", "3"), "--sample_batch_size 3 does not divide --num_generations 2: pick one of 1, 2"),
    (("--profile_steps", "2-x"), "--profile_steps '2-x': '2-x' is not understood"),
])  # fmt: skip
def test_bad_arguments_are_refused_at_start(runs, extra, line):
    record = runs(*extra)
    assert record.returncode != 0
    console = (record.run_dir / "logs" / "console.log").read_text()
    trainer = [entry for entry in console.splitlines() if entry.startswith("[default")]  # the trainer's own output
    refusals = [entry for entry in trainer if "error:" in entry]
    assert len(refusals) == 1 and f"train_grpo_flux.py: error: {line}" in refusals[0], trainer
    assert not any("Traceback" in entry or "loading model" in entry for entry in trainer)


def test_sample_batch_size_1_is_the_series_without_the_rollout_patches_bit_for_bit(runs):
    base = ok(runs(*ALIGNED, tree="without"))
    ours = ok(runs(*ALIGNED))
    assert_same_records(base, ours)
    # every figure the series without the two writes, but wall times and memory
    figures = [k for k in metrics(base)[0] if k not in WALL]
    assert [[m[k] for k in figures] for m in metrics(ours)] == [[m[k] for k in figures] for m in metrics(base)]
    assert images(ours) == images(base) and len(images(base)) == G


def test_sample_batch_size_g_is_aligned_with_1(runs):
    one = ok(runs(*ALIGNED))
    batched = ok(runs(*BATCHED))
    assert_same_records(one, batched)  # noise, latents, log-probs, images, rewards, training: bit-equal
    assert images(batched) == images(one)  # one PNG a sample, upstream's names
    for m in metrics(one) + metrics(batched):
        assert m["clip_frac_first"] == 0.0 and m["logprob_diff_max"] == 0.0


def test_compare_says_aligned(runs, tmp_path):
    from dancegrpo_npu.cli import main

    one, batched = ok(runs(*ALIGNED)), ok(runs(*BATCHED))
    assert main(["compare", str(one), str(private_copy(batched, tmp_path))]) == 0  # its report goes into the copy


@pytest.mark.extended  # CI keeps the full trainer's batching checks and the LoRA trainer's alignment
def test_the_lora_trainer_takes_the_flag(runs):
    one = ok(runs(*ALIGNED, lora=True))
    batched = ok(runs(*ALIGNED, "--sample_batch_size", "2", lora=True))
    assert_same_records(one, batched)
    assert all(m["clip_frac_first"] == 0.0 for m in metrics(batched))


def test_phase_times_and_the_profile(runs):
    run_dir = ok(runs(*BATCHED))
    for m in metrics(run_dir):
        times = [m[f"time_{p}"] for p in PHASES]
        assert all(t > 0 for t in times) and sum(times) <= m["step_time"], m
        assert set(m["peak_memory_bytes"]) == set(PHASES) and all(b > 2**20 for b in m["peak_memory_bytes"].values())
        assert m["peak_memory_kind"] == "host peak RSS (includes weights)"
    traces = sorted(p.relative_to(run_dir).as_posix() for p in (run_dir / "profile").rglob("*.json"))
    assert len(traces) == 1 and traces[0].startswith("profile/step_2/rank_0.")  # step 2 only
    assert sorted(p.name for p in (run_dir / "profile").iterdir()) == ["step_2"]  # no folder for other steps


def test_a_tree_without_the_batched_rollout_refuses_a_batch_size(runs):
    """Without batched-rollout.patch the flag still parses (the seam defines it) but the trainer samples one at a
    time: the run stops at its first batch, naming why, instead of ignoring the flag."""
    record = runs(*ALIGNED, "--sample_batch_size", "2", tree="without")
    assert record.returncode != 0
    console = (record.run_dir / "logs" / "console.log").read_text()
    assert "--sample_batch_size 2: this trainer sampled a batch of 1" in console
