"""A tiny, randomly initialised stand-in for Stable Diffusion v1.4, as a pipeline directory.

Real diffusers / transformers classes with small configurations, written with
``StableDiffusionPipeline.save_pretrained``, so that upstream's ``from_pretrained`` reads it as it
reads CompVis/stable-diffusion-v1-4: a ``UNet2DConditionModel`` (cross-attention blocks with
GEGLU feed-forwards, as SD's), an ``AutoencoderKL`` with SD's 8x downsampling and 4 latent
channels, the smoke's narrow CLIP text encoder with CLIP's full tokenizer (77 tokens), SD v1.4's
scheduler configuration, and no safety checker.  The HPS reward files and the prompts are the
smoke's shared reward fixtures (``smoke.fixtures``).  Same dependency set as the tool (diffusers 0.32): built here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError

FORMAT = 1
SEED = 2026

# SD v1.4's UNet, narrow: two levels (one with cross-attention), one layer a block.
UNET_CONFIG = {
    "sample_size": 8,
    "in_channels": 4,
    "out_channels": 4,
    "layers_per_block": 1,
    "block_out_channels": [32, 32],
    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
    "attention_head_dim": 8,
    "norm_num_groups": 8,
}

# Four levels (8x downsampling, as SD's VAE), 4 latent channels, SD's scaling factor.
VAE_CONFIG = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [8, 8, 8, 8],
    "latent_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "sample_size": 64,
    "scaling_factor": 0.18215,
}

# CompVis/stable-diffusion-v1-4's scheduler/scheduler_config.json (PNDM; upstream switches to DDIM).
SCHEDULER_CONFIG = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
}


@dataclass(frozen=True)
class SdFixtures:
    model_dir: Path  # the StableDiffusionPipeline directory


def params_sha256() -> str:
    from dancegrpo_npu.smoke import tiny_models

    data = {"format": FORMAT, "unet": UNET_CONFIG, "vae": VAE_CONFIG, "scheduler": SCHEDULER_CONFIG,
            "clip": tiny_models.CLIP_TEXT_CONFIG, "seed": SEED}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def build_sd_fixtures(dest: Path) -> SdFixtures:
    """The pipeline at ``dest/pipeline``, built once (reused while its parameters are the same);
    built beside it and renamed into place, so a stopped build leaves nothing half-written."""
    dest = Path(dest).resolve()
    stamp = dest / "stamp.json"
    params = params_sha256()
    fixtures = SdFixtures(model_dir=dest / "pipeline")
    if stamp.is_file() and json.loads(stamp.read_text()).get("params") == params and fixtures.model_dir.is_dir():
        return fixtures
    tmp = dest.with_name(dest.name + ".tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _build(tmp / "pipeline", tmp / "work")
        shutil.rmtree(tmp / "work")
        (tmp / "stamp.json").write_text(json.dumps({"params": params}) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    except OSError as exc:
        raise DancegrpoError(f"cannot build the SD fixtures in {dest}: {exc}",
                             "check that its directory is writable and has space") from None
    return fixtures


def _build(model_dir: Path, work: Path) -> None:
    import torch
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from dancegrpo_npu.smoke import tiny_models
    from dancegrpo_npu.smoke.fixtures import clip_bpe_path

    torch.manual_seed(SEED)
    tokenizer = tiny_models.build_clip_tokenizer(clip_bpe_path(), work / "clip")
    text_encoder = CLIPTextModel(CLIPTextConfig(**tiny_models.CLIP_TEXT_CONFIG))
    unet = UNet2DConditionModel(cross_attention_dim=tiny_models.CLIP_TEXT_CONFIG["hidden_size"], **UNET_CONFIG)
    vae = AutoencoderKL(**VAE_CONFIG)
    pipeline = StableDiffusionPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
        scheduler=PNDMScheduler(**SCHEDULER_CONFIG), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(model_dir)
