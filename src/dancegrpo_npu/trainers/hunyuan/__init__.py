"""HunyuanVideo (text-to-video) and SkyReels-V1-I2V (image-to-video): upstream's GRPO trainers with
the VideoAlign reward, and their embeddings preprocessing, on the FLUX dependency set."""

from __future__ import annotations

# where the family's rows come in the registry (and every list made from it)
ORDER = 50
# the family's smoke hooks ("module:function", so that a copy of the folder names its own)
HOOKS = f"{__name__}.smoke"

from . import architecture
from dancegrpo_npu.trainers.common import (
    PREPROCESS_PATH_FLAGS,
    TRAIN_PATH_FLAGS,
    TWO_ENCODER_PIPELINE,
    dataset_input,
    pipeline_input,
    preprocess_defaults,
    short_run_bench,
    vae_input,
    weights_input,
)
from dancegrpo_npu.registry.spec import ImageSizes, Input, Smoke, TrainerSpec

# Where upstream's trainers read VideoAlign (hard-coded there, relative to the run directory; the
# port's --videoalign_ckpt and --videoalign_base_model, with these defaults, relative to the tree).
VIDEOALIGN_DEFAULTS = (("--videoalign_ckpt", "videoalign_ckpt"), ("--videoalign_base_model", "Qwen2-VL-2B-Instruct"))
VIDEOALIGN_FLAGS = ("--videoalign_ckpt", "--videoalign_base_model")
VIDEOALIGN_INPUTS = (
    Input(flag="--videoalign_ckpt", kind="directory",
          what="VideoAlign checkpoint (KwaiVGI/VideoReward: model_config.json, checkpoint-*/)"),
    Input(flag="--videoalign_base_model", kind="model",
          what="Qwen2-VL-2B-Instruct, VideoAlign's base model and processor"),
)

# HunyuanVideo's VAE downsamples 8x and its transformer takes 2x2 latent patches (patch_size 2):
# --h 72 makes 9 latent rows, which the patch embedding cannot split.
SIZES = ImageSizes(vae_scale=8, patch=2, why="HunyuanVideo's VAE downsamples 8x and its transformer takes 2x2 latent "
                   "patches")

ROWS = (
    TrainerSpec(
        name="hunyuan", relpath="fastvideo/train_grpo_hunyuan.py",
        help="GRPO of HunyuanVideo (text-to-video, VideoAlign reward)", title="HunyuanVideo",
        defaults=VIDEOALIGN_DEFAULTS, path_flags=(*TRAIN_PATH_FLAGS, *VIDEOALIGN_FLAGS),
        required_inputs=(
            weights_input("HunyuanVideo weights (hunyuanvideo-community/HunyuanVideo, diffusers layout)"),
            vae_input("HunyuanVideo VAE weights"),
            dataset_input("preprocess-hunyuan"),
            *VIDEOALIGN_INPUTS,
        ),
        output_in_run_dir=True, recipe_glob="scripts/finetune/finetune_hunyuan_grpo*.sh", dataset="hunyuan",
        preprocess="preprocess-hunyuan", aligns=True, image_sizes=SIZES,
        renamed_values=(("use_same_noise", "init_same_noise"),),  # its recipe shares the initial noise
        smoke=Smoke(title="HunyuanVideo GRPO (5 frames)", label="HunyuanVideo",
                    fixtures=f"{HOOKS}:fixtures", arguments=f"{HOOKS}:arguments",
                    checkpoint=f"{HOOKS}:checkpoint",
                    model_class="HunyuanVideoTransformer3DModel", params=(("first_frame", False),), reward="VideoAlign"),
        plan=architecture.plan("hunyuan"), offload_flag="--use_cpu_offload",
        per_rank_batch=("best-of-n and the advantages are a rank's: its prompt's generations, so the recipe runs as it "
                        "is on each rank at any world size"),
        no_lora="upstream's HunyuanVideo trainer has no LoRA option",
        bench=short_run_bench("bench builds no VideoAlign reward in process"),
    ),
    TrainerSpec(
        name="skyreels-i2v", relpath="fastvideo/train_grpo_skyreels_i2v.py",
        help="GRPO of SkyReels-V1-I2V (image-to-video; FLUX makes each step's first frame; VideoAlign reward)",
        title="SkyReels-V1-I2V",
        defaults=(*VIDEOALIGN_DEFAULTS, ("--empty_embeddings_dir", "data/empty")),
        path_flags=(*TRAIN_PATH_FLAGS, *VIDEOALIGN_FLAGS, "--reference_model_path", "--empty_embeddings_dir"),
        required_inputs=(
            weights_input("SkyReels-V1-I2V weights (xzyhku/SkyReels-V1-I2V, diffusers layout)"),
            vae_input("SkyReels-V1-I2V VAE weights"),
            dataset_input("preprocess-skyreels-i2v"),
            pipeline_input("--reference_model_path",
                           "FLUX.1-dev pipeline that makes each step's first frame (black-forest-labs/FLUX.1-dev)",
                           **TWO_ENCODER_PIPELINE),
            Input(flag="--empty_embeddings_dir", kind="directory",
                  what="the empty prompt's embeddings: run `dancegrpo-npu launch preprocess-skyreels-i2v` first"),
            *VIDEOALIGN_INPUTS,
        ),
        output_in_run_dir=True, recipe_glob="scripts/finetune/finetune_skyreels_i2v*.sh", dataset="skyreels-i2v",
        preprocess="preprocess-skyreels-i2v", aligns=True,
        image_sizes=ImageSizes(vae_scale=8, patch=2, why="SkyReels-V1-I2V's VAE downsamples 8x and its transformer "
                               "takes 2x2 latent patches (its FLUX first frame needs the same)"),
        smoke=Smoke(title="SkyReels-I2V GRPO (5 frames from a FLUX first frame, CFG 5)", label="SkyReels-I2V",
                    fixtures=f"{HOOKS}:fixtures", arguments=f"{HOOKS}:arguments",
                    checkpoint=f"{HOOKS}:checkpoint",
                    model_class="HunyuanVideoTransformer3DModel", params=(("first_frame", True),), reward="VideoAlign"),
        plan=architecture.plan("skyreels-i2v"), offload_flag="--use_cpu_offload",
        per_rank_batch=("the first frame and the advantages are a rank's: its prompt's generations, so the recipe runs as it "
                        "is on each rank at any world size"),
        no_lora="upstream's SkyReels-I2V trainer has no LoRA option",
        bench=short_run_bench("bench builds no VideoAlign reward nor first-frame pipeline in process"),
    ),
    # upstream scripts/preprocess/preprocess_hunyuan_rl_embeddings.sh (commit 15cc71d5), without its
    # copy of the tokenizers into the text encoders' folders (the port reads them where they are)
    TrainerSpec(
        name="preprocess-hunyuan", relpath="fastvideo/data_preprocess/preprocess_hunyuan_embeddings.py",
        help="HunyuanVideo's RL-embeddings dataset from a prompt file", title="HunyuanVideo",
        defaults=preprocess_defaults("data/HunyuanVideo", "./assets/video_prompts.txt", ("--model_type", "hunyuan_hf")),
        path_flags=PREPROCESS_PATH_FLAGS,
        required_inputs=(pipeline_input("--model_path", "HunyuanVideo weights (hunyuanvideo-community/HunyuanVideo)",
                                        **TWO_ENCODER_PIPELINE),
                         Input(flag="--prompt_dir", kind="file",
                               what="prompt file (upstream's is assets/video_prompts.txt: "
                                    "`dancegrpo-npu fetch --with-assets`)")),
        output_in_run_dir=False, dataset="hunyuan",
    ),
)

ROWS += (
    # upstream scripts/preprocess/preprocess_skyreels_rl_embeddings.sh (commit 15cc71d5): the
    # HunyuanVideo script over the prompts, then over assets/empty.txt into data/empty; here one
    # run writes both (--empty_output_dir), reading the tokenizers where they are.
    TrainerSpec(
        name="preprocess-skyreels-i2v", relpath="fastvideo/data_preprocess/preprocess_hunyuan_embeddings.py",
        help="SkyReels-V1-I2V's RL-embeddings dataset from a prompt file, and the empty prompt's embeddings",
        title="SkyReels-V1-I2V",
        defaults=preprocess_defaults("data/SkyReels-I2V", "./assets/consist-id.txt", ("--model_type", "hunyuan_hf"),
                                     ("--empty_output_dir", "data/empty")),
        path_flags=(*PREPROCESS_PATH_FLAGS, "--empty_output_dir"),
        required_inputs=(pipeline_input("--model_path", "SkyReels-V1-I2V weights (xzyhku/SkyReels-V1-I2V)",
                                        **TWO_ENCODER_PIPELINE),
                         Input(flag="--prompt_dir", kind="file",
                               what="prompt file (upstream's is assets/consist-id.txt: "
                                    "`dancegrpo-npu fetch --with-assets`)")),
        output_in_run_dir=False, dataset="skyreels-i2v",
    ),
)
