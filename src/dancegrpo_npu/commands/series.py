"""``dancegrpo-npu series``: the patches in order, each with its one-line description."""

from __future__ import annotations

import sys

from dancegrpo_npu.engine.series import TODO_MARK, load_series, todo_warning


def register(sub, common) -> None:
    p = sub.add_parser(
        "series",
        parents=[common],
        help="list the patches in order with their one-line descriptions",
        description="List patches/series in order, each with the first line of its DEP-3 "
        "Description: header. Read top to bottom, it is the port in brief. A patch whose "
        "Description: still starts with TODO (the stub `export` writes) is flagged, with a "
        "warning; it applies like any other.",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from dancegrpo_npu.project import project_from_args

    project = project_from_args(args)
    patches = load_series(project.patches_dir)
    if not patches:
        print("patches/series is empty")
    width = max((len(p.name) for p in patches), default=0)
    for i, p in enumerate(patches, 1):
        print(f"{i:3d}  {p.name:<{width}}  {p.description}" + (f"  {TODO_MARK}" if p.unfinished else ""))
    warning = todo_warning(patches)
    if warning:
        print(f"dancegrpo-npu: {warning}", file=sys.stderr)
    return 0
