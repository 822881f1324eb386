"""``dancegrpo-npu plan``: the memory one rank needs for a GRPO run, before the run.

For a trainer of the registry with model shapes (its row's ``plan``: shapes shipped with the
tool in its family's folder, and the architecture they are counted as), a world size, the
device's memory and upstream's recipe sizes (read from upstream's launch script in the patched
tree: plan runs in a project after `dancegrpo-npu fetch && dancegrpo-npu apply`, or with
--workdir naming a patched tree), it estimates per rank: the fp32 master weights, gradients and
AdamW moments sharded over the ranks (FSDP FULL_SHARD), FSDP's gathered blocks, the reward and
the VAE, the activations of the largest phase (from the model's config, the recipe's sizes and
how many blocks --selective-checkpointing checkpoints) and a runtime reserve (an assumption, in
the total); with the recipe's --use_ema, the host memory upstream's EMA takes on rank 0.  A UNet
trained under DDP (its sizes read from the absl configuration its script names) is whole on
every rank: fp32 weights, gradients, DDP's buckets, AdamW and autocast's bf16 copy, with its
text encoder, and the activations counted layer by layer.  Then it sets the ways to make it
smaller side by side - selective checkpointing 1.0, more ranks, FSDP CPU offload, LoRA, a
training batch of 1 where a configuration sets a larger one, the other placements of a first
frame's pipeline - each against 64 GiB (910B3 and the like) and 32 GiB (910B4) cards, with the
launch arguments for it.

A configuration that does not fit --device-memory is refused in one line (exit 1) naming the
options that would fit, or, where none fits alone, the fewest of them that fit together.  An
option the trainer's registry row lacks (--cpu-offload, --lora-rank, a first frame's placement)
is refused (exit 2).  It is an estimate from shapes, not a measurement: see docs/memory-plan.md
for how it compares with the peaks bench measures.
"""

from __future__ import annotations

import argparse
import sys

from dancegrpo_npu import registry
from dancegrpo_npu.plan import memory, models
from dancegrpo_npu.plan.report import first_frame_options, plan
from dancegrpo_npu.project import project_from_args


def examples() -> str:
    """plan's examples, from the registry: its default trainer, and the rows that have each option."""
    names = models.names()
    default = registry.default_trainer().name if registry.default_trainer().name in names else names[0]
    offload = next((n for n in names if registry.get(n).offload_flag and n != default), default)
    lora = next((n for n in names if registry.get(n).lora), None)
    ddp = next((n for n in names if models.model_of(n).parallel == "ddp"), None)
    lines = [
        f"  dancegrpo-npu plan {default}                       # upstream's recipe, read from the patched tree",
        f"  dancegrpo-npu plan {default} --device-memory 32    # a 910B4",
        f"  dancegrpo-npu plan {default} --world-size 16 --selective-checkpointing 1.0",
        f"  dancegrpo-npu plan {offload} --cpu-offload",
    ]
    if lora:
        lines.append(f"  dancegrpo-npu plan {lora} --lora-rank 128")
    lines.append(f"  dancegrpo-npu plan {default} --workdir ../DanceGRPO   # the recipe read from another patched tree")
    if ddp:
        lines.append(f"  dancegrpo-npu plan {ddp} --device-memory 32   # under DDP: the whole model on every rank")
    lines += [f"  dancegrpo-npu plan {takers[0]} {option} offload   # the first frame's pipeline a model at a time"
              for option, takers in first_frame_options()]
    return "examples:\n" + "\n".join(lines) + "\n"


def run(args) -> int:
    overrides = {"height": args.height, "width": args.width, "generations": args.generations,
                 "sampling_steps": args.sampling_steps, "text_tokens": args.text_tokens,
                 "selective_checkpointing": args.selective_checkpointing, "sample_batch_size": args.sample_batch_size}
    text, refusal = plan(args.model, args.world_size, args.device_memory, args.ranks_per_node, overrides,
                         args.cpu_offload, args.lora_rank, args.reserve, tree=lambda: _tree(args),
                         first_frame=args.first_frame)
    print(text)
    if refusal is not None:
        sys.stdout.flush()
        raise refusal
    return 0


def _tree(args):
    """The patched tree, where the recipe sizes are read (a missing one is refused there)."""
    return project_from_args(args).workdir


def register(sub, common) -> None:
    p = sub.add_parser(
        "plan",
        parents=[common],
        help=f"estimate the memory a rank needs for a GRPO run ({', '.join(models.names())}) and what fits on "
             "64/32 GiB cards",
        description=__doc__,
        epilog=examples(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help=f"one of {', '.join(models.names())}")
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="ranks of the job (default: the recipe's, from its script's torchrun line; the plan's "
                        "`recipe:` line says it)")
    p.add_argument("--ranks-per-node", type=int, default=8, metavar="N", help="NPUs a node (default 8), for the launch lines")
    p.add_argument("--device-memory", type=float, default=64.0, metavar="GIB",
                   help="memory of one card in GiB (default 64; a 910B4 has 32); refused above it")
    p.add_argument("--cpu-offload", action="store_true", help="FSDP CPU offload of weights, gradients and AdamW")
    p.add_argument("--lora-rank", type=int, default=0, metavar="R", help="LoRA of rank R instead of full fine-tuning")
    for option, takers in first_frame_options():  # each first-frame pipeline's placement, named by its trainer's flag
        flag = models.model_of(takers[0]).first_frame["flag"]
        p.add_argument(option, dest="first_frame", choices=memory.FIRST_FRAME_PLACEMENTS, default=None,
                       help=f"where the first frame's {models.model_of(takers[0]).first_frame['name']} lives "
                            f"({', '.join(takers)}; launch's {flag}): upstream (on the device while it runs, on the "
                            "host between steps; the default), device (kept there), offload (one of its models at a "
                            "time)")
    p.set_defaults(first_frame=None)
    p.add_argument("--reserve", type=float, default=3.0, metavar="GIB",
                   help="runtime reserve a rank: device runtime, collective buffers, allocator slack (default 3, assumed)")
    p.add_argument("--selective-checkpointing", type=float, default=None, metavar="P",
                   help="fraction of blocks checkpointed (default: the recipe's)")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--generations", type=int, default=None, metavar="G")
    p.add_argument("--sampling-steps", type=int, default=None)
    p.add_argument("--text-tokens", type=int, default=None,
                   help="prompt-embedding tokens (default: the model's: "
                        + ", ".join(f"{n} {models.entry(n)['recipe']['text_tokens']}" for n in models.names()) + ")")
    p.add_argument("--sample-batch-size", type=int, default=None, metavar="N", help="samples a transformer call in the rollout (default 1)")
    p.set_defaults(func=run)
