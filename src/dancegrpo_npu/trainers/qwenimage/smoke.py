"""The Qwen-Image and Qwen-Image-Edit smokes' hooks (the rows' ``Smoke``): the tiny fixtures, the
trainers' arguments, the checkpoint check, and why a block's text-stream parts do not move.

``train_grpo_qwenimage.py`` (and ``_edit``) count their loop from 0, save ``checkpoint-<step>-0``
at the *start* of each step with ``(step - 1) % --checkpointing_steps == 0`` other than 1, as
the Wan2.1 trainer does (trainers/wan/smoke.py), but stop only past ``--max_train_steps + 1``.  The
smoke's ``--steps S`` passes ``--max_train_steps S-2`` and ``--checkpointing_steps 1``: S steps
train (the seam numbers them 1..S), and ``checkpoint-S-0``, saved as the loop reaches step S,
holds the weights after all S updates (S = 1: ``checkpoint-0-0``, the starting weights).  The
dataloader must have S + 1 batches on every rank.  The Edit trainer makes three such passes
(``for epoch in range(3)``, each of --max_train_steps + 2 steps, saving checkpoint-<step>-<pass>):
a smoke of S steps makes three of S / 3 and checks the last pass's checkpoint (the registry's
rows hold the passes, smoke.trained the checkpoint).

Qwen-Image runs with the diffusers-0.35 set; its checkpoint is loaded back with
``QwenImageTransformer2DModel.from_pretrained`` in a child of that set's interpreter
(smoke.trained).  The transformer is under FSDP in upstream's trainers already; the
equal-weights check holds the port to it.
"""

from __future__ import annotations

import re

from dancegrpo_npu.smoke.fixtures import WithReward
from dancegrpo_npu.smoke.recipe import shrunk_recipe

# The parts of a Qwen-Image block that only make its text stream's output: the model keeps the image
# stream alone after its last block, so in that block no loss depends on them.
_TEXT_STREAM_OUTPUT = re.compile(r"^transformer_blocks\.(\d+)\.(attn\.(add_q_proj|norm_added_q|to_add_out)|txt_mlp)\.")


def fixtures(project, options, spec) -> WithReward:
    """The tiny model and dataset of the row ``spec`` (built once, reused, by the row's set's
    interpreter): the Edit pipeline where the row's ``edit`` says so; and the reward fixtures."""
    from dancegrpo_npu.run.depsets import python_for
    from dancegrpo_npu.smoke.fixtures import build_reward_fixtures
    from dancegrpo_npu.trainers.qwenimage.fixtures import build_qwen_fixtures

    python = python_for(spec.depset, needed_by=spec.name)
    reward = build_reward_fixtures(project.build_dir / "fixtures-reward")
    return WithReward(build_qwen_fixtures(project.build_dir / f"fixtures-{spec.name}", reward.prompts, python,
                                          edit=spec.smoke.param("edit")), reward)


def arguments(project, built: WithReward, options, spec) -> tuple[str, ...]:
    """Upstream's recipe (finetune_qwenimage*_grpo.sh) shrunk: S steps a pass (``max_train_steps``
    S - 2: the trainer stops past max_train_steps + 1) at 64x64, 4 sampling steps, on the tiny
    Qwen-Image and the HPS fixture; the row's --selective_checkpointing (upstream's recipe's)."""
    from dancegrpo_npu.smoke.runner import max_train_steps

    qwen = built.models
    return (
        *shrunk_recipe(qwen.model_dir, qwen.data_json, built.reward, options.generations,
                       max_train_steps(spec, options.steps), 1),
        "--selective_checkpointing", spec.smoke.param("selective_checkpointing"),
        "--weights_digest",
    )  # fmt: skip


def checkpoint(run_dir, built: WithReward, options, spec, args):
    from dancegrpo_npu.smoke.trained import check_last_checkpoint

    return check_last_checkpoint(run_dir, built.models.model_dir, options, spec, args)


def unchanged_note(check) -> str | None:
    """Why the trainable tensors that did not move cannot: the last block's text-stream parts."""
    blocks = {m.group(1) for m in map(_TEXT_STREAM_OUTPUT.match, check.unchanged) if m}
    if len(blocks) == 1 and all(_TEXT_STREAM_OUTPUT.match(n) for n in check.unchanged):
        return (f"the other {len(check.unchanged)} are block {blocks.pop()}'s text-stream parts (add_q_proj, "
                "norm_added_q, to_add_out, txt_mlp): the model keeps only the image stream after its last block, "
                "so no output depends on them and no gradient reaches them")
    return None
