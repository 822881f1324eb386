"""Wan2.1's transformer as plan and bench count it (the rows' ``plan``): blocks over the video's
tokens, cross-attending to the text; the shapes are in plan.json and the configs beside this file."""

from __future__ import annotations

from pathlib import Path

from dancegrpo_npu.registry.spec import Architecture, Plan
from dancegrpo_npu.trainers.counting import linear

SHAPES = Path(__file__).with_name("plan.json")


def _patch(cfg: dict) -> int:
    return cfg["patch_size"][0] * cfg["patch_size"][1] * cfg["patch_size"][2]


def block_parameters(model) -> list[int]:
    """Self- and cross-attention (q/k/v/out each, RMSNorm over q and k across heads), the
    cross-attention's affine LayerNorm, a GELU FFN of ffn_dim, the 6d scale-shift table."""
    cfg, d = model.transformer, model.hidden
    attention = 4 * linear(d, d) + 2 * d
    return [2 * attention + 2 * d + linear(d, cfg["ffn_dim"]) + linear(cfg["ffn_dim"], d) + 6 * d] * cfg["num_layers"]


def root_parameters(model) -> int:
    """The patch embedding, the time and text embedders, the time projection, the output."""
    cfg, d = model.transformer, model.hidden
    patch = _patch(cfg)
    embedders = linear(cfg["freq_dim"], d) + linear(d, d) + linear(d, 6 * d) + linear(cfg["text_dim"], d) + linear(d, d)
    return cfg["in_channels"] * patch * d + d + embedders + linear(d, cfg["out_channels"] * patch) + 2 * d


def latent_per_token(model) -> int:
    """The patch embedding takes 16 channels x its 1x2x2 patch: 64."""
    return model.transformer["in_channels"] * _patch(model.transformer)


ARCHITECTURE = Architecture(kind="cross-transformer", block_parameters=block_parameters,
                            root_parameters=root_parameters, latent_per_token=latent_per_token)


def plan(entry: str) -> Plan:
    """A row's ``plan``: its entry in the family's shapes, counted as above."""
    return Plan(shapes=SHAPES, entry=entry, architecture=ARCHITECTURE)
