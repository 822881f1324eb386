"""``dancegrpo-npu fetch``: upstream at the locked commit into the work tree."""

from __future__ import annotations

import argparse
import sys
import textwrap

from dancegrpo_npu.engine.worktree import display_path, shorten
from dancegrpo_npu.engine.fetch import fetch, missing_assets


def register(sub, common) -> None:
    p = sub.add_parser(
        "fetch",
        parents=[common],
        help="fetch upstream DanceGRPO at the locked commit into the work tree",
        description=textwrap.dedent(
            """\
            Put upstream at the commit upstream.lock pins into the work tree (default
            build/DanceGRPO), with its full history, and check the commit and the sha256 of
            every file the lock records.  assets/ is left out unless --with-assets.

            Source: --source, else $DANCEGRPO_SOURCE, else the lock's url (git's
            url.<base>.insteadOf applies, so a configured mirror is used).  A source is a git
            URL, a local git directory, or a .tar.gz of the tree whose sha256 equals the
            lock's archive_sha256.

            A new tree appears only complete and verified.  A tree already at the locked
            commit is left as it is (the applied series too).  If the lock moved, the tree is
            moved to the new commit (unpatched; run `dancegrpo-npu apply` next), unless it has
            local edits, which are named."""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--source", metavar="URL|PATH", help="a git URL, git directory or .tar.gz to fetch from")
    p.add_argument("--with-assets", action="store_true", help="also check out assets/ (large media and prompt files)")
    p.set_defaults(func=run)


def run(args) -> int:
    from dancegrpo_npu.project import project_from_args

    project = project_from_args(args)
    def say(line: str) -> None:  # progress for people at a terminal; pipes get only results and errors
        if sys.stderr.isatty():
            print(line, file=sys.stderr, flush=True)

    outcome = fetch(project, args.source, args.with_assets, say=say)
    f = outcome.fetched
    where = display_path(project.workdir)
    stands = f" (commit {f.head[:12]} of the archive)" if f.kind == "archive" else ""
    messages = {
        "fetched": f"{where}: upstream {f.commit[:12]}{stands} fetched from {f.source}",
        "up to date": f"{where}: already at upstream {f.commit[:12]}; nothing to do",
        "moved": f"{where}: moved to upstream {f.commit[:12]}{stands}; run `dancegrpo-npu apply` to patch it",
        "assets added": f"{where}: assets/ checked out",
    }
    print(messages[outcome.action])
    assets = missing_assets(outcome.left_out)
    others = [p for p in outcome.left_out if p not in assets]
    if others:
        print(
            f"note: the source lacks {len(others)} file(s) the series does not touch; left out of the tree"
            f"{'' if f.with_assets else ' (as assets/ is)'}: {shorten(others, 5)}"
        )
    if assets:
        print(
            f"note: assets/ checked out without {len(assets)} file(s) the source lacks: {shorten(assets, 5)};"
            f" copy upstream's into the tree from a complete clone (`git -C CLONE show {f.commit[:12]}:{assets[0]}"
            f" > {where}/{assets[0]}`), or fetch into a new --workdir from a complete --source"
        )
    return 0
