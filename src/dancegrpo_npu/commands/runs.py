"""``dancegrpo-npu runs``: the run directories, one line each."""

from __future__ import annotations

import json

from dancegrpo_npu.contract import OPTIONAL_PHASES
from dancegrpo_npu.contract import PHASES as STEP_PHASES
from dancegrpo_npu.rundirs.rundir import list_runs, runs_of_args
from dancegrpo_npu.rundirs.listing import format_table, row


def register(sub, common) -> None:
    p = sub.add_parser(
        "runs",
        parents=[common],
        help="list the run records with their reward trend and GRPO health",
        description=(
            "List runs/<time>-<name>/ records: status, device, world size, steps, reward first -> last, the last "
            "clip fraction and log-prob difference before the first update (metrics.jsonl; should be 0), wall time; "
            f"under a run that timed its phases ({', '.join(STEP_PHASES)}; {', '.join(OPTIONAL_PHASES)} where the "
            "trainer has it), the mean time per step of each and its peak memory. --json adds the last value of every "
            "GRPO health key."
        ),
    )
    p.add_argument("--json", action="store_true", help="one JSON object per run, for scripts")
    p.set_defaults(func=run)


def run(args) -> int:
    project = runs_of_args(args)
    rows = [row(run) for run in list_runs(project.runs_dir)]
    if args.json:
        for r in rows:
            print(json.dumps(r))
    elif not rows:
        print(f"no runs in {project.runs_dir} yet (`dancegrpo-npu launch` makes them)")
    else:
        print(format_table(rows))
    return 0
