"""The Qwen-Image and Qwen-Image-Edit smokes: the trainers' arguments and their checks.

``train_grpo_qwenimage.py`` (and ``_edit``) count their loop from 0, save ``checkpoint-<step>-0``
at the *start* of each step with ``(step - 1) % --checkpointing_steps == 0`` other than 1, as
the Wan2.1 trainer does (smoke.wan_smoke), but stop only past ``--max_train_steps + 1``.  The
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

from dancegrpo_npu.smoke.recipe import shrunk_recipe


def trainer_args(qwen, hps, max_train_steps: int, generations: int, spec) -> tuple[str, ...]:
    """Upstream's recipe (finetune_qwenimage*_grpo.sh) shrunk: S steps a pass (``max_train_steps``
    S - 2: the trainer stops past max_train_steps + 1) at 64x64, 4 sampling steps, on the tiny
    Qwen-Image and the HPS fixture; the row's --selective_checkpointing (upstream's recipe's)."""
    return (
        *shrunk_recipe(qwen.model_dir, qwen.data_json, hps, generations, max_train_steps, 1),
        "--selective_checkpointing", spec.smoke.param("selective_checkpointing"),
        "--weights_digest",
    )  # fmt: skip


def fixtures(project, hps_prompts, spec, python: str):
    """The tiny model and dataset of the row ``spec`` (built once, reused): the Edit pipeline
    where the row's ``edit`` says so."""
    from dancegrpo_npu.smoke.qwen_fixtures import build_qwen_fixtures

    return build_qwen_fixtures(project.build_dir / f"fixtures-{spec.name}", hps_prompts, python,
                               edit=spec.smoke.param("edit"))
