"""Wan2.1-T2V-1.3B: the GRPO trainer and its preprocessing (the diffusers-0.35 dependency set)."""

from __future__ import annotations

# where the family's rows come in the registry (and every list made from it)
ORDER = 20
# the family's smoke hooks ("module:function", so that a copy of the folder names its own)
HOOKS = f"{__name__}.smoke"

from pathlib import Path

from . import architecture
from dancegrpo_npu.trainers.common import (
    HPS_DEFAULTS,
    HPS_INPUTS,
    ONE_ENCODER_PIPELINE,
    PREPROCESS_PATH_FLAGS,
    PROMPTS_INPUT,
    TINY_SAMPLER,
    TRAIN_PATH_FLAGS,
    dataset_input,
    pipeline_input,
    preprocess_defaults,
    vae_input,
    weights_input,
)
from dancegrpo_npu.registry.spec import Bench, BenchPreset, ImageSizes, Smoke, TrainerSpec

DEPSET = "diffusers-0.35"  # Wan2.1 needs diffusers >= 0.33 (run.depsets, docs/dependencies.md)
HERE = Path(__file__).parent  # the family's folder: its model configs


def prompt_batch(transformer_cfg, sizes, device, dtype, caption: str) -> tuple:
    """The UMT5 embeddings (1, text_tokens, text_dim), the negative prompt's (zeros: the recipe's
    CFG needs a second batch), the caption."""
    import torch

    shape = (1, sizes.text_tokens, transformer_cfg["text_dim"])
    embed = torch.randn(shape, device=device, dtype=dtype)
    return embed, torch.zeros(shape, device=device, dtype=dtype), [caption]


def train_one_step(train, args, device, models, optimizer, lr_scheduler, prompt, max_grad_norm):
    """train_one_step takes the prompt's embeddings and the negative ones directly."""
    m = models
    embeds, negative, caption = prompt
    return train(args, device, m.transformer, m.vae, m.hps, m.hps_tokenizer, optimizer, lr_scheduler,
                 embeds, negative, caption, None, max_grad_norm, m.hps_preprocess)


BENCH = Bench(
    classes=("WanTransformer3DModel", "AutoencoderKLWan"),
    # scripts/finetune/finetune_wan_2_1_grpo.sh; it accumulates its 2 prompts x 12 generations a
    # rank, one optimizer step per GRPO step, and a bench step is one prompt: the accumulation
    # is capped at the generations (throughput.presets), one optimizer step per step.
    recipe="8gpus",
    text_tokens=226,  # WanPipeline.encode_prompt's UMT5 tokens (what preprocessing saves)
    presets=(
        BenchPreset(size="full", transformer=HERE / "wan2.1-t2v-1.3b-transformer.json",
                    vae=HERE / "wan2.1-t2v-1.3b-vae.json",
                    summary="Wan2.1-T2V-1.3B at full size (30 blocks), its VAE, a ViT-H-14 HPS; upstream's Wan "
                            "recipe"),
        # Full width, one block, as the FLUX cpu preset: 128x128 (64 image tokens), 4 steps, G = 4.
        BenchPreset(size="cpu", transformer=HERE / "wan2.1-t2v-1.3b-transformer.json",
                    vae=HERE / "wan2.1-t2v-1.3b-vae.json",
                    summary="Wan2.1-T2V-1.3B width with 1 block, the full Wan VAE, ViT-H-14 width with 1 + 1 layers",
                    transformer_overrides={"num_layers": 1}, hps_overrides={"vision_layers": 1, "text_layers": 1},
                    sizes=dict(height=128, width=128, sampling_steps=4, generations=4, gradient_accumulation_steps=4,
                               steps=1)),
        # The Wan smoke's tiny models (trainers/wan/fixtures.py): seconds, for tests.
        BenchPreset(size="tiny", tiny=f"{__name__}.fixtures",
                    summary="the Wan smoke's tiny models (2 heads x 12, 1 block; tiny Wan VAE and HPS) at 64x64",
                    sizes=dict(height=64, width=64, sampling_steps=4, generations=4, gradient_accumulation_steps=2,
                               **TINY_SAMPLER)),
    ),
    # CFG 5.0 as upstream's recipe; the reward from the decoded frame (the port's default)
    extra_args=(("cfg_infer", 5.0), ("reward_from_mp4", False)),
    prompt=prompt_batch,
    train=train_one_step,
    run_dirs=("videos",),  # the trainer's main makes ./videos for each sample's mp4
)

ROWS = (
    TrainerSpec(
        name="wan", relpath="fastvideo/train_grpo_wan_2_1.py", help="GRPO of Wan2.1-T2V-1.3B",
        title="Wan2.1-T2V-1.3B", defaults=HPS_DEFAULTS, path_flags=TRAIN_PATH_FLAGS,
        required_inputs=(
            weights_input("Wan2.1-T2V-1.3B weights"),
            vae_input("Wan2.1-T2V-1.3B VAE weights"),
            dataset_input("preprocess-wan"),
            *HPS_INPUTS,
        ),
        output_in_run_dir=True, recipe_glob="scripts/finetune/finetune_wan_2_1_grpo*.sh", depset=DEPSET,
        image_sizes=ImageSizes(vae_scale=8, patch=2, why="Wan2.1's VAE downsamples 8x and its transformer takes "
                               "1x2x2 latent patches"),
        dataset="wan", preprocess="preprocess-wan", aligns=True,
        smoke=Smoke(title="Wan2.1 GRPO (one frame)", label="Wan", loop_below=1,
                    fixtures=f"{HOOKS}:fixtures", arguments=f"{HOOKS}:arguments",
                    checkpoint=f"{HOOKS}:checkpoint", model_class="WanTransformer3DModel"),
        bench=BENCH, plan=architecture.plan("wan"),
        offload_flag="--use_cpu_offload",  # the port's FSDP of the trainer takes it
        no_lora="upstream's Wan trainer has no LoRA option",
    ),
    # upstream scripts/preprocess/preprocess_wan_2_1_rl_embeddings.sh (commit 15cc71d5)
    TrainerSpec(
        name="preprocess-wan", relpath="fastvideo/data_preprocess/preprocess_wan_2_1_embeddings.py",
        help="Wan2.1-T2V-1.3B's RL-embeddings dataset from a prompt file", title="Wan2.1-T2V-1.3B",
        defaults=preprocess_defaults("data/Wan2.1-T2V-1.3B"), path_flags=PREPROCESS_PATH_FLAGS,
        required_inputs=(pipeline_input("--model_path", "Wan2.1-T2V-1.3B weights", **ONE_ENCODER_PIPELINE),
                         PROMPTS_INPUT),
        output_in_run_dir=False, depset=DEPSET, dataset="wan",
    ),
)
