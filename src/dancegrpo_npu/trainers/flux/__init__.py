"""FLUX.1-dev: the full and the LoRA GRPO trainer, and their preprocessing."""

from __future__ import annotations

# where the family's rows come in the registry (and every list made from it)
ORDER = 10
# the family's smoke hooks ("module:function", so that a copy of the folder names its own)
HOOKS = f"{__name__}.smoke"

from pathlib import Path

from . import architecture
from dancegrpo_npu.trainers.common import (
    HPS_DEFAULTS,
    HPS_INPUTS,
    PREPROCESS_PATH_FLAGS,
    PROMPTS_INPUT,
    TINY_SAMPLER,
    TRAIN_PATH_FLAGS,
    TWO_ENCODER_PIPELINE,
    dataset_input,
    pipeline_input,
    preprocess_defaults,
    short_run_bench,
    vae_input,
    weights_input,
)
from dancegrpo_npu.registry.spec import Bench, BenchPreset, ImageSizes, Input, Smoke, TrainerSpec

RECIPE_GLOB = "scripts/finetune/finetune_flux_grpo*.sh"
HERE = Path(__file__).parent  # the family's folder: its model configs
# Where upstream's README puts the FLUX.1-dev weights, and its recipes point.
WEIGHTS_DIR = "data/flux"

# FLUX.1-dev's VAE downsamples 8x and the pipeline packs 2x2 latents into a token.
SIZES = ImageSizes(vae_scale=8, patch=2, why="FLUX.1-dev's VAE downsamples 8x and its transformer takes 2x2 latent "
                   "patches")

INPUTS = (
    weights_input("FLUX.1-dev weights"),
    vae_input("FLUX.1-dev VAE weights"),
    Input(flag="--dit_model_name_or_path", kind="model", what="transformer weights"),
    dataset_input("preprocess"),
    *HPS_INPUTS,
)


def prompt_batch(transformer_cfg, sizes, device, dtype, caption: str) -> tuple:
    """One prompt as the trainer's loader yields it: T5 embeddings (1, text_tokens, D), the
    pooled CLIP embedding (1, P), text ids (1, 3: FluxPipeline's zeros), the caption."""
    import torch

    embed = torch.randn(1, sizes.text_tokens, transformer_cfg["joint_attention_dim"], device=device, dtype=dtype)
    pooled = torch.randn(1, transformer_cfg["pooled_projection_dim"], device=device, dtype=dtype)
    return embed, pooled, torch.zeros(1, 3, device=device, dtype=dtype), [caption]


def train_one_step(train, args, device, models, optimizer, lr_scheduler, prompt, max_grad_norm):
    """The trainer's train_one_step as its main calls it: the loader yields the one prompt."""
    m = models
    return train(args, device, m.transformer, m.vae, m.hps, m.hps_tokenizer, optimizer, lr_scheduler,
                 iter(lambda: prompt, None), None, max_grad_norm, m.hps_preprocess, None)


BENCH = Bench(
    classes=("FluxTransformer2DModel", "AutoencoderKL"),
    recipe="2nodes",  # scripts/finetune/finetune_flux_grpo.sh
    text_tokens=512,  # FluxPipeline's T5 tokens
    presets=(
        BenchPreset(size="full", transformer=HERE / "flux1-dev-transformer.json", vae=HERE / "flux1-dev-vae.json",
                    summary="FLUX.1-dev at full size (19 + 38 blocks), its VAE, a ViT-H-14 HPS; upstream's recipe"),
        # Full width, few blocks: what one block of FLUX.1-dev costs, on a machine without
        # 100 GB.  Sized for a 2-core, 24 GiB CPU: a full-width block is ~1 GFLOP per token
        # per forward (fp32 there: ~20 GFLOPS), so the token count decides the time: 128x128
        # images (64 image tokens) and 64 text tokens; one timed step after the warm-up.
        BenchPreset(size="cpu", transformer=HERE / "flux1-dev-transformer.json", vae=HERE / "flux1-dev-vae.json",
                    summary="FLUX.1-dev width with 1 double + 1 single block, the full VAE, ViT-H-14 width with "
                            "1 + 1 layers",
                    transformer_overrides={"num_layers": 1, "num_single_layers": 1},
                    hps_overrides={"vision_layers": 1, "text_layers": 1},
                    sizes=dict(height=128, width=128, sampling_steps=4, generations=4, text_tokens=64, steps=1)),
        # The smoke's tiny models (trainers/flux/tiny_models.py) and sizes: seconds, for tests.
        BenchPreset(size="tiny", tiny=f"{__name__}.tiny_models",
                    summary="the smoke's tiny models (2 heads x 16, 1 + 1 blocks; tiny VAE and HPS) at 64x64",
                    sizes=dict(height=64, width=64, sampling_steps=4, generations=4, gradient_accumulation_steps=2,
                               **TINY_SAMPLER)),
    ),
    prompt=prompt_batch,
    train=train_one_step,
    trainer_prepare="install_float32_rope",
)


def _smoke(*, title: str, run_name: str, lora: bool) -> Smoke:
    return Smoke(title=title, run_name=run_name, label="FLUX", fixtures=f"{HOOKS}:fixtures",
                 arguments=f"{HOOKS}:arguments", checkpoint=f"{HOOKS}:checkpoint",
                 equal_weights=False, model_class="FluxTransformer2DModel",
                 loader="FluxPipeline's LoRA loader" if lora else "", params=(("lora", lora),))


def _trainer(*, name: str, relpath: str, help: str, smoke: Smoke, **more) -> TrainerSpec:
    return TrainerSpec(
        name=name, relpath=relpath, help=help, title="FLUX.1-dev", defaults=HPS_DEFAULTS,
        path_flags=TRAIN_PATH_FLAGS, required_inputs=INPUTS, output_in_run_dir=True, recipe_glob=RECIPE_GLOB,
        image_sizes=SIZES, dataset="flux", preprocess="preprocess", aligns=True, smoke=smoke,
        numerics_block=f"{__name__}.numerics:double_block",  # its own folder's, in a copy too
        **more,
    )


ROWS = (
    _trainer(
        name="flux", relpath="fastvideo/train_grpo_flux.py", help="GRPO of FLUX.1-dev (full fine-tuning)",
        smoke=_smoke(title="full FLUX GRPO", run_name="smoke", lora=False), default=True, bench=BENCH,
        plan=architecture.plan("flux"), offload_flag="--use_cpu_offload", lora="flux-lora",
        lora_args="--lora_rank {rank} --lora_alpha {alpha}",
    ),
    _trainer(
        name="flux-lora", relpath="fastvideo/train_grpo_flux_lora.py", help="GRPO of FLUX.1-dev with LoRA",
        smoke=_smoke(title="LoRA FLUX GRPO", run_name="smoke-lora", lora=True),
        bench=short_run_bench("bench builds no LoRA adapters in process; `bench --trainer flux` times the base model's "
                              "steps"),
    ),
    # upstream scripts/preprocess/preprocess_flux_rl_embeddings.sh (commit 15cc71d5)
    TrainerSpec(
        name="preprocess", relpath="fastvideo/data_preprocess/preprocess_flux_embedding.py",
        help="FLUX.1-dev's RL-embeddings dataset from a prompt file", title="FLUX.1-dev",
        defaults=preprocess_defaults(WEIGHTS_DIR), path_flags=PREPROCESS_PATH_FLAGS,
        required_inputs=(pipeline_input("--model_path", "FLUX.1-dev weights", **TWO_ENCODER_PIPELINE), PROMPTS_INPUT),
        output_in_run_dir=False, dataset="flux",
    ),
)
