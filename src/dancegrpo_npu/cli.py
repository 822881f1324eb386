"""The ``dancegrpo-npu`` command: argument parsing and error reporting only.

Each verb lives in its own module of ``dancegrpo_npu.commands``, which adds its sub-parser in
``register`` and turns the arguments into calls of plain functions in ``run``.  Modules keep heavy imports (torch, diffusers)
inside functions, so ``--help`` and the patch-set verbs start fast.
"""

from __future__ import annotations

import sys

from dancegrpo_npu.errors import INTERRUPTED, DancegrpoError

# Nothing else is imported at module level: the console script and ``python -m`` import only
# this much before main() runs, and main() catches a Ctrl-C while the verbs' modules load.

# The verbs' modules in dancegrpo_npu.commands, in the order --help lists them.
COMMAND_MODULES = (
    "fetch",
    "apply",
    "status",
    "verify",
    "series",
    "lock",
    "upstream_log",
    "rebase",
    "export",
    "smoke",
    "launch",
    "doctor",
    "runs",
    "plot",
    "compare",
    "bench",
    "plan",
)

DESCRIPTION = """\
{intro}

The usual path:
  dancegrpo-npu fetch      upstream at the locked commit into build/DanceGRPO
  dancegrpo-npu apply      the series, then the overlay, atomically
  dancegrpo-npu verify     exit 0 only if the tree is exactly lock + series + overlay
  dancegrpo-npu smoke      a 2-step GRPO run with tiny models (CPU is enough)
  dancegrpo-npu launch {default} -- [upstream args]   the real job, under torchrun
{others}
Weights to download, and where they go: docs/weights.md.
"""


def description() -> str:
    """DESCRIPTION with the registry's models and trainers (every row, as ``--help`` lists them)."""
    import textwrap

    from dancegrpo_npu import registry
    names = registry.trainers()
    titles = list(dict.fromkeys(registry.get(name).title for name in names))
    default = registry.default_trainer().name
    models = ", ".join(titles[:-1]) + " and " + titles[-1] if len(titles) > 1 else titles[0]
    others = textwrap.fill(f"(also: {', '.join(n for n in names if n != default)})", width=92,
                           initial_indent=" " * 27, subsequent_indent=" " * 27, break_on_hyphens=False)
    intro = textwrap.fill(f"Run upstream DanceGRPO (GRPO post-training of {models}) on Ascend NPUs, CUDA or CPU, "
                          "from a pinned upstream commit (upstream.lock), an ordered patch series (patches/series) "
                          "and an overlay of added modules (overlay/).", width=92, break_on_hyphens=False)
    return DESCRIPTION.format(intro=intro, default=default, others=others)


EXIT_STATUS = """\
Exit status: 0 done, or the check passed; 1 checked and failed (verify, compare, doctor,
lock --check, rebase --dry-run, smoke), or refused by the state of the project (a tree that
is not exact, local edits, a patch that does not apply, a run that failed); 2 could not
check: the command line is wrong (a usage error, a value out of range, a name that names
nothing, options that do not go together, runs that cannot be compared); 130 interrupted
(Ctrl-C); 141 stdout closed by its reader (`| head`).  Errors are one line: what is wrong,
then what to run.
"""


def common_options(for_subcommand: bool) -> argparse.ArgumentParser:
    """-C, --workdir and --runs-dir, accepted before or after the verb.

    On sub-parsers the defaults are SUPPRESS so that a value given before the verb
    is not overwritten by the sub-parser's default.
    """
    import argparse

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
    p.add_argument(
        "--runs-dir",
        metavar="DIR",
        default=default,
        help="where run records go (launch, smoke) and are read (runs, plot, compare: with --runs-dir or "
        "$DANCEGRPO_RUNS they need no project); default: $DANCEGRPO_RUNS, else runs/ in the project",
    )
    return p


def plain_text(text: str) -> str:
    """Help text as a terminal shows it: the docstrings' reST markup (``x``, :func:`x`) that
    descriptions taken from module docs carry, as the `x` the tool's messages use."""
    import re

    text = re.sub(r":(?:func|mod|class|meth|attr|data|obj):`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+?)``", r"`\1`", text)


def did_you_mean(word: str, options) -> str | None:
    """The option a mistyped one meant: ``--nproc_per_node`` (torchrun's spelling) is
    ``--nproc-per-node``, ``--dryrun`` is ``--dry-run``; None when nothing is close."""
    import difflib

    flag = word.split("=", 1)[0]
    if not flag.startswith("--"):
        return None
    options = [o for o in options if o.startswith("--")]
    hyphened = flag.replace("_", "-")
    if hyphened in options:
        return hyphened
    shorter = [o for o in options if hyphened.startswith(o + "-")]  # smoke's --nproc for --nproc_per_node
    if shorter:
        return max(shorter, key=len)
    close = difflib.get_close_matches(hyphened, options, n=1, cutoff=0.8)
    return close[0] if close else None


def build_parser() -> argparse.ArgumentParser:
    import argparse
    import importlib

    from dancegrpo_npu import __version__

    class Parser(argparse.ArgumentParser):
        """Usage errors as the tool's other errors: one line, with what to run (exit 2)."""

        def format_help(self) -> str:
            return plain_text(super().format_help())

        def parse_known_args(self, args=None, namespace=None):
            self.words = list(sys.argv[1:] if args is None else args)  # what error() suggests from
            return super().parse_known_args(args, namespace)

        def _suggestion(self, message: str) -> DancegrpoError | None:
            """"did you mean" for an option left over that is close to one of the verb's."""
            if not message.startswith("unrecognized arguments:"):
                return None
            verbs = self._subparsers._group_actions[0].choices if self._subparsers else {}
            verb = next((w for w in getattr(self, "words", []) if w in verbs), None)
            parsers = [self] + ([verbs[verb]] if verb else [])
            options = [o for p in parsers for a in p._actions for o in a.option_strings]
            for word in message.split(":", 1)[1].split():
                meant = did_you_mean(word, options)
                if meant:
                    where = f"dancegrpo-npu {verb} --help" if verb else "dancegrpo-npu --help"
                    return DancegrpoError(f"unknown option {word.split('=', 1)[0]!r}",
                                          f"did you mean {meant}? see `{where}`", exit_code=2)
            return None

        def error(self, message: str):
            suggestion = self._suggestion(message)
            if suggestion is not None:
                raise suggestion
            verb = self.prog.split()[1:]  # "dancegrpo-npu compare" -> ["compare"]
            help_cmd = " ".join(["dancegrpo-npu", *verb[:1], "--help"])
            raise DancegrpoError(message, f"see `{help_cmd}`", exit_code=2)

    parser = Parser(
        prog="dancegrpo-npu",
        description=description(),
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common_options(for_subcommand=False)],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")  # sub-parsers are Parsers too
    common = common_options(for_subcommand=True)
    for name in COMMAND_MODULES:  # every one exists and registers its verb(s)
        importlib.import_module(f"dancegrpo_npu.commands.{name}").register(sub, common)
    return parser


# What a shell reports for a process killed by SIGPIPE (128 + 13), as for `git log | head`,
# and by SIGINT (128 + 2), as for any tool stopped by Ctrl-C.
EXIT_BROKEN_PIPE = 128 + 13
EXIT_INTERRUPTED = 128 + 2


def main(argv: list[str] | None = None) -> int:
    """Run one verb; errors the user can act on become one line of stderr.

    Ctrl-C at any moment, the verbs' imports included, is one line and exit 130: a verb's
    clean-up and roll-backs run as the KeyboardInterrupt unwinds through it.

    ``dancegrpo-npu status | head -3``: when the reader of stdout goes away, the verb stops
    at its next write (the BrokenPipeError unwinds through the verb, so its clean-up and
    roll-backs run, unlike a SIGPIPE death), nothing more is printed, and the exit status
    is 141 as for any Unix tool cut off by its reader: without ``set -o pipefail`` the
    pipeline's status is head's, with it the cut-off output is not taken for a success.
    """
    try:
        try:
            status = _main(argv)
        except SystemExit:  # argparse's --help and --version
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # block-buffered into a pipe: the write may happen only now
        return status
    except KeyboardInterrupt as e:  # a run's own says how to continue it (errors.RunInterrupted)
        print(f"dancegrpo-npu: {getattr(e, 'message', None) or INTERRUPTED}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        import os

        if not _stdout_reader_gone():
            raise  # a pipe of the verb's own (a subprocess, a socket): a bug, not `| head`
        # Point stdout at devnull, so that the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has closed it."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False  # not a real file (captured): its reader cannot be the one gone
    if not hasattr(select, "poll"):
        return True  # cannot tell (Windows): the usual case, `| head`
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    # A pipe's write end with no reader polls as POLLERR on Linux; where poll cannot tell,
    # the error is raised as before.
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _main(argv: list[str] | None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except DancegrpoError as e:
        print(f"dancegrpo-npu: error: {e.one_line()}", file=sys.stderr)
        return e.exit_code
