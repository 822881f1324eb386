"""The shapes the memory plan knows: shipped in models.json, or the bench's built configs."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from dancegrpo_npu.plan.memory import Model, Recipe

MODELS_FILE = Path(__file__).with_name("models.json")


@lru_cache(maxsize=1)
def _shipped() -> dict:
    return {k: v for k, v in json.loads(MODELS_FILE.read_text()).items() if not k.startswith("_")}


def names() -> list[str]:
    return list(_shipped())


def entry(name: str) -> dict:
    """The shipped entry, with ``same_as`` resolved (the edit model shares Qwen-Image's shapes)."""
    data = _shipped()[name]
    if "same_as" in data:
        data = {**data_of(data["same_as"]), **data}
    return data


def data_of(name: str) -> dict:
    return _shipped()[name]


def load(name: str) -> tuple[Model, Recipe, int, str]:
    """(model, upstream's recipe sizes, its world size, its script) of a shipped model."""
    data = entry(name)
    model = Model(name, data["trainer"], data["transformer"], data["vae"], data["hps"],
                  reference_image_tokens=data.get("reference_image_tokens", False))
    r = data["recipe"]
    recipe = Recipe(height=r["height"], width=r["width"], generations=r["generations"],
                    sampling_steps=r["sampling_steps"], text_tokens=r["text_tokens"],
                    selective_checkpointing=r["selective_checkpointing"])
    return model, recipe, r["world_size"], r["script"]


def from_bench(name: str, configs, counts) -> Model:
    """A bench preset's models (FLUX-shaped: its transformer config, its VAE and HPS configs
    and their parameter counts from meta-device builds) as the plan sees them."""
    transformer_cfg, vae_cfg, hps_cfg = configs
    vision = hps_cfg["vision_cfg"]
    vae = {"parameters": counts.vae, "first_channels": vae_cfg["block_out_channels"][0],
           "widest_channels": max(vae_cfg["block_out_channels"]), "tile": vae_cfg.get("sample_size", 1024)}
    hps = {"parameters": counts.hps, "image_size": vision["image_size"], "patch_size": vision["patch_size"],
           "width": vision["width"], "head_width": vision.get("head_width", 64)}
    return Model(name, "flux", {"_class_name": "FluxTransformer2DModel", **transformer_cfg}, vae, hps)
