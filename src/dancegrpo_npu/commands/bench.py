"""``dancegrpo-npu bench``: GRPO steps of a trainer, timed phase by phase."""

from __future__ import annotations

import argparse
import textwrap

from dancegrpo_npu import registry
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import project_from_args
from dancegrpo_npu.throughput import bench, presets
from dancegrpo_npu.throughput.bench import bench_fingerprint, format_table, run_bench, say_progress, write_json


def sizes_text() -> str:
    """The trainers and their sizes, from the registry: what each preset builds, or why the sizes
    it has none at are refused (once for the sizes of one reason), and which are short runs."""
    lines = []
    for spec in registry.benched():
        short = f" (a short run: {spec.bench.short_run})" if spec.bench.short_run else ""
        lines.append(textwrap.fill(f"{spec.name}{short}", 96, initial_indent="  ", subsequent_indent="      "))
        refused: dict[str, list[str]] = {}
        for size in presets.SIZES:
            preset = spec.bench.preset(size)
            if preset is None:
                refused.setdefault(dict(spec.bench.no_sizes).get(size, "no preset"), []).append(size)
                continue
            lines.append(textwrap.fill(preset.summary, 96, initial_indent=f"    {size:<5} ", subsequent_indent=" " * 10))
        for why, sizes in refused.items():
            lines.append(textwrap.fill(f"{', '.join(sizes)}: refused: {why}", 96, initial_indent="    ",
                                       subsequent_indent=" " * 10))
    return "\n".join(lines)


def epilog() -> str:
    default = registry.default_trainer().name
    other = next((s.name for s in registry.benched() if s.depset != registry.default_trainer().depset), default)
    short = next((s.name for s in registry.benched() if s.bench.short_run), None)
    examples = [
        f"  dancegrpo-npu bench --trainer {default} --sample-batch-sizes 1,4,12 --json bench.json   # full size",
        f"  dancegrpo-npu bench --trainer {default} --size cpu --device cpu --sample-batch-sizes 1,4",
        f"  dancegrpo-npu bench --trainer {default} --size tiny --generations 8 --sample-batch-sizes 1,8",
        f"  dancegrpo-npu bench --trainer {other} --size tiny --sample-batch-sizes 1,2 --record",
        f"  dancegrpo-npu bench --trainer {default} --size tiny --sampling-steps 16 --timestep-fraction 0.6 "
        "--sde-window-size 4\n      # upstream's 9 trained timesteps a sample against an SDE window of 4, step by step",
    ]
    if short:
        examples.append(f"  dancegrpo-npu bench --trainer {short} --size tiny --device cpu   # a short run of its smoke")
    return f"""\
trainers and sizes (--trainer NAME --size SIZE; explicit size flags win over the preset's).
The sizes a preset does not set are upstream's recipe (resolution, sampling steps, generations,
timestep fraction, eta, shift, accumulation), read from its script in the patched tree: those
need `dancegrpo-npu fetch && dancegrpo-npu apply` first (or --workdir); the tiny ones set them all.
A trainer of another dependency set than the tool's runs in that set's interpreter
(./scripts/bootstrap.sh --deps-only --with SET installs it).
{sizes_text()}

examples:
{chr(10).join(examples)}

The run directory (runs/<time>-bench-<trainer>-<size>/; a short run: one a sample batch size,
-n<N>) holds metrics.jsonl (one line per timed step, the trainer's phase times), summary.json,
the fingerprint, bench.json and the trainer's log.

rollout samples/s = G / (rollout + decode + reward seconds); step samples/s = G / all four.
Peak memory: the device allocator's max_memory_allocated in the phase; on the CPU the
process's peak RSS in the phase (weights included).  On the CPU the torch threads are set from
the free cores (the load average counted; OMP_NUM_THREADS wins) and said in the table.
"""


def options_from_args(args) -> dict:
    from dancegrpo_npu.commands.launch import resolve_device

    if args.preset is not None:  # the names before --trainer and --size
        raise DancegrpoError(f"bench: --preset {args.preset}: a bench is named by its trainer and size",
                             f"give `dancegrpo-npu bench --trainer NAME --size {'|'.join(presets.SIZES)}` "
                             f"(trainers: {', '.join(s.name for s in registry.benched())})", exit_code=2)
    options = {name: getattr(args, name) for _, name in presets.SIZE_FLAGS}
    options.update(
        trainer=args.trainer, size=args.size, sample_batch_sizes=args.sample_batch_sizes,
        vae_decode_chunk=args.vae_decode_chunk, device=resolve_device(args.device), dtype=args.dtype,
        record=args.record, sde_window_size=args.sde_window_size,
    )  # fmt: skip
    return options


def run(args) -> int:
    options = options_from_args(args)
    config = presets.resolve(options, tree=lambda: project_from_args(args).workdir)
    project = project_from_args(args)
    depset = bench.child_depset(config)
    if depset is not None:  # the trainer needs another dependency set: bench runs there
        return bench.run_in_depset(project, depset, options, args.json)
    results, facts = run_bench(project, config)
    print(format_table(results, facts), flush=True)
    if args.json:
        write_json(args.json, results, bench_fingerprint(project, facts))
        say_progress(f"wrote {args.json}")
    return 0


def register(sub, common) -> None:
    names = [s.name for s in registry.benched()]
    p = sub.add_parser(
        "bench",
        parents=[common],
        help=f"time GRPO steps of a trainer ({', '.join(names)}) phase by phase, at size tiny, cpu or full",
        description=bench.__doc__,
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Names are checked in presets.resolve, so a wrong one is a one-line error, not argparse's usage.
    p.add_argument("--trainer", default=presets.DEFAULT_TRAINER, metavar="NAME",
                   help=f"the trainer: {', '.join(names)} (default {presets.DEFAULT_TRAINER})")
    p.add_argument("--size", default=presets.DEFAULT_SIZE, metavar="SIZE",
                   help=f"{' | '.join(presets.SIZES)}: the smoke's tiny models, one full-width block, the full model "
                        f"(default {presets.DEFAULT_SIZE}); below: what each trainer has")
    p.add_argument("--preset", default=None, help=argparse.SUPPRESS)  # refused, naming --trainer and --size
    p.add_argument("--device", default=None,
                   help="auto | cpu | cuda | npu (default: $DANCEGRPO_DEVICE if set, else auto: npu, else cuda, else cpu)")
    p.add_argument("--dtype", default="auto", help="auto | bf16 | fp32 (default auto: bf16 on npu/cuda, fp32 on cpu)")
    p.add_argument("--sample-batch-sizes", default="1", metavar="N,N,...",
                   help="samples per transformer call in the rollout, each measured in turn; each must divide "
                   "--generations (default 1: upstream's)")
    p.add_argument("--vae-decode-chunk", type=int, default=None, metavar="K", help="images per VAE decode call (default N)")
    p.add_argument("--height", type=int, default=None, help="image height (multiple of 16)")
    p.add_argument("--width", type=int, default=None, help="image width (multiple of 16)")
    p.add_argument("--sampling-steps", type=int, default=None, help="denoising steps of the rollout")
    p.add_argument("--generations", type=int, default=None, metavar="G", help="samples of one prompt in a GRPO step")
    p.add_argument("--timestep-fraction", type=float, default=None, help="share of the timesteps trained")
    p.add_argument("--eta", type=float, default=None, help="the SDE sampler's noise level")
    p.add_argument("--shift", type=float, default=None, help="the sigma schedule's time shift")
    p.add_argument("--text-tokens", type=int, default=None,
                   help="prompt-embedding length (default: the trainer's: "
                        + ", ".join(f"{s.name} {s.bench.text_tokens}" for s in registry.benched() if s.bench.text_tokens)
                        + ")")
    p.add_argument("--gradient-accumulation-steps", type=int, default=None, metavar="K",
                   help="samples per optimizer step (must divide G)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"timed GRPO steps per N (default {presets.TIMING['steps']}; cpu size 1)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help=f"untimed GRPO steps before them (default {presets.TIMING['warmup_steps']})")
    p.add_argument("--sde-window-size", type=int, default=0, metavar="W",
                   help="measure each N twice, step by step in turn: upstream's step (every sampling step an SDE "
                   "step, --timestep-fraction of them trained), then one with the trainer's --sde_window_size W (W "
                   "steps an SDE step and trained, the rest the ODE); the table says how much faster the train "
                   "phase and the whole step are (default 0: upstream's alone)")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results and the fingerprint here")
    p.add_argument("--record", action="store_true",
                   help="record every timed step's stages into <run>/records/ as `launch --record` does, so that "
                   "`dancegrpo-npu compare` reads two bench runs (docs/alignment.md)")
    p.set_defaults(func=run)
