"""``dancegrpo-npu plan sd``: Stable Diffusion v1.4's UNet under DDP.

The counts are checked against the real classes on the meta device (UNet2DConditionModel, the
SD VAE, CLIP ViT-L's text encoder), the activations against what the real UNet keeps for
backward on the meta device, and the recipe sizes are read from the absl / ml_collections
configuration the script names in the tree (a synthetic tree here; the real one in
tests/plan/test_memory_plan.py's upstream tests).
"""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import pytest

from dancegrpo_npu.cli import main
from dancegrpo_npu.plan import memory, models
from dancegrpo_npu.plan.memory import GiB

REPO = Path(__file__).resolve().parents[2]
SD = "sd"

# SD v1.4's VAE (vae/config.json) and text encoder (text_encoder/config.json): the counts the
# plan ships are these classes' on the meta device
SD_VAE = dict(block_out_channels=[128, 256, 512, 512], down_block_types=["DownEncoderBlock2D"] * 4,
              up_block_types=["UpDecoderBlock2D"] * 4, latent_channels=4, layers_per_block=2, sample_size=512)
CLIP_L = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
              max_position_embeddings=77, vocab_size=49408, projection_dim=768)


def test_the_counts_are_the_real_classes():
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    model = models.model_of(SD)
    cfg = {k: v for k, v in model.transformer.items() if not k.startswith("_")}
    with torch.device("meta"):
        unet, vae = UNet2DConditionModel(**cfg), AutoencoderKL(**SD_VAE)
        text = CLIPTextModel(CLIPTextConfig(**CLIP_L))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert memory.denoiser_parameters(model) == memory.unet_parameters(model.transformer) == count(unet) == 859_520_964
    assert model.vae["parameters"] == count(vae) and model.text_encoder["parameters"] == count(text)
    assert (model.vae["first_channels"], model.vae["widest_channels"]) == (128, 512)


def _saved_on_meta(cfg: dict, side: int) -> int:
    """Bytes the real UNet's forward keeps for backward (one sample, fp32, on the meta device),
    each storage once, without its parameters and without the attention scores (the meta
    device runs the math attention; the plan assumes a fused kernel, which keeps none)."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**cfg)
    params = {p.untyped_storage()._cdata for p in unet.parameters()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        unet(torch.randn(1, 4, side, side, device="meta"), torch.tensor([500], device="meta"),
             torch.randn(1, 77, cfg["cross_attention_dim"], device="meta"))
    tokens = {side * side >> 2 * i for i in range(len(cfg["block_out_channels"]))}
    heads = cfg["attention_head_dim"]
    storages = {}
    for t in saved:
        s = t.untyped_storage()
        scores = t.dim() >= 3 and t.shape[-3] == heads and t.shape[-2] in tokens and t.shape[-1] in tokens | {77}
        if s._cdata not in params and not scores:
            storages[s._cdata] = s.nbytes()
    return sum(storages.values())


@pytest.mark.parametrize("side", [64, 16])
def test_the_activations_are_what_the_real_unet_keeps(side):
    """At SD's 64x64 latents (512x512) and at 16x16: the layer-by-layer count within 10% of the
    real class's saved tensors (it counts 4-5% more: a few tensors it counts twice are shared)."""
    model = models.model_of(SD)
    cfg = {k: v for k, v in model.transformer.items() if not k.startswith("_")}
    norm, other = memory.unet_saved(model.transformer, side, side, 77)
    measured = _saved_on_meta(cfg, side)
    assert measured <= 4 * (norm + other) <= 1.10 * measured, (4 * (norm + other) / GiB, measured / GiB)


def test_an_unknown_unet_block_is_not_counted():
    cfg = {**models.model_of(SD).transformer, "down_block_types": ["SimpleCrossAttnDownBlock2D"] * 4}
    with pytest.raises(ValueError, match="SimpleCrossAttnDownBlock2D"):
        memory.unet_parameters(cfg)


# ---- the recipe, read from the configuration in a tree ------------------------------------------

SCRIPT = """\
mkdir images_same
torchrun --nproc_per_node={nproc} --master_port 19001 \\
fastvideo/train_grpo_sd.py --config fastvideo/config_sd/dgx.py:{name}
"""
# a stand-in for upstream's configuration (tests only), loaded as absl loads it
CONFIG = """\
import ml_collections


def hpsv2():
    config = ml_collections.ConfigDict()
    config.num_generations = {generations}
    config.sample = ml_collections.ConfigDict(dict(num_steps={steps}, batch_size={prompts}, guidance_scale=5.0))
    config.train = ml_collections.ConfigDict(dict(batch_size={batch}, gradient_accumulation_steps={accumulation}, cfg=True))
    return config


def get_config(name):
    return globals()[name]()
"""


def _sd_tree(root: Path, *, nproc=8, name="hpsv2", generations=16, steps=50, prompts=4, batch=4, accumulation=8) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "upstream.lock").write_text((REPO / "upstream.lock").read_text())
    tree = root / "build" / "DanceGRPO"
    (tree / "scripts" / "finetune").mkdir(parents=True)
    (tree / "fastvideo" / "config_sd").mkdir(parents=True)
    script = models.entry(SD)["recipe"]["script"]
    (tree / script).write_text(SCRIPT.format(nproc=nproc, name=name))
    (tree / "fastvideo/config_sd/dgx.py").write_text(
        CONFIG.format(generations=generations, steps=steps, prompts=prompts, batch=batch, accumulation=accumulation))
    return root


def _plan(capsys, root, *argv):
    status = main(["-C", str(root), "plan", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_the_sizes_are_read_from_the_configuration_the_script_names(tmp_path, capsys):
    status, out, err = _plan(capsys, _sd_tree(tmp_path / "a"), SD)
    assert status == 0 and err == "", err
    assert ("(UNet2DConditionModel, 0.86e9 parameters, DDP: the whole model on every rank), 8 ranks, 512x512, "
            "4 prompts x 16 generations, 50 sampling steps, 77 text tokens, no activation checkpointing, "
            "train batch 4, accumulation 8, classifier-free guidance") in out
    assert "UNet batch 8, no checkpointing" in out
    # other values in the configuration are what the plan shows: read, not shipped
    status, out, _ = _plan(capsys, _sd_tree(tmp_path / "b", nproc=4, generations=8, steps=20, prompts=2, batch=2,
                                            accumulation=3), SD)
    assert status == 0 and "4 ranks, 512x512, 2 prompts x 8 generations, 20 sampling steps" in out
    assert "train batch 2, accumulation 3" in out and "UNet batch 4," in out


def test_ddp_holds_the_whole_model_on_every_rank(tmp_path):
    model, recipe, world, _ = models.load(SD, _sd_tree(tmp_path) / "build" / "DanceGRPO")
    params = 859_520_964
    at8 = dict(memory.estimate(model, recipe, memory.Options(world_size=8)).parts)
    at32 = dict(memory.estimate(model, recipe, memory.Options(world_size=32)).parts)
    assert at8 == at32  # nothing sharded
    weights = next(v for k, v in at8.items() if k.startswith("fp32 weights"))
    buckets = next(v for k, v in at8.items() if k.startswith("DDP gradient buckets"))
    assert weights == buckets == 4 * params and at8["AdamW moments (2 x fp32)"] == 8 * params
    assert at8["autocast's bf16 copy of the weights"] == 2 * params
    assert at8["text encoder (bf16)"] == 2 * 123_060_480
    # the training call's batch: train.batch_size, doubled by CFG
    one = memory.replace(recipe, train_batch_size=1)
    train = lambda r: next(v for k, v in memory.estimate(model, r, memory.Options(world_size=8)).parts  # noqa: E731
                           if k.startswith("activations, largest phase: train"))
    norm, other = memory.unet_saved(model.transformer, 64, 64, 77)
    assert train(recipe) - train(one) == 3 * 2 * (4 * norm + 2 * other)


def test_it_fits_64_gib_and_a_910b4_with_a_train_batch_of_1(tmp_path, capsys):
    root = _sd_tree(tmp_path)
    status, out, err = _plan(capsys, root, SD)
    assert status == 0
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("as asked "))
    assert row[-2:] == ["fits", "no"]
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("train batch 1, accumulation 32 "))
    assert row[-2:] == ["fits", "fits"]
    assert "FSDP CPU offload" not in out  # no FSDP: not an option to list
    assert "(none: the trainer has no activation checkpointing option)" in out
    assert "--selective_checkpointing" not in out
    status, out, err = _plan(capsys, root, SD, "--device-memory", "32")
    [line] = err.strip().splitlines()
    assert status == 1 and "the device has 32 GiB" in line
    assert ("these fit: train batch 1, accumulation 32 (" in line and f"dancegrpo-npu launch {SD} --nproc-per-node 8 -- "
            "--config.train.batch_size=1 --config.train.gradient_accumulation_steps=32)" in line)
    assert "LoRA" not in line and "ranks" not in line.split("these fit:")[1]
    status, _, err = _plan(capsys, root, SD, "--device-memory", "16")
    assert status == 1 and "under DDP every rank holds the whole model" in err


def test_the_train_batch_line_is_one_launch_takes(tmp_path, capsys):
    from dancegrpo_npu.cli import build_parser
    from dancegrpo_npu.commands import launch as launch_cmd

    _, out, _ = _plan(capsys, _sd_tree(tmp_path), SD)
    line = next(line for line in out.splitlines() if line.strip().startswith("train batch 1, accumulation 32:"))
    args = build_parser().parse_args(shlex.split(line.split("dancegrpo-npu ", 1)[1]))
    script, upstream = launch_cmd._parse_words(args)
    assert script == SD and upstream == ["--config.train.batch_size=1", "--config.train.gradient_accumulation_steps=32"]


def test_a_missing_or_broken_configuration_is_one_line(tmp_path, capsys):
    root = _sd_tree(tmp_path / "gone")
    (root / "build/DanceGRPO/fastvideo/config_sd/dgx.py").unlink()
    status, out, err = _plan(capsys, root, SD)
    [line] = err.strip().splitlines()
    assert status == 1 and out == "" and "dgx.py:hpsv2" in line and "cannot be loaded" in line
    root = _sd_tree(tmp_path / "other", name="nosuch")
    status, out, err = _plan(capsys, root, SD)
    [line] = err.strip().splitlines()
    assert status == 1 and "Traceback" not in err and "dgx.py:nosuch" in line
    root = _sd_tree(tmp_path / "field")
    path = root / "build/DanceGRPO/fastvideo/config_sd/dgx.py"
    path.write_text(path.read_text().replace("config.num_generations", "config.generations"))
    status, out, err = _plan(capsys, root, SD)
    [line] = err.strip().splitlines()
    assert status == 1 and "has no usable num_generations" in line


def test_without_ml_collections_it_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ml_collections", None)  # import ml_collections raises ImportError
    status, out, err = _plan(capsys, _sd_tree(tmp_path), SD)
    [line] = err.strip().splitlines()
    assert status == 1 and out == "" and "needs ml_collections" in line and "pip install ml-collections" in line


def test_a_checkpointing_fraction_is_refused_for_a_trainer_without_it(tmp_path, capsys):
    for root in (_sd_tree(tmp_path / "tree"), REPO):  # refused before the tree is looked for
        status, out, err = _plan(capsys, root, SD, "--selective-checkpointing", "1.0")
        [line] = err.strip().splitlines()
        assert status == 2 and out == "" and "has no activation checkpointing" in line


def test_plans_help_names_it():
    from dancegrpo_npu.cli import build_parser

    plan_parser = build_parser()._subparsers._group_actions[0].choices["plan"]
    assert SD in plan_parser.format_help()


def test_doctors_disk_check_counts_the_unet():
    """doctor sizes a resume checkpoint from plan's shapes: the UNet's parameters, not a transformer's."""
    from dancegrpo_npu.doctor import trainers as doctor_trainers

    assert doctor_trainers.resume_checkpoint_bytes(SD) == int(
        859_520_964 * doctor_trainers.RESUME_BYTES_PER_PARAMETER * doctor_trainers.SAVE_MARGIN)


@pytest.mark.parametrize("argv, says", [
    (["--cpu-offload"], "--cpu-offload: sd's trainer has no FSDP CPU offload"),
    (["--lora-rank", "8"], "--lora-rank 8: upstream's LoRA path (config.use_lora)"),
])
def test_options_the_trainer_lacks_are_refused(tmp_path, capsys, argv, says):
    for root in (_sd_tree(tmp_path / "tree"), REPO):  # refused before the tree is looked for
        status, out, err = _plan(capsys, root, SD, *argv)
        [line] = err.strip().splitlines()
        assert status == 2 and out == "" and says in line, err


def test_what_a_trainer_lacks_is_its_rows_not_its_names(tmp_path, capsys, monkeypatch):
    """A row without an offload flag or a LoRA variant is refused those options, whatever its name;
    SD's row given them is planned with them."""
    from dataclasses import replace

    from dancegrpo_npu import registry
    monkeypatch.setitem(registry.REGISTRY, "flux", replace(registry.REGISTRY["flux"], offload_flag=None, lora=None,
                                                           no_lora="no LoRA in this row"))
    for argv, says in ((["--cpu-offload"], "has no FSDP CPU offload"), (["--lora-rank", "8"], "no LoRA in this row")):
        status, out, err = _plan(capsys, REPO, "flux", *argv)
        assert status == 2 and out == "" and says in err, err
    monkeypatch.setitem(registry.REGISTRY, SD, replace(registry.REGISTRY[SD], offload_flag="--use_cpu_offload"))
    status, out, err = _plan(capsys, _sd_tree(tmp_path / "tree"), SD, "--cpu-offload")
    assert "--cpu-offload" not in err and "CPU offload" in out.splitlines()[0], err
