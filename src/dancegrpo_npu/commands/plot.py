"""``dancegrpo-npu plot``: reward, loss, health and phase times of runs, as a PNG."""

from __future__ import annotations

import time
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.files import writing
from dancegrpo_npu.rundirs.rundir import find_run, load_run, runs_of_args
from dancegrpo_npu.rundirs.plot import plot_runs


def register(sub, common) -> None:
    p = sub.add_parser(
        "plot",
        parents=[common],
        help="draw reward (and loss) curves of runs to a PNG",
        description=(
            "Draw reward and loss per step of one or more runs on one figure (e.g. a GPU run and an NPU run). "
            "RUN is a directory under runs/, a unique part of its name, or a path."
        ),
    )
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="the PNG to write (default: <run>/reward.png for one run, runs/compare-<time>.png for several)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    project = runs_of_args(args)
    runs = [load_run(find_run(project.runs_dir, ref)) for ref in args.runs]
    if args.output:
        output = Path(args.output).expanduser().resolve()
    elif len(runs) == 1:
        output = runs[0].path / "reward.png"
    else:
        output = project.runs_dir / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.png"
    if output.suffix.lower() != ".png":
        raise DancegrpoError(f"{output} is not a .png file name", "name the output FILE.png", exit_code=2)
    with writing(output, "free space or fix the permissions there, or write elsewhere: --output FILE.png"):
        plot_runs(runs, output)
    print(output)
    return 0
