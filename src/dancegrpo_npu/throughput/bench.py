"""``dancegrpo-npu bench``: GRPO steps of a trainer of the registry, timed phase by phase.

``bench --trainer NAME --size tiny|cpu|full`` builds the trainer's transformer, its VAE and a
ViT-H-14 HPSv2 reward from configs shipped with the tool (its family's; the smoke's tiny ones at
--size tiny), with random weights (nothing is downloaded), on the chosen device, and runs the
patched trainer's own ``train_one_step`` for one prompt's G generations (``phases``): rollout,
decode, reward, train, timed by the trainer's PhaseTimer through its seam.  Each
``--sample-batch-sizes`` value N is measured in the same process, one after the other: the G
generations go through the transformer N at a time (the trainer's --sample_batch_size).  With
``--sde-window-size W`` each N is measured twice, step by step in turn: upstream's step, then
one with the trainer's SDE window of W steps (docs/sde-window.md).

A trainer whose row says bench cannot call its ``train_one_step`` in process (``bench.short_run``:
a loop with none, or a reward or conditioning bench does not build) is timed by a short run
instead: its smoke's tiny models and arguments, launched once per N (``short_run``), the phase
times read from the run's metrics.jsonl, written by the same seam; the table says so.

Before building anything it estimates the memory the preset needs and refuses, with what
to do instead, when the device (or, on the CPU, the host) has less free; running out of
memory anyway ends the same way, never with a traceback.  Then it writes a run directory
under runs/ like a launch (``record``): ``runs`` and ``plot`` read it, and with --record
(the timed steps' stages in records/, as ``launch --record`` writes them) ``compare`` too.

A trainer of another dependency set than the tool's (its row's ``depset``) needs that set's
interpreter: ``bench`` then runs itself, with the same arguments, in a child process of it
(``run_in_depset``), which writes the same table, run directory and records.
"""

from __future__ import annotations

import json
import os
import sys
import time

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.throughput import presets
from dancegrpo_npu.throughput.phases import PHASES

# Set in the child that runs a bench in its preset's dependency set: it measures in-process.
DEPSET_ENV = "DANCEGRPO_BENCH_DEPSET"


def say_progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def resolve_dtype(requested: str, kind: str):
    """bf16 (upstream's autocast type) on accelerators; fp32 on the CPU, where bf16 matmuls
    without AVX512-BF16/AMX run a fallback ~100x slower than fp32."""
    import torch

    if requested == "auto":
        requested = "fp32" if kind == "cpu" else "bf16"
    return torch.bfloat16 if requested == "bf16" else torch.float32


def precision_autocast(trainer, kind: str, dtype):
    """The autocast the phases use.  In fp32 the trainer's own ``device_autocast(bfloat16)``
    calls (in run_sample_step and grpo_one_step) are switched off for this process."""
    import torch

    if dtype == torch.bfloat16:
        return trainer.device_autocast

    def disabled(dtype=None, enabled=True):
        return torch.autocast(kind, enabled=False)

    trainer.device_autocast = disabled  # looked up at call time by the trainer's functions
    return disabled


def float32_inputs(module) -> None:
    """In fp32 the trainer's bfloat16 inputs (its latents, guidance, ids: made for autocast,
    which is off) reach the module as float32, as autocast would have cast them for its matmuls."""
    import torch

    def cast(value):
        return value.float() if torch.is_tensor(value) and value.dtype == torch.bfloat16 else value

    def pre_hook(module, args, kwargs):
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    module.register_forward_pre_hook(pre_hook, with_kwargs=True)


def set_cpu_threads(environ: dict[str, str], busy: float | None = None) -> tuple[int, str]:
    """torch's CPU threads as smoke sets its ranks' (``host.cpus.cpu_threads``; one
    process here), not counting the cores the load average says others keep busy: a timing
    must not be taken with threads spinning against other processes.  An explicit
    OMP_NUM_THREADS wins.  (threads, where the number comes from)."""
    import torch

    from dancegrpo_npu.host.cpus import cpu_threads

    busy = os.getloadavg()[0] if busy is None and hasattr(os, "getloadavg") else (busy or 0.0)
    threads, why = cpu_threads(1, environ, busy)
    torch.set_num_threads(threads)
    return threads, why


def run_bench(project, config: presets.BenchConfig, progress=say_progress):
    """Check, build, measure, record: (results, facts for the fingerprint).  The run directory
    (``facts["run_dir"]``) is made once the memory check has passed.  A short run's preset is
    measured by ``short_run.run_short``."""
    from dancegrpo_npu.engine.treecheck import tree_state
    from dancegrpo_npu.throughput import models as model_lib
    from dancegrpo_npu.throughput import phases, record

    if config.short is not None:
        from dancegrpo_npu.throughput.short_run import run_short

        return run_short(project, config, progress)
    spec = presets.trainer_of(config.preset)
    state = tree_state(project, spec.relpath)
    if state["state"] == "missing":
        raise DancegrpoError(f"bench: {state['detail']}", "run `dancegrpo-npu fetch && dancegrpo-npu apply` first")
    if state["state"] == "unverified":
        progress(f"warning: measuring a tree that is not lock + series + overlay ({state['detail']})")
    progress(f"importing the trainer from {project.workdir}")
    trainer, kind = phases.load_trainer(project.workdir, config.device, spec.relpath)
    import torch

    threads_from = set_cpu_threads(dict(os.environ))[1] if kind == "cpu" else None
    if threads_from:
        progress(f"{torch.get_num_threads()} CPU thread(s) ({threads_from})")
    dtype = resolve_dtype(config.dtype, kind)
    family = config.preset.trainer
    configs = model_lib.model_configs(config.preset)
    counts = model_lib.count_parameters(configs, family)
    weight_bytes = torch.finfo(dtype).bits // 8
    estimate = model_lib.estimate_memory(counts, configs, config.sizes, config.sample_batch_sizes, config.decode_chunk,
                                         weight_bytes, family)
    available, what = model_lib.available_memory(kind)
    model_lib.check_fits(estimate, available, what, config.preset.name, kind)
    facts = {
        **config.describe(),
        "recipe": None if config.recipe is None else str(config.recipe),  # None: a tiny preset's own sizes
        "device_kind": kind,
        "dtype": str(dtype).replace("torch.", ""),
        "parameters": {"transformer": counts.transformer, "vae": counts.vae, "hps": counts.hps},
        "memory_estimate_bytes": estimate.total,
        "memory_available_bytes": available,
        "peak_memory": "max_memory_allocated per phase" if kind != "cpu" else "peak RSS of the process per phase (VmHWM)",
        "torch_threads": torch.get_num_threads(),
        "torch_threads_from": threads_from,  # on the CPU: how the thread count was chosen
        "trainer": f"{spec.relpath}: train_one_step, timed by dancegrpo_port.phases.PhaseTimer",
        "dependency_set": presets.depset_of(config.preset),
        "tree": state,
    }
    started = time.time()
    run_dir = record.start(project, facts, started)
    facts["run_dir"] = str(run_dir)
    progress(f"run directory {run_dir}")
    bench, results, status, error = None, [], "failed", None
    try:
        progress(f"building the models on {kind} in {facts['dtype']} (transformer: {counts.transformer:.3g} parameters)")
        torch.manual_seed(0)
        from dancegrpo_port.device import current_device

        target = current_device()
        built = model_lib.build_models(trainer, configs, target, dtype, family)
        precision_autocast(trainer, kind, dtype)
        if dtype == torch.float32:
            float32_inputs(built.transformer)
        prompt = phases.prompt_batch(configs[0], config.sizes, target, dtype, spec)
        with phases.single_rank_group():
            recorded = config.sizes.steps * len(config.sample_batch_sizes) if config.record else 0
            bench = phases.Bench(trainer, built, prompt, config.sizes, kind, target, run_dir, recorded, spec)
            windows = (0, config.sde_window_size) if config.sde_window_size else (0,)  # side by side, step by step
            for n in config.sample_batch_sizes:
                results.extend(phases.measure(bench, n, config.decode_chunk(n), progress, windows))
        facts["rewards_finite"] = all(r.rewards_finite for r in results)
        status = "succeeded"
        return results, facts
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted"
        raise
    except Exception as e:  # noqa: BLE001 - only out-of-memory is translated; every failure is recorded
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        if not phases.is_out_of_memory(e):
            raise
        where = f" in the {bench.timer.phase_failed} phase" if bench is not None and bench.timer.phase_failed else ""
        message = (f"bench: ran out of memory on {kind}{where} ({config.preset.name}, estimated "
                   f"{estimate.total / 2**30:.1f} GiB): {str(e).splitlines()[0][:160]}")
        error = message
        raise DancegrpoError(
            message,
            "use a smaller --size, smaller --height/--width, --generations, --sample-batch-sizes or --vae-decode-chunk",
            exit_code=2,
        ) from None
    finally:
        trainer.hooks.install([])  # the seam as it is before a run starts
        fingerprint = record_fingerprint(project, facts)
        document = results_document(results, fingerprint) if status == "succeeded" else None
        note = record.finish(run_dir, status, started, facts, fingerprint, document, error)
        if note:
            progress(f"warning: {note}")


def child_depset(config: presets.BenchConfig, environ=None) -> str | None:
    """The dependency set whose interpreter must run this bench, or None: this process runs it
    (the preset's set is the tool's own, or this is that set's child already)."""
    from dancegrpo_npu.run import depsets

    environ = os.environ if environ is None else environ
    name = presets.depset_of(config.preset)
    if not depsets.get(name).layered or environ.get(DEPSET_ENV) == name:
        return None
    return name


def bench_argv(options: dict, json_path: str | None) -> list[str]:
    """``bench``'s own arguments for ``options`` (commands.bench.options_from_args), as typed."""
    argv = ["--trainer", options["trainer"], "--size", options["size"], "--device", options["device"],
            "--dtype", options["dtype"], "--sample-batch-sizes", options["sample_batch_sizes"]]
    if options.get("vae_decode_chunk") is not None:
        argv += ["--vae-decode-chunk", str(options["vae_decode_chunk"])]
    if options.get("sde_window_size"):
        argv += ["--sde-window-size", str(options["sde_window_size"])]
    for flag, name in presets.SIZE_FLAGS:
        if options.get(name) is not None:
            argv += [flag, str(options[name])]
    return argv + (["--record"] if options.get("record") else []) + (["--json", json_path] if json_path else [])


def run_in_depset(project, name: str, options: dict, json_path: str | None) -> int:
    """This bench in a child process of dependency set ``name``'s interpreter, its output on this
    terminal; its exit status.  A set that is not installed is refused in one line."""
    import subprocess
    from pathlib import Path

    from dancegrpo_npu.run.depsets import python_for

    python = python_for(name, needed_by=f"bench --trainer {options['trainer']}")
    src = str(Path(__file__).resolve().parents[2])  # this tool, whatever the set's interpreter imports
    env = {**os.environ, DEPSET_ENV: name, "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(filter(None, (src, os.environ.get("PYTHONPATH"))))}
    where = ["-C", str(project.root), "--workdir", str(project.workdir), "--runs-dir", str(project.runs_dir)]
    say_progress(f"{options['trainer']} runs with the {name} dependency set: {python}")
    sys.stdout.flush()
    command = [python, "-m", "dancegrpo_npu", *where, "bench", *bench_argv(options, json_path)]
    try:
        return subprocess.run(command, env=env).returncode
    except OSError as e:
        raise DancegrpoError(f"bench: cannot start {python}: {e.strerror or e}",
                             f"reinstall it: ./scripts/bootstrap.sh --deps-only --with {name}") from None


def format_table(results, facts) -> str:
    gib = 2**30
    windowed = any(r.sde_window_size for r in results)
    head = (f"{'N':>3}  " + (f"{'W':>3}  " if windowed else "") + f"{'rollout/s':>9}  {'step/s':>8}  "
            + "  ".join(f"{p + ' s':>9}" for p in PHASES) + "  " + "  ".join(f"{'peak ' + p:>12}" for p in PHASES))
    threads = (f"; {facts['torch_threads']} CPU thread(s) ({facts['torch_threads_from']})"
               if facts.get("torch_threads_from") else "")
    if facts.get("short_run"):
        first = (f"{facts['row']} at size {facts['size']} on {facts['device_kind']}: a short run of its smoke "
                 f"(its tiny models and sizes), G={facts['generations']}, {facts['steps']} timed step(s) after "
                 f"{facts['warmup_steps']} warm-up, one run per N{threads}")
        how = (f"timed by the seam's phases of each run's metrics.jsonl, not a train_one_step called in process: "
               f"{facts['short_run']}")
        lines = [first, how]
    else:
        lines = [
            f"{facts['row']} at size {facts['size']} on {facts['device_kind']} ({facts['dtype']}): "
            f"{facts['height']}x{facts['width']}, {facts['sampling_steps']} sampling steps, G={facts['generations']}, "
            f"{facts['train_timesteps']} trained timesteps a sample, {facts['steps']} timed step(s) after "
            f"{facts['warmup_steps']} warm-up{threads}",
        ]
    lines += ["samples/s; seconds per GRPO step; peak memory in GiB (" + facts["peak_memory"] + ")", head]
    for r in results:
        peaks = ["-" if r.peak_memory_bytes[p] is None else f"{r.peak_memory_bytes[p] / gib:.2f}" for p in PHASES]
        window = (f"{r.sde_window_size or '-':>3}  " if windowed else "")
        lines.append(
            f"{r.sample_batch_size:>3}  {window}{r.rollout_samples_per_s:>9.3f}  {r.step_samples_per_s:>8.3f}  "
            + "  ".join(f"{r.phases_s[p]:>9.3f}" for p in PHASES) + "  " + "  ".join(f"{x:>12}" for x in peaks))
    upstream = [r for r in results if not r.sde_window_size]
    if len(upstream) > 1:
        base = upstream[0]
        lines.append("rollout samples/s against N=%d: %s" % (base.sample_batch_size, ", ".join(
            f"N={r.sample_batch_size} {r.rollout_samples_per_s / base.rollout_samples_per_s:.2f}x" for r in upstream[1:])))
    if windowed:
        lines.append(window_line(results, facts["train_timesteps"]))
    if not facts.get("rewards_finite", True):
        lines.append("note: some rewards were not finite (random weights); the timings stand")
    return "\n".join(lines)


def window_ratios(upstream_phases_s: dict, window_phases_s: dict) -> dict:
    """How much faster the SDE window's step is than upstream's, measured side by side: seconds
    without it over seconds with it, of the train phase, the rollout and the whole step (a
    Result's ``phases_s``, or the bench JSON's)."""
    return {"train": upstream_phases_s["train"] / window_phases_s["train"],
            "rollout": upstream_phases_s["rollout"] / window_phases_s["rollout"],
            "whole step": sum(upstream_phases_s.values()) / sum(window_phases_s.values())}


def window_line(results, train_timesteps: int) -> str:
    """The SDE window against upstream at each N (``results``: upstream's, then the window's,
    at each N in turn): how much faster the train phase and the whole step are."""
    parts = []
    for base, windowed in zip(results[::2], results[1::2]):
        ratio = window_ratios(base.phases_s, windowed.phases_s)
        parts.append(f"N={base.sample_batch_size} train {ratio['train']:.2f}x, whole step {ratio['whole step']:.2f}x")
    return (f"SDE window of {results[1].sde_window_size} steps against upstream's {train_timesteps} trained "
            f"timesteps (faster by): " + "; ".join(parts))


def bench_fingerprint(project, facts: dict) -> dict:
    from dancegrpo_npu.run.fingerprint import fingerprint

    env = dict(os.environ)
    return {**fingerprint(project, env, facts.get("tree", {})), "bench": facts}


def results_document(results, fingerprint: dict) -> dict:
    """What ``--json`` and the run directory's bench.json hold."""
    return {"results": [r.as_json() for r in results], "fingerprint": fingerprint}


def record_fingerprint(project, facts: dict) -> dict:
    """The fingerprint for the run directory, or why it could not be taken: the record must
    not hide the bench's own result or error."""
    try:
        return bench_fingerprint(project, facts)
    except Exception as e:  # noqa: BLE001 - best effort by design, the error is recorded
        return {"error": f"{type(e).__name__}: {e}", "bench": facts}


def write_json(path: str, results, fingerprint: dict) -> None:
    from pathlib import Path

    from dancegrpo_npu.files import write_atomic

    document = results_document(results, fingerprint)
    try:
        write_atomic(Path(path), json.dumps(document, indent=2) + "\n")
    except OSError as e:
        raise DancegrpoError(f"bench: cannot write {path}: {e.strerror}", "give a writable --json path") from None
