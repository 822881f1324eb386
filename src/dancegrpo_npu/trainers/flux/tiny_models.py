"""Tiny, randomly initialised stand-ins for FLUX.1-dev: its transformer, VAE and scheduler, with
the smoke's shared tiny CLIP and T5 text encoders (``smoke.tiny_models``).

Real diffusers classes with small configurations, saved with ``save_pretrained``, so that upstream's
loading code reads them as it reads the real checkpoints.  The interfaces the trainer relies on are
kept: 16 latent channels and 8x downsampling, upstream's VAE scale/shift.  The configurations are
plain data (``PARAMS``): their hash decides whether a built fixture directory is still current.
"""

from __future__ import annotations

from pathlib import Path

from dancegrpo_npu.smoke import tiny_models as shared
from dancegrpo_npu.smoke.tiny_models import CLIP_TEXT_CONFIG, T5_CONFIG, build_clip_tokenizer, build_t5_tokenizer, seeded

# FLUX.1-dev's transformer with every width shrunk: 2 heads x 16, one double and
# one single block; the RoPE axes (4, 6, 6) add up to the head dim like (16, 56, 56).
TRANSFORMER_CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 16,  # = T5_CONFIG["d_model"]
    "pooled_projection_dim": 16,  # = CLIP_TEXT_CONFIG["hidden_size"] (pooler_output)
    "guidance_embeds": True,  # FLUX.1-dev is guidance-distilled
    "axes_dims_rope": [4, 6, 6],
}

# Four blocks for 8x downsampling and 16 latent channels, as FLUX's VAE; the
# trainer hard-codes the scale 0.3611 and shift 0.1159.  sample_size 64 matches
# the smoke run's 64x64 images, so enable_tiling() is a no-op there, as it is
# for FLUX's 1024 sample size at 1024x1024.
VAE_CONFIG = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [8, 8, 16, 16],
    "layers_per_block": 1,
    "act_fn": "silu",
    "latent_channels": 16,
    "norm_num_groups": 4,
    "sample_size": 64,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}

# FLUX.1-dev's scheduler/scheduler_config.json.
SCHEDULER_CONFIG = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
}

SEEDS = {"transformer": 1, "vae": 2, "text_encoder": 3, "text_encoder_2": 4}

PARAMS = {"transformer": TRANSFORMER_CONFIG, "vae": VAE_CONFIG, "scheduler": SCHEDULER_CONFIG, "seeds": SEEDS,
          "shared": shared.PARAMS}


def build_flux_pipeline(bpe_gz: Path, work_dir: Path):
    """The tiny FluxPipeline (all seven components), in float32, ready to save."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    tokenizer = build_clip_tokenizer(bpe_gz, work_dir / "clip")
    tokenizer_2 = build_t5_tokenizer(work_dir / "t5")
    seeded(SEEDS["text_encoder"])
    text_encoder = CLIPTextModel(CLIPTextConfig(**CLIP_TEXT_CONFIG))
    seeded(SEEDS["text_encoder_2"])
    text_encoder_2 = T5EncoderModel(T5Config(vocab_size=len(tokenizer_2), **T5_CONFIG))
    seeded(SEEDS["transformer"])
    transformer = FluxTransformer2DModel(**TRANSFORMER_CONFIG)
    seeded(SEEDS["vae"])
    vae = AutoencoderKL(**VAE_CONFIG)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    return FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )
