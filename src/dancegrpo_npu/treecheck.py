"""Is the patched tree there, and is it exactly lock + series + overlay?

The check itself belongs to the engine (``dancegrpo-npu verify``, module ``status``).  Launch
and doctor call it through here: ``dancegrpo_npu.status.verify_tree(project)`` raising
DancegrpoError when the tree differs (``verify`` is accepted as the function's name too).
While the engine's module is not installed the answer is "unknown", with the reason, and the
tree is only checked for presence.
"""

from __future__ import annotations

import importlib

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import Project

FIX = "run `dancegrpo-npu fetch && dancegrpo-npu apply`"


def tree_state(project: Project, script_relpath: str | None = None) -> dict:
    """{"state": missing|unverified|verified|unknown, "detail": why}."""
    tree = project.workdir
    if not tree.is_dir():
        return {"state": "missing", "detail": f"no patched upstream tree at {tree}"}
    if script_relpath and not (tree / script_relpath).is_file():
        return {"state": "missing", "detail": f"{tree} has no {script_relpath}"}
    try:
        module = importlib.import_module("dancegrpo_npu.status")
    except ModuleNotFoundError as e:
        if e.name != "dancegrpo_npu.status":
            raise
        return {"state": "unknown", "detail": "the engine's verify (dancegrpo_npu.status) is not installed"}
    verify = getattr(module, "verify_tree", None) or getattr(module, "verify", None)
    if not callable(verify):
        return {"state": "unknown", "detail": "dancegrpo_npu.status has no verify_tree(project)"}
    try:
        verify(project)
    except DancegrpoError as e:
        return {"state": "unverified", "detail": e.one_line()}
    except TypeError as e:  # a verify with another signature: say so rather than guess
        return {"state": "unknown", "detail": f"dancegrpo_npu.status.verify_tree(project) failed: {e}"}
    return {"state": "verified", "detail": f"{tree} is lock + series + overlay"}


def require_tree(project: Project, script_relpath: str) -> dict:
    """tree_state, raising the error a launch must stop with (missing or unverified tree)."""
    state = tree_state(project, script_relpath)
    if state["state"] == "missing":
        raise DancegrpoError(state["detail"], FIX)
    if state["state"] == "unverified":
        raise DancegrpoError(
            f"the patched tree {project.workdir} is not lock + series + overlay ({state['detail']})",
            "run `dancegrpo-npu status` to see what differs, then `dancegrpo-npu apply`",
        )
    return state
