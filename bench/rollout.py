"""Rollout throughput with batched sampling: ``dancegrpo-npu bench`` at N = 1 and N = G, side by side.

    PYTHONPATH=src python bench/rollout.py [-C PROJECT] [--threads K] [--skip-cpu-preset]

Needs the patched tree (``dancegrpo-npu fetch && dancegrpo-npu apply``).  On the CPU:

1. the default trainer at size tiny, G = 4 and G = 8: rollout samples/s (sampling + decode + reward) at
   N = G against N = 1, each pair measured in one bench process.  Goal: >= 2x,
   never below 1.5x; the script exits 1 if a ratio falls below 1.5x;
2. the default trainer at size cpu (FLUX.1-dev width, 1 double + 1 single block) at N = 1 and N = 4: the
   bench's table with seconds and peak memory (peak RSS) per phase.

``--threads K`` sets OMP_NUM_THREADS for the bench processes (default: inherited).  On a
shared machine use 1: two OpenMP threads spinning against other processes slowed the tiny
model's small ops about tenfold here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL, FLOOR = 2.0, 1.5


def run_bench(project: Path, env: dict, *args: str) -> tuple[dict, str, float]:
    """(the --json document, the printed table, wall seconds) of one bench process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        command = [sys.executable, "-m", "dancegrpo_npu", "-C", str(project), "bench", "--runs-dir", str(Path(tmp) / "runs"),
                   "--device", "cpu", *args, "--json", str(out)]  # fmt: skip
        start = time.monotonic()
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            sys.exit(f"bench failed (exit {proc.returncode}): {' '.join(command)}\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text()), proc.stdout, wall


def machine() -> str:
    cores = os.cpu_count()
    try:
        mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
        ram = f"{mem / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        ram = "RAM unknown"
    load = ", load average %.1f" % os.getloadavg()[0] if hasattr(os, "getloadavg") else ""
    return f"{cores} cores, {ram}{load}"


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark script takes: the project, and the CPU threads it sets."""
    parser.add_argument("-C", dest="project", default=".", help="the project directory (default .)")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for the bench (default: inherited)")


def bench_env(threads: int | None) -> dict:
    """The bench processes' environment: this one, with OMP_NUM_THREADS set where --threads says."""
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser)
    parser.add_argument("--skip-cpu-preset", action="store_true", help="only the tiny ratios (size cpu takes ~15 min on 2 cores)")
    args = parser.parse_args()
    project = Path(args.project).resolve()
    env = bench_env(args.threads)
    print(f"machine: {machine()}; OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}")

    worst = None
    print("\n1. size tiny on the CPU: rollout samples/s (sampling + decode + reward), N = G against N = 1")
    print(f"{'G':>3}  {'N=1 /s':>8}  {'N=G /s':>8}  {'ratio':>6}  {'step N=1 /s':>11}  {'step N=G /s':>11}  verdict")
    for g in (4, 8):
        doc, _table, _wall = run_bench(project, env, "--size", "tiny", "--generations", str(g), "--sample-batch-sizes", f"1,{g}")
        one, batched = doc["results"]
        ratio = batched["rollout_samples_per_s"] / one["rollout_samples_per_s"]
        worst = ratio if worst is None else min(worst, ratio)
        verdict = "goal met" if ratio >= GOAL else ("above the floor" if ratio >= FLOOR else "BELOW THE 1.5x FLOOR")
        print(f"{g:>3}  {one['rollout_samples_per_s']:>8.3f}  {batched['rollout_samples_per_s']:>8.3f}  {ratio:>5.2f}x  "
              f"{one['step_samples_per_s']:>11.3f}  {batched['step_samples_per_s']:>11.3f}  {verdict}")
        for r in (one, batched):
            phases = ", ".join(f"{p} {s:.3f} s" for p, s in r["phases_s"].items())
            print(f"     N={r['sample_batch_size']}: {phases}")

    if not args.skip_cpu_preset:
        print("\n2. size cpu on the CPU (FLUX.1-dev width, 1 + 1 blocks), N = 1 and 4")
        _doc, table, wall = run_bench(project, env, "--size", "cpu", "--sample-batch-sizes", "1,4")
        print(table)
        print(f"(the bench process took {wall / 60:.1f} min)")
    return 0 if worst is not None and worst >= FLOOR else 1


if __name__ == "__main__":
    sys.exit(main())
