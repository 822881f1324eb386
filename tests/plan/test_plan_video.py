"""``plan hunyuan`` and ``plan skyreels-i2v``: HunyuanVideo's transformer (its parameters counted on
a meta-device build of diffusers' class), its float32 VAE decoding a video's tile of frames, the
VideoAlign reward, and SkyReels' FLUX.1-dev pipeline for the first frame, placed as
--flux_placement says."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dancegrpo_npu.plan import memory, models
from dancegrpo_npu.plan.memory import GiB

pytest.importorskip("diffusers")

COUNT = r"""
import json, sys, torch
from diffusers import HunyuanVideoTransformer3DModel, AutoencoderKLHunyuanVideo
cfg = {k: v for k, v in json.loads(sys.argv[1]).items() if not k.startswith("_")}
with torch.device("meta"):
    m, vae = HunyuanVideoTransformer3DModel(**cfg), AutoencoderKLHunyuanVideo()
n = lambda mod: sum(p.numel() for p in mod.parameters())
print(json.dumps([n(m), n(m.transformer_blocks[0]), n(m.single_transformer_blocks[0]), n(vae)]))
"""


@pytest.mark.parametrize("name", ["hunyuan", "skyreels-i2v"])
def test_the_counts_are_diffusers_classes_own(name):
    model = models.model_of(name)
    r = subprocess.run([sys.executable, "-c", COUNT, json.dumps(model.transformer)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    total, dual, single, vae = json.loads(r.stdout.splitlines()[-1])
    assert memory.transformer_parameters(model) == total
    assert memory.block_parameters(model)[0] == dual and memory.block_parameters(model)[-1] == single
    assert model.vae["parameters"] == vae
    assert model.transformer["in_channels"] == (32 if name == "skyreels-i2v" else 16)


def recipe(**kw):
    base = dict(height=480, width=480, frames=53, generations=24, sampling_steps=16, text_tokens=257,
                selective_checkpointing=1.0)
    return memory.Recipe(**{**base, **kw})


def test_the_video_tokens_and_the_trajectory_are_hunyuans():
    model = models.model_of("hunyuan")
    r = recipe()
    assert r.image_tokens == 14 * 30 * 30  # 53 frames -> 14 latent frames, 480/16 = 30
    assert model.latent_per_token == 16 * 2 * 2  # the noise's 16 channels in a 1x2x2 patch
    parts = dict(memory.estimate(model, r, memory.Options(world_size=32)).parts)
    assert parts["VideoAlign reward (bf16)"] == 2208985600 * 2 and parts["VAE (fp32)"] == 246478803 * 4
    assert "HPSv2 reward (fp32)" not in parts


def test_skyreels_first_frame_pipeline_by_placement():
    model, r = models.model_of("skyreels-i2v"), recipe(height=400, width=640, generations=8, guidance_batch=2)
    whole = sum(model.first_frame["parameters"].values()) * 2
    largest = max(model.first_frame["parameters"].values()) * 2
    assert 33 * 10**9 < whole < 34 * 10**9  # FLUX.1-dev, T5-XXL, CLIP-L, VAE in bf16: upstream's "34 GB a step"
    upstream = memory.estimate(model, r, memory.Options(world_size=32))
    kept = memory.estimate(model, r, memory.Options(world_size=32, first_frame="device"))
    offload = memory.estimate(model, r, memory.Options(world_size=32, first_frame="offload"))
    assert dict(upstream.parts)["activations, largest phase: condition"] == whole
    assert upstream.host_bytes_per_rank == offload.host_bytes_per_rank == whole and kept.host_bytes_per_rank == 0
    assert dict(kept.parts)["FLUX.1-dev pipeline (bf16), kept on the device"] == whole
    assert dict(offload.parts)["activations, largest phase: condition"] == largest
    assert offload.total < upstream.total < kept.total
    # HunyuanVideo has no first frame: no such phase, no host copy
    hunyuan = memory.estimate(models.model_of("hunyuan"), recipe(), memory.Options(world_size=32))
    assert hunyuan.host_bytes_per_rank == 0 and not any("condition" in what for what, _ in hunyuan.parts)


@pytest.mark.upstream
def test_plan_skyreels_offers_the_placements_with_their_launch_arguments(patched_tree, capsys):
    from dancegrpo_npu.cli import main

    status = main(["-C", str(patched_tree.project.root), "plan", "skyreels-i2v", "--world-size", "16"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "16 ranks, 400x640, 8 generations, 16 sampling steps, 257 text tokens, 53 frames" in out
    assert "host memory (the FLUX.1-dev pipeline between steps), per node of 8 ranks" in out
    assert "-- --flux_placement offload --selective_checkpointing 1.0" in out
    assert "LoRA rank 64:" in out and "upstream's SkyReels-I2V trainer has no LoRA option" in out


@pytest.mark.upstream
@pytest.mark.parametrize("name, ranks, gib, fits", [
    ("hunyuan", 8, 64, True), ("hunyuan", 8, 32, False), ("hunyuan", 32, 32, True),
    ("skyreels-i2v", 8, 64, False), ("skyreels-i2v", 32, 64, True), ("skyreels-i2v", 32, 32, False),
])
def test_what_fits_as_upstreams_recipe_runs(patched_tree, name, ranks, gib, fits):
    model, r, _, _ = models.load(name, patched_tree.tree)
    est = memory.estimate(model, r, memory.Options(world_size=ranks))
    assert memory.fits(est, gib * GiB) == fits, est.total / GiB
