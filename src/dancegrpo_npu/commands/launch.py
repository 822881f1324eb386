"""``dancegrpo-npu launch``: a stock upstream script from the patched tree under torchrun, with a run directory."""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import replace

from dancegrpo_npu import registry
from dancegrpo_npu.cli import did_you_mean
from dancegrpo_npu.contract import DEVICE_CHOICES as DEVICES
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import project_from_args
from dancegrpo_npu.run.align_flags import add_align_options, options_from_args
from dancegrpo_npu.run.environment import parse_env_assignment
from dancegrpo_npu.run.launch import launch
from dancegrpo_npu.run.plan import LaunchSpec
from dancegrpo_npu.run.resume import resume_spec
from dancegrpo_npu.run.watchdog import FACTOR, FLOOR_S, GRACE_S, LOADING_S, stall_timeout


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise DancegrpoError(f"launch: {message}", "see `dancegrpo-npu launch --help`", exit_code=2)


def _add_options(p: argparse.ArgumentParser, suppress: bool) -> None:
    d = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=d(1),
        metavar="N",
        help="processes on this node: one per NPU/GPU (default 1)",
    )
    p.add_argument("--nnodes", type=int, default=d(1), metavar="N", help="nodes in the job (default 1)")
    p.add_argument(
        "--node-rank", type=int, default=d(0), metavar="K", help="this node's number, 0..nnodes-1 (0 is the master)"
    )
    p.add_argument("--master-addr", default=d(None), metavar="ADDR",
                   help="node 0's address; needed with --nnodes > 1, where a node other than 0 must name another host "
                   "(default 127.0.0.1, one node)")
    p.add_argument(
        "--master-port",
        type=int,
        default=d(None),
        metavar="PORT",
        help="node 0's port, 1024-65535 (default: a free port; 29500 with several nodes)",
    )
    p.add_argument("--recipe", default=d(None), metavar="NAME",
                   help="upstream's recipe for a trainer: the trainer arguments of one of its launch scripts in "
                   "the patched tree (" + ", ".join(dict.fromkeys(
                       s.recipe_glob for s in registry.REGISTRY.values() if s.recipe_glob)).replace("%", "%%")
                   + "), named after the file (e.g. 8gpus); default: the one for the launch's world size, else "
                   "the nearest one, scaled")
    p.add_argument(
        "--device",
        choices=DEVICES,
        default=d(None),
        help="DANCEGRPO_DEVICE for the scripts (default: $DANCEGRPO_DEVICE if set, else auto: npu, else cuda, "
        "else cpu)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        default=d(False),
        help="DANCEGRPO_NPU_STRICT=1: stop at the first op anywhere in the run (forward, the math between modules, backward, optimizer) that makes a complex or float64 tensor on the device (the NPU runs neither), naming the op and where it ran; slow, for checking",
    )
    p.add_argument(
        "--env",
        action="append",
        default=d(None),
        metavar="NAME=VALUE",
        help="set a variable in the job's environment (wins over launch's defaults and yours); repeatable",
    )
    p.add_argument(
        "--ifname",
        default=d(None),
        metavar="IFACE",
        help="this host's network interface between the nodes: sets HCCL_SOCKET_IFNAME (npu), NCCL_SOCKET_IFNAME (cuda) and GLOO_SOCKET_IFNAME",
    )
    p.add_argument("--name", default=d(None), help="run directory suffix (default: the script's name)")
    p.add_argument(
        "--no-upstream-defaults",
        dest="upstream_defaults",
        action="store_false",
        default=d(True),
        help="pass only the arguments after --, not upstream's recipe and the port's defaults",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        default=d(False),
        help="check every input and print the plan as a script (environment, torchrun command, what is missing), "
        "start nothing; works on a login node; exit 0 when the job could start here, 1 when not",
    )
    p.add_argument("--resume", default=d(None), metavar="RUN",
                   help="continue RUN (a run directory, or its name or a unique part of it) in its own directory "
                   "from its newest complete checkpoint: its recorded arguments, then those after --, plus "
                   "--resume_from_checkpoint latest; a change of world size, generations, sizes, series or "
                   "upstream commit is refused (docs/resume.md)")
    p.add_argument("--max-restarts", type=int, default=d(0), metavar="N",
                   help="torchrun's elastic restarts: up to N times the workers start again after a failure, "
                   "each resuming from the newest complete checkpoint; the run record counts them (default 0)")
    p.add_argument("--stall-timeout", type=stall_timeout, default=d(None), metavar="SECONDS|off",
                   help="end the workers when a rank of this node makes no progress (no event of the seam) for "
                   f"SECONDS after its first step has started: every rank's stacks into <run>/stacks/, one line "
                   "naming the stalled rank(s) and the line each is on, then SIGTERM (SIGKILL after "
                   f"{GRACE_S:g} s); --max-restarts restarts them from the last checkpoint, else the run is "
                   f"'stalled' with the command that continues it; default: {FACTOR:g}x the slowest step so far, "
                   f"at least {FLOOR_S:g} s; before the first step at least {LOADING_S:g} s; off: no watchdog "
                   "(docs/troubleshooting.md)")
    add_align_options(p, d)
    p.add_argument("--profile", dest="profile_steps", default=d(None), metavar="STEPS",
                   help="write a profiler trace of these steps into <run>/profile/step_<N>/ (torch_npu.profiler on "
                   "the NPU, torch.profiler elsewhere), e.g. 3, 2-4 or 1,5; the GRPO trainers only")


EPILOG = textwrap.dedent(
    """\
    The GRPO trainers start from upstream's own recipe: the trainer arguments of its launch
    script in the patched tree, read from scripts/finetune/finetune_*.sh (e.g. 8gpus, the
    one-node script; --recipe lists each trainer's).  The default is the recipe for the
    launch's world size; a world size no recipe has runs the nearest one scaled to it (the same
    prompts per step and effective batch where it divides them), or, for a trainer whose batch
    is a rank's, as it is on each rank, and says how the recipe's global batch is kept.  The port adds the HPS reward paths; each
    preprocessing script gets the arguments of its scripts/preprocess/*.sh.  Arguments
    after -- override these.  The weights each one reads, and where: docs/weights.md.
    Their relative paths (data/<model>, data/rl_embeddings/..., hps_ckpt/...) are read in the
    patched tree; relative paths you type, in the current directory.  Without --output_dir,
    training writes its checkpoints to <run>/outputs.  --dry-run prints the recipe and every
    value that differs from its script.

    Each model's RL-embeddings dataset has its own directory, data/rl_embeddings/<model>/
    ({datasets}): its preprocessing writes it there, with dataset.json
    saying what made it, and the model's trainers read it from there; a dataset of another
    model is refused.  Upstream's shared data/rl_embeddings/ is reachable by its path.

    Each launch gets <runs>/<YYYYmmdd-HHMMSS>-<name>/ (runs/ in the project, or --runs-dir /
    $DANCEGRPO_RUNS) with the command, environment fingerprint, every rank's log, reward.txt,
    images/, metrics.jsonl and summary.json.

    """
)


def examples() -> str:
    """launch's examples, from the registry: the default trainer, and the rows that show each option."""
    default = registry.default_trainer()
    name = default.name
    rows = [registry.get(n) for n in registry.trainers()]
    lines = [f"dancegrpo-npu launch {default.preprocess} --nproc-per-node 8"] if default.preprocess else []
    lines += [
        f"dancegrpo-npu launch {name} --nproc-per-node 8 --device npu            # its one-node recipe",
        f"dancegrpo-npu launch {name} --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --nproc-per-node 8 --ifname eth0",
    ]
    if default.lora:
        lines.append(f"dancegrpo-npu launch {default.lora} --nproc-per-node 8 -- --max_train_steps 100 --h 512 --w 512")
    lines += [
        f"dancegrpo-npu launch {name} --nproc-per-node 8 --profile 3 -- --max_train_steps 5   # trace of step 3",
        f"dancegrpo-npu launch {name} --nproc-per-node 8 --max-restarts 3                     # restarts resume",
    ]
    other = next((r for r in rows if r.depset != default.depset), None)
    if other:
        lines.append(f"dancegrpo-npu launch {other.name} --nproc-per-node 8 --device npu  # the {other.depset} set; "
                     "see `dancegrpo-npu plan`")
    configured = next((r for r in rows if r.config_example), None)
    if configured:
        lines.append(f"dancegrpo-npu launch {configured.name} --nproc-per-node 8 -- {configured.config_example}")
    per_rank = next((r for r in rows if r.per_rank_batch), None)
    if per_rank:
        if per_rank.preprocess:
            lines.append(f"dancegrpo-npu launch {per_rank.preprocess} --nproc-per-node 8")
        lines.append(f"dancegrpo-npu launch {per_rank.name} --nproc-per-node 8   # its batch kept per rank")
    lines.append(f"dancegrpo-npu launch --resume 20261201-101500-{name} -- --max_train_steps 600   # continue, longer")
    return "examples:\n" + "\n".join(f"  {line}" for line in lines) + "\n"


def scripts_table() -> str:
    """The registry's trainers, one a line with what each trains, then its preprocessing scripts."""
    width = max(map(len, registry.trainers()))
    lines = [f"  {name:<{width}}  {registry.get(name).help}" for name in registry.trainers()]
    return "\n".join([*lines, f"  preprocessing (a model's dataset): {', '.join(registry.preprocessing())}"])


def register(sub, common) -> None:
    datasets = ", ".join(dict.fromkeys(s.dataset for s in registry.REGISTRY.values() if s.dataset))
    p = sub.add_parser(
        "launch",
        parents=[common],
        help=f"run {' | '.join(registry.names())} under torchrun, with a run record",
        description="Run a stock upstream script (SCRIPT) from the patched tree under torchrun.\n\ntrainers:\n"
                    + scripts_table(),
        epilog=EPILOG.replace("{datasets}", datasets) + examples(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="dancegrpo-npu launch SCRIPT [options] [-- upstream args]",
    )
    _add_options(p, suppress=False)
    # The script name and everything after it, verbatim: argparse would drop a "--" that
    # directly follows a positional, so options given after the script are parsed below.
    p.add_argument("words", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def _parse_words(args) -> tuple[str, list[str]]:
    words = list(args.words)
    if not words or words[0].startswith("-"):
        raise DancegrpoError("launch: name the script", f"one of: {', '.join(registry.names())}", exit_code=2)
    script, rest = words[0], words[1:]
    upstream: list[str] = []
    if "--" in rest:
        i = rest.index("--")
        rest, upstream = rest[:i], rest[i + 1 :]
    inner = _Parser(prog="dancegrpo-npu launch", add_help=False)
    _add_options(inner, suppress=True)
    inner.add_argument("-C", dest="project_dir", default=argparse.SUPPRESS)
    inner.add_argument("--workdir", default=argparse.SUPPRESS)
    inner.add_argument("--runs-dir", dest="runs_dir", default=argparse.SUPPRESS)
    _, unknown = inner.parse_known_args(rest, namespace=args)
    meant = did_you_mean(unknown[0], [o for a in inner._actions for o in a.option_strings]) if unknown else None
    if meant:
        raise DancegrpoError(f"launch: unknown option {unknown[0].split('=', 1)[0]!r}",
                             f"did you mean {meant}? (launch's options go before --, the script's own after it: "
                             "`dancegrpo-npu launch --help`)", exit_code=2)
    if unknown:
        raise DancegrpoError(
            f"launch: unknown option {unknown[0]!r}",
            f"put the script's own arguments after --, e.g. `launch {registry.default_trainer().name} -- "
            "--max_train_steps 10`",
            exit_code=2,
        )
    return script, upstream


def resolve_device(device: str | None, environ=None) -> str:
    """--device as given, else $DANCEGRPO_DEVICE (the variable the trainers read: a user who set
    it means it), else auto."""
    import os

    from dancegrpo_npu.contract import DEVICE_ENV

    if device is not None:
        return device
    value = (os.environ if environ is None else environ).get(DEVICE_ENV) or "auto"
    if value not in DEVICES:
        raise DancegrpoError(f"{DEVICE_ENV}={value} is not a device", f"set it to one of {', '.join(DEVICES)}, "
                             "or unset it and pass --device", exit_code=2)
    return value


def _ifname_env(ifname: str, device: str) -> list[tuple[str, str]]:
    names = {"npu": ["HCCL_SOCKET_IFNAME"], "cuda": ["NCCL_SOCKET_IFNAME"], "cpu": []}
    chosen = names.get(device, ["HCCL_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"])
    return [(n, ifname) for n in chosen + ["GLOO_SOCKET_IFNAME"]]


def run(args) -> int:
    args.device = resolve_device(args.device)
    if args.resume is not None or (args.words and "--resume" in args.words[: (args.words + ["--"]).index("--")]):
        return _resume(args)
    script, upstream = _parse_words(args)
    env = [parse_env_assignment(text) for text in args.env or []]
    if args.ifname:
        env = _ifname_env(args.ifname, args.device) + env
    spec = LaunchSpec(
        script=script,
        args=tuple(upstream),
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        device=args.device,
        name=args.name,
        env=tuple(env),
        upstream_defaults=args.upstream_defaults,
        strict=args.strict,
        align=options_from_args(args),
        profile_steps=args.profile_steps,
        recipe=args.recipe,
        ifname=args.ifname,
        max_restarts=args.max_restarts,
        stall_timeout=args.stall_timeout,
    )
    record = launch(project_from_args(args), spec, dry_run=args.dry_run)
    return 0 if record.returncode == 0 else (record.returncode if 0 < record.returncode < 126 else 1)


def _resume(args) -> int:
    """``launch --resume RUN [-- trainer args]``: the run's own script and launch options."""
    words = list(args.words)
    if words and not words[0].startswith("-"):
        raise DancegrpoError(f"launch --resume: the script comes from the run's record, not {words[0]!r}",
                             "give `launch --resume RUN [-- trainer args]`", exit_code=2)
    _, upstream = _parse_words(argparse.Namespace(**{**vars(args), "words": ["resume", *words]}))
    project = project_from_args(args)
    given = {"nproc_per_node": args.nproc_per_node if args.nproc_per_node != 1 else None,
             "nnodes": args.nnodes if args.nnodes != 1 else None,
             "device": args.device if args.device != "auto" else None}
    spec = resume_spec(project, args.resume, tuple(upstream), given, max_restarts=args.max_restarts)
    spec = replace(spec, stall_timeout=args.stall_timeout)
    record = launch(project, spec, dry_run=args.dry_run)
    return 0 if record.returncode == 0 else (record.returncode if 0 < record.returncode < 126 else 1)
