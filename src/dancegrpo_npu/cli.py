"""The ``dancegrpo-npu`` command: argument parsing and error reporting only.

Each verb lives in its own module, which adds its sub-parser in ``register`` and
does its work in plain functions.  Modules keep heavy imports (torch, diffusers)
inside functions, so ``--help`` and the patch-set verbs start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap

from dancegrpo_npu import __version__
from dancegrpo_npu.errors import DancegrpoError

# Verb modules, in the order --help lists them.
COMMAND_MODULES = (
    "engine.fetch",
    "engine.apply",
    "engine.status",
    "engine.series",
    "engine.lockfile",
    "rebase.upstream_log",
    "rebase.command",
    "rebase.export",
    "smoke.command",
    "run.launch",
    "doctor.command",
    "run.runs",
    "run.plot",
    "align.compare",
)

DESCRIPTION = textwrap.dedent(
    """\
    Run upstream DanceGRPO (GRPO post-training for FLUX) on Ascend NPUs, CUDA or CPU,
    from a pinned upstream commit (upstream.lock), an ordered patch series
    (patches/series) and an overlay of added modules (overlay/).

    The usual path:
      dancegrpo-npu fetch      upstream at the locked commit into build/DanceGRPO
      dancegrpo-npu apply      the series, then the overlay, atomically
      dancegrpo-npu verify     exit 0 only if the tree is exactly lock + series + overlay
      dancegrpo-npu smoke      a 2-step GRPO run with tiny models (CPU is enough)
      dancegrpo-npu launch flux -- [upstream args]   the real job, under torchrun
    """
)


def common_options(for_subcommand: bool) -> argparse.ArgumentParser:
    """-C and --workdir, accepted before or after the verb.

    On sub-parsers the defaults are SUPPRESS so that a value given before the verb
    is not overwritten by the sub-parser's default.
    """
    default = argparse.SUPPRESS if for_subcommand else None
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "-C",
        dest="project_dir",
        metavar="DIR",
        default=default,
        help="the project directory (holding upstream.lock); default: the current directory",
    )
    p.add_argument(
        "--workdir",
        metavar="DIR",
        default=default,
        help="the upstream work tree; default: build/DanceGRPO in the project",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dancegrpo-npu",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common_options(for_subcommand=False)],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = common_options(for_subcommand=True)
    for name in COMMAND_MODULES:  # every one exists and registers its verb(s)
        importlib.import_module(f"dancegrpo_npu.{name}").register(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except DancegrpoError as e:
        print(f"dancegrpo-npu: error: {e.one_line()}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("dancegrpo-npu: interrupted; re-run the same command to finish or roll back", file=sys.stderr)
        return 130
