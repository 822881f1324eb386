"""``dancegrpo-npu plan``: the per-rank memory estimate, its counts, and its refusals.

The counts are checked against the real classes built on the meta device; the upstream rule
for which blocks are checkpointed against upstream's own function; the estimate against the
peaks ``bench`` measured (the live tiny run is in tests/throughput/test_bench.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dancegrpo_npu.cli import main
from dancegrpo_npu.plan import memory, models
from dancegrpo_npu.plan.memory import GiB

REPO = Path(__file__).resolve().parents[2]


def _plan(capsys, patched_tree, *argv):
    """``dancegrpo-npu plan ARGV`` in the project of ``patched_tree`` (the upstream fixture: the
    recipe sizes are read from its scripts), or, with None, in this checkout (no patched tree)."""
    where = ["-C", str(patched_tree.project.root)] if patched_tree is not None else []
    status = main([*where, "plan", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def _meta_count(cls, config: dict) -> int:
    import torch

    with torch.device("meta"):
        built = cls(**{k: v for k, v in config.items() if not k.startswith("_")})
    return sum(p.numel() for p in built.parameters())


def test_flux_counts_are_the_real_classes():
    from diffusers import FluxTransformer2DModel

    model = models.model_of("flux")
    assert memory.transformer_parameters(model) == _meta_count(FluxTransformer2DModel, model.transformer) == 11_901_408_320


def test_qwen_image_counts_are_the_real_classes():
    """Built on the meta device by the diffusers-0.35 set's interpreter (the suite's has 0.32)."""
    import json

    from depset_035 import diffusers_035_python

    python = diffusers_035_python()
    model = models.model_of("qwenimage")
    snippet = (
        "import json, sys, torch\n"
        "from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel\n"
        "cfg = {k: v for k, v in json.loads(sys.argv[1]).items() if not k.startswith('_')}\n"
        "with torch.device('meta'):\n"
        "    t, v = QwenImageTransformer2DModel(**cfg), AutoencoderKLQwenImage()\n"
        "print(json.dumps([sum(p.numel() for p in m.parameters()) for m in (t, v)]))\n"
    )
    r = subprocess.run([python, "-c", snippet, json.dumps(model.transformer)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    transformer, vae = json.loads(r.stdout.splitlines()[-1])
    assert memory.transformer_parameters(model) == transformer == 20_430_401_088
    assert model.vae["parameters"] == vae


@pytest.mark.upstream
def test_checkpointed_blocks_follow_upstreams_rule(patched_tree):
    """upstream's apply_fsdp_checkpointing on a toy model: how many blocks it wraps, per fraction."""
    snippet = """
import sys, torch
from fastvideo.utils.fsdp_util import apply_fsdp_checkpointing
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
class Block(torch.nn.Linear):
    pass
out = []
for blocks, p in ((60, 0.5), (60, 1.0), (60, 0.0), (57, 1/3), (7, 0.25)):
    model = torch.nn.Sequential(*[Block(2, 2) for _ in range(blocks)])
    apply_fsdp_checkpointing(model, Block, p)
    out.append(sum(isinstance(m, CheckpointWrapper) for m in model.modules()))
print(out)
"""
    r = subprocess.run([sys.executable, "-c", snippet], cwd=patched_tree.tree, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(patched_tree.tree)), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    theirs = eval(r.stdout.strip().splitlines()[-1])
    ours = [memory.checkpointed_blocks(b, p) for b, p in ((60, 0.5), (60, 1.0), (60, 0.0), (57, 1 / 3), (7, 0.25))]
    assert ours == theirs and theirs[:3] == [30, 60, 0]


# The peaks bench measured on the CPU (float32, peak RSS, the largest phase), as docs/throughput.md
# and docs/memory-plan.md give them: (preset, bench's sizes, measured GiB).
MEASURED_ON_CPU = (
    ("flux-cpu", dict(height=128, width=128, generations=4, sampling_steps=4, text_tokens=64), 10.13),
    ("flux-tiny", dict(height=64, width=64, generations=4, sampling_steps=4, text_tokens=512), 0.894),
)


@pytest.mark.parametrize("preset,sizes,measured_gib", MEASURED_ON_CPU, ids=[m[0] for m in MEASURED_ON_CPU])
def test_estimate_against_the_peaks_bench_measured(preset, sizes, measured_gib):
    pytest.importorskip("hpsv2", reason="the bench's HPS model is built from hpsv2's open_clip")
    from dancegrpo_npu.throughput import models as bench_models
    from dancegrpo_npu.throughput.presets import PRESETS

    configs = bench_models.model_configs(PRESETS[preset])
    model = models.from_bench(preset, configs, bench_models.count_parameters(configs))
    recipe = memory.Recipe(selective_checkpointing=1.0, **sizes)
    estimate = memory.estimate(model, recipe, memory.bench_on_cpu())
    assert abs(estimate.total / GiB - measured_gib) <= 0.25 * measured_gib, (estimate.total / GiB, measured_gib)


@pytest.mark.upstream
def test_sharding_divides_the_weights_and_checkpointing_shrinks_the_activations(patched_tree):
    model, recipe, _, _ = models.load("qwenimage", patched_tree.tree)
    at8 = dict(memory.estimate(model, recipe, memory.Options(world_size=8)).parts)
    at16 = dict(memory.estimate(model, recipe, memory.Options(world_size=16)).parts)
    assert at8["fp32 master weights"] == 4 * 20_430_401_088 // 8 and at16["AdamW moments (2 x fp32)"] * 2 == at8["AdamW moments (2 x fp32)"]
    half = memory.estimate(model, recipe, memory.Options(world_size=8))
    full = memory.estimate(model, memory.Recipe(**{**recipe.__dict__, "selective_checkpointing": 1.0}), memory.Options(world_size=8))
    assert (half.checkpointed_blocks, full.checkpointed_blocks) == (30, 60)
    assert half.parts[-2][1] > 8 * full.parts[-2][1] > 0  # activations: 30 blocks kept against none
    offload = memory.estimate(model, recipe, memory.Options(world_size=8, cpu_offload=True))
    assert offload.host_bytes_per_rank == 16 * 20_430_401_088 // 8 and offload.total < half.total - 35 * GiB


@pytest.mark.upstream
def test_upstreams_qwen_image_recipe_fits_64_gib_but_not_a_910b4(patched_tree, capsys):
    status, out, err = _plan(capsys, patched_tree, "qwenimage")
    assert status == 0 and err == ""
    assert "20.43e9 parameters, 60 blocks), 8 ranks, 720x720, 12 generations" in out
    assert "30 of 60 blocks checkpointed" in out and "runtime reserve (an assumption" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("16 ranks, selective"))
    assert row[-2:] == ["fits", "fits"]
    assert ("dancegrpo-npu launch qwenimage --nproc-per-node 8 --nnodes 2 --node-rank $NODE_RANK --master-addr $MASTER_ADDR "
            "-- --selective_checkpointing 1.0") in out


@pytest.mark.upstream
def test_what_does_not_fit_is_refused_in_one_line_naming_what_would(patched_tree, capsys):
    status, out, err = _plan(capsys, patched_tree, "qwenimage", "--device-memory", "32")
    assert status == 1 and out  # the plan itself is printed, then the refusal
    [line] = err.strip().splitlines()
    assert line.startswith("dancegrpo-npu: error: plan: qwenimage at 8 ranks needs about 57.") and "the device has 32 GiB" in line
    assert "these fit: 16 ranks, selective checkpointing 1.0 (29." in line
    assert "dancegrpo-npu launch qwenimage --nproc-per-node 8 --nnodes 2 --node-rank $NODE_RANK" in line
    # the port honours the Qwen-Image trainers' --use_cpu_offload; they have no LoRA, which is not offered
    assert "FSDP CPU offload (" in line and "launch qwenimage --nproc-per-node 8 -- --use_cpu_offload" in line
    assert "LoRA" not in line
    status, _, err = _plan(capsys, patched_tree, "flux", "--device-memory", "32")
    assert status == 1 and "FSDP CPU offload (" in err and "launch flux --nproc-per-node 8 -- --use_cpu_offload" in err
    status, _, err = _plan(capsys, patched_tree, "qwenimage", "--device-memory", "4")
    [line] = err.strip().splitlines()
    assert status == 1 and "none of the options fits alone" in line


@pytest.mark.parametrize("argv,expected", [
    (["qwen"], "plan: unknown model 'qwen'"),
    (["qwenimage", "--world-size", "0"], "--world-size 0 is below 1"),
    (["qwenimage", "--height", "100"], "--height 100 is not a positive multiple of 16"),
    (["qwenimage", "--selective-checkpointing", "2"], "--selective-checkpointing 2 is not in [0, 1]"),
    (["qwenimage", "--device-memory", "0"], "--device-memory 0 is not positive"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, expected):
    status, out, err = _plan(capsys, None, *argv)
    assert status == 2 and out == "" and expected in err and len(err.strip().splitlines()) == 1


@pytest.mark.upstream
def test_a_sample_batch_size_must_divide_the_recipes_generations(patched_tree, capsys):
    status, out, err = _plan(capsys, patched_tree, "qwenimage", "--sample-batch-size", "5")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--sample-batch-size 5 does not divide 12 generations" in err


# Every option of plan that takes a number, and a valid value of it (the refusals must come from the value).
NUMERIC_OPTIONS = ("--world-size", "--ranks-per-node", "--device-memory", "--lora-rank", "--reserve",
                   "--selective-checkpointing", "--height", "--width", "--generations", "--sampling-steps",
                   "--text-tokens", "--sample-batch-size")


def test_the_numeric_options_are_all_covered():
    from dancegrpo_npu.cli import build_parser

    plan_parser = build_parser()._subparsers._group_actions[0].choices["plan"]
    numeric = {o for a in plan_parser._actions if a.type in (int, float) for o in a.option_strings}
    assert numeric == set(NUMERIC_OPTIONS)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "-0.5"])
@pytest.mark.parametrize("option", NUMERIC_OPTIONS)
def test_nan_inf_and_negative_values_are_one_line_exit_2(capsys, option, value):
    status, out, err = _plan(capsys, None, "qwenimage", f"{option}={value}")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and option in err, err


@pytest.mark.upstream
def test_the_reserve_is_in_the_total_and_says_so(patched_tree, capsys):
    status, out, _ = _plan(capsys, patched_tree, "qwenimage", "--reserve", "5")
    table = out.split("per rank, as asked")[1].split("\n\n")[0].splitlines()[1:]
    rows = {line[:74].strip(): float(line[74:]) for line in table}
    total = rows.pop("total")
    reserve = next(k for k in rows if k.startswith("runtime reserve"))
    assert rows[reserve] == 5.0 and "not counted" not in reserve and "in the total" in reserve
    assert abs(sum(rows.values()) - total) <= 0.05 * len(rows)  # the rows are rounded to 0.1
    without = dict(memory.estimate(*models.load("qwenimage", patched_tree.tree)[:2], memory.Options(world_size=8, reserve_bytes=0)).parts)
    assert abs(total - sum(without.values()) / GiB - 5.0) <= 0.05  # the total is rounded to 0.1


@pytest.mark.upstream
def test_options_a_trainer_lacks_are_not_marked_as_fitting(patched_tree, capsys):
    status, out, _ = _plan(capsys, patched_tree, "qwenimage")
    lora_rows = [line.split() for line in out.splitlines() if line.strip().startswith("LoRA rank 64") and "GiB" not in line
                 and "launch" not in line and "none:" not in line]
    assert len(lora_rows) == 2 and all("fits" not in row for row in lora_rows), lora_rows
    _, out, _ = _plan(capsys, patched_tree, "flux")
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("LoRA rank 64") and "fits" in line)
    assert row[-2:] == ["fits", "fits"]


@pytest.mark.upstream
def test_a_several_node_launch_line_is_one_launch_accepts(patched_tree, capsys):
    """Run on each node with its NODE_RANK and node 0's MASTER_ADDR, the printed line passes
    launch's own checks of the node options (it needs --node-rank and --master-addr)."""
    import shlex

    from dancegrpo_npu.cli import build_parser
    from dancegrpo_npu.commands import launch as launch_cmd
    from dancegrpo_npu.run.launch import check_spec
    from dancegrpo_npu.run.plan import LaunchSpec

    _, out, _ = _plan(capsys, patched_tree, "qwenimage")
    line = next(line for line in out.splitlines() if line.strip().startswith("16 ranks:"))
    command = line.split("dancegrpo-npu ", 1)[1]
    for node_rank in ("0", "1"):
        words = shlex.split(command.replace("$NODE_RANK", node_rank).replace("$MASTER_ADDR", "192.0.2.7"))
        args = build_parser().parse_args(words)
        script, upstream = launch_cmd._parse_words(args)
        spec = LaunchSpec(script=script, args=tuple(upstream), nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
                          node_rank=args.node_rank, master_addr=args.master_addr)
        check_spec(spec)
        assert (spec.nnodes, spec.node_rank, spec.nproc_per_node) == (2, int(node_rank), 8)


@pytest.mark.upstream
def test_the_edit_model_shares_the_transformer_and_doubles_the_image_tokens(patched_tree):
    edit, edit_recipe, _, script = models.load("qwenimage-edit", patched_tree.tree)
    base, *_ = models.load("qwenimage", patched_tree.tree)
    assert edit.transformer == base.transformer and edit.reference_image_tokens and script.endswith("edit_grpo.sh")
    assert (edit_recipe.height, edit_recipe.generations, edit_recipe.selective_checkpointing) == (512, 8, 1.0)
    doubled = memory.estimate(edit, edit_recipe, memory.Options(world_size=8))
    single = memory.estimate(base, edit_recipe, memory.Options(world_size=8))
    assert doubled.parts[-2][1] > single.parts[-2][1]


@pytest.mark.upstream
def test_the_launch_lines_name_flags_the_trainers_have(patched_tree, capsys):
    """Every trainer flag a launch line prints is one its script's argparse defines."""
    import re

    from dancegrpo_npu.registry import REGISTRY as SCRIPTS

    for model in ("flux", "qwenimage", "qwenimage-edit", "wan"):
        for extra in ([], ["--lora-rank", "128"]) if SCRIPTS[model].lora else ([],):  # a row without LoRA: refused
            status = main(["-C", str(patched_tree.project.root), "plan", model, *extra])
            out = capsys.readouterr().out
            assert status == 0, model
            for line in re.findall(r"dancegrpo-npu launch (\S+) [^\n]*? -- ([^\n;)]*)", out):
                trainer, flags = line
                script = {"qwenimage": "fastvideo/train_grpo_qwenimage.py",
                          "qwenimage-edit": "fastvideo/train_grpo_qwenimage_edit.py"}.get(trainer) or SCRIPTS[trainer].relpath
                source = (patched_tree.tree / script).read_text()
                for flag in re.findall(r"--\w+", flags):
                    assert f'"{flag}"' in source, (trainer, flag)


# ------------------------------------------------------------------ FLUX's EMA, Wan


@pytest.mark.upstream
def test_fluxs_ema_copy_on_rank_0_is_counted(patched_tree, capsys):
    """Upstream's FSDP_EMA (the 8-rank recipe's --use_ema) holds a full fp32 copy of the
    transformer on rank 0, in host memory, and gathers the full state dict there at each update."""
    status, out, _ = _plan(capsys, patched_tree, "flux")
    assert status == 0
    rows = [line for line in out.splitlines() if line.strip().startswith("rank 0 host memory")]
    copy = 4 * 11_901_408_320 / GiB
    assert len(rows) == 3 and "EMA copy" in rows[0] and "--use_ema" in rows[0]
    assert float(rows[0].split()[-1]) == round(copy, 1) and float(rows[-1].split()[-1]) == round(2 * copy, 1)
    model, recipe, _, _ = models.load("flux", patched_tree.tree)
    assert recipe.ema and sum(b for _, b in memory.estimate(model, recipe, memory.Options(world_size=8)).rank0_host) == 8 * 11_901_408_320
    lora = memory.estimate(model, recipe, memory.Options(world_size=8, lora_rank=64))
    assert lora.rank0_host == ()  # the LoRA trainer's recipe keeps no EMA
    _, out, _ = _plan(capsys, patched_tree, "qwenimage")
    assert "rank 0 host memory" not in out  # its recipe has no --use_ema


WAN_SCRIPT = """\
torchrun --nproc_per_node={nproc} --master_port 19002 \\
    fastvideo/train_grpo_wan_2_1.py \\
    --seed 42 \\
    --gradient_checkpointing \\
    --train_batch_size 2 \\
    --h {h} \\
    --w {w} \\
    --t 1 \\
    --sampling_steps {steps} \\
    --num_generations {generations} \\
    --use_group
"""
# a stand-in for the trainer's argparse (tests only): the defaults the script leaves to it
WAN_TRAINER = """\
parser.add_argument("--selective_checkpointing", type=float, default=1.0)
parser.add_argument(
    "--cfg_infer",
    type = float,
    default=5.0,
)
"""


def _wan_tree(root, **sizes):
    import textwrap

    root.mkdir(exist_ok=True)
    (root / "upstream.lock").write_text((REPO / "upstream.lock").read_text())
    tree = root / "build" / "DanceGRPO"
    (tree / "scripts" / "finetune").mkdir(parents=True)
    (tree / "fastvideo").mkdir()
    (tree / "scripts/finetune/finetune_wan_2_1_grpo.sh").write_text(WAN_SCRIPT.format(**sizes))
    (tree / "fastvideo/train_grpo_wan_2_1.py").write_text(textwrap.dedent(WAN_TRAINER))
    return root


def test_wan_reads_its_recipe_from_upstreams_script_in_the_tree(tmp_path, capsys):
    root = _wan_tree(tmp_path, nproc=8, h=512, w=512, steps=20, generations=12)
    status = main(["-C", str(root), "plan", "wan"])
    out, err = capsys.readouterr()
    assert status == 0 and err == "", err
    assert "plan: wan (WanTransformer3DModel, 1.42e9 parameters, 30 blocks), 8 ranks, 512x512, 12 generations" in out
    assert "20 sampling steps, 512 text tokens, 1 frame, selective checkpointing 1.0, classifier-free guidance" in out
    assert "dancegrpo-npu launch wan --nproc-per-node 8 -- --use_cpu_offload" in out
    assert "(none: upstream's Wan trainer has no LoRA option)" in out
    # other sizes in the script are what the plan shows: read, not shipped
    other = _wan_tree(tmp_path / "other", nproc=4, h=256, w=320, steps=8, generations=6)
    assert main(["-C", str(other), "plan", "wan"]) == 0
    assert "4 ranks, 256x320, 6 generations, 8 sampling steps" in capsys.readouterr().out
    # without the tree: one line naming what to run
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "upstream.lock").write_text((REPO / "upstream.lock").read_text())
    assert main(["-C", str(tmp_path / "bare"), "plan", "wan"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "finetune_wan_2_1_grpo.sh" in line and "dancegrpo-npu apply" in line


def test_wan_counts_are_the_real_classes():
    """Built on the meta device by the diffusers-0.35 set's interpreter (0.32 has no Wan)."""
    import json

    from depset_035 import diffusers_035_python

    model = models.model_of("wan")
    snippet = (
        "import json, sys, torch\n"
        "from diffusers import AutoencoderKLWan, WanTransformer3DModel\n"
        "t, v = ({k: x for k, x in json.load(open(f)).items() if not k.startswith('_')} for f in sys.argv[1:])\n"
        "with torch.device('meta'):\n"
        "    t, v = WanTransformer3DModel(**t), AutoencoderKLWan(**v)\n"
        "print(json.dumps([sum(p.numel() for p in m.parameters()) for m in (t, v, t.blocks[0])]))\n"
    )
    files = [str(models.config_file("wan", k)) for k in ("denoiser", "vae")]
    r = subprocess.run([diffusers_035_python(), "-c", snippet, *files], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    transformer, vae, block = json.loads(r.stdout.splitlines()[-1])
    assert memory.transformer_parameters(model) == transformer == 1_418_996_800
    assert memory.block_parameters(model)[0] == block and model.vae["parameters"] == vae
    assert (model.vae["first_channels"], model.vae["widest_channels"]) == (96, 384)


# Upstream's recipe sizes at the locked commit, as each model's script in the patched tree holds
# them: (world size, height, width, frames, generations, sampling steps, selective checkpointing, EMA).
UPSTREAM_RECIPES = {
    "qwenimage": (8, 720, 720, 1, 12, 20, 0.5, False),
    "qwenimage-edit": (8, 512, 512, 1, 8, 20, 1.0, False),
    "flux": (8, 720, 720, 1, 12, 16, 1.0, True),
    "wan": (8, 512, 512, 1, 12, 20, 1.0, False),
    # SD: its sizes in fastvideo/config_sd/dgx.py:hpsv2 (the script's --config); no checkpointing
    "sd": (8, 512, 512, 1, 16, 50, 0.0, False),
    # the video trainers: 4 nodes x 8, 53 frames (the trainers' --selective_checkpointing default, 1.0)
    "hunyuan": (32, 480, 480, 53, 24, 16, 1.0, False),
    "skyreels-i2v": (32, 400, 640, 53, 8, 16, 1.0, False),
}


@pytest.mark.upstream
def test_every_models_sizes_are_read_from_upstreams_script(patched_tree, capsys):
    """The shapes (each family's plan.json) hold no recipe size: each one is read from upstream's script in the tree."""
    assert set(UPSTREAM_RECIPES) == set(models.names())
    for name in models.names():
        recipe_entry = models.entry(name)["recipe"]
        assert set(recipe_entry) - {"config"} == {"script", "text_tokens"}, name
        # a configuration's sizes are named by their keys there, never given
        assert all(isinstance(key, str) and not key[0].isdigit() for key in recipe_entry.get("config", {}).get("fields", {}).values())
        recipe, world = models.read_recipe(name, patched_tree.tree)
        assert (world, recipe.height, recipe.width, recipe.frames, recipe.generations, recipe.sampling_steps,
                recipe.selective_checkpointing, recipe.ema) == UPSTREAM_RECIPES[name], name
        _, loaded, loaded_world, _ = models.load(name, patched_tree.tree)
        assert (loaded, loaded_world) == (recipe, world), name
    wan, _ = models.read_recipe("wan", patched_tree.tree)
    assert wan.guidance_batch == 2
    sd, _ = models.read_recipe("sd", patched_tree.tree)
    assert (sd.prompts, sd.sample_batch_size, sd.train_batch_size, sd.accumulation, sd.guidance_batch,
            sd.train_guidance_batch, sd.text_tokens) == (4, 4, 4, 8, 2, 2, 77)
    status, out, _ = _plan(capsys, patched_tree, "wan")
    assert status == 0 and "plan: wan (WanTransformer3DModel" in out
    assert "recipe: scripts/finetune/finetune_wan_2_1_grpo.sh (8 ranks, read from the patched tree)" in out


@pytest.mark.parametrize("name", models.names())
def test_without_a_patched_tree_plan_is_refused_in_one_line(tmp_path, capsys, name):
    """No copy of upstream's sizes to fall back on: the one line says what to run."""
    (tmp_path / "upstream.lock").write_text((REPO / "upstream.lock").read_text())
    status = main(["-C", str(tmp_path), "plan", name])
    out, err = capsys.readouterr()
    [line] = err.strip().splitlines()
    assert status == 1 and out == "" and "Traceback" not in err
    assert f"plan: {name}'s recipe sizes are upstream's, read from {models.entry(name)['recipe']['script']}" in line
    assert "`dancegrpo-npu fetch && dancegrpo-npu apply`" in line and "--workdir" in line


@pytest.mark.upstream
def test_the_world_size_help_names_no_default_the_recipes_do_not_share(patched_tree):
    import re

    from dancegrpo_npu.cli import build_parser

    plan_parser = build_parser()._subparsers._group_actions[0].choices["plan"]
    text = next(a.help for a in plan_parser._actions if "--world-size" in a.option_strings)
    worlds = {models.read_recipe(name, patched_tree.tree)[1] for name in models.names()}
    assert len(worlds) > 1 and "recipe" in text
    assert {int(n) for n in re.findall(r"\d+", text)} in (set(), worlds), (text, worlds)


@pytest.mark.upstream
def test_the_plan_says_an_sde_window_changes_none_of_its_figures(patched_tree, capsys):
    """Every flow trainer takes --sde_window_size; training still takes one timestep at a time and
    the rollout keeps every step's latents, so the plan says so once, and a UNet's plan (a trainer
    that refuses the window) says nothing of it."""
    from dancegrpo_npu.plan import models

    kinds = set()
    for name in models.names():
        model = models.load(name, patched_tree.tree)[0]
        _, out, _ = _plan(capsys, patched_tree, name)
        said = out.count("an SDE window (--sde_window_size W) changes no figure here")
        assert said == (0 if model.unet else 1), (name, out[:400])
        kinds.add(model.unet)
    assert kinds == {True, False}  # both kinds were asked
