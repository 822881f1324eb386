"""bootstrap.sh with nothing to do (target <= 10 s), measured against its parts in one run.

    python bench/bootstrap.py [--repeat N]

Runs ./scripts/bootstrap.sh once to make sure everything is set up (that first run may
install, fetch, apply and smoke: it is not timed), then times N reruns, each of which must
find nothing to do, and beside them the CLI's start-up alone (`dancegrpo-npu --version`),
so the ratio says how much of a rerun is the tool's own checks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("DANCEGRPO_VENV", ROOT / ".venv"))
TARGET_S = 10.0


def timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    return elapsed, r.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    first, _ = timed(["./scripts/bootstrap.sh"])
    print(f"first run (set-up, not the figure): {first:.1f} s")
    reruns, outputs = [], []
    for _ in range(args.repeat):
        t, out = timed(["./scripts/bootstrap.sh"])
        reruns.append(t)
        outputs.append(out)
    if not all("nothing to do" in out and "already passed" in out for out in outputs):
        sys.exit("bench: a rerun did work (fetch, apply or smoke); it should have found nothing to do")
    cli = statistics.median(timed([str(VENV / "bin" / "dancegrpo-npu"), "--version"])[0] for _ in range(args.repeat))
    rerun = statistics.median(reruns)
    print(f"bootstrap.sh rerun, nothing to do: {rerun:.2f} s (median of {args.repeat}; target <= {TARGET_S:.0f} s)")
    print(f"dancegrpo-npu start-up alone:      {cli:.2f} s; a rerun is {rerun / cli:.1f}x the start-up")
    return 0 if rerun <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
