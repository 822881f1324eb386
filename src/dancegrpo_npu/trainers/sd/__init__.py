"""Stable Diffusion v1.4: upstream's DDPO-style GRPO trainer on accelerate, configured with absl /
ml_collections (``--config fastvideo/config_sd/dgx.py:hpsv2``), on the FLUX dependency set."""

from __future__ import annotations

# where the family's rows come in the registry (and every list made from it)
ORDER = 40
# the family's smoke hooks ("module:function", so that a copy of the folder names its own)
HOOKS = f"{__name__}.smoke"

from . import architecture
from dancegrpo_npu.trainers.common import (
    HPS_DEFAULTS,
    HPS_INPUTS,
    PROMPTS_INPUT,
    TRAIN_PATH_FLAGS,
    pipeline_input,
    short_run_bench,
)
from dancegrpo_npu.registry.spec import ImageSizes, Smoke, TrainerSpec

# Where upstream's trainer reads the weights and the prompts (hard-coded there; the port's flags,
# with these defaults, relative to the patched tree).
WEIGHTS_DIR = "data/stable-diffusion-v1-4"
PROMPTS = "assets/prompts.txt"

ROWS = (
    TrainerSpec(
        name="sd", relpath="fastvideo/train_grpo_sd.py",
        help="GRPO of Stable Diffusion v1.4 (accelerate; --config passes through to absl)",
        title="Stable Diffusion v1.4",
        defaults=(("--pretrained_model_name_or_path", WEIGHTS_DIR), ("--prompt_dir", PROMPTS), *HPS_DEFAULTS),
        path_flags=(*TRAIN_PATH_FLAGS, "--prompt_dir", "--config"),
        required_inputs=(
            pipeline_input("--pretrained_model_name_or_path",
                           "Stable Diffusion v1.4 weights (CompVis/stable-diffusion-v1-4, diffusers layout)",
                           ("unet", "vae", "text_encoder"), weights=True),
            PROMPTS_INPUT,
            *HPS_INPUTS,
        ),
        output_in_run_dir=True, recipe_glob="scripts/finetune/finetune_sd_grpo*.sh", aligns=True,
        # the latents are --h/8 x --w/8 (the overlay refuses the rest at start); the UNet pads its
        # own down- and up-sampling, so any latent size runs
        image_sizes=ImageSizes(vae_scale=8, why="the SD VAE downsamples 8x: the initial latents are --h/8 x --w/8"),
        smoke=Smoke(title="Stable Diffusion GRPO (DDIM, accelerate)", label="SD",
                    fixtures=f"{HOOKS}:fixtures", arguments=f"{HOOKS}:arguments",
                    checkpoint=f"{HOOKS}:checkpoint", check_options=f"{HOOKS}:check_options",
                    model_class="UNet2DConditionModel",
                    sampling_steps=6),  # at 4 DDIM steps the tiny UNet's 2 images score equal
        no_lora=("upstream's LoRA path (config.use_lora) builds LoRAAttnProcessor(hidden_size=...), which diffusers "
                 "0.32 no longer takes"),
        foreign_flags=("--config",), config_check="dancegrpo_port.sd:configuration_problem",
        config_settle="dancegrpo_port.sd:settle",
        config_example="--config fastvideo/config_sd/dgx.py:hpsv2",
        fixed_values=(("init_same_noise", True),),  # one initial latent for a rank's epoch (upstream's loop)
        plan=architecture.plan("sd"),
        # its sample batch is its configuration's train.batch_size: no --sample_batch_size
        bench=short_run_bench("upstream's SD trainer has no train_one_step: its rollout and training are inside main",
                              sample_batch_flag=False),
    ),
)
