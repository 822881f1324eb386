"""The FLUX.1-dev configs the flux family ships build the right shapes, and a bench that does not fit is refused.

Shapes are checked on the meta device: the full 11.9e9-parameter transformer costs no memory there.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.throughput import models, presets

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("hpsv2")

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30


@pytest.fixture(scope="module")
def full_configs():
    return models.model_configs(presets.PRESETS["flux-full"])


def count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_full_transformer_is_flux1_dev(full_configs):
    with torch.device("meta"):
        flux = models.build_transformer(full_configs[0])
    # FLUX.1-dev's transformer has 11.9e9 parameters
    assert abs(count(flux) - 11.9e9) / 11.9e9 < 0.01
    assert (len(flux.transformer_blocks), len(flux.single_transformer_blocks)) == (19, 38)
    assert tuple(flux.x_embedder.weight.shape) == (3072, 64)  # in_channels 64 -> 24 heads x 128
    assert tuple(flux.context_embedder.weight.shape) == (3072, 4096)  # T5-XXL's width
    assert flux.time_text_embed.text_embedder.linear_1.in_features == 768  # CLIP-L's pooled output
    assert hasattr(flux.time_text_embed, "guidance_embedder")  # FLUX.1-dev is guidance-distilled
    assert list(flux.pos_embed.axes_dim) == [16, 56, 56]
    assert flux.transformer_blocks[0].attn.heads == 24


def test_full_vae_is_flux1_devs(full_configs):
    with torch.device("meta"):
        vae = models.build_vae(full_configs[1])
    assert vae.config.latent_channels == 16 and vae.decoder.conv_in.in_channels == 16
    assert tuple(vae.config.block_out_channels) == (128, 256, 512, 512)
    assert (vae.config.scaling_factor, vae.config.shift_factor) == (0.3611, 0.1159)
    assert vae.quant_conv is None and vae.post_quant_conv is None
    assert abs(count(vae) - 83.8e6) / 83.8e6 < 0.01


def test_full_hps_is_vit_h_14(full_configs):
    with torch.device("meta"):
        hps = models.build_hps(full_configs[2], "meta", "fp32")[0]
    assert hps.visual.transformer.width == 1280 and len(hps.visual.transformer.resblocks) == 32
    assert hps.transformer.width == 1024 and len(hps.transformer.resblocks) == 24
    assert hps.visual.image_size == (224, 224)
    assert abs(count(hps) - 986e6) / 986e6 < 0.01  # open_clip's ViT-H-14


def test_cpu_preset_is_full_width_with_few_blocks():
    transformer, vae, hps = models.model_configs(presets.PRESETS["flux-cpu"])
    assert (transformer["num_layers"], transformer["num_single_layers"]) == (1, 1)
    assert transformer["num_attention_heads"] * transformer["attention_head_dim"] == 3072
    assert vae == models.shipped_config(presets.PRESETS["flux-full"].vae)
    assert (hps["vision_cfg"]["layers"], hps["text_cfg"]["layers"]) == (1, 1)
    assert (hps["vision_cfg"]["width"], hps["text_cfg"]["width"]) == (1280, 1024)


def test_configs_ship_as_package_data():
    """Every config file a preset names lies in a family's folder that the package data ships."""
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = package_data["dancegrpo_npu.trainers"]
    package = ROOT / "src" / "dancegrpo_npu" / "trainers"
    files = {f for p in presets.PRESETS.values() for f in (p.transformer, p.vae) if f is not None}
    assert files
    for path in files:
        relative = path.relative_to(package)
        assert path.is_file() and any(relative.match(p) for p in patterns), relative


@functools.cache
def counted(preset: str):
    configs = models.model_configs(presets.PRESETS[preset])
    return configs, models.count_parameters(configs)


def estimate(preset: str, tree, batch_sizes=(1,), weight_bytes=2):
    """The memory estimate of ``preset`` at upstream's recipe sizes, read from the patched ``tree``."""
    found = presets.PRESETS[preset]
    config = presets.resolve({"trainer": found.trainer, "size": found.size}, tree)
    configs, counts = counted(preset)
    return models.estimate_memory(counts, configs, config.sizes, batch_sizes, config.decode_chunk, weight_bytes)


@pytest.mark.upstream
def test_full_preset_needs_the_weights_four_times_over(patched_tree):
    e = estimate("flux-full", patched_tree.tree, (1, 4, 12))
    transformer = 11901408320
    assert e.weights > transformer * 2 * 4  # bf16 weights, gradients, AdamW's two moments
    assert 95 * GiB < e.total < 125 * GiB  # fits an 80 GiB card? no; a 141 GiB H200: yes
    assert estimate("flux-full", patched_tree.tree, (12,)).activations > estimate("flux-full", patched_tree.tree, (1,)).activations


def test_check_fits_refuses_with_what_to_do():
    e = models.MemoryEstimate(weights=100 * GiB, activations=10 * GiB)
    models.check_fits(e, 200 * GiB, "free cuda memory", "flux-full", "cuda")  # fits: nothing happens
    models.check_fits(e, None, "available RAM (unknown here)", "flux-full", "cpu")  # unknown: not refused
    with pytest.raises(DancegrpoError) as err:
        models.check_fits(e, 50 * GiB, "available RAM", "flux-full", "cpu")
    line = err.value.one_line()
    assert err.value.exit_code == 2
    assert "needs about 110.0 GiB on cpu" in line and "only 50.0 GiB is available RAM" in line
    assert "--size cpu" in line and "--height" not in line  # sizes cannot help when the weights alone do not fit
    with pytest.raises(DancegrpoError) as err:
        models.check_fits(e, 115 * GiB, "free cuda memory", "flux-full", "cuda")
    assert "--size cpu" in err.value.one_line() and "--height/--width" in err.value.one_line()


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no /proc/meminfo")


@pytest.mark.upstream
def test_full_preset_on_this_cpu_is_refused_up_front(patched_tree, tmp_path):
    needs = estimate("flux-full", patched_tree.tree, weight_bytes=4).total  # fp32 on the CPU
    if mem_available() > needs * models.HEADROOM:
        pytest.skip(f"this machine has more than the {needs / GiB:.0f} GiB the full preset needs on its CPU")
    r = subprocess.run(
        [sys.executable, "-m", "dancegrpo_npu", "-C", str(patched_tree.project.root), "bench", "--device", "cpu",
         "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=900, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("dancegrpo-npu: error: bench: flux-full needs about ")
    assert "GiB is available RAM; use --size cpu (fewer blocks) or a device with more memory" in last
    assert "building the models" not in r.stderr  # refused before anything was built
    assert not (tmp_path / "runs").exists()  # and before its run directory was made
