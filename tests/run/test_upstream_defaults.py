"""launch's recipes are upstream's launch scripts themselves, read from the fetched, patched tree.

Each script's torchrun line is read here with the shell's own word splitting (shlex), apart from
the tool's parser, and compared flag for flag with the recipe launch offers and with the
arguments a launch of that world size passes.  Preprocessing's defaults (kept as data) are
compared with upstream's preprocessing script the same way.

Needs upstream (the patched_tree fixture); skipped with the reason when it cannot be fetched.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from dancegrpo_npu.registry import REGISTRY as SCRIPTS
from dancegrpo_npu.run.datasets import dataset_dir
from dancegrpo_npu.run.launch import LaunchSpec, build_plan
from dancegrpo_npu.run.recipes import recipes_for
from dancegrpo_npu.trainers.flux import RECIPE_GLOB as FLUX_RECIPE_GLOB

PREPROCESS_DEFAULTS = SCRIPTS["preprocess"].defaults

pytestmark = pytest.mark.upstream


def script_words(text: str) -> list[str]:
    """The words of the torchrun command of an upstream shell script, variables substituted."""
    variables = dict(re.findall(r'^([A-Z_]+)="?([^"#\n]*?)"?\s*(?:#.*)?$', text, re.M))
    text = re.sub(r"\\\s*$", "", text.rstrip())  # finetune_flux_grpo.sh ends in a dangling backslash
    joined = text.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if ln.lstrip().startswith("torchrun"))
    return [re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], t) for t in shlex.split(line)]


def after(words: list[str], script: str) -> list[str]:
    return words[words.index(script) + 1 :]


def torchrun_option(words: list[str], name: str) -> int:
    for i, w in enumerate(words):
        if w.startswith(f"--{name}="):
            return int(w.split("=", 1)[1])
        if w == f"--{name}":
            return int(words[i + 1])
    return 1


def flat(pairs) -> list[str]:
    return [x for flag, value in pairs for x in ((flag,) if value is None else (flag, value))]


@pytest.fixture(scope="module")
def scripts(patched_tree) -> dict[Path, list[str]]:
    paths = sorted(patched_tree.tree.glob(FLUX_RECIPE_GLOB))
    assert len(paths) >= 3, paths  # the 2-node, the 8-GPU and the 8-GPU LoRA scripts at least
    return {p: script_words(p.read_text()) for p in paths}


def test_every_flux_script_is_a_recipe_of_its_trainer_flag_for_flag(patched_tree, scripts):
    offered = {}
    for name in ("flux", "flux-lora"):
        info = SCRIPTS[name]
        for recipe in recipes_for(patched_tree.tree, info.relpath, info.recipe_glob):
            offered[recipe.path] = (name, recipe)
    assert sorted(offered) == sorted(scripts)  # every script is offered, by exactly one trainer
    for path, words in scripts.items():
        name, recipe = offered[path]
        trainer = SCRIPTS[name].relpath
        assert trainer in words, (path, trainer)
        assert flat(recipe.args) == after(words, trainer), path
        assert (recipe.nnodes, recipe.nproc_per_node) == (torchrun_option(words, "nnodes"),
                                                          torchrun_option(words, "nproc_per_node"))


def test_recipe_names_come_from_the_file_names(patched_tree):
    names = {
        name: {r.name: r.path.name for r in recipes_for(patched_tree.tree, SCRIPTS[name].relpath, FLUX_RECIPE_GLOB)}
        for name in ("flux", "flux-lora")
    }
    assert names["flux"]["8gpus"] == "finetune_flux_grpo_8gpus.sh"
    assert names["flux"]["2nodes"] == "finetune_flux_grpo.sh"  # no suffix: named after its torchrun layout
    assert names["flux-lora"]["8gpus-lora"] == "finetune_flux_grpo_8gpus_lora.sh"


@pytest.mark.parametrize(
    "script, nnodes, nproc, upstream_file",
    [
        ("flux", 1, 8, "finetune_flux_grpo_8gpus.sh"),
        ("flux", 2, 8, "finetune_flux_grpo.sh"),
        ("flux-lora", 1, 8, "finetune_flux_grpo_8gpus_lora.sh"),
        ("wan", 1, 8, "finetune_wan_2_1_grpo.sh"),
        ("qwenimage", 1, 8, "finetune_qwenimage_grpo.sh"),
        ("qwenimage-edit", 1, 8, "finetune_qwenimage_edit_grpo.sh"),
        ("hunyuan", 4, 8, "finetune_hunyuan_grpo.sh"),
        ("skyreels-i2v", 4, 8, "finetune_skyreels_i2v.sh"),
    ],
)
def test_a_launch_of_the_scripts_world_size_passes_its_values(patched_tree, scripts, script, nnodes, nproc,
                                                              upstream_file):
    tree = patched_tree.tree
    if upstream_file not in {p.name for p in scripts}:
        scripts = {tree / "scripts/finetune" / upstream_file:
                   script_words((tree / "scripts/finetune" / upstream_file).read_text())}
    spec = LaunchSpec(script, nproc_per_node=nproc, nnodes=nnodes, master_addr="192.0.2.1" if nnodes > 1 else None,
                      master_port=29500, device="cpu")
    plan = build_plan(patched_tree.project, spec, tree.parent / "RUN", dry_run=True)
    assert plan.recipe.path.name == upstream_file and plan.recipe_scaling is None
    expected = after(scripts[tree / "scripts/finetune" / upstream_file], SCRIPTS[script].relpath)
    got = list(plan.script_args)
    for i, word in enumerate(expected):  # the script's words, in order; paths resolved in the tree
        if word == "--output_dir":
            continue
        if i and expected[i - 1] == "--output_dir":
            continue
        if i and expected[i - 1] == "--data_json_path":  # the model's own dataset directory (run.datasets)
            assert got[got.index("--data_json_path") + 1] == str(dataset_dir(tree, SCRIPTS[script].dataset) / "videos2caption.json")
        elif i and expected[i - 1] in SCRIPTS[script].path_flags:
            assert got[got.index(expected[i - 1]) + 1] == str((tree / word).resolve())
        else:
            assert word in got, word
    # the differences the plan lists are only paths, the run's outputs and the port's flags for
    # paths upstream hard-codes (the reward files)
    for note in plan.recipe_notes:
        assert ("resolved in the patched tree" in note or "the run's own outputs" in note
                or "the port's flag for a path upstream hard-codes" in note), note


def test_preprocess_defaults_match_upstreams_script(patched_tree):
    text = (patched_tree.tree / "scripts/preprocess/preprocess_flux_rl_embeddings.sh").read_text()
    assert flat(PREPROCESS_DEFAULTS) == after(script_words(text), SCRIPTS["preprocess"].relpath)


@pytest.mark.parametrize("name, script, added", [
    ("preprocess-qwenimage", "preprocess_qwen_image_rl_embeddings.sh", []),
    # the patch's --image_dir, at the path upstream's script hard-codes
    ("preprocess-qwenimage-edit", "preprocess_qwen_image_edit_rl_embeddings.sh",
     ["--image_dir", "data/SEED-Data-Edit-Part2-3/real_editing/images"]),
])
def test_qwen_image_preprocess_defaults_match_upstreams_scripts(patched_tree, name, script, added):
    text = (patched_tree.tree / "scripts/preprocess" / script).read_text()
    info = SCRIPTS[name]
    assert info.depset == "diffusers-0.35"
    assert flat(info.defaults) == after(script_words(text), info.relpath) + added
