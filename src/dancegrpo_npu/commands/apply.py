"""``dancegrpo-npu apply``: the series, then the overlay, onto the work tree, atomically."""

from __future__ import annotations

import argparse
import textwrap

from dancegrpo_npu.engine.series import series_label
from dancegrpo_npu.engine.worktree import display_path
from dancegrpo_npu.engine.apply import apply_worktree


def register(sub, common) -> None:
    p = sub.add_parser(
        "apply",
        parents=[common],
        help="apply patches/series, then overlay/, to the work tree (atomically)",
        description=textwrap.dedent(
            """\
            Apply every patch of patches/series in order, exactly (no fuzz, no offset), then
            add the files of overlay/, to the work tree fetched by `dancegrpo-npu fetch`.

            The series is applied to a staging copy first; the work tree changes only when
            every patch and the overlay succeeded, and an interrupted apply is finished by
            the next dancegrpo-npu command.  Re-applying an unchanged series is a no-op.

            --without PATCH leaves patches out (an ablation tree, e.g. `--workdir
            build/norope --without float32-rope`): refused, naming it, when a later patch no longer
            applies without them.  status and verify then say "series without PATCH", a
            launch or smoke on it records what was left out, and a plain apply restores the
            full series.

            Local edits (files that differ from what the last apply wrote, or from upstream)
            make apply refuse and name them.  --force saves them first, as a git-format patch
            plus copies, under <workdir>/.git/dancegrpo-npu/saved/<time>/, then re-applies.
            Untracked files outside the series' paths are left alone."""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--force", action="store_true", help="save local edits as a patch file, then re-apply over them")
    p.add_argument(
        "--without", action="append", metavar="PATCH",
        help="leave this patch of the series out (repeatable; its name, e.g. batched-rollout, or its file name):"
        " an ablation tree, e.g. `--workdir build/norope --without"
        " float32-rope`; refused, naming it, when a later patch"
        " needs it; status and verify then say 'series without PATCH', and a plain apply restores the full series",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from dancegrpo_npu.project import project_from_args

    project = project_from_args(args)
    outcome = apply_worktree(project, force=args.force, without=tuple(args.without or ()))
    where = display_path(project.workdir)
    series = series_label(outcome.without)
    if outcome.saved is not None:
        print(f"saved local edits to {display_path(outcome.saved / 'local-edits.patch')} (copies in files/ beside it)")
    if outcome.noop:
        print(f"{where}: {series} ({outcome.patches} patch(es)) and overlay ({outcome.overlay} file(s)) already applied; nothing to do")
    else:
        print(f"{where}: applied {outcome.patches} patch(es) and {outcome.overlay} overlay file(s); {len(outcome.changed)} path(s) changed")
    if outcome.without:
        print(f"note: {where} is the {series}; `dancegrpo-npu apply` without --without restores the full series")
    if outcome.moved:
        print(f"note: {len(outcome.moved)} hunk(s) of later patches were placed where their context now is"
              " (what the left-out patches added or removed above them moved them; the context matched in full):")
        for line in outcome.moved:
            print(f"  {line}")
    if outcome.untracked:
        listed = ", ".join(outcome.untracked[:5]) + (" ..." if len(outcome.untracked) > 5 else "")
        print(f"note: {len(outcome.untracked)} untracked file(s) left alone, not part of the tree: {listed}")
    return 0
