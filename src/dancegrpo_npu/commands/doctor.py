"""``dancegrpo-npu doctor``: can training start on this host?"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dancegrpo_npu.doctor.checks import FAIL, DoctorOptions
from dancegrpo_npu.contract import DEVICE_CHOICES
from dancegrpo_npu.project import project_from_args
from dancegrpo_npu.doctor.report import CHECK_NAMES, format_report, run_checks
from dancegrpo_npu.doctor import report, trainers
from dancegrpo_npu.argtypes import non_negative, positive


def _trainer(name: str) -> str:
    """--trainer NAME: a registry trainer, else one line naming the trainers."""
    from dancegrpo_npu import registry

    if name not in registry.trainers():
        raise registry.unknown(name, "trainer", registry.trainers(), "doctor")
    return name


def _takers(flag: str) -> str:
    """The trainers with an input doctor's ``flag`` stands for."""
    from dancegrpo_npu import registry

    return ", ".join(n for n in trainers.grpo_trainers() if flag in trainers.doctor_inputs(registry.get(n)))


def _examples() -> str:
    """doctor's examples, with the registry's default trainer."""
    from dancegrpo_npu import registry

    name = registry.default_trainer().name
    return (f"examples:\n"
            f"  dancegrpo-npu doctor --device npu                      # every trainer whose dependency set is here\n"
            f"  dancegrpo-npu doctor --trainer {name} --weights /data/weights   # its weights elsewhere\n"
            f"  dancegrpo-npu doctor --skip all_reduce --json\n")


def _check_runs_dir(runs_dir: Path) -> None:
    """The runs directory, or where it will be made: refused in one line where a file is in the way."""
    from dancegrpo_npu.errors import DancegrpoError

    there = next((p for p in (runs_dir, *runs_dir.parents) if p.exists()), None)
    if there is not None and not there.is_dir():
        where = "is a file" if there == runs_dir else f"is under {there}, a file"
        raise DancegrpoError(f"doctor: the runs directory {runs_dir} {where}, not a directory",
                             "give --runs-dir (or DANCEGRPO_RUNS) a directory, or move the file", exit_code=2)


def register(sub, common) -> None:
    p = sub.add_parser(
        "doctor",
        parents=[common],
        help="check that training can start here (NPU stack, devices, HCCL, disk, tree, weights)",
        description=report.__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog=_examples(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--device",
        choices=DEVICE_CHOICES,
        default=None,
        help="what training will run on (npu: the NPU checks must pass; default: $DANCEGRPO_DEVICE if set, "
             "else auto)",
    )
    p.add_argument(
        "--trainer", action="append", type=_trainer, default=None, metavar="NAME",
        help=f"the trainer whose inputs and dependency set to check, as `launch NAME --dry-run` does "
             f"({', '.join(trainers.grpo_trainers())}); repeatable; default: every one whose dependency set "
             "is installed here",
    )
    p.add_argument(
        "--weights", type=Path, metavar="DIR",
        help="the weights directory of the one trainer --trainer names, as upstream's README lays it out: it "
             "stands for that trainer's inputs that are its model's own weights (e.g. --pretrained_model_name_or_path "
             f"and --vae_model_path; {_takers('--weights')}); default: its recipe's, in the patched tree"
    )
    p.add_argument("--hps-ckpt", type=Path, metavar="FILE",
                   help=f"for {_takers('--hps-ckpt')} (default: <tree>/hps_ckpt/HPS_v2.1_compressed.pt)")
    p.add_argument(
        "--hps-open-clip-ckpt", type=Path, metavar="FILE",
        help=f"for {_takers('--hps-open-clip-ckpt')} (default: <tree>/hps_ckpt/open_clip_pytorch_model.bin)"
    )
    p.add_argument(
        "--min-free-gb", type=non_negative, default=50.0, metavar="GB",
        help="the least free disk the check asks for under the runs directory (default 50; 0 or more); "
             "it asks for one resume checkpoint of the largest trainer checked where that is more"
    )
    p.add_argument(
        "--timeout", type=positive, default=180.0, metavar="S",
        help="seconds the all_reduce may take (default 180; above 0)"
    )
    p.add_argument(
        "--skip",
        action="append",
        choices=CHECK_NAMES,
        default=None,
        metavar="CHECK",
        help=f"skip a check ({', '.join(CHECK_NAMES)}); repeatable",
    )
    p.add_argument("--json", action="store_true", help="the checks as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from dancegrpo_npu.commands.launch import resolve_device

    chosen = tuple(dict.fromkeys(args.trainer or ()))
    if args.weights is not None and len(chosen) != 1:
        from dancegrpo_npu.errors import DancegrpoError

        raise DancegrpoError(f"doctor: --weights {args.weights} is one model's weights, and "
                             + (f"{len(chosen)} trainers are named" if chosen else "no --trainer names it"),
                             f"name its trainer once: `dancegrpo-npu doctor --trainer NAME --weights {args.weights}`",
                             exit_code=2)
    project = project_from_args(args)
    _check_runs_dir(project.runs_dir)
    here = Path.cwd()
    resolve = lambda p: None if p is None else (p if p.is_absolute() else here / p).resolve()  # noqa: E731
    opts = DoctorOptions(
        device=resolve_device(args.device),
        weights_dir=resolve(args.weights),
        hps_ckpt=resolve(args.hps_ckpt),
        hps_open_clip_ckpt=resolve(args.hps_open_clip_ckpt),
        min_free_gb=args.min_free_gb,
        timeout=args.timeout,
        skip=tuple(args.skip or ()),
        trainers=chosen,
    )
    checks = run_checks(project, opts)
    if args.json:
        print(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        print(format_report(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0
