"""Qwen-Image and Qwen-Image-Edit: the GRPO trainers and their preprocessing (the diffusers-0.35 set)."""

from __future__ import annotations

# where the family's rows come in the registry (and every list made from it)
ORDER = 30
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
    short_run_bench,
    weights_input,
)
from dancegrpo_npu.registry.spec import Bench, BenchPreset, ImageSizes, Input, Smoke, TrainerSpec

DEPSET = "diffusers-0.35"
HERE = Path(__file__).parent  # the family's folder: its model configs
NO_LORA = "upstream's Qwen-Image trainers have no LoRA option"
SIZES = ImageSizes(vae_scale=8, patch=2, why="Qwen-Image's VAE downsamples 8x and its transformer takes 2x2 latent "
                   "patches")


def prompt_batch(transformer_cfg, sizes, device, dtype, caption: str) -> tuple:
    """Qwen2.5-VL embeddings, their mask, the caption, the prompt's length."""
    import torch

    embed = torch.randn(1, sizes.text_tokens, transformer_cfg["joint_attention_dim"], device=device, dtype=dtype)
    mask = torch.ones(1, sizes.text_tokens, device=device, dtype=torch.long)
    return embed, mask, [caption], torch.tensor([sizes.text_tokens])


def train_one_step(train, args, device, models, optimizer, lr_scheduler, prompt, max_grad_norm):
    m = models
    embeds, mask, caption, length = prompt
    return train(args, device, m.transformer, m.vae, m.hps, m.hps_tokenizer, optimizer, lr_scheduler,
                 embeds, mask, caption, length, None, max_grad_norm, m.hps_preprocess, None)


BENCH = Bench(
    classes=("QwenImageTransformer2DModel", "AutoencoderKLQwenImage"),
    recipe="8gpus",  # scripts/finetune/finetune_qwenimage_grpo.sh
    text_tokens=256,  # as the memory plan's (plan.json)
    presets=(
        # the transformer's config is the memory plan's (plan.json); the VAE's is Wan2.1's (Qwen-Image's
        # AutoencoderKLQwenImage is that architecture with that configuration)
        BenchPreset(size="full", vae=HERE / "qwen-image-vae.json",
                    summary="Qwen-Image at full size (60 blocks, 20e9 parameters), its VAE, a ViT-H-14 HPS; "
                            "upstream's recipe"),
        # Full width, one block, as the other families' cpu presets: 128x128 (64 image tokens), 4 steps, G = 4.
        BenchPreset(size="cpu", vae=HERE / "qwen-image-vae.json",
                    summary="Qwen-Image width with 1 block, the full Qwen-Image VAE, ViT-H-14 width with 1 + 1 layers",
                    transformer_overrides={"num_layers": 1}, hps_overrides={"vision_layers": 1, "text_layers": 1},
                    sizes=dict(height=128, width=128, sampling_steps=4, generations=4, text_tokens=64,
                               gradient_accumulation_steps=4, steps=1)),
        # The Qwen-Image smoke's tiny models (trainers/qwenimage/fixtures.py): seconds, for tests.
        BenchPreset(size="tiny", tiny=f"{__name__}.fixtures",
                    summary="the Qwen-Image smoke's tiny models (2 heads x 16, 2 blocks; tiny Qwen VAE and HPS) at "
                            "64x64",
                    sizes=dict(height=64, width=64, sampling_steps=4, generations=4, text_tokens=16,
                               gradient_accumulation_steps=2, **TINY_SAMPLER)),
    ),
    extra_args=(("use_hpsv3", False),),  # the HPSv2 reward, as the recipe (not HPSv3), no EMA
    prompt=prompt_batch,
    train=train_one_step,
    # as the trainer's main: the real-valued RoPE first, diffusers' kernels by device
    before_build=("dancegrpo_port.models.qwen_rope:install_real_rope",
                  "dancegrpo_port.device:choose_diffusers_kernels"),
    checkpointed_blocks="diffusers.models.transformers.transformer_qwenimage:QwenImageTransformerBlock",
)


def _smoke(*, title: str, label: str, passes: int, edit: bool, selective_checkpointing: str) -> Smoke:
    return Smoke(title=title, label=label, loop_below=2, passes=passes, fixtures=f"{HOOKS}:fixtures",
                 arguments=f"{HOOKS}:arguments", checkpoint=f"{HOOKS}:checkpoint",
                 unchanged_note=f"{HOOKS}:unchanged_note", model_class="QwenImageTransformer2DModel",
                 params=(("edit", edit), ("selective_checkpointing", selective_checkpointing)))


def _trainer(*, name: str, title: str, preprocess: str, **more) -> TrainerSpec:
    return TrainerSpec(
        name=name, title=title, defaults=HPS_DEFAULTS, path_flags=TRAIN_PATH_FLAGS,
        required_inputs=(weights_input(f"{title} weights (transformer/, vae/)"), dataset_input(preprocess),
                         *HPS_INPUTS),
        output_in_run_dir=True, depset=DEPSET, dataset=name, preprocess=preprocess, aligns=True, image_sizes=SIZES,
        plan=architecture.plan(name), offload_flag="--use_cpu_offload", no_lora=NO_LORA,  # offload: the port's
        **more,
    )


def _preprocess(*, name: str, relpath: str, title: str, dataset: str, defaults, inputs, path_flags=()) -> TrainerSpec:
    return TrainerSpec(
        name=name, relpath=relpath, help=f"{title}'s RL-embeddings dataset", title=title, defaults=defaults,
        path_flags=PREPROCESS_PATH_FLAGS + path_flags, required_inputs=inputs, output_in_run_dir=False,
        depset=DEPSET, dataset=dataset,
    )


ROWS = (
    _trainer(
        name="qwenimage", relpath="fastvideo/train_grpo_qwenimage.py", help="GRPO of Qwen-Image",
        title="Qwen-Image", preprocess="preprocess-qwenimage",
        recipe_glob="scripts/finetune/finetune_qwenimage_grpo*.sh",
        smoke=_smoke(title="Qwen-Image GRPO", label="Qwen-Image", passes=1, edit=False, selective_checkpointing="0.5"),
        bench=BENCH,
    ),
    _trainer(
        name="qwenimage-edit", relpath="fastvideo/train_grpo_qwenimage_edit.py", help="GRPO of Qwen-Image-Edit",
        title="Qwen-Image-Edit", preprocess="preprocess-qwenimage-edit",
        recipe_glob="scripts/finetune/finetune_qwenimage_edit_grpo*.sh",
        argument_checks=("reference-sizes",),
        smoke=_smoke(title="Qwen-Image-Edit GRPO", label="Qwen-Image-Edit", passes=3, edit=True,
                     selective_checkpointing="1.0"),
        bench=short_run_bench("bench builds no reference image's latents in process; `bench --trainer qwenimage` times "
                              "the same transformer's steps"),
    ),
    # upstream scripts/preprocess/preprocess_qwen_image_rl_embeddings.sh (commit 15cc71d5)
    _preprocess(
        name="preprocess-qwenimage", relpath="fastvideo/data_preprocess/preprocess_qwenimage_embedding.py",
        title="Qwen-Image", dataset="qwenimage", defaults=preprocess_defaults("data/qwenimage"),
        inputs=(pipeline_input("--model_path", "Qwen-Image weights", **ONE_ENCODER_PIPELINE), PROMPTS_INPUT),
    ),
    # upstream scripts/preprocess/preprocess_qwen_image_edit_rl_embeddings.sh (commit 15cc71d5); its
    # images are read from --image_dir, the patch's argument for the path the script hard-codes
    # (relative to the directory it runs in, as upstream's README lays out data/).
    _preprocess(
        name="preprocess-qwenimage-edit", relpath="fastvideo/data_preprocess/preprocess_qwenimage_edit_embeddings.py",
        title="Qwen-Image-Edit", dataset="qwenimage-edit",
        defaults=preprocess_defaults("data/qwenimage_edit", "./assets/edit_data.jsonl", ("--height", "512"),
                                     ("--width", "512"),
                                     ("--image_dir", "data/SEED-Data-Edit-Part2-3/real_editing/images")),
        inputs=(
            # with the Qwen2-VL processor/ the edit pipeline reads the reference image with
            pipeline_input("--model_path", "Qwen-Image-Edit weights", ONE_ENCODER_PIPELINE["models"],
                           ("tokenizer", "processor")),
            Input(flag="--prompt_dir", kind="file",
                  what="edit_data.jsonl (upstream's is assets/edit_data.jsonl: `dancegrpo-npu fetch --with-assets`)"),
            # edit_data.jsonl's source_image paths are relative to it
            Input(flag="--image_dir", kind="directory", what="source-image"),
        ),
        path_flags=("--image_dir",),
    ),
)
