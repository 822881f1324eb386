"""``dancegrpo-npu status``: the locked commit, each patch, the overlay and local edits."""

from __future__ import annotations

from dancegrpo_npu.engine.series import TODO_MARK, is_todo
from dancegrpo_npu.engine.worktree import display_path
from dancegrpo_npu.engine.status import inspect


def register(sub, common) -> None:
    p = sub.add_parser(
        "status",
        parents=[common],
        help="show the locked commit, each patch, the overlay and local edits",
        description="Show the locked upstream commit, each patch of the series (applied / not "
        "applied / drifted), the overlay (present / missing / modified) and every local edit in "
        "the work tree, file by file; first, a rebase in progress and what to run to go on.",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from dancegrpo_npu.project import project_from_args

    project = project_from_args(args)
    r = inspect(project, mid_swap_ok=True)
    where = display_path(project.workdir)
    if r.rebase:
        print(f"rebase     {r.rebase}")
    print(f"upstream   {r.lock.commit} ({r.lock.url}); lock records {len(r.lock.files)} file(s)")
    f = r.fetched
    extra = ", archive commit " + f.head[:12] if f.kind == "archive" else ""
    print(f"work tree  {where}: fetched from {f.source}{extra}; assets/ {'included' if f.with_assets else 'left out'}")
    if r.problem:
        print(f"problem    {r.problem}")
    print(f"patches    {len(r.patches)} in patches/series")
    width = max((len(p.name) for p in r.patches), default=0)
    for p in r.patches:
        detail = f"  [{p.detail}]" if p.detail else ""
        todo = f"  {TODO_MARK}" if is_todo(p.description) else ""
        print(f"  {p.state:<12} {p.name:<{width}}  {p.description}{detail}{todo}")
    if r.todo:
        print(r.todo)
    for name in r.dropped:
        print(f"  {'dropped':<12} {name}  (applied last time, no longer in the series; `apply` removes it)")
    print(f"overlay    {r.overlay}")
    for line in r.overlay_detail:
        print(f"  {line}")
    blocking = [e for e in r.edits if e.blocking]
    print(f"local edits {len(blocking) or 'none'}")
    for e in blocking:
        print(f"  {e.kind:<12} {e.path}")
    if r.untracked:
        print(f"untracked  {len(r.untracked)} file(s) git does not ignore, not part of the tree")
        for path in r.untracked:
            print(f"  {path}")
    print("verdict    " + (f"exactly {r.what}" if r.exact else f"NOT exactly {r.what} (see above; `dancegrpo-npu verify` says why)"))
    return 0
