"""``dancegrpo-npu compare``: two recorded runs, stage by stage, against tolerances."""

from __future__ import annotations

import argparse
import textwrap

from dancegrpo_npu.align import tolerances as tolerances_mod
from dancegrpo_npu.rundirs.rundir import runs_of_args
from dancegrpo_npu.align import compare as compare_module
from dancegrpo_npu.align.compare import compare


EPILOG = textwrap.dedent(
    """\
    RUN_A is the reference (the GPU or CPU run), RUN_B the run under test (the NPU run); both must
    have been launched with --record (docs/alignment.md).  compare.json and compare.png are written
    into RUN_B.  Exit 0: aligned; 1: not aligned; 2: cannot compare (a run with itself too).

    examples:
      dancegrpo-npu compare 20260101-100000-gpu 20260101-110000-npu
      dancegrpo-npu compare gpu npu --steps 1-5 --tol rewards_rel_pct=0.05
    """
)


def register(sub, common) -> None:
    p = sub.add_parser(
        "compare",
        parents=[common],
        help="compare two recorded runs stage by stage; name the first divergence",
        description=compare_module.__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_a", metavar="RUN_A", help="the reference run: a directory under runs/, a unique part of its name, or a path")
    p.add_argument("run_b", metavar="RUN_B", help="the run under test (compare.json and compare.png go here)")
    p.add_argument("--tol", action="append", metavar="NAME=VALUE",
                   help=f"override a tolerance (repeatable); NAME is one of: {', '.join(tolerances_mod.BY_NAME)}")
    p.add_argument("--steps", metavar="SPEC", help="compare only these of the common recorded steps, e.g. 1-10,50")
    p.set_defaults(func=run)


def run(args) -> int:
    return compare(runs_of_args(args), args.run_a, args.run_b, args.tol, args.steps)
