"""A bench of a trainer bench cannot drive in process: a short run of its smoke, timed by the seam.

Where a trainer's row says bench cannot call its ``train_one_step`` on models it builds (its
``bench.short_run``: a loop without one, or a reward or a conditioning bench does not build),
``bench`` launches the trainer as its smoke does (the row's smoke hooks: the tiny fixtures, the
trainer's arguments) for warm-up + timed steps, once per sample batch size N (the trainer's
``--sample_batch_size``), each in its own run directory (``runs/<time>-bench-TRAINER-SIZE-nN/``,
a launch's record, with ``--record`` its records).  The figures are the seam's: each step's
``time_<phase>`` and ``peak_memory_bytes`` in the run's metrics.jsonl, the same PhaseTimer that
times an in-process bench; the warm-up steps are left out.  The CPU threads of the job are set
here (``host.cpus``, the load average counted) and said.
"""

from __future__ import annotations

import contextlib
import json
import math
import os

from dancegrpo_npu import registry
from dancegrpo_npu.contract import PHASES
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.throughput import presets
from dancegrpo_npu.throughput.phases import Result, result_of


def run_short(project, config: presets.BenchConfig, progress):
    """(results, facts) of the short runs of ``config`` (a preset of a row's ``bench.short_run``)."""
    from dancegrpo_npu.engine.treecheck import require_tree
    from dancegrpo_npu.host.cpus import cpu_threads
    from dancegrpo_npu.smoke import runner

    preset, short = config.preset, config.short
    spec = presets.trainer_of(preset)
    total = short.warmup_steps + short.steps
    options = runner.SmokeOptions(trainer=spec.name, device=config.device, steps=total,
                                  generations=short.generations)
    try:
        runner.check_options(options)
    except DancegrpoError as e:
        raise DancegrpoError(f"bench: a short run of {spec.name} takes --warmup-steps + --steps = {total} smoke "
                             f"steps, and {e.message}", e.hint, exit_code=2) from None
    verified = require_tree(project, spec.relpath)
    job = runner.job_env(config.device, 1)  # it sets OMP_NUM_THREADS where the job runs on the CPU
    env = [(k, v) for k, v in job if k != "OMP_NUM_THREADS"]
    threads, threads_from = None, None
    if len(env) < len(job):
        busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        threads, threads_from = cpu_threads(1, dict(os.environ), busy)
        env.append(("OMP_NUM_THREADS", str(threads)))
        progress(f"{threads} CPU thread(s) for the job ({threads_from})")
    progress(f"{spec.name}: a short run of its smoke for each N ({preset.short_run})")
    built = registry.load(spec.smoke.fixtures)(project, options, spec)
    args = runner.trainer_arguments(project, built, options, spec)
    results, run_dirs = [], []
    for n in config.sample_batch_sizes:
        progress(f"N={n}: {short.warmup_steps} warm-up + {short.steps} timed step(s)")
        run_dir = _launch(project, config, spec, args, n, env, verified)
        run_dirs.append(str(run_dir))
        results.append(result_of_run(run_dir, n, short))
    facts = {
        **config.describe(),
        "device_kind": _device_kind(run_dirs[-1], config.device),
        "dtype": "the smoke's",
        "peak_memory": "the seam's peak_memory_bytes per phase (metrics.jsonl)",
        "torch_threads": threads,
        "torch_threads_from": threads_from,
        "trainer": f"{spec.relpath}: a short run of its smoke, timed by dancegrpo_port.phases.PhaseTimer",
        "dependency_set": spec.depset,
        "tree": verified,
        "run_dirs": run_dirs,
        "run_dir": run_dirs[-1],
        "rewards_finite": all(r.rewards_finite for r in results),
    }
    return results, facts


def _launch(project, config, spec, args, n: int, env, verified):
    """One short run at sample batch size ``n``: its run directory (a run that did not end well is
    the launch's one-line error)."""
    from dancegrpo_npu.run.align_flags import AlignOptions
    from dancegrpo_npu.run.launch import LaunchSpec, launch

    batch = ("--sample_batch_size", str(n)) if spec.bench.sample_batch_flag else ()
    launched = LaunchSpec(script=spec.name, args=(*args, *batch), device=config.device,
                          name=f"bench-{config.preset.name}-n{n}", env=tuple(env), upstream_defaults=False,
                          strict=True, align=AlignOptions(record=config.record), verb="smoke")
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):  # the run's log keeps it
        record = launch(project, launched, verified=verified)
    if record.returncode != 0:
        raise DancegrpoError(f"bench: the short run of {spec.name} at N={n} failed (exit {record.returncode})",
                             f"see the rank logs in {record.run_dir / 'logs'}")
    return record.run_dir


def result_of_run(run_dir, n: int, short: presets.ShortRun) -> Result:
    """The timed steps' figures of a short run's metrics.jsonl: mean seconds and the largest peak,
    per phase (a phase a step does not run counts 0 s: a trainer that samples at an epoch's first
    update only)."""
    path = run_dir / "metrics.jsonl"
    try:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise DancegrpoError(f"bench: {path} cannot be read ({e})", f"see the rank logs in {run_dir / 'logs'}") from None
    timed = [line for line in lines if line.get("step", 0) > short.warmup_steps]
    if len(timed) < short.steps:
        raise DancegrpoError(f"bench: {path} holds {len(timed)} timed step(s), not {short.steps}",
                             f"see the rank logs in {run_dir / 'logs'}")
    figures = [{**{f"time_{p}": float(line.get(f"time_{p}") or 0.0) for p in PHASES},
                "peak_memory_bytes": line.get("peak_memory_bytes") or {},
                "reward_mean": float(line.get("reward_mean", math.nan))} for line in timed]
    return result_of(n, short.generations, figures)


def _device_kind(run_dir: str, requested: str) -> str:
    """The device the run ran on, as its record says (auto resolved), else as requested."""
    try:
        summary = json.loads(open(os.path.join(run_dir, "summary.json")).read())
        return summary.get("device_kind") or summary.get("device") or requested
    except (OSError, ValueError):
        return requested
