"""``dancegrpo-npu export``: the work tree's edits written back as patches."""

from __future__ import annotations

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import project_from_args
from dancegrpo_npu.rebase.export import export_edits, renumber_series


def register(sub, common) -> None:
    p = sub.add_parser(
        "export",
        parents=[common],
        help="save hand edits in the patched tree as a new patch at the end of the series",
        description="Turn your edits in the patched tree (changed, new and deleted upstream files) into "
        "patches/NNNN-NAME.patch, appended to patches/series with a DEP-3 header stub, and add the hashes "
        "of newly touched upstream files to upstream.lock. Edited overlay files are copied back to overlay/. "
        "Afterwards `dancegrpo-npu verify` passes. Edit the TODO lines of the new patch's Description: "
        "before you commit it. Numbers follow the series' order, as gbp pq writes them: in a numbered series "
        "every export renames each patch whose number is not its position (its file and its line in "
        "patches/series); `export --renumber` alone renumbers the whole series.",
    )
    p.add_argument("name", metavar="NAME", nargs="?",
                   help="what the patch does, e.g. fix-hccl-timeout: patches/NNNN-fix-hccl-timeout.patch, NNNN its "
                   "position in the series (a series without numbers: fix-hccl-timeout.patch)")
    p.add_argument("--renumber", action="store_true",
                   help="number every patch by its position in patches/series ('%%04d-' %% position, as gbp pq), "
                   "renaming those whose number differs; alone (no NAME) it only renumbers, no tree needed")
    p.add_argument("-m", "--description", metavar="TEXT", help="the Description: first line (default: a TODO to edit)")
    p.add_argument("-U", "--context", type=int, metavar="N", help="lines of context (default: what the series uses)")
    p.add_argument("--include", action="append", default=[], metavar="PATH",
                   help="also take this new file (or the new files under this directory) into the patch; "
                   "new files that neither upstream, the series nor the overlay has are otherwise listed and left "
                   "in the tree; repeatable")
    p.set_defaults(func=run)


def run(args) -> int:
    project = project_from_args(args)
    if args.name is None:
        if not args.renumber:
            raise DancegrpoError("export needs NAME (the new patch's name) or --renumber",
                                 "e.g. `dancegrpo-npu export fix-hccl-timeout`, or `dancegrpo-npu export --renumber`",
                                 exit_code=2)
        print_renamed(renumber_series(project), project)
        return 0
    if args.context is not None and not 0 <= args.context <= 20:
        raise DancegrpoError(f"--context {args.context} is out of range", "use 0 to 20 lines (Debian style: 3 or fewer)",
                             exit_code=2)
    result = export_edits(project, args.name, args.description, args.context, tuple(args.include), args.renumber)
    if result.renamed:
        print_renamed(result.renamed, project)
    if result.patch is not None:
        rel = result.patch.relative_to(project.root)
        print(f"exported {len(result.files)} file(s) to {rel} (appended to patches/series):")
        print("\n".join(f"  {f}" for f in result.files))
    for rel in result.overlay:
        print(f"copied back to overlay/: {rel}")
    for note in result.notes:
        print(f"note: {note}")
    if result.left_out:
        print("left in the tree, not exported (new files that neither upstream, the series nor the overlay has; "
              "--include PATH takes one into the patch):")
        print("\n".join(f"  ? {path}" for path in result.left_out))
    if result.patch is not None and "TODO" in result.patch.read_text(encoding="utf-8").split("\n---\n", 1)[0]:
        print(f"now edit the TODO lines of the Description: in {rel}, then commit patches/ and upstream.lock")
    return 0


def print_renamed(renamed, project) -> None:
    """What renumbering did: each rename, or that every number already is its position."""
    if not renamed:
        print("patches/series: every patch's number is its position; nothing renamed")
        return
    print(f"renumbered {len(renamed)} patch(es) to their position in patches/series:")
    print("\n".join(f"  {old} -> {new}" for old, new in renamed))
    if project.workdir.exists():
        print("then `dancegrpo-npu apply` records the renamed series in the tree (no file of it changes)")
