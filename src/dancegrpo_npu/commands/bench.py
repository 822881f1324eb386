"""``dancegrpo-npu bench``: GRPO steps of the trainer, timed phase by phase."""

from __future__ import annotations

import argparse

from dancegrpo_npu.project import project_from_args
from dancegrpo_npu.throughput import presets
from dancegrpo_npu.throughput.bench import say_progress, bench_fingerprint, format_table, run_bench, write_json
from dancegrpo_npu.throughput import bench


EXAMPLES = """\
presets (explicit size flags win over the preset's). The sizes a preset does not set are
upstream's recipe (resolution, sampling steps, generations, timestep fraction, eta, shift,
accumulation), read from its script in the patched tree: those presets need
`dancegrpo-npu fetch && dancegrpo-npu apply` first (or --workdir); the tiny ones set them all.
  full   FLUX.1-dev (11.9e9 parameters), its VAE, a ViT-H-14 HPS; upstream's recipe
         (finetune_flux_grpo.sh), 512 text tokens
  cpu    full width, 1 double + 1 single block, HPS with 1 + 1 layers; 128x128, 4 steps,
         4 generations, 64 text tokens, 1 timed step, the rest upstream's recipe (minutes on a
         2-core CPU)
  tiny   the smoke's tiny models at 64x64, 4 steps, 4 generations (seconds; for tests)
  wan    Wan2.1-T2V-1.3B (1.42e9 parameters), its VAE, a ViT-H-14 HPS; upstream's Wan recipe
         (finetune_wan_2_1_grpo.sh, one frame), CFG 5.0, 226 UMT5 tokens
  wan-cpu  Wan2.1-1.3B width, 1 block, HPS with 1 + 1 layers; 128x128, 4 steps, 4 generations,
         the rest upstream's Wan recipe
  tiny-wan the Wan smoke's tiny models at 64x64, 4 steps, 4 generations (seconds; for tests)
  qwenimage  Qwen-Image (20.4e9 parameters), its VAE, a ViT-H-14 HPS; upstream's recipe
         (finetune_qwenimage_grpo.sh), 256 text tokens (about 160 GiB in bf16)
  tiny-qwenimage the Qwen-Image smoke's tiny models at 64x64, 4 steps, 4 generations (seconds)
  The wan and qwenimage presets run with the diffusers-0.35 dependency set, in its interpreter
  (./scripts/bootstrap.sh --deps-only --with diffusers-0.35 installs it).

examples:
  dancegrpo-npu bench --sample-batch-sizes 1,4,12 --json bench.json   # the full preset
  dancegrpo-npu bench --preset cpu --device cpu --sample-batch-sizes 1,4
  dancegrpo-npu bench --preset tiny --generations 8 --sample-batch-sizes 1,8
  dancegrpo-npu bench --preset wan --sample-batch-sizes 1,4,12 --record

The run directory (runs/<time>-bench-<preset>/) holds metrics.jsonl (one line per timed step,
the trainer's phase times), summary.json, the fingerprint, bench.json and the trainer's log.

rollout samples/s = G / (rollout + decode + reward seconds); step samples/s = G / all four.
Peak memory: the device allocator's max_memory_allocated in the phase; on the CPU the
process's peak RSS in the phase (weights included).
"""


def options_from_args(args) -> dict:
    from dancegrpo_npu.commands.launch import resolve_device

    options = {name: getattr(args, name) for _, name in presets.SIZE_FLAGS}
    options.update(
        preset=args.preset, sample_batch_sizes=args.sample_batch_sizes, vae_decode_chunk=args.vae_decode_chunk,
        device=resolve_device(args.device), dtype=args.dtype, record=args.record,
    )  # fmt: skip
    return options


def run(args) -> int:
    options = options_from_args(args)
    config = presets.resolve(options, tree=lambda: project_from_args(args).workdir)
    project = project_from_args(args)
    depset = bench.child_depset(config)
    if depset is not None:  # the preset's trainer needs another dependency set: bench runs there
        return bench.run_in_depset(project, depset, options, args.json)
    results, facts = run_bench(project, config)
    print(format_table(results, facts), flush=True)
    if args.json:
        write_json(args.json, results, bench_fingerprint(project, facts))
        say_progress(f"wrote {args.json}")
    return 0


def register(sub, common) -> None:
    p = sub.add_parser(
        "bench",
        parents=[common],
        help="time GRPO steps of FLUX.1-dev's, Wan2.1's or Qwen-Image's architecture (random weights) phase by phase",
        description=bench.__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Names are checked in presets.resolve, so a wrong one is a one-line error, not argparse's usage.
    p.add_argument("--preset", default=presets.DEFAULT_PRESET,
                   help=f"one of {', '.join(presets.presets())} (default {presets.DEFAULT_PRESET})")
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
    p.add_argument("--text-tokens", type=int, default=None, help="prompt-embedding length (the presets': FLUX's T5 512, Wan's UMT5 226, Qwen-Image 256)")
    p.add_argument("--gradient-accumulation-steps", type=int, default=None, metavar="K",
                   help="samples per optimizer step (must divide G)")
    p.add_argument("--steps", type=int, default=None, help="timed GRPO steps per N (default 2; cpu preset 1)")
    p.add_argument("--warmup-steps", type=int, default=None, help="untimed GRPO steps before them (default 1)")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results and the fingerprint here")
    p.add_argument("--record", action="store_true",
                   help="record every timed step's stages into <run>/records/ as `launch --record` does, so that "
                   "`dancegrpo-npu compare` reads two bench runs (docs/alignment.md)")
    p.set_defaults(func=run)
