"""The Wan2.1 smoke's hooks (the row's ``Smoke``): the tiny fixtures, the trainer's arguments, the
checkpoint check.

``train_grpo_wan_2_1.py`` counts its loop from 0 and runs steps 0..--max_train_steps; it saves
``checkpoint-<step>-0`` at the *start* of each step with ``(step - 1) % --checkpointing_steps ==
0`` other than 1 (so at step 0, before any update, too), and only then stops past
--max_train_steps.  The smoke's ``--steps S`` passes ``--max_train_steps S-1`` and
``--checkpointing_steps 1``: S steps train (the seam numbers them 1..S in metrics.jsonl), and
``checkpoint-S-0``, saved when the loop reaches step S, holds the weights after all S updates
(``checkpoint-0-0`` with S = 1: the starting weights).  The dataloader must have S + 1 batches
on every rank.

Wan runs with the diffusers-0.35 set (run.depsets), so the checkpoint is loaded back
(``WanTransformer3DModel.from_pretrained``) in a child process of that set's interpreter
(smoke.trained).
"""

from __future__ import annotations

from dancegrpo_npu.smoke.fixtures import WithReward
from dancegrpo_npu.smoke.recipe import shrunk_recipe


def fixtures(project, options, spec) -> WithReward:
    """The tiny Wan2.1 pipeline and dataset (built once, reused) by the row's set's interpreter, and
    the reward fixtures."""
    from dancegrpo_npu.run.depsets import python_for
    from dancegrpo_npu.smoke.fixtures import build_reward_fixtures
    from dancegrpo_npu.trainers.wan.fixtures import build_wan_fixtures

    python = python_for(spec.depset, needed_by=spec.name)
    reward = build_reward_fixtures(project.build_dir / "fixtures-reward")
    return WithReward(build_wan_fixtures(project.build_dir / f"fixtures-{spec.name}", reward.prompts, python), reward)


def arguments(project, built: WithReward, options, spec) -> tuple[str, ...]:
    """Upstream's recipe (finetune_wan_2_1_grpo.sh) shrunk: S steps (``max_train_steps`` S - 1: the
    Wan trainer counts its steps from 0 and stops past S - 1) at 64x64, one frame, 4 sampling steps,
    CFG 5.0 in the rollout as upstream, on the tiny Wan and the HPS fixture; a checkpoint every step
    (the smoke checks the last one)."""
    from dancegrpo_npu.smoke.runner import max_train_steps

    wan = built.models
    return (
        *shrunk_recipe(wan.model_dir, wan.data_json, built.reward, options.generations,
                       max_train_steps(spec, options.steps), 1),
        "--cfg_infer", "5.0",
        "--weights_digest",
    )  # fmt: skip


def checkpoint(run_dir, built: WithReward, options, spec, args):
    from dancegrpo_npu.smoke.trained import check_last_checkpoint

    return check_last_checkpoint(run_dir, built.models.model_dir, options, spec, args)
