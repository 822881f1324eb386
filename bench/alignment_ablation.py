"""What the float32-RoPE patch (float32-rope.patch) does to the numbers: the smoke's run on the full series vs
the same run on the series without that patch, both with ``--rng cpu --record``, then ``compare``.

    PYTHONPATH=src python bench/alignment_ablation.py [-C PROJECT] [--steps 10] [--nproc 1] [--size 64]

Needs the patched tree with the alignment patches (``dancegrpo-npu fetch && dancegrpo-npu apply``).
The tree without the patch: a copy of the patched tree at build/ablation-norope/DanceGRPO whose
trainer does not call ``install_float32_rope`` (the only effect of float32-rope.patch on the run: the
transformer keeps diffusers' float64 RoPE, upstream's numerics).  Until ``apply --without`` exists
that copy is not a tree the engine can verify, so this script alone tells launch to trust it.
Both runs have strict mode off (the float64 RoPE would stop a strict run) and the smoke's other
settings (4 sampling steps, 2 generations, HPSv2 reward on the tiny fixtures), for --steps, at
--size x --size pixels (the smoke's 64 by default; 720 is upstream's resolution, where the RoPE
ids span a 45x45 grid instead of 4x4).

Prints, per step: the reward relative error (max over samples, %), the min image PSNR (dB), the
max sampling log-prob difference, the max recomputed log-prob difference, the loss error, and
compare's exit status and first divergence at default tolerances.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

CALL = "    install_float32_rope(transformer)\n"


def tree_without_float32_rope(tree: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tree, dest, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    for name in ("train_grpo_flux.py", "train_grpo_flux_lora.py"):
        path = dest / "fastvideo" / name
        text = path.read_text()
        if text.count(CALL) != 1:
            sys.exit(f"{path}: the install_float32_rope call is not there once; is float32-rope.patch in the series?")
        path.write_text(text.replace(CALL, "    pass  # ablation: diffusers' float64 RoPE (no float32-rope.patch)\n"))
    return dest


def run(project, fixtures, steps: int, nproc: int, size: int, name: str):
    from dancegrpo_npu.run.align_flags import AlignOptions
    from dancegrpo_npu.run.launch import LaunchSpec, launch
    from dancegrpo_npu.smoke import runner as smoke
    from dancegrpo_npu.trainers.flux.smoke import trainer_args

    args = list(trainer_args(fixtures, lora=False))
    args[args.index("--max_train_steps") + 1] = str(steps)
    args[args.index("--checkpointing_steps") + 1] = "100000"  # no checkpoint: not what is measured
    args[args.index("--h") + 1] = args[args.index("--w") + 1] = str(size)
    spec = LaunchSpec(script="flux", args=tuple(args), nproc_per_node=nproc, device="cpu", name=name,
                      env=smoke.job_env("cpu", nproc), upstream_defaults=False, strict=False,
                      align=AlignOptions(rng="cpu", record=True))  # fmt: skip
    record = launch(project, spec)
    if record.returncode != 0:
        sys.exit(f"{name}: the run failed (exit {record.returncode}); see {record.run_dir / 'logs'}")
    return record.run_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-C", dest="project_dir", default=".")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--size", type=int, default=64, help="image height and width (a multiple of 16)")
    args = parser.parse_args()

    from dancegrpo_npu.align.compare import compare
    from dancegrpo_npu.engine import treecheck
    from dancegrpo_npu.project import find_project
    from dancegrpo_npu.trainers.flux.fixtures import build_fixtures

    full = find_project(args.project_dir)
    fixtures = build_fixtures(full.build_dir / "fixtures", tree=full.workdir)
    norope = find_project(full.root, workdir=tree_without_float32_rope(
        full.workdir, full.build_dir / "ablation-norope" / "DanceGRPO"))  # fmt: skip
    a = run(full, fixtures, args.steps, args.nproc, args.size, "ablation-full")
    verdict = treecheck.tree_state
    treecheck.tree_state = lambda project, script=None: (  # the copy only; see the module doc
        {"state": "verified", "detail": "ablation copy"} if project.workdir == norope.workdir else verdict(project, script))
    b = run(norope, fixtures, args.steps, args.nproc, args.size, "ablation-norope")
    rc = compare(full, str(a), str(b), None, None)
    report = json.loads((b / "compare.json").read_text())
    rows = report["rows"]

    def value(stage, step):
        return next((r["value"] for r in rows if r["stage"] == stage and r["step"] == step), None)

    print(f"\nfull series: {a}\nwithout float32-rope: {b}\ncompare exit {rc}: "
          f"{report['first_divergence']['text'] if report['first_divergence'] else 'first divergence: none'}\n")
    print("| step | reward rel. error (%) | min PSNR (dB) | log-prob max diff | recomputed log-prob max diff |"
          " loss error (of max) | grad norm rel. error |")
    print("|---|---|---|---|---|---|---|")
    for step in report["steps"]:
        cells = [value(s, step) for s in ("rewards", "images", "log_probs", "train.log_prob", "train.loss", "grad_norm")]
        print(f"| {step} | " + " | ".join(c if isinstance(c, str) else f"{c:.3g}" for c in cells) + " |")
    return rc


if __name__ == "__main__":
    sys.exit(main())
