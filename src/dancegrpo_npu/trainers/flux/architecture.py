"""FLUX.1-dev's transformer as plan and bench count it (the rows' ``plan``): joint attention, 19
double-stream and 38 single-stream blocks; the shapes are in plan.json beside this file."""

from __future__ import annotations

from pathlib import Path

from dancegrpo_npu.registry.spec import Architecture, Plan
from dancegrpo_npu.trainers.counting import dual_single_lora, dual_stream_block, joint_root, linear, single_stream_block

SHAPES = Path(__file__).with_name("plan.json")


def block_parameters(model) -> list[int]:
    cfg, d = model.transformer, model.hidden
    h = cfg["attention_head_dim"]
    return [dual_stream_block(d, h)] * cfg["num_layers"] + [single_stream_block(d, h)] * cfg.get("num_single_layers", 0)


def root_parameters(model) -> int:
    """The joint root, the guidance embedder (FLUX.1-dev's distilled guidance) and the pooled CLIP
    text embedder."""
    cfg, d = model.transformer, model.hidden
    guidance = linear(256, d) + linear(d, d) if cfg.get("guidance_embeds") else 0
    return joint_root(cfg, d) + guidance + linear(cfg["pooled_projection_dim"], d) + linear(d, d)


ARCHITECTURE = Architecture(kind="joint-transformer", block_parameters=block_parameters,
                            root_parameters=root_parameters, lora_parameters=dual_single_lora)


def plan(entry: str) -> Plan:
    """A row's ``plan``: its entry in the family's shapes, counted as above."""
    return Plan(shapes=SHAPES, entry=entry, architecture=ARCHITECTURE)
