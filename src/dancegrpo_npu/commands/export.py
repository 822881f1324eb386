"""``dancegrpo-npu export``: the work tree's edits written back as patches."""

from __future__ import annotations

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import project_from_args
from dancegrpo_npu.rebase.export import export_edits


def register(sub, common) -> None:
    p = sub.add_parser(
        "export",
        parents=[common],
        help="save hand edits in the patched tree as a new patch at the end of the series",
        description="Turn your edits in the patched tree (changed, new and deleted upstream files) into "
        "patches/NAME.patch with a DEP-3 header stub, one line appended to patches/series, and add the hashes "
        "of newly touched upstream files to upstream.lock. Edited overlay files are copied back to overlay/. "
        "Afterwards `dancegrpo-npu verify` passes. Edit the TODO lines of the new patch's Description: "
        "before you commit it. The series' order is the lines of patches/series: no file carries a number "
        "and nothing is renamed. A patch that belongs earlier: export it, move its line up in patches/series, "
        "then `dancegrpo-npu apply` checks that it applies there.",
    )
    p.add_argument("name", metavar="NAME", nargs="?",
                   help="what the patch does, e.g. fix-hccl-timeout: patches/fix-hccl-timeout.patch")
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
        raise DancegrpoError("export needs NAME (the new patch's name)", "e.g. `dancegrpo-npu export fix-hccl-timeout`",
                             exit_code=2)
    if args.context is not None and not 0 <= args.context <= 20:
        raise DancegrpoError(f"--context {args.context} is out of range", "use 0 to 20 lines (Debian style: 3 or fewer)",
                             exit_code=2)
    result = export_edits(project, args.name, args.description, args.context, tuple(args.include))
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

