"""What the embedded default costs: ``dancegrpo-npu smoke`` with 1 and 2 processes, side by side.

    PYTHONPATH=src python bench/smoke.py [-C PROJECT] [--lora] [--device cpu|cuda|npu|auto]

Needs the patched tree (``dancegrpo-npu fetch && dancegrpo-npu apply``).  The fixtures are
built first and not timed ("cached fixtures"); each smoke is then timed from the start of
``python -m dancegrpo_npu smoke`` to its exit (tool start-up, torchrun, every rank's imports,
2 GRPO steps in strict mode, the checkpoint read back).  Peak RSS per rank is each training
process's VmHWM, read from /proc every 0.1 s while it runs (Linux; the last 0.1 s of growth
can be missed).  The import time is that of the patched train_grpo_flux.py's top level in a
fresh interpreter, beside the interpreter's own start.  Targets (2 cores): smoke
<= 30 s with 1 process, <= 45 s with 2.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

TARGETS = {1: 30.0, 2: 45.0}
SCRIPTS = ("train_grpo_flux.py", "train_grpo_flux_lora.py")


def _ranks() -> dict[int, int]:
    """{pid: LOCAL_RANK} of the running training processes."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(arg.decode(errors="replace").endswith(SCRIPTS) for arg in cmd):
                continue
            env = dict(v.split(b"=", 1) for v in (entry / "environ").read_bytes().split(b"\0") if b"=" in v)
            found[int(entry.name)] = int(env.get(b"LOCAL_RANK", b"-1"))
        except (OSError, ValueError):
            continue
    return found


def _vm_hwm_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_smoke(project: Path, nproc: int, lora: bool, device: str) -> tuple[float, dict[int, float], str]:
    """(wall seconds, {rank: peak RSS MiB}, last line of output)."""
    peaks: dict[int, float] = {}
    done = threading.Event()

    def watch():
        while not done.is_set():
            for pid, rank in _ranks().items():
                hwm = _vm_hwm_mib(pid)
                if hwm is not None:
                    peaks[rank] = max(peaks.get(rank, 0.0), hwm)
            done.wait(0.1)

    command = [sys.executable, "-m", "dancegrpo_npu", "-C", str(project), "smoke", "--nproc", str(nproc), "--device", device]
    command += ["--lora"] if lora else []
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    done.set()
    watcher.join()
    if proc.returncode != 0:
        sys.exit(f"bench: smoke --nproc {nproc} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, peaks, proc.stdout.strip().splitlines()[-1]


def import_time(tree: Path, script: str) -> tuple[float, float]:
    """(interpreter start-up s, top-level import of the patched script s), in fresh interpreters."""
    env = dict(os.environ, PYTHONPATH=str(tree), DANCEGRPO_DEVICE="cpu")
    env.pop("DANCEGRPO_NPU_STRICT", None)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, env=env)
    bare = time.perf_counter() - start
    code = (
        "import importlib.util, sys, time; t = time.perf_counter(); "
        f"spec = importlib.util.spec_from_file_location('trainer', {str(tree / 'fastvideo' / script)!r}); "
        "spec.loader.exec_module(importlib.util.module_from_spec(spec)); print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True)
    return bare, float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-C", dest="project", default=".", help="the dancegrpo-npu project (default: .)")
    parser.add_argument("--lora", action="store_true", help="bench the LoRA smoke")
    parser.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda", "npu"))
    args = parser.parse_args()

    from dancegrpo_npu.trainers.flux.fixtures import build_fixtures
    from dancegrpo_npu.project import find_project

    project = find_project(args.project)
    script = SCRIPTS[1] if args.lora else SCRIPTS[0]
    if not (project.workdir / "fastvideo" / script).is_file():
        sys.exit(f"bench: no patched tree at {project.workdir}; run `dancegrpo-npu fetch && dancegrpo-npu apply`")
    build_fixtures(project.build_dir / "fixtures-flux")  # where the smoke builds them: cached from here on

    results = {n: run_smoke(project.root, n, args.lora, args.device) for n in (1, 2)}
    bare, imported = import_time(project.workdir, script)

    what = "LoRA" if args.lora else "full"
    print(f"dancegrpo-npu smoke ({what}, device {args.device}), {os.cpu_count()} CPU cores, cached fixtures")
    print(f"{'':42}{'1 process':>12}{'2 processes':>14}")
    walls = [results[n][0] for n in (1, 2)]
    print(f"{'wall time incl. start-up':42}{walls[0]:>10.1f} s{walls[1]:>12.1f} s")
    print(f"{'target':42}{'<= %.0f s' % TARGETS[1]:>12}{'<= %.0f s' % TARGETS[2]:>14}")
    print(f"{'within target':42}{str(walls[0] <= TARGETS[1]):>12}{str(walls[1] <= TARGETS[2]):>14}")
    for rank in (0, 1):
        cells = []
        for n in (1, 2):
            peak = results[n][1].get(rank)
            cells.append(f"{peak:.0f} MiB" if peak else "-")
        print(f"{'peak RSS, rank %d' % rank:42}{cells[0]:>12}{cells[1]:>14}")
    print(f"{'import ' + script + ' (top level)':42}{imported:>10.2f} s   (interpreter start-up {bare:.2f} s)")
    for n in (1, 2):
        print(f"  {n} process(es): {results[n][2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
