"""Qwen-Image's transformer as plan and bench count it (the rows' ``plan``): joint attention, 60
double-stream blocks; the shapes are in plan.json beside this file."""

from __future__ import annotations

from pathlib import Path

from dancegrpo_npu.registry.spec import Architecture, Plan
from dancegrpo_npu.trainers.counting import dual_stream_block, joint_root

SHAPES = Path(__file__).with_name("plan.json")


def block_parameters(model) -> list[int]:
    cfg = model.transformer
    return [dual_stream_block(model.hidden, cfg["attention_head_dim"])] * cfg["num_layers"]


def root_parameters(model) -> int:
    """The joint root and the text's RMSNorm (txt_norm)."""
    cfg = model.transformer
    return joint_root(cfg, model.hidden) + cfg["joint_attention_dim"]


ARCHITECTURE = Architecture(kind="joint-transformer", block_parameters=block_parameters,
                            root_parameters=root_parameters)


def plan(entry: str) -> Plan:
    """A row's ``plan``: its entry in the family's shapes, counted as above."""
    return Plan(shapes=SHAPES, entry=entry, architecture=ARCHITECTURE)
