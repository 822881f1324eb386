"""``dancegrpo-npu lock``: the sha256 of every upstream file the series touches, into upstream.lock."""

from __future__ import annotations

import argparse
import textwrap

from dancegrpo_npu.engine.lockfile import describe_change, refresh_lock


def register(sub, common) -> None:
    p = sub.add_parser(
        "lock",
        parents=[common],
        help="record in upstream.lock the sha256 of every upstream file the series touches",
        description=textwrap.dedent(
            """\
            Rewrite [files] of upstream.lock: the sha256 of every upstream file the series
            touches, at the locked commit, before patching (from the work tree's git objects,
            so run `dancegrpo-npu fetch` first).  Run it whenever a patch starts or stops
            touching a file.  The lock is replaced atomically; url and commit are kept.

            --check changes nothing and exits non-zero if [files] is stale (for CI)."""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--check", action="store_true", help="only check; exit 1 if [files] is stale")
    p.set_defaults(func=run)


def run(args) -> int:
    from dancegrpo_npu.project import project_from_args

    project = project_from_args(args)
    old, new = refresh_lock(project, check=args.check)
    if args.check:
        print(f"upstream.lock [files] is up to date ({len(new)} files)")
    elif old == new:
        print(f"upstream.lock [files] already up to date ({len(new)} files)")
    else:
        print(f"upstream.lock [files] rewritten ({len(new)} files: {describe_change(old, new)})")
    return 0
