"""Stable Diffusion v1.4's UNet as plan counts it (the row's ``plan``): a conditional UNet, which
plan counts layer by layer from its config; the shapes are in plan.json beside this file."""

from __future__ import annotations

from pathlib import Path

from dancegrpo_npu.registry.spec import Architecture, Plan

SHAPES = Path(__file__).with_name("plan.json")
ARCHITECTURE = Architecture(kind="unet")


def plan(entry: str) -> Plan:
    """A row's ``plan``: its entry in the family's shapes, counted as above."""
    return Plan(shapes=SHAPES, entry=entry, architecture=ARCHITECTURE)
