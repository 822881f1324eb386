"""The environment fingerprint a run records: enough to reproduce it and to compare runs.

The host's facts (devices, drivers, package versions) come from ``host.devices``; this module
adds the run's own: the tree, the series, the command.  Every part is best effort: a part that
cannot be read says why instead of failing the launch.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from pathlib import Path

from dancegrpo_npu import __version__

from dancegrpo_npu.host import ascend, torch_stack
from dancegrpo_npu.host.devices import nvidia_driver, package_versions, probe_devices
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitutil import rev_parse
from dancegrpo_npu.project import Project

def git_head(tree: Path) -> str | None:
    """The tree's HEAD commit, or None (no tree, not a repository, no git)."""
    try:
        return rev_parse(tree, "HEAD")
    except (OSError, DancegrpoError):
        return None


def upstream_facts(project: Project) -> dict:
    """Locked commit, the tree's HEAD, the series hash: read through the project's own modules."""
    from dancegrpo_npu.engine.lock import load_lock
    from dancegrpo_npu.engine.series import load_series, series_sha256

    facts: dict = {"tree": str(project.workdir), "tree_head": git_head(project.workdir)}
    try:
        facts["locked_commit"] = load_lock(project.lock_path).commit
    except DancegrpoError as e:
        facts["locked_commit"] = None
        facts["lock_error"] = e.one_line()
    try:
        patches = load_series(project.patches_dir)
        facts["series_sha256"] = series_sha256(patches)
        facts["patches"] = [p.name for p in patches]
    except DancegrpoError as e:
        facts["series_sha256"] = None
        facts["series_error"] = e.one_line()
    facts["patches_left_out"] = left_out_patches(project)
    return facts


# Written in the run directory by the patched trainers' rank 0 at the start of main() (the allow-tf32-hf32 patch,
# overlay dancegrpo_port/device/matmul.py allow_tf32): the TF32 / HF32 switches as set and read back.
# Only the trainer can see them, so the launcher folds the file in after the run.
MATMUL_RECORD = "matmul_precision.json"


def trainer_matmul_precision(run_dir: Path) -> dict:
    """The matmul precision switches the trainer reported, or why there is no report."""
    path = run_dir / MATMUL_RECORD
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"reported": False,
                "why": f"the trainer wrote no {MATMUL_RECORD} (it stopped before main(), or its tree predates the allow-tf32-hf32 patch)"}
    except (OSError, ValueError) as e:
        return {"reported": False, "why": f"{MATMUL_RECORD} is unreadable: {e}"}
    if not isinstance(data, dict):
        return {"reported": False, "why": f"{MATMUL_RECORD} is not a JSON object"}
    return {"reported": True, "source": f"{MATMUL_RECORD}, written by the trainer's rank 0 at start", **data}


def left_out_patches(project: Project) -> list[str] | None:
    """The patches the tree was applied without (``apply --without``, an ablation): [] for
    the full series, None when the tree records no apply."""
    from dancegrpo_npu.engine.worktree import WorkTree, load_applied

    try:
        applied = load_applied(WorkTree(project.workdir))
    except DancegrpoError:
        return None
    return list(applied.without) if applied is not None else None


def fingerprint(project: Project, env: dict[str, str], tree_state: dict, python: str | None = None,
                devices: dict | None = None) -> dict:
    """``python``: the job's interpreter (a dependency set's, run.depsets), default the tool's.
    ``devices``: what a child of that interpreter with ``env`` probed already (the launch's check
    of the script's arguments probes them), else probed here."""
    home = torch_stack.active_home(env)
    cann = torch_stack.find_cann(env)
    if devices is None:
        devices = probe_devices(env, python=python)
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "python_executable": python or sys.executable,
        "dancegrpo_npu": __version__,
        "packages": package_versions(python),
        "devices": devices,
        "cann": {
            "home": home,
            "version": cann.version if cann else None,
            "version_file": str(cann.info_file) if cann else None,
        },
        "npu_driver": ascend.driver_version(),
        "nvidia_driver": nvidia_driver(),
        "npu_device_files": ascend.davinci_count(),
        "upstream": {**upstream_facts(project), "verification": tree_state},
        "pid": os.getpid(),
    }
