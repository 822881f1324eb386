"""``dancegrpo-npu upstream-log``: upstream commits since the locked one, marking those that touch patched files."""

from __future__ import annotations

from dancegrpo_npu.project import project_from_args
from dancegrpo_npu.rebase.upstream_log import format_log, upstream_log


def register(sub, common) -> None:
    p = sub.add_parser(
        "upstream-log",
        parents=[common],
        help="upstream commits since the locked one, marking those that touch patched files",
        description="List the upstream commits between the locked commit (upstream.lock) and REF "
        "(default: the upstream's default branch, fetched now), newest first. Commits that touch a "
        "file the series patches are marked with * and the patches are named: those are where a "
        "`dancegrpo-npu rebase --onto REF` can conflict.",
    )
    p.add_argument("ref", nargs="?", metavar="REF", help="an upstream branch, tag or commit (default: the default branch)")
    p.add_argument("--touching", action="store_true", help="list only the commits that touch patched files")
    p.add_argument("--source", metavar="URL|DIR", help="fetch from here (default: $DANCEGRPO_SOURCE, else the lock's url)")
    p.set_defaults(func=run)


def run(args) -> int:
    log = upstream_log(project_from_args(args), args.ref, args.source)
    print(format_log(log, args.touching), end="")
    return 0
