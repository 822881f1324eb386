"""The environment fingerprint a run records: enough to reproduce it and to compare runs.

Devices are probed in a child Python (it imports torch, which the CLI itself must not), with
the environment the job gets, so ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES count.
Every part is best effort: a part that cannot be read says why instead of failing the launch.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from dancegrpo_npu import __version__

from dancegrpo_npu.host import ascend
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitutil import rev_parse
from dancegrpo_npu.project import Project

PACKAGES = (
    "torch",
    "torch_npu",
    "torchvision",
    "diffusers",
    "transformers",
    "accelerate",
    "peft",
    "open_clip_torch",
    "hpsv2",
    "wandb",
    "numpy",
)

# Runs in the child: which device kind DANCEGRPO_DEVICE resolves to (contract 2's rule for
# auto), and that kind's device names and memory.  Prints one JSON object.
DEVICE_PROBE = r"""
import json, os
out = {"requested": os.environ.get("DANCEGRPO_DEVICE", "auto")}
try:
    import torch
    out["torch"] = torch.__version__
    npu = False
    if out["requested"] in ("auto", "npu"):
        try:
            import torch_npu  # noqa: F401
            npu = torch.npu.is_available() and torch.npu.device_count() > 0
        except Exception as e:
            out["torch_npu_error"] = f"{type(e).__name__}: {e}"
    if npu:
        mod, kind = torch.npu, "npu"
    elif out["requested"] in ("auto", "cuda") and torch.cuda.is_available():
        mod, kind = torch.cuda, "cuda"
    else:
        mod, kind = None, "cpu"
    out["kind"] = kind
    if mod is not None:
        n = mod.device_count()
        out["count"] = n
        out["names"] = [mod.get_device_name(i) for i in range(n)]
        out["memory_bytes"] = [mod.get_device_properties(i).total_memory for i in range(n)]
    else:
        import platform
        out["count"] = 1
        out["names"] = [platform.processor() or platform.machine()]
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


_VERSIONS_PROBE = r"""
import importlib.metadata as md, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = md.version(name)
    except md.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def package_versions(python: str | None = None) -> dict[str, str | None]:
    """The versions the job imports: another interpreter's (a layered dependency set,
    run.depsets) are asked of it."""
    if python and python != sys.executable:
        try:
            proc = subprocess.run([python, "-c", _VERSIONS_PROBE, *PACKAGES], capture_output=True, text=True,
                                  timeout=120)
            return json.loads(proc.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            return {"error": f"{python}: {e}"}
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def probe_devices(env: dict[str, str], timeout: float = 180.0, python: str | None = None) -> dict:
    """The device kind and names the job will see, from a child process with its environment."""
    try:
        proc = subprocess.run(
            [python or sys.executable, "-c", DEVICE_PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"device probe failed: {e}"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        return {"error": f"device probe exited {proc.returncode}: {' | '.join(tail)}"}
    try:
        return json.loads(lines[-1])
    except ValueError:
        return {"error": "device probe printed no JSON"}


def nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()
    return first[0].strip() if out.returncode == 0 and first else None


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


# Written in the run directory by the patched trainers' rank 0 at the start of main() (patch 0016,
# overlay dancegrpo_port/device.py allow_tf32): the TF32 / HF32 switches as set and read back.
# Only the trainer can see them, so the launcher folds the file in after the run.
MATMUL_RECORD = "matmul_precision.json"


def trainer_matmul_precision(run_dir: Path) -> dict:
    """The matmul precision switches the trainer reported, or why there is no report."""
    path = run_dir / MATMUL_RECORD
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"reported": False,
                "why": f"the trainer wrote no {MATMUL_RECORD} (it stopped before main(), or its tree predates patch 0016)"}
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


def fingerprint(project: Project, env: dict[str, str], tree_state: dict, probe: bool = True,
                python: str | None = None) -> dict:
    """``python``: the job's interpreter (a dependency set's, run.depsets), default the tool's."""
    home = ascend.cann_home(env)
    cann_version, cann_file = ascend.cann_version(home) if home else (None, None)
    devices = probe_devices(env, python=python) if probe else {"skipped": True}
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
            "home": str(home) if home else None,
            "version": cann_version,
            "version_file": str(cann_file) if cann_file else None,
        },
        "npu_driver": ascend.driver_version(),
        "nvidia_driver": nvidia_driver(),
        "npu_device_files": ascend.davinci_count(),
        "upstream": {**upstream_facts(project), "verification": tree_state},
        "pid": os.getpid(),
    }
