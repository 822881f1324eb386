"""The SDE window's cost: ``dancegrpo-npu bench --sde-window-size 4`` against upstream's step, side by side.

    PYTHONPATH=src python bench/sde_window.py [-C PROJECT] [--threads K] [--window W] [--steps N]
                                              [--cpu-generations G] [--skip-cpu-sizes]

Needs the patched tree (``dancegrpo-npu fetch && dancegrpo-npu apply``).  Every bench runs at
upstream's FLUX recipe shapes for the step count, 16 sampling steps and timestep fraction 0.6, so
upstream trains int(15 x 0.6) = 9 timesteps a sample and the window W (default 4) of them: the
train phase should be about 9 / W times faster (2.25x at W = 4), the rollout (every step is a
transformer call, ODE or SDE) about the same.  In each bench process the two steps alternate,
upstream's then the window's, after a warm-up of each, so that a change in the machine's load
reaches both alike.  On the CPU:

1. ``--trainer flux --size tiny`` (the smoke's models, 64x64, G = 4);
2. ``--trainer flux --size cpu`` (FLUX.1-dev width, 1 double + 1 single block, 128x128), G =
   --cpu-generations (default 2: an upstream step takes about 20 minutes on 2 cores at G = 4);
3. ``--trainer wan --size cpu`` (Wan2.1-1.3B width, 1 block, 128x128, one frame, CFG 5.0), G = 4,
   in the diffusers-0.35 set's interpreter (bench starts it).

Prints each bench's table, and the train phase's and the whole step's ratio (upstream's seconds
over the window's).  Goal: the train phase at least 1.9x faster on FLUX's tiny and cpu sizes; the
script exits 1 if either is below.  ``--threads K`` sets OMP_NUM_THREADS for the bench processes
(default: inherited; the table says what bench ran with).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# one bench process as the rollout benchmark runs it, its options and machine line (bench/ is on sys.path)
from rollout import add_common_options, bench_env, machine, run_bench

from dancegrpo_npu.throughput.bench import window_ratios

GOAL = 1.9
SHAPES = ("--sampling-steps", "16", "--timestep-fraction", "0.6")


def ratios(doc: dict) -> tuple[float, float, float]:
    """(train, whole step, rollout) seconds of upstream's step over the window's (the bench's own
    ratios, throughput.bench.window_ratios)."""
    upstream, window = doc["results"]
    assert not upstream["sde_window_size"] and window["sde_window_size"]
    ratio = window_ratios(upstream["phases_s"], window["phases_s"])
    return ratio["train"], ratio["whole step"], ratio["rollout"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser)
    parser.add_argument("--window", type=int, default=4, help="the SDE window's size (default 4)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps of each kind at the tiny size (default 3; "
                        "the cpu sizes time 1 after 1 warm-up)")
    parser.add_argument("--cpu-generations", type=int, default=2, help="G of FLUX's cpu size (default 2)")
    parser.add_argument("--skip-cpu-sizes", action="store_true", help="FLUX's tiny size only (seconds, not half an hour)")
    args = parser.parse_args()
    project = Path(args.project).resolve()
    env = bench_env(args.threads)
    print(f"machine: {machine()}; OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}; "
          f"16 sampling steps, timestep fraction 0.6 (9 trained timesteps) against an SDE window of {args.window}")
    common = (*SHAPES, "--sde-window-size", str(args.window))
    runs = [("flux tiny", ("--trainer", "flux", "--size", "tiny", "--steps", str(args.steps)), True)]
    if not args.skip_cpu_sizes:  # the cpu sizes time 1 step after 1 warm-up
        runs += [("flux cpu", ("--trainer", "flux", "--size", "cpu", "--generations", str(args.cpu_generations),
                               "--gradient-accumulation-steps", str(args.cpu_generations)), True),
                 ("wan cpu", ("--trainer", "wan", "--size", "cpu"), False)]
    measured = []
    for name, words, held in runs:
        doc, table, wall = run_bench(project, env, *words, *common)
        train, whole, rollout = ratios(doc)
        measured.append((name, train, whole, rollout, held))
        print(f"\n{name} ({wall / 60:.1f} min):\n{table}")
    print(f"\n{'bench':<10}  {'train':>6}  {'step':>6}  {'rollout':>7}  verdict")
    for name, train, whole, rollout, held in measured:
        verdict = ("goal met" if train >= GOAL else f"BELOW THE {GOAL}x GOAL") if held else "(not held to the goal)"
        print(f"{name:<10}  {train:>5.2f}x  {whole:>5.2f}x  {rollout:>6.2f}x  {verdict}")
    return 0 if all(train >= GOAL for _, train, _, _, held in measured if held) else 1


if __name__ == "__main__":
    sys.exit(main())
