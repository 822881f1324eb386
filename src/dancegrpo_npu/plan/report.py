"""The memory plan as the tool prints it: the estimate, the options side by side, the refusal.

``dancegrpo-npu plan`` (dancegrpo_npu.commands.plan) calls :func:`plan`.

What it counts is in :mod:`dancegrpo_npu.plan.memory`; docs/memory-plan.md says how it
compares with the peaks bench measures.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from dancegrpo_npu import registry
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.plan import memory, models
from dancegrpo_npu.plan.memory import GiB

CARDS = ((64, "64 GiB"), (32, "32 GiB (910B4)"))

# What each trainer takes for an option is its registry row's (offload_flag; lora, lora_args, no_lora).
NO_OFFLOAD = "the trainer has no FSDP CPU offload"
NO_LORA = "the trainer has no LoRA option"
NO_CHECKPOINTING = "the trainer has no activation checkpointing option"


def _bad(message: str, hint: str) -> DancegrpoError:
    return DancegrpoError(f"plan: {message}", hint, exit_code=2)


def _ranks(n: int) -> str:
    return f"{n} rank{'' if n == 1 else 's'}"


def _gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def launch_line(model: memory.Model, choice: memory.Choice, ranks_per_node: int) -> str:
    """The launch command for a choice, or why there is none."""
    spec = registry.get(model.trainer)
    trainer, extra = spec.name, []
    opts, recipe = choice.options, choice.recipe
    if model.first_frame and opts.first_frame != "upstream":
        extra.append(f"{model.first_frame['flag']} {opts.first_frame}")
    if opts.cpu_offload:
        if spec.offload_flag is None:
            return f"(none: {NO_OFFLOAD})"
        extra.append(spec.offload_flag)
    if opts.lora_rank:
        if spec.lora is None:
            return f"(none: {spec.no_lora or NO_LORA})"
        trainer = spec.lora
        extra.append(spec.lora_args.format(rank=opts.lora_rank, alpha=2 * opts.lora_rank))
    if model.checkpointing:
        extra.append(f"--selective_checkpointing {recipe.selective_checkpointing}")
    elif recipe.selective_checkpointing:
        return f"(none: {NO_CHECKPOINTING})"
    fields = dict(model.config_fields)
    extra += [f"{model.config_flag}.{fields[key]}={value}" for key, value in choice.config]
    per_node = min(ranks_per_node, opts.world_size)
    nodes = -(-opts.world_size // per_node)
    where = f"--nproc-per-node {per_node}"
    if nodes > 1:  # the same line on every node, each with its own rank; launch refuses it without them
        where += f" --nnodes {nodes} --node-rank $NODE_RANK --master-addr $MASTER_ADDR"
    return f"dancegrpo-npu launch {trainer} {where}" + (" -- " + " ".join(extra) if extra else "")


def plan(name: str, world_size: int | None, device_memory_gib: float, ranks_per_node: int, overrides: dict,
         cpu_offload: bool, lora_rank: int, reserve_gib: float, tree=None,
         first_frame: str | None = None) -> tuple[str, DancegrpoError | None]:
    """(the printed plan, the refusal when the asked configuration does not fit, else None).
    ``tree``: the patched tree (or a function giving it, asked only once the values are
    checked), where the recipe sizes are read from upstream's script; ``first_frame``: where the
    model's first-frame pipeline lives (plan's option for it: ``first_frame_option``; None: upstream's)."""
    if name not in models.names():
        raise registry.unknown(name, "model", models.names(), "plan")
    _check_numbers(world_size, device_memory_gib, ranks_per_node, lora_rank, reserve_gib, overrides)
    _check_options(name, overrides, cpu_offload, lora_rank, first_frame)
    tree = tree() if callable(tree) else tree
    model, recipe, recipe_world, script = models.load(name, tree)
    recipe = replace(recipe, **{k: v for k, v in overrides.items() if v is not None})
    _check(recipe)
    options = memory.Options(world_size=world_size or recipe_world, cpu_offload=cpu_offload, lora_rank=lora_rank,
                             reserve_bytes=int(reserve_gib * GiB), first_frame=first_frame or "upstream")
    choices = memory.alternatives(model, recipe, options)
    asked = choices[0]
    device_bytes = int(device_memory_gib * GiB)
    params = memory.denoiser_parameters(model)

    shape = "DDP: the whole model on every rank" if model.parallel == "ddp" else f"{model.blocks} blocks"
    lines = [
        f"plan: {name} ({model.transformer['_class_name']}, {params / 1e9:.2f}e9 parameters, {shape}), "
        f"{_ranks(options.world_size)}, {recipe.height}x{recipe.width}, "
        + (f"{recipe.prompts} prompts x " if recipe.prompts > 1 else "")
        + f"{recipe.generations} generations, "
        f"{recipe.sampling_steps} sampling steps, {recipe.text_tokens} text tokens, "
        + (f"{recipe.frames} frame{'s' if recipe.frames > 1 else ''}, " if not model.unet and (model.cross_attention or recipe.frames > 1) else "")
        + (f"selective checkpointing {recipe.selective_checkpointing}" if model.checkpointing else "no activation checkpointing")
        + (f", train batch {recipe.train_batch_size}, accumulation {recipe.accumulation}" if recipe.train_batch_size > 1 else "")
        + (", classifier-free guidance (2 samples a call)" if recipe.guidance_batch > 1 else "")
        + (f", CPU offload" if cpu_offload else "") + (f", LoRA rank {lora_rank}" if lora_rank else "")
        + (f", the first frame's {model.first_frame['name']}: {options.first_frame}" if model.first_frame else ""),
        f"  recipe: {script} ({_ranks(recipe_world)}, read from the patched tree); an estimate from shapes, not a measurement",
        *([] if model.unet else ["  an SDE window (--sde_window_size W) changes no figure here: training takes one timestep at "
                                 "a time at any W, and the rollout keeps every step's latents, as upstream's"]),
        "",
        f"  {'per rank, as asked':<72} {'GiB':>7}",
    ]
    lines += [f"  {what:<72} {_gib(size):>7}" for what, size in asked.estimate.parts]
    lines.append(f"  {'total':<72} {_gib(asked.estimate.total):>7}")
    if asked.estimate.host_bytes_per_rank:
        held = "CPU offload" if options.cpu_offload else ""
        if model.first_frame and options.first_frame != "device":
            held += ("; " if held else "") + f"the {model.first_frame['name']} between steps"
        lines.append(f"  {'host memory (' + held + '), per node of ' + _ranks(min(ranks_per_node, options.world_size)):<72} "
                     f"{_gib(asked.estimate.host_bytes_per_rank * min(ranks_per_node, options.world_size)):>7}")
    if asked.estimate.rank0_host:
        lines += [f"  {'rank 0 host memory: ' + what:<72} {_gib(size):>7}" for what, size in asked.estimate.rank0_host]
        lines.append(f"  {'rank 0 host memory in all (upstream FSDP_EMA; not on the device)':<72} "
                     f"{_gib(sum(size for _, size in asked.estimate.rank0_host)):>7}")
    lines += ["", f"  {'options':<52} {'GiB/rank':>9}  " + "  ".join(f"{label:>15}" for _, label in CARDS)]
    for c in choices:
        if launch_line(model, c, ranks_per_node).startswith("(none"):  # the trainer has no such option
            marks = ["no option"] * len(CARDS)
        else:
            marks = ["fits" if memory.fits(c.estimate, gib * GiB) else "no" for gib, _ in CARDS]
        lines.append(f"  {c.label:<52} {_gib(c.estimate.total):>9}  " + "  ".join(f"{m:>15}" for m in marks))
    lines += ["", "  launch arguments:"]
    lines += [f"  {c.label + ':':<52} {launch_line(model, c, ranks_per_node)}" for c in choices]
    if any("$NODE_RANK" in launch_line(model, c, ranks_per_node) for c in choices):
        lines.append(f"  {'':<52} several nodes: the same line on each, with NODE_RANK=0, 1, ... (0 on the master) "
                     "and MASTER_ADDR=node 0's address")

    if memory.fits(asked.estimate, device_bytes):
        return "\n".join(lines), None
    would = [c for c in choices[1:] if memory.fits(c.estimate, device_bytes) and not launch_line(model, c, ranks_per_node).startswith("(none")]
    message = (f"{name} at {_ranks(options.world_size)} needs about {_gib(asked.estimate.total)} GiB a rank "
               f"but the device has {device_memory_gib:g} GiB")
    if would:
        hint = "these fit: " + "; ".join(f"{c.label} ({_gib(c.estimate.total)} GiB: {launch_line(model, c, ranks_per_node)})" for c in would[:3])
    elif model.parallel == "ddp":
        hint = "none of the options fits: under DDP every rank holds the whole model; use larger cards"
    else:
        together = combined(model, recipe, options, device_bytes)
        if together is None:
            hint = (f"none of the options fits alone nor together (up to {options.world_size * MAX_RANKS_FACTOR} ranks): "
                    "use larger cards")
        else:
            flags, choice = together
            hint = (f"none of the options fits alone; these fit together: {' '.join(flags)} "
                    f"({_gib(choice.estimate.total)} GiB: {launch_line(model, choice, ranks_per_node)})")
    return "\n".join(lines), DancegrpoError(f"plan: {message}", hint, exit_code=1)


def first_frame_option(model: memory.Model) -> str:
    """plan's option for where the model's first-frame pipeline lives: the trainer's flag (its
    shapes' ``first_frame["flag"]``) as plan's options are written (``--a_b`` -> ``--a-b``)."""
    return "--" + model.first_frame["flag"].lstrip("-").replace("_", "-")


def first_frame_options() -> list[tuple[str, list[str]]]:
    """(plan's option, the trainers it places a first frame for), for each first-frame pipeline
    the planned trainers have."""
    found: dict[str, list[str]] = {}
    for name in models.names():
        model = models.model_of(name)
        if model.first_frame:
            found.setdefault(first_frame_option(model), []).append(name)
    return list(found.items())


# combined() tries the world size times 2 and times this, beside the other remedies
MAX_RANKS_FACTOR = 4


def combined(model: memory.Model, recipe: memory.Recipe, options: memory.Options,
             device_bytes: int) -> tuple[list[str], memory.Choice] | None:
    """The remedies together where none fits alone: (plan's flags that change the asked
    configuration, the Choice), the fewest changes first, then the fewest ranks, then the least
    memory; None when no combination of them fits.  Only the remedies the trainer's row has."""
    spec = registry.get(model.trainer)
    n = options.world_size
    worlds = [(n, []), *((n * k, ["--world-size", str(n * k)]) for k in (2, MAX_RANKS_FACTOR))]
    ckpts = [(recipe.selective_checkpointing, [])]
    if model.checkpointing and recipe.selective_checkpointing < 1.0:
        ckpts.append((1.0, ["--selective-checkpointing", "1.0"]))
    offloads = [(options.cpu_offload, [])] + ([(True, ["--cpu-offload"])]
                                              if spec.offload_flag and not options.cpu_offload else [])
    loras = [(options.lora_rank, [])] + ([(64, ["--lora-rank", "64"])] if spec.lora and not options.lora_rank else [])
    places = [(options.first_frame, [])]
    if model.first_frame:
        places += [(p, [first_frame_option(model), p]) for p in memory.FIRST_FRAME_PLACEMENTS if p != options.first_frame]
    found = []
    for (w, a), (c, b), (o, d), (r, e), (p, f) in itertools.product(worlds, ckpts, offloads, loras, places):
        flags = a + b + d + e + f
        if not flags:
            continue  # the asked configuration
        opts = replace(options, world_size=w, cpu_offload=o, lora_rank=r, first_frame=p)
        rec = replace(recipe, selective_checkpointing=c)
        est = memory.estimate(model, rec, opts)
        if memory.fits(est, device_bytes):
            changes = sum(1 for x in (a, b, d, e, f) if x)
            found.append(((changes, w, est.total), flags, memory.Choice(" ".join(flags), opts, rec, est)))
    if not found:
        return None
    _, flags, choice = min(found, key=lambda item: item[0])
    return flags, choice


def _check_options(name: str, overrides: dict, cpu_offload: bool, lora_rank: int, first_frame: str | None) -> None:
    """Options the trainer's row does not have, refused before the tree is read."""
    spec, model = registry.get(name, "model"), models.model_of(name)
    again = f"leave it out; `dancegrpo-npu plan {name}` lists what fits instead"
    if not model.checkpointing and overrides.get("selective_checkpointing") is not None:
        raise _bad(f"--selective-checkpointing: {name}'s trainer has no activation checkpointing", again)
    if cpu_offload and spec.offload_flag is None:
        raise _bad(f"--cpu-offload: {name}'s trainer has no FSDP CPU offload"
                   + (" (DDP: every rank holds the whole model)" if model.parallel == "ddp" else ""), again)
    if lora_rank and spec.lora is None:
        raise _bad(f"--lora-rank {lora_rank}: {spec.no_lora or NO_LORA}", again)
    if first_frame is not None and not model.first_frame:
        options = first_frame_options()
        raise _bad(f"{' / '.join(option for option, _ in options)}: {name}'s trainer has no first-frame pipeline to "
                   "place", "leave it out; it is for the trainers that make a first frame "
                   f"({', '.join(n for _, takers in options for n in takers)})")


def _check_numbers(world_size, device_memory_gib, ranks_per_node, lora_rank, reserve_gib, overrides) -> None:
    """The values the user gave, before the recipe is read (a model may read it from the tree)."""
    for flag, value in (("--device-memory", device_memory_gib), ("--reserve", reserve_gib)):
        if not math.isfinite(value):
            raise _bad(f"{flag} {value:g} is not a number of GiB", "give a finite number, e.g. 64")
    if world_size is not None and world_size < 1:
        raise _bad(f"--world-size {world_size} is below 1", "give the number of ranks (NPUs) of the job")
    if ranks_per_node < 1:
        raise _bad(f"--ranks-per-node {ranks_per_node} is below 1", "an Atlas 800T A2 node has 8")
    if device_memory_gib <= 0:
        raise _bad(f"--device-memory {device_memory_gib:g} is not positive", "give the card's memory in GiB: 64, or 32 for a 910B4")
    if lora_rank < 0:
        raise _bad(f"--lora-rank {lora_rank} is negative", "give 0 (full fine-tuning) or a rank such as 64")
    if reserve_gib < 0:
        raise _bad(f"--reserve {reserve_gib:g} is negative", "give the GiB a rank keeps for the runtime, 0 or more (default 3)")
    _check_sizes({k: v for k, v in overrides.items() if v is not None})


def _check_sizes(sizes: dict) -> None:
    """Recipe sizes, given or read: heights and widths multiples of 16, counts 1 or more."""
    for key in ("height", "width"):
        value = sizes.get(key)
        if value is not None and (value < 16 or value % 16):
            raise _bad(f"--{key} {value} is not a positive multiple of 16", f"use e.g. {max(16, value // 16 * 16)}")
    for key in ("generations", "sampling_steps", "text_tokens", "sample_batch_size"):
        value = sizes.get(key)
        if value is not None and value < 1:
            flag = "--" + key.replace("_", "-")
            raise _bad(f"{flag} {value} is below 1", f"give {flag} 1 or more")
    fraction = sizes.get("selective_checkpointing")
    if fraction is not None and not 0 <= fraction <= 1:
        raise _bad(f"--selective-checkpointing {fraction:g} is not in [0, 1]",
                   "the fraction of blocks checkpointed: upstream's recipes use 0.5 or 1.0 (1.0 checkpoints all)")


def _check(recipe) -> None:
    _check_sizes(recipe.__dict__)
    if recipe.generations % recipe.sample_batch_size:
        raise _bad(f"--sample-batch-size {recipe.sample_batch_size} does not divide {recipe.generations} generations",
                   "give a divisor of --generations")
