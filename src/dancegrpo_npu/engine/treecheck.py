"""Is the patched tree there, and is it exactly lock + series + overlay?

The check itself belongs to the engine (``dancegrpo-npu verify``,
``dancegrpo_npu.engine.status.verify_tree``); launch, smoke, bench and doctor call it through here.
A command verifies the tree once and passes the verdict down (``require_tree``'s ``verified``): a
verified tree's verdict carries the digests it was verified against (``DIGESTS``).
"""

from __future__ import annotations

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import Project
from dancegrpo_npu.engine.status import DIFFERS_HINT, TreeDiffers, verify_tree

FIX = "run `dancegrpo-npu fetch && dancegrpo-npu apply`"
# What a verified tree's verdict carries: the locked commit, the series and the overlay it is exactly.
DIGESTS = ("upstream_commit", "series_sha256", "overlay_sha256")


def tree_state(project: Project, script_relpath: str | None = None) -> dict:
    """{"state": missing|unverified|verified, "detail": why}; a verified tree adds "without" (the
    patches ``apply --without`` left out) and the digests it is exactly (``DIGESTS``)."""
    tree = project.workdir
    if not tree.is_dir():
        return {"state": "missing", "detail": f"no patched upstream tree at {tree}"}
    if script_relpath and not (tree / script_relpath).is_file():
        return {"state": "missing", "detail": f"{tree} has no {script_relpath}"}
    try:
        report = verify_tree(project)
    except TreeDiffers as e:
        # files differ from what the series makes, which `apply` puts right, or untracked files
        # are in the way, which its hint says how to move or ignore
        return {"state": "unverified", "detail": e.message, "differs": True, "fix": e.hint}
    except DancegrpoError as e:
        # any other problem (a broken lock, a patch that does not fit) says in its own hint what does
        return {"state": "unverified", "detail": e.one_line(), "differs": False}
    # an ablation tree (apply --without) runs, and says so: the run's record keeps it
    return {"state": "verified", "detail": f"{tree} is {report.what}", "without": list(report.without),
            "upstream_commit": report.lock.commit, "series_sha256": report.series_sha256,
            "overlay_sha256": report.overlay_sha256}


def unverified_fix(state: dict) -> str | None:
    """The hint for an unverified tree: what makes it exact when it differs (status and apply for
    its files; untracked files moved out or ignored); else None, as the detail carries the
    problem's own hint (`apply` would fail the same way)."""
    if not state.get("differs"):
        return None
    fix = state.get("fix") or ""
    if fix.startswith(DIFFERS_HINT):
        fix = "run `dancegrpo-npu status` to see what differs, then `dancegrpo-npu apply`" + fix[len(DIFFERS_HINT):]
    return fix


def require_tree(project: Project, script_relpath: str, verified: dict | None = None) -> dict:
    """tree_state, raising the error a launch must stop with (missing or unverified tree).
    ``verified``: the tree_state the command took already (the tree is verified once a command)."""
    state = tree_state(project, script_relpath) if verified is None else verified
    if state["state"] == "missing":
        raise DancegrpoError(state["detail"], FIX)
    if state["state"] == "unverified":
        raise DancegrpoError(
            f"the patched tree {project.workdir} is not lock + series + overlay ({state['detail']})",
            unverified_fix(state),
        )
    return state
