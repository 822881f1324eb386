"""``dancegrpo-npu rebase``: the patch series moved onto another upstream commit."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import project_from_args
from dancegrpo_npu.rebase.dry_run import dry_run
from dancegrpo_npu.rebase.session import abort_rebase, continue_rebase, project_of_rebase_tree, skip_patch, start_rebase


GUIDE = textwrap.dedent(
    """\
    Move the patch series onto another upstream commit (a branch, tag or commit id).

      dancegrpo-npu upstream-log main        what changed upstream, and which patches it hits
      dancegrpo-npu rebase --onto main --dry-run    what would happen; changes nothing
      dancegrpo-npu rebase --onto main       move the series; stops on a conflict
      ... resolve in <workdir>.rebase (conflict markers), then, there or in the project:
      dancegrpo-npu rebase --continue        take the resolved tree as the patch, go on
      dancegrpo-npu rebase --skip            drop the stopped patch from the series
      dancegrpo-npu rebase --abort           back to exactly where you started

    REF is fetched from --source (else $DANCEGRPO_SOURCE, else the lock's url) and must
    be found there: a failed fetch is refused, never replaced by a local ref of that name
    (to move onto a local commit, give its full id); a short id needs a source that is a
    local repository.  When REF came from a repository that may lack it, the summary says
    in one line what to set as upstream.lock's url.

    Each patch is applied as is, else 3-way merged on the upstream history. When all
    went through, every patch is regenerated against REF (fresh context and line
    numbers; a patch whose diff changed gets Last-Update set to today, the others
    keep their bytes), upstream.lock is rewritten, and the new series is verified by
    applying it from scratch; only then are patches/ and upstream.lock replaced.
    Then, as git rebase leaves your branch on its new base, your work tree is moved
    to REF with the new series applied and verified (local edits made meanwhile are
    saved first, as `apply --force` saves them).  The previous series and lock are
    kept in <workdir>/.git/dancegrpo-npu/rebase-orig/, the previous patched tree as
    the commit refs/dancegrpo-npu/rebase-orig (the new one: .../rebased-tree), until
    the next rebase.  The state of a rebase lives in
    <workdir>/.git/dancegrpo-npu/rebase/ and survives a crash.

    --continue refuses a conflict marker left anywhere in a line, and a Python file of
    the resolution that does not compile; --continue, --skip and --abort also run in
    the rebase tree.  Once the work tree is moved, every trainer's script is imported
    under its dependency set: one that fails ends the rebase with exit 1, naming the
    file and line, the nearest patch and the upstream commit that brought the line.
    After a rebase that 3-way merged or hand-resolved patches, the last line names
    the smoke of each trainer they touch.  A patch changed only in its index lines is
    kept (header and Last-Update too); one upstream absorbed is named so.
    The dry run runs the same steps; after each stop it keeps the patch's side of the
    conflicts, so its count of stops is the rebase's when resolutions keep the patches.
    """
)


def register(sub, common) -> None:
    p = sub.add_parser(
        "rebase", parents=[common], help="move the patch series onto another upstream commit",
        description=GUIDE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--onto", metavar="REF", help="the upstream branch, tag or commit to move the series onto")
    what.add_argument("--continue", dest="cont", action="store_true", help="go on after resolving (or after a crash)")
    what.add_argument("--skip", action="store_true", help="drop the patch the rebase stopped at, and go on")
    what.add_argument("--abort", action="store_true", help="undo the rebase: everything as before it started")
    p.add_argument("--dry-run", action="store_true", help="with --onto: report what would happen and change nothing; exit 1 if the rebase would stop "
                   "(later patches tried as if each stop were resolved keeping the patch)")
    p.add_argument("--source", metavar="URL|DIR", help="fetch REF from here (default: $DANCEGRPO_SOURCE, else the lock's url); "
                   "REF must be found there: a failed fetch is refused, never replaced by a local ref")
    p.set_defaults(func=run)


def project_for(args):
    """The project: -C or the current directory, else (--continue, --skip, --abort) the one
    whose rebase tree the current directory is in, where the stop report says to resolve."""
    try:
        return project_from_args(args)
    except DancegrpoError:
        if args.onto or getattr(args, "project_dir", None):
            raise
        found = project_of_rebase_tree(Path.cwd())
        if found is None:
            raise
        return found


def run(args) -> int:
    project = project_for(args)
    if args.dry_run and not args.onto:
        raise DancegrpoError("--dry-run goes with --onto REF", "run `dancegrpo-npu rebase --onto REF --dry-run`", exit_code=2)
    if args.onto and args.dry_run:
        result = dry_run(project, args.onto, args.source)
    elif args.onto:
        result = start_rebase(project, args.onto, args.source)
    elif args.cont:
        result = continue_rebase(project)
    elif args.skip:
        result = skip_patch(project)
    else:
        result = abort_rebase(project)
    print(result.report, end="")
    if result.status == "stopped" or result.message:
        raise DancegrpoError(result.message, result.hint)
    return 0
