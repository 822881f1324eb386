"""``dancegrpo-npu smoke``: a few GRPO steps of the patched stock trainer on tiny models."""

from __future__ import annotations

import argparse
from dataclasses import replace

from dancegrpo_npu import registry
from dancegrpo_npu.contract import DEVICE_CHOICES as DEVICES
from dancegrpo_npu.engine import treecheck
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import Project, project_from_args
from dancegrpo_npu.run.align_flags import AlignOptions, add_align_options, options_from_args
from dancegrpo_npu.run.watchdog import stall_timeout
from dancegrpo_npu.rundirs.records import records_index
from dancegrpo_npu.smoke import passes, runner


def examples() -> str:
    """``smoke --help``'s examples, the trainers named from the registry's rows."""
    import textwrap

    default = registry.default_trainer()
    smoked = [registry.get(name) for name in registry.smoked()]
    lines = [("dancegrpo-npu smoke", f"1 process, {default.smoke.title} ({default.name}), device auto")]
    if default.lora:
        lines.append(("dancegrpo-npu smoke --nproc 2 --lora", f"its LoRA variant ({default.lora}) on 2 ranks"))
    other_set = next((s for s in smoked if s.depset != default.depset and s.smoke.equal_weights), None)
    if other_set is not None:
        lines.append((f"dancegrpo-npu smoke --trainer {other_set.name} --nproc 2",
                      f"{other_set.smoke.label} (the {other_set.depset} set); checks too that every rank holds "
                      "the same weights after training"))
    other_reward = next((s for s in smoked if s.smoke.reward != default.smoke.reward), None)
    if other_reward is not None:
        lines.append((f"dancegrpo-npu smoke --trainer {other_reward.name} --steps 4",
                      f"{other_reward.smoke.title}: the tiny {other_reward.smoke.reward} reward"))
    lines += [
        ("dancegrpo-npu smoke --device npu -v", "on a 910B node, showing the run as it goes"),
        ("dancegrpo-npu smoke --steps 10 --generations 4 -- --h 128 --w 128",
         "longer, bigger groups, 128x128 (later arguments win)"),
        ("dancegrpo-npu smoke --workdir /tmp/tree-without-rope", "the tree at DIR instead of build/DanceGRPO"),
        ("dancegrpo-npu smoke --steps 4 --checkpointing-steps 1", "a resume checkpoint after every step"),
        ("dancegrpo-npu smoke --resume 20261201-101500-smoke", "continue that smoke run from its newest one"),
    ]
    text = "examples:\n"
    for command, why in lines:
        head = f"  {command:<46} # " if len(command) <= 46 else f"  {command}\n{'':49}# "
        text += head + textwrap.fill(why, 100, initial_indent=" " * 51, subsequent_indent=" " * 51)[51:] + "\n"
    return text + """
The run directory (runs/<time>-smoke/) keeps the command, every rank's log, metrics.jsonl,
reward.txt, images/ and the checkpoint; `dancegrpo-npu runs` lists it.
"""


def align_options(args, project: Project) -> AlignOptions:
    """The smoke's alignment options (launch turns them into trainer arguments and checks a
    replay against the planned run).  A replay source is looked up here already, so that one
    without records is refused before the fixtures are built."""
    from dancegrpo_npu.rundirs.rundir import find_run

    align = options_from_args(args)
    if align.given() and args.if_needed:
        raise DancegrpoError(f"--if-needed skips the run, so it does not combine with {', '.join(align.given())}",
                             "drop --if-needed", exit_code=2)
    if align.replay is not None:
        records_index(find_run(project.runs_dir, align.replay))
    return align


def run(args) -> int:
    from dancegrpo_npu.commands.launch import resolve_device

    args.device = resolve_device(args.device)
    project = project_from_args(args)
    options = runner.SmokeOptions(nproc=1 if args.nproc is None else args.nproc, lora=args.lora, trainer=args.trainer or "", device=args.device,
                           verbose=args.verbose, generations=runner.GENERATIONS if args.generations is None else args.generations,
                           extra_args=tuple(args.trainer_args),
                           align=align_options(args, project), strict=not args.no_strict,
                           checkpointing_steps=args.checkpointing_steps, resume=args.resume,
                           max_restarts=args.max_restarts, stall_timeout=args.stall_timeout)
    if options.trainer:
        registry.smoke_spec(options.trainer)  # an unknown one is refused before anything else
    steps = args.steps if args.steps is not None else runner.default_steps(registry.smoke_spec(runner.trainer_of(options)))
    options = replace(options, steps=steps)
    if options.resume is not None and (options.extra_args or options.align.given() or args.if_needed):
        raise DancegrpoError("smoke --resume continues a run as it was started",
                             "give --resume RUN alone (and -v as before)", exit_code=2)
    typed = {"trainer": args.trainer or (runner.lora_trainer() if args.lora else None), "steps": args.steps,
             "generations": args.generations, "nproc": args.nproc,
             "checkpointing-steps": args.checkpointing_steps, "device": None if args.device == "auto" else args.device}
    options = runner.resumed_options(project, options, typed)
    runner.check_options(options)
    spec = registry.smoke_spec(runner.trainer_of(options))
    verified = treecheck.tree_state(project, spec.relpath)  # once: the pass's key, then the smoke and its launch
    key = passes.inputs_sha256(project, options, verified)
    if args.if_needed:
        earlier = passes.previous_pass(project, key)
        if earlier:
            print(f"smoke: already passed for this tree, series, overlay, fixtures and options (record: {earlier}); "
                  "`dancegrpo-npu smoke` runs it again")
            return 0
    print(f"smoke: {spec.smoke.title}, {options.steps} step{'s' if options.steps > 1 else ''} at 64x64, {spec.smoke.sampling_steps} sampling steps, {options.generations} "
          f"generations, {spec.smoke.reward} reward, {'strict mode' if options.strict else 'strict mode OFF'}; {options.nproc} process{'es' if options.nproc != 1 else ''}, device {options.device}; "
          f"tree {project.workdir}", flush=True)
    if options.extra_args:
        print(f"smoke: trainer arguments after the smoke's own: {' '.join(options.extra_args)}", flush=True)
    result = runner.run_smoke(project, options, verified)
    print(runner.format_result(result))
    passes.record_pass(project, key, result)
    return 0


def _loads_with(smoke) -> str:
    """The class (or loader) the smoke loads the row's checkpoint back with."""
    return smoke.loader or smoke.model_class


def description() -> str:
    """``smoke --help``'s text: what every smoked trainer of the registry runs and is checked on."""
    import textwrap

    default = registry.default_trainer().name
    rows = []
    for name in registry.smoked():
        spec = registry.get(name)
        smoke = spec.smoke
        text = (f"{smoke.title}{' (default)' if name == default else ''}: {spec.relpath.rsplit('/', 1)[-1]}, "
                f"{smoke.sampling_steps} sampling steps, {smoke.reward} reward; the checkpoint loads with "
                f"{_loads_with(smoke)}")
        rows.append(textwrap.fill(text, 100, initial_indent=f"  {name:<15} ", subsequent_indent=" " * 18))
    paragraphs = (
        "A few GRPO steps of a patched stock trainer of the registry on tiny models (built once, reused), "
        "launched from the tree (build/DanceGRPO, or --workdir) through `dancegrpo-npu launch`, so the run "
        f"gets a run directory like any launch: {runner.STEPS} steps (--steps) at 64x64, {runner.GENERATIONS} "
        "generations per prompt (--generations), strict mode on.",
        "It passes only if, read back from what the trainer itself wrote: metrics.jsonl has every step, with finite "
        "rewards and losses, a finite non-zero grad norm and no step whose rewards are all equal (every advantage "
        "0); the checkpoint the trainer writes at the last step loads back with the class the released weights "
        "load with, and its trainable weights moved further than AdamW's weight decay alone moves them; at more "
        "than one process, for the trainers that check it, every rank holds the same weights after training. "
        "With --steps 1 the checkpoint holds the starting weights, so only the grad norm shows that training "
        "reached the model.",
    )
    return (textwrap.fill(paragraphs[0], 100) + "\n\nThe trainers (--trainer NAME):\n" + "\n".join(rows)
            + "\n\n" + textwrap.fill(paragraphs[1], 100))


def _trainer_help(name: str, default: str) -> str:
    spec = registry.get(name)
    return f"{name} ({'default, ' if name == default else ''}{spec.relpath.rsplit('/', 1)[-1]}, {spec.depset})"


def _passes_help() -> str:
    """The trainers of several passes over their prompts: their default --steps is one a pass."""
    several = [(name, registry.get(name).smoke.passes) for name in registry.smoked() if registry.get(name).smoke.passes > 1]
    return "".join(f"; {name}: {passes}, one a pass of its {passes} passes, so a multiple of {passes}"
                   for name, passes in several)


def register(sub, common) -> None:
    p = sub.add_parser(
        "smoke",
        parents=[common],
        help="a few GRPO steps of the patched stock trainer on tiny models: proves the port end to end",
        description=description(),
        epilog=examples(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="dancegrpo-npu smoke [options] [-- trainer args]",
    )
    p.add_argument("--nproc", type=int, default=None, metavar="N", help="processes (ranks) on this machine (default 1)")
    default = registry.default_trainer()
    p.add_argument("--trainer", default=None, metavar="NAME",
                   help="the trainer: " + ", ".join(_trainer_help(name, default.name) for name in registry.smoked())
                   + "; a dependency set other than the tool's: docs/dependencies.md")
    p.add_argument("--lora", action="store_true", help=f"the same as --trainer {runner.lora_trainer()}")
    p.add_argument("--device", choices=DEVICES, default=None,
                   help="DANCEGRPO_DEVICE for the run (default: $DANCEGRPO_DEVICE if set, else auto: npu, else cuda, "
                   "else cpu)")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help=f"GRPO steps (default {runner.STEPS}{_passes_help()}); the checkpoint of step N (the weights "
                   "after step N-1) is checked, so the weight check needs 2 or more")
    p.add_argument("--generations", type=int, default=None, metavar="G",
                   help=f"images per prompt, GRPO's group (default {runner.GENERATIONS}, at least 2); one optimizer "
                   "update a step, on the whole group")
    p.add_argument("--checkpointing-steps", type=int, default=None, metavar="N",
                   help="checkpoint every N steps (a divisor of --steps; default: the last step only): upstream's "
                   "weights and the port's resume checkpoint (outputs/resume/)")
    p.add_argument("--resume", default=None, metavar="RUN",
                   help="continue smoke run RUN in its own directory from its newest complete checkpoint "
                   "(`launch --resume`), then check it as any smoke run; it keeps the run's --trainer, --steps, "
                   "--generations, --nproc, --checkpointing-steps and --device, and refuses another value of one")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="torchrun's elastic restarts, as launch's: up to N times the workers start again after a "
                   "failure (or a stall), each resuming from the newest complete checkpoint (with "
                   "--checkpointing-steps) (default 0)")
    p.add_argument("--stall-timeout", type=stall_timeout, default=None, metavar="SECONDS|off",
                   help="the stall watchdog, as launch's: end the workers when a rank makes no progress for SECONDS "
                   "after its first step has started (default: derived from the run, docs/troubleshooting.md); off: "
                   "no watchdog")
    p.add_argument("--verbose", "-v", action="store_true", help="show the run's own output as it goes")
    p.add_argument("--if-needed", action="store_true",
                   help="do nothing if a smoke run with the same options already passed on this exact tree, "
                   "series, overlay and fixtures (what ./scripts/bootstrap.sh uses to stay idempotent)")
    p.add_argument("trainer_args", nargs="*", metavar="-- ARGS",
                   help="more trainer arguments, after the smoke's own: the later wins (not --max_train_steps, "
                   "--checkpointing_steps, --num_generations, --output_dir: the checks depend on them)")
    p.add_argument("--no-strict", action="store_true",
                   help="run without strict mode (DANCEGRPO_NPU_STRICT): for a tree that runs float64 on purpose, "
                   "e.g. one applied --without float32-rope, diffusers' float64 RoPE")
    add_align_options(p)
    p.set_defaults(func=run)
