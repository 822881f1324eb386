"""HunyuanVideo's transformer (SkyReels-V1-I2V's too) as plan and bench count it (the rows'
``plan``): joint attention, 20 double-stream and 40 single-stream blocks, whose parameters (with
its token refiner, which no formula here describes) are counted on a meta-device build of the
class: plan.json's ``counted``."""

from __future__ import annotations

from pathlib import Path

from dancegrpo_npu.registry.spec import Architecture, Plan
from dancegrpo_npu.trainers.counting import dual_single_lora

SHAPES = Path(__file__).with_name("plan.json")


def block_parameters(model) -> list[int]:
    cfg, counted = model.transformer, model.counted
    return [counted["dual_block"]] * cfg["num_layers"] + [counted["single_block"]] * cfg["num_single_layers"]


def root_parameters(model) -> int:
    return model.counted["root"]


def latent_per_token(model) -> int:
    """The trajectory holds the 16 noise channels of a token's 1x2x2 patch (SkyReels' 32 input
    channels add the first frame's, which is not sampled)."""
    cfg = model.transformer
    return cfg["out_channels"] * cfg["patch_size"] * cfg["patch_size"] * cfg["patch_size_t"]


ARCHITECTURE = Architecture(kind="joint-transformer", block_parameters=block_parameters,
                            root_parameters=root_parameters, latent_per_token=latent_per_token,
                            lora_parameters=dual_single_lora)


def plan(entry: str) -> Plan:
    """A row's ``plan``: its entry in the family's shapes, counted as above."""
    return Plan(shapes=SHAPES, entry=entry, architecture=ARCHITECTURE)
