"""``dancegrpo-npu bench`` end to end: the default trainer's tiny size on the CPU, through the patched trainer's
own ``train_one_step``, timed by its PhaseTimer, recorded in a run directory that ``runs`` reads.

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

RESULT_KEYS = {"sample_batch_size", "sde_window_size", "rollout_samples_per_s", "step_samples_per_s", "phases_s",
               "peak_memory_bytes"}
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
    r = bench(patched_tree.project.root, "--runs-dir", str(tmp_path / "runs"), "--size", "tiny", "--device", "cpu",
              "--sample-batch-sizes", "1,2", "--steps", "1", "--json", str(out), "--record")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    document = json.loads(out.read_text())
    assert set(document) == {"results", "fingerprint"}
    results = document["results"]
    assert [(x["sample_batch_size"], x["sde_window_size"]) for x in results] == [(1, 0), (2, 0)]  # no SDE window
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
    assert (facts["preset"], facts["device_kind"], facts["dtype"]) == ("flux-tiny", "cpu", "float32")
    assert (facts["row"], facts["size"], facts["short_run"]) == ("flux", "tiny", None)
    assert (facts["height"], facts["width"], facts["sampling_steps"], facts["generations"]) == (64, 64, 4, 4)
    assert facts["sample_batch_sizes"] == [1, 2] and facts["train_timesteps"] == 1
    assert facts["tree"]["state"] == "verified"
    # the table: a row per N and the ratio line
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [row[0] for row in rows] == ["1", "2"]
    assert "rollout samples/s against N=1: N=2 " in r.stdout
    # the header says how many CPU threads it used and why: the OMP_NUM_THREADS=1 given here
    assert r.stdout.splitlines()[0].endswith("warm-up; 1 CPU thread(s) (OMP_NUM_THREADS=1, yours)")
    assert facts["torch_threads"] == 1 and facts["torch_threads_from"] == "OMP_NUM_THREADS=1, yours"
    check_run_directory(patched_tree, tmp_path / "runs", facts, results)
    check_compare(patched_tree, tmp_path / "runs", facts)
    check_memory_plan(facts, results)


@pytest.mark.slow
@pytest.mark.upstream
def test_an_sde_window_is_measured_step_by_step_beside_upstreams(patched_tree, tmp_path):
    """--sde-window-size W: each N twice, upstream's step then the window's, alternating (here
    one timed step each, no warm-up): its own result, its table row and the ratio line; the
    window's steps say their window in metrics.jsonl, and `runs` says how many had one."""
    out = tmp_path / "bench.json"
    r = bench(patched_tree.project.root, "--runs-dir", str(tmp_path / "runs"), "--size", "tiny", "--device", "cpu",
              "--steps", "1", "--warmup-steps", "0", "--sde-window-size", "2", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    document = json.loads(out.read_text())
    assert [(x["sample_batch_size"], x["sde_window_size"]) for x in document["results"]] == [(1, 0), (1, 2)]
    assert document["fingerprint"]["bench"]["sde_window_size"] == 2
    rows = [line.split()[:2] for line in r.stdout.splitlines() if line.split()[:1] == ["1"]]
    assert rows == [["1", "-"], ["1", "2"]]
    assert "SDE window of 2 steps against upstream's 1 trained timesteps (faster by): N=1 train " in r.stdout
    assert "N=1, W=2: timed step 1/1" in r.stderr  # bench's progress
    (run,) = (tmp_path / "runs").iterdir()
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x.get("sde_window"), x.get("timesteps_trained")) for x in lines] == [(1, None, None),
                                                                                             (2, [0, 2], 2)]
    listed = subprocess.run([sys.executable, "-m", "dancegrpo_npu", "-C", str(patched_tree.project.root), "runs",
                             "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=120)
    assert "SDE window: [0, 2), 2 timesteps trained a sample (1 of 2 steps)" in listed.stdout, listed.stdout


def check_memory_plan(facts, results):
    """``plan``'s estimate of this bench (one process, float32 on the CPU) is within 25% of the
    largest peak it measured.  At the tiny preset the peak is the runtime (4 MB of models):
    this checks the plan's CPU runtime, not its per-parameter or activation counts."""
    from dancegrpo_npu.plan import memory, models as plan_models
    from dancegrpo_npu.throughput import models as bench_models
    from dancegrpo_npu.throughput.presets import PRESETS

    configs = bench_models.model_configs(PRESETS["flux-tiny"])
    model = plan_models.from_bench("tiny", configs, bench_models.count_parameters(configs))
    recipe = memory.Recipe(height=facts["height"], width=facts["width"], generations=facts["generations"],
                           sampling_steps=facts["sampling_steps"], text_tokens=facts["text_tokens"],
                           selective_checkpointing=1.0, sample_batch_size=max(facts["sample_batch_sizes"]))
    estimate = memory.estimate(model, recipe, memory.bench_on_cpu()).total
    measured = max(max(x["peak_memory_bytes"].values()) for x in results)
    assert abs(estimate - measured) <= 0.25 * measured, (estimate, measured)


def check_run_directory(patched_tree, runs_dir, facts, results):
    """The bench's run directory: the trainer's metrics.jsonl (one line per timed step, written
    by the seam's MetricsLog, with the PhaseTimer's figures) that the table was made from; the
    trainer's reward.txt and prints; and ``runs`` lists it like any launch."""
    from dancegrpo_npu.rundirs.rundir import list_runs, load_run
    from dancegrpo_npu.rundirs.listing import row

    [run] = list_runs(runs_dir)
    assert str(run.path) == facts["run_dir"] and run.name.endswith("-bench-flux-tiny")
    lines = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["sample_batch_size"]) for x in lines] == [(1, 1), (2, 2)]  # timed steps only
    for line, result in zip(lines, results):
        assert {p: line[f"time_{p}"] for p in PHASES} == result["phases_s"]  # one timed step: its mean
        assert line["peak_memory_bytes"] == result["peak_memory_bytes"]
        assert line["peak_memory_kind"] == "host peak RSS (includes weights)"  # the trainer's PhaseTimer says it
        assert math.isfinite(line["loss"]) and math.isfinite(line["grad_norm"]) and line["lr"] == 1e-5
        assert line["ratio_min"] <= 1.0 <= line["ratio_max"] and line["clip_frac_first"] == 0.0  # the seam's health
    assert len((run.path / "reward.txt").read_text().split()) == 4  # the trainer's, warm-up steps included
    assert "final loss" in (run.path / "logs" / "console.log").read_text()  # the trainer's prints, not the terminal's
    document = json.loads((run.path / "bench.json").read_text())
    assert document["results"] == results
    listed = row(load_run(run.path))
    assert (listed["status"], listed["device"], listed["world_size"], listed["steps"]) == ("succeeded", "cpu", 1, 2)
    assert set(listed["phases_s"]) == PHASES and set(listed["peak_memory_bytes"]) == PHASES
    assert listed["health"]["clip_frac"] is not None and listed["health"]["grad_norm"] == lines[-1]["grad_norm"]
    from dancegrpo_npu.rundirs.plot import make_figure  # plot draws its phase panel from the same lines

    phase_panel = next(ax for ax in make_figure([run]).axes if ax.get_title() == "time per phase (s per step)")
    assert {line.get_label().rsplit(": ", 1)[1] for line in phase_panel.get_lines()} == PHASES
    r = subprocess.run([sys.executable, "-m", "dancegrpo_npu", "-C", str(patched_tree.project.root), "runs",
                        "--runs-dir", str(runs_dir)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert run.name in r.stdout and "succeeded" in r.stdout and "time per step (mean): rollout" in r.stdout


def check_compare(patched_tree, runs_dir, facts):
    """With --record the bench's run directory holds records/ as a launch's does, so `compare`
    reads two bench runs: a second one at N=1 repeats the first one's step 1 exactly."""
    first = os.path.basename(facts["run_dir"])
    index = json.loads((runs_dir / first / "records" / "index.json").read_text())
    assert (index["steps"], index["world_size"], index["h"], index["num_generations"]) == ([1, 2], 1, 64, 4)
    r = bench(patched_tree.project.root, "--runs-dir", str(runs_dir), "--size", "tiny", "--device", "cpu",
              "--sample-batch-sizes", "1", "--steps", "1", "--record")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    second = next(p.name for p in runs_dir.iterdir() if p.is_dir() and p.name != first)
    r = subprocess.run([sys.executable, "-m", "dancegrpo_npu", "-C", str(patched_tree.project.root), "compare",
                        "--runs-dir", str(runs_dir), first, second], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "steps compared: 1\n" in r.stdout and "verdict: aligned: " in r.stdout


@pytest.mark.parametrize("error, expected", [
    ("torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')", True),
    ("RuntimeError('[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can\\'t allocate memory: you tried to allocate 42 bytes')", True),
    ("RuntimeError('NPU out of memory. Tried to allocate 1.00 GiB')", True),
    ("MemoryError()", True),
    ("RuntimeError('mat1 and mat2 shapes cannot be multiplied')", False),
    ("ValueError('out of memory')", False),
])  # fmt: skip
def test_what_counts_as_out_of_memory(error, expected):
    import torch  # noqa: F401  (used by the expressions)

    from dancegrpo_npu.throughput.phases import is_out_of_memory

    assert is_out_of_memory(eval(error)) is expected


OOM_IN_ROLLOUT = """
import sys
from dancegrpo_npu.throughput import phases

def run_sample_step(*args, **kwargs):
    raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] . DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 123456789 bytes. Error code 12 (Cannot allocate memory)")

load_trainer = phases.load_trainer

def load_failing_trainer(tree, device, *relpath):
    trainer, kind = load_trainer(tree, device, *relpath)
    trainer.run_sample_step = run_sample_step  # called by the trainer's own sample_reference_model
    return trainer, kind

phases.load_trainer = load_failing_trainer
from dancegrpo_npu.cli import main
sys.exit(main(["-C", sys.argv[1], "bench", "--runs-dir", sys.argv[2], "--size", "tiny", "--device", "cpu",
               "--sample-batch-sizes", "2"]))
"""


@pytest.mark.upstream
def test_running_out_of_memory_is_one_line_exit_2(patched_tree, tmp_path):
    r = subprocess.run([sys.executable, "-c", OOM_IN_ROLLOUT, str(patched_tree.project.root), str(tmp_path / "runs")],
                       capture_output=True, text=True, timeout=900, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and r.stdout == ""
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("dancegrpo-npu: error: bench: ran out of memory on cpu in the rollout phase (flux-tiny")
    assert "DefaultCPUAllocator: can't allocate memory" in last and "use a smaller --size" in last
    # the run directory says so, as a failed launch's does
    from dancegrpo_npu.rundirs.rundir import list_runs
    from dancegrpo_npu.rundirs.listing import failure_reason

    [run] = list_runs(tmp_path / "runs")
    assert run.summary["status"] == "failed" and run.summary["steps"] == 0
    assert failure_reason(run.summary).startswith("bench: ran out of memory on cpu in the rollout phase")
    assert not (run.path / "bench.json").exists()


def test_fp32_switches_the_trainers_autocast_off():
    """On the CPU (fp32) the trainer's own device_autocast(bfloat16) calls must not cast
    matmuls to bf16 (a fallback ~100x slower there); in bf16 they stay as they are."""
    import types

    import torch

    from dancegrpo_npu.throughput.bench import precision_autocast, resolve_dtype

    def original(dtype=None, enabled=True):
        return torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=enabled)

    trainer = types.SimpleNamespace(device_autocast=original)
    assert precision_autocast(trainer, "cpu", torch.bfloat16) is original and trainer.device_autocast is original
    autocast = precision_autocast(trainer, "cpu", torch.float32)
    assert trainer.device_autocast is autocast
    x = torch.ones(2, 2)
    with trainer.device_autocast(torch.bfloat16):
        assert (x @ x).dtype == torch.float32
    with original(torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16
    assert resolve_dtype("auto", "cpu") == torch.float32 and resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
