"""The devices, drivers and package versions a job will see, each read in a child process or
from files (the CLI itself never imports torch).

Devices are probed in a child Python with the environment the job gets, so
ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES count; package versions are asked of the
interpreter the job runs (a layered dependency set has its own).  Every probe is best effort:
one that cannot read its fact says why instead of failing.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys

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

# Defines, in a child, devices(): which device kind DANCEGRPO_DEVICE resolves to (contract 2's rule
# for auto), and that kind's device names and memory.  The launch's own child, which checks the
# script's arguments in the job's interpreter and environment, calls it too (run.script_parser):
# torch is imported there already, so the run's record costs no second interpreter.
DEVICE_PROBE_FUNCTION = r"""
def devices():
    import os
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
    return out
"""

# Runs in the child: prints devices()'s one JSON object.
DEVICE_PROBE = DEVICE_PROBE_FUNCTION + "\nimport json\nprint(json.dumps(devices()))\n"


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
