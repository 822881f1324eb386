"""``dancegrpo-npu verify``: exit 0 only if the work tree is exactly lock + series + overlay."""

from __future__ import annotations

import argparse

from dancegrpo_npu.engine.series import series_label
from dancegrpo_npu.engine.status import verify_tree
from dancegrpo_npu.engine.worktree import display_path


def register(sub, common) -> None:
    p = sub.add_parser(
        "verify",
        parents=[common],
        help="exit 0 only if the work tree is exactly lock + series + overlay",
        description="Check that the work tree is exactly upstream at the locked commit, with the "
        "series and the overlay applied, and nothing else (no local edit, no untracked file git "
        "does not ignore).  Exit 0 if so; otherwise exit 1 with a one-line reason.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from dancegrpo_npu.project import project_from_args

    project = project_from_args(args)
    r = verify_tree(project)
    where = display_path(project.workdir)
    if r.without:
        kept = len(r.patches) - len(r.without)
        print(f"{where}: exactly upstream {r.lock.commit[:12]} + {kept} of {len(r.patches)} patches ({series_label(r.without)}) + overlay")
    else:
        print(f"{where}: exactly upstream {r.lock.commit[:12]} + {len(r.patches)} patches + overlay")
    return 0
