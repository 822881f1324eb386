"""The FLUX smokes' hooks (the rows' ``Smoke``): the tiny FLUX.1-dev fixtures, upstream's recipe
shrunk, and the checkpoint loaded back the way upstream and diffusers intend.

``train_grpo_flux.py`` (and ``_lora``) run steps 1..--max_train_steps and save
``checkpoint-<step>-0`` (``lora-checkpoint-<step>-0``) at the *start* of a step whose number is a
multiple of --checkpointing_steps: the smoke passes --steps as both, so checkpoint N holds the
weights after step N-1's update.  The full checkpoint must load with
``FluxTransformer2DModel.from_pretrained``; the LoRA one with ``FluxPipeline.lora_state_dict`` +
``load_lora_into_transformer`` (what ``FluxPipeline.load_lora_weights`` does), its ``lora_B`` moved
from peft's zeros.
"""

from __future__ import annotations

from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.smoke.checks import CheckpointCheck, DecayBudget, check_full_checkpoint, compare_weights, \
    decay_budget, unmoved
from dancegrpo_npu.smoke.recipe import shrunk_recipe
from dancegrpo_npu.smoke.runner import GENERATIONS, STEPS

LORA_ARGS = ("--lora_rank", "4", "--lora_alpha", "8")
LORA_WEIGHTS_FILE = "pytorch_lora_weights.safetensors"  # diffusers' save_lora_weights default


def fixtures(project, options, spec):
    """The tiny FLUX.1-dev pipeline, the reward and the dataset (built once, reused); the dataset is
    also read back through the patched tree's LatentDataset."""
    from dancegrpo_npu.trainers.flux.fixtures import build_fixtures

    return build_fixtures(project.build_dir / "fixtures-flux", tree=project.workdir)


def trainer_args(fixtures, lora: bool, steps: int = STEPS, generations: int = GENERATIONS,
                 checkpointing_steps: int | None = None) -> tuple[str, ...]:
    """Exactly the arguments the smoke passes (no upstream defaults): upstream's recipe
    (finetune_flux_grpo*.sh), shrunk to ``steps`` steps at 64x64 on the fixtures."""
    args = shrunk_recipe(fixtures.model_dir, fixtures.data_json, fixtures, generations, steps,
                         checkpointing_steps or steps)
    return tuple(args) + (LORA_ARGS if lora else ())


def arguments(project, built, options, spec) -> tuple[str, ...]:
    return trainer_args(built, spec.smoke.param("lora"), options.steps, options.generations,
                        options.checkpointing_steps)


def checkpoint(run_dir: Path, built, options, spec, args) -> CheckpointCheck:
    budget = decay_budget(args, options.steps)
    if spec.smoke.param("lora"):
        return check_lora_checkpoint(run_dir / "outputs", built.model_dir, options.steps, budget)
    return check_full_checkpoint(run_dir / "outputs", built.model_dir, options.steps, budget, spec.smoke.model_class)


def check_lora_checkpoint(outputs: Path, model_dir: Path, step: int, budget: DecayBudget) -> CheckpointCheck:
    import torch
    from diffusers import FluxPipeline, FluxTransformer2DModel

    path = outputs / f"lora-checkpoint-{step}-0"
    if not path.is_dir():
        raise DancegrpoError(f"smoke: the trainer wrote no LoRA checkpoint {path}")
    # The file upstream's save_lora_weights writes, named: without a name diffusers guesses it,
    # and refuses to guess under HF_HUB_OFFLINE=1 (an air-gapped host's setting).
    state_dict, alphas = FluxPipeline.lora_state_dict(str(path), return_alphas=True, weight_name=LORA_WEIGHTS_FILE)
    transformer = FluxTransformer2DModel.from_pretrained(str(model_dir), subfolder="transformer")
    FluxPipeline.load_lora_into_transformer(state_dict, network_alphas=alphas, transformer=transformer)
    loaded = {k: v for k, v in transformer.state_dict().items() if ".lora_B." in k}
    if not loaded:
        raise DancegrpoError(f"smoke: {path} loaded, but the transformer has no LoRA layers afterwards")
    # peft initialises lora_B to zeros, which weight decay leaves at zero: only a gradient moves it.
    start = {k: torch.zeros_like(v) for k, v in loaded.items()}
    changed, total, biggest, decay = compare_weights(start, loaded, "lora_B", budget)
    return CheckpointCheck(path, "FluxPipeline.lora_state_dict + load_lora_into_transformer",
                           changed, total, biggest, decay, budget.updates, unmoved(start, loaded, budget))
