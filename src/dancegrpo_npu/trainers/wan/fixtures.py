"""Tiny, randomly initialised stand-ins for Wan2.1-T2V-1.3B, and its RL-embeddings dataset.

Real diffusers / transformers classes with small configurations, written with the libraries'
own ``save_pretrained``, so that upstream's loading code reads them as it reads the real
checkpoint: a ``WanPipeline`` directory (``WanTransformer3DModel``, ``AutoencoderKLWan``, a
UMT5 text encoder and tokenizer, the UniPC scheduler).  The interfaces the trainer relies on are
kept: 16 latent channels, 8x spatial and 4x temporal downsampling, the VAE's latents_mean/std,
UMT5 sequences of WanPipeline.encode_prompt's 226 tokens.  The dataset is written as upstream's
``preprocess_wan_2_1_embeddings.py`` writes it (``WanPipeline.encode_prompt``, one prompt a
batch, ``prompt_embed/<i>.pt`` and ``negative_prompt_embeds/<i>.pt``).  The HPS reward files
and the prompts are the smoke's shared reward fixtures (``smoke.fixtures``).

Wan needs the diffusers-0.35 dependency set: the tool (diffusers 0.32) builds these in a child
process of that set's interpreter, ``python -m dancegrpo_npu.trainers.wan.fixtures DEST PROMPTS``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

# Wan2.1-T2V-1.3B's transformer, narrow: 2 heads x 12 (the RoPE splits 12 as 4 + 4 + 4 over
# frames, height, width), one block; text_dim is the UMT5's d_model.
TRANSFORMER_CONFIG = {
    "patch_size": [1, 2, 2],
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 32,
    "freq_dim": 16,
    "ffn_dim": 32,
    "num_layers": 1,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "image_dim": None,
    "added_kv_proj_dim": None,
    "rope_max_seq_len": 1024,
}

# Four levels (8x spatial downsampling, 4x temporal), 16 latent channels; the class's own
# latents_mean / latents_std (the trainer reads them from the config).
VAE_CONFIG = {
    "base_dim": 8,
    "z_dim": 16,
    "dim_mult": [1, 2, 2, 2],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
}

# UMT5-XXL's encoder (gated-gelu), narrow; vocab_size is the tokenizer's length.
UMT5_CONFIG = {
    "d_model": 32,
    "d_kv": 16,
    "d_ff": 64,
    "num_layers": 1,
    "num_heads": 2,
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.0,
    "tie_word_embeddings": False,
    "is_encoder_decoder": False,
    "use_cache": False,
}

# Wan2.1-T2V-1.3B's scheduler/scheduler_config.json (what matters of it).
SCHEDULER_CONFIG = {"flow_shift": 3.0, "prediction_type": "flow_prediction", "use_flow_sigmas": True,
                    "num_train_timesteps": 1000}

SEEDS = {"transformer": 11, "vae": 12, "text_encoder": 13}
PARAMS = {"transformer": TRANSFORMER_CONFIG, "vae": VAE_CONFIG, "umt5": UMT5_CONFIG,
          "scheduler": SCHEDULER_CONFIG, "seeds": SEEDS}


@dataclass(frozen=True)
class WanFixtures:
    model_dir: Path  # the tiny Wan2.1 pipeline directory
    data_json: Path  # videos2caption.json of its RL-embeddings dataset

    @property
    def root(self) -> Path:
        return self.model_dir.parent


def wan_fixtures_at(dest: Path) -> WanFixtures:
    dest = Path(dest)
    return WanFixtures(dest / "pipeline", dest / "rl_embeddings" / "videos2caption.json")


def params_sha256(python: str) -> str:
    h = hashlib.sha256(json.dumps(PARAMS, sort_keys=True).encode())
    h.update(Path(__file__).read_bytes())
    h.update(python.encode())
    return h.hexdigest()


def build_wan_fixtures(dest: Path, prompts: Path, python: str) -> WanFixtures:
    """The Wan fixtures at ``dest``, built with ``python`` (the diffusers-0.35 set's) unless
    they are there and current; built into a staging directory, then swapped in whole."""
    from dancegrpo_npu.smoke.child_build import build_in_child

    want = params_sha256(python) + hashlib.sha256(Path(prompts).read_bytes()).hexdigest()
    dest = build_in_child(dest, want, python, "dancegrpo_npu.trainers.wan.fixtures", [str(prompts)], "Wan")
    return wan_fixtures_at(dest)


# ---- run in the diffusers-0.35 interpreter ------------------------------------------------------


def build_pipeline(work_dir: Path):
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from dancegrpo_npu.smoke.tiny_models import build_t5_tokenizer

    tokenizer = build_t5_tokenizer(work_dir / "umt5")
    torch.manual_seed(SEEDS["text_encoder"])
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **UMT5_CONFIG))
    torch.manual_seed(SEEDS["transformer"])
    transformer = WanTransformer3DModel(**TRANSFORMER_CONFIG)
    torch.manual_seed(SEEDS["vae"])
    vae = AutoencoderKLWan(**VAE_CONFIG)
    scheduler = UniPCMultistepScheduler(**SCHEDULER_CONFIG)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
                       scheduler=scheduler)


def write_rl_embeddings(model_dir: Path, prompts: list[str], out_dir: Path) -> None:
    """As upstream's preprocess_wan_2_1_embeddings.py: the pipeline in bfloat16,
    ``encode_prompt(prompt=, do_classifier_free_guidance=True)`` on a batch of one, the ``[idx]``
    views saved, ``<i>.pt`` names and JSON entries."""
    import torch
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(str(model_dir), torch_dtype=torch.bfloat16)
    for sub in ("prompt_embed", "negative_prompt_embeds"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    entries = []
    with torch.inference_mode():
        for i, caption in enumerate(prompts):
            name, idx = f"{i}.pt", 0
            prompt_embeds, negative_prompt_embeds = pipe.encode_prompt(prompt=[caption], do_classifier_free_guidance=True)
            torch.save(prompt_embeds[idx], out_dir / "prompt_embed" / name)
            torch.save(negative_prompt_embeds[idx], out_dir / "negative_prompt_embeds" / name)
            entries.append({"prompt_embed_path": name, "negative_prompt_embeds_path": name, "caption": caption})
    (out_dir / "videos2caption.json").write_text(json.dumps(entries, indent=4))


def _main(argv: list[str]) -> int:
    import torch

    dest, prompts = Path(argv[0]), Path(argv[1]).read_text().splitlines()
    fixtures = wan_fixtures_at(dest)
    dest.mkdir(parents=True)
    with torch.random.fork_rng(devices=[]):
        pipe = build_pipeline(dest / ".scratch")
        pipe.save_pretrained(str(fixtures.model_dir))
    shutil.rmtree(dest / ".scratch")
    write_rl_embeddings(fixtures.model_dir, prompts, fixtures.data_json.parent)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
