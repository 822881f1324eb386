"""``plan hunyuan`` and ``plan skyreels-i2v``: HunyuanVideo's transformer (its parameters counted on
a meta-device build of diffusers' class), its float32 VAE decoding a video's tile of frames, the
VideoAlign reward, and SkyReels' FLUX.1-dev pipeline for the first frame, placed as
--flux_placement says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dancegrpo_npu.plan import memory, models
from dancegrpo_npu.plan.memory import GiB

REPO = Path(__file__).resolve().parents[2]

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


def _plan(capsys, root, *argv):
    from dancegrpo_npu.cli import main

    status = main(["-C", str(root), "plan", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.mark.upstream
@pytest.mark.parametrize("argv, together", [
    (["skyreels-i2v", "--device-memory", "32"], False),  # upstream's 32 ranks, checkpointing 1.0: what was advised
    (["qwenimage", "--device-memory", "8"], False),
    (["skyreels-i2v", "--device-memory", "36"], True),
    (["skyreels-i2v", "--device-memory", "40", "--world-size", "8"], True),
])
def test_the_advice_is_a_configuration_that_fits_and_not_the_one_asked(patched_tree, capsys, argv, together):
    """Where no option fits alone, the refusal names the options that fit together (plan with them
    added fits) or says that none does; it never advises what was asked."""
    root = patched_tree.project.root
    status, _, err = _plan(capsys, root, *argv)
    [line] = err.strip().splitlines()
    assert status == 1 and "none of the options fits alone" in line, line
    if not together:
        assert "nor together" in line and "use larger cards" in line and "e.g." not in line, line
        return
    added = line.split("fit together: ", 1)[1].split(" (", 1)[0].split()
    assert added and not set(added) & set(argv[1:]), line
    asked = dict(zip(argv[1::2], argv[2::2]))
    assert all(asked.get(flag) != value for flag, value in zip(added, added[1:]) if flag.startswith("--")), line
    status, out, err = _plan(capsys, root, *argv, *added)
    assert status == 0 and err == "", err


@pytest.mark.upstream
def test_nothing_fitting_says_so(patched_tree, capsys):
    status, _, err = _plan(capsys, patched_tree.project.root, "skyreels-i2v", "--device-memory", "4")
    [line] = err.strip().splitlines()
    assert status == 1 and "none of the options fits alone nor together" in line and "--world-size" not in line


@pytest.mark.upstream
def test_the_flux_placement_is_planned_as_asked(patched_tree, capsys):
    root = patched_tree.project.root
    model, recipe, world, _ = models.load("skyreels-i2v", patched_tree.tree)
    for where in ("upstream", "device", "offload"):
        status, out, err = _plan(capsys, root, "skyreels-i2v", "--flux-placement", where)
        assert err == "" or status == 1, err
        assert out.splitlines()[0].endswith(f"FLUX.1-dev pipeline: {where}"), out.splitlines()[0]
        total = memory.estimate(model, recipe, memory.Options(world_size=world, first_frame=where)).total
        assert f"{'total':<72} {total / GiB:>7.1f}" in out
        others = {f"--flux_placement {w}" for w in ("upstream", "device", "offload") if w != where}
        labels = {line.split(":")[0].strip() for line in out.split("launch arguments:")[1].splitlines() if ":" in line}
        assert others <= labels and f"--flux_placement {where}" not in labels, labels
        asked = next(line for line in out.splitlines() if line.strip().startswith("as asked:"))
        assert (f"--flux_placement {where}" in asked) == (where != "upstream"), asked


def test_a_flux_placement_for_a_trainer_without_a_first_frame_is_refused(capsys):
    status, out, err = _plan(capsys, REPO, "hunyuan", "--flux-placement", "device")
    [line] = err.strip().splitlines()
    assert status == 2 and out == "" and "--flux-placement: hunyuan's trainer has no first-frame pipeline" in line
    status, out, err = _plan(capsys, REPO, "skyreels-i2v", "--flux-placement", "gpu")
    assert status == 2 and out == "" and "upstream, device, offload" in err.replace("'", "")


@pytest.mark.upstream
def test_one_rank_is_one_rank(patched_tree, capsys):
    status, out, err = _plan(capsys, patched_tree.project.root, "skyreels-i2v", "--world-size", "1", "--ranks-per-node", "1")
    assert status == 1 and "1 ranks" not in out + err and ", 1 rank, " in out and "per node of 1 rank " in out
    assert "at 1 rank needs" in err
