"""Strict mode in the real trainer: the smoke's run stops at a float64 op planted in the GRPO step.

``test_smoke.py`` shows that the patched trainers pass the smoke in strict mode; these
tests show that strict mode there would have seen a float64 op where the NPU would
fail on one - in ``flux_step``'s log-prob (plain math between modules) and in the loss's
backward (FSDP, activation checkpointing) - and names the line.  The op is planted in a
copy of the patched tree, run with the command the smoke's launch plans.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import pytest
from tiny_fixtures import built  # noqa: F401  (a fixture)

from dancegrpo_npu.run.launch import build_plan
from dancegrpo_npu.run.plan import LaunchSpec
from dancegrpo_npu.smoke import runner as smoke
from dancegrpo_npu.trainers.flux.smoke import trainer_args

pytest.importorskip("torch")
pytest.importorskip("diffusers")

TRAINER = "fastvideo/train_grpo_flux.py"
PLANTS = {
    # after the log-prob's mean in flux_step: runs while sampling and in every GRPO step
    "flux_step": ("        log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))\n",
                  "        log_prob = log_prob.double().float()\n",
                  "aten._to_copy.default made a torch.float64 tensor on cpu outside modules: {at} (flux_step);"),
    # a hook on the loss: runs inside loss.backward(), when the loss's grad_fn gets its gradient
    "loss-backward": ("            loss = torch.mean(torch.maximum(unclipped_loss, clipped_loss)) / "
                      "(args.gradient_accumulation_steps * train_timesteps)\n",
                      "            loss.register_hook(lambda grad: grad.double().float())\n",
                      "aten._to_copy.default made a torch.float64 tensor on cpu in backward of DivBackward0 "
                      "at {at} (<lambda>);"),
}


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("place", sorted(PLANTS))
def test_strict_mode_stops_the_smokes_trainer_at_a_planted_float64_op(patched_tree, built, tmp_path, place):  # noqa: F811
    after, planted, expected = PLANTS[place]
    tree = patched_tree.tree
    spec = LaunchSpec(script="flux", args=trainer_args(built, lora=False), device="cpu",
                      env=smoke.job_env("cpu", 1), upstream_defaults=False, strict=True)
    run_dir = tmp_path / "run"
    (run_dir / "images").mkdir(parents=True)
    plan = build_plan(patched_tree.project, spec, run_dir)  # checks the tree before the plant

    copy = tmp_path / "tree"
    shutil.copytree(tree, copy, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    source = (copy / TRAINER).read_text()
    assert source.count(after) == 1, f"upstream's {TRAINER} changed: the plant for {place} needs a new anchor"
    (copy / TRAINER).write_text(source.replace(after, after + planted))
    line = source[: source.index(after)].count("\n") + 2
    plan = replace(plan, command=tuple(a.replace(str(tree), str(copy)) for a in plan.command),
                   env={k: v.replace(str(tree), str(copy)) for k, v in plan.env.items()})
    assert plan.env["DANCEGRPO_NPU_STRICT"] == "1"

    proc = subprocess.run(plan.command, cwd=run_dir, env=plan.env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    message = expected.format(at=f"{copy / TRAINER}:{line}")
    assert "StrictModeError: strict mode: " + message in proc.stdout + proc.stderr
