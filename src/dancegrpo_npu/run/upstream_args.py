"""The three stock scripts launch runs, the default arguments launch gives them, and path handling.

The trainers' defaults are upstream's own recipes, read from its launch scripts in the patched
tree (``run.recipes``), so that ``launch flux --nproc-per-node 8`` runs what
``bash scripts/finetune/finetune_flux_grpo_8gpus.sh`` runs; the port adds the reward paths
(``HPS_DEFAULTS``).  Preprocessing's defaults are kept here as data, copied from upstream's
script (its table names the file).  The user's arguments override them flag by flag.  The
torchrun options (nodes, processes, master) are launch's own options.

Relative paths: upstream's defaults (``data/flux``, ``data/rl_embeddings/...``) are relative to
the upstream checkout, where upstream's README puts the weights, so they are resolved against
the patched tree; relative paths the user types are resolved against the directory the command
was run from.  The script itself runs in the run directory, so every path it gets is absolute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.run import datasets
from dancegrpo_npu.run.inputs import image_sizes_problem, reference_sizes_problem

# upstream's Flux recipes, the scripts launch reads its default arguments from (run/recipes.py)
FLUX_RECIPE_GLOB = "scripts/finetune/finetune_flux_grpo*.sh"
WAN_RECIPE_GLOB = "scripts/finetune/finetune_wan_2_1_grpo*.sh"
QWENIMAGE_RECIPE_GLOB = "scripts/finetune/finetune_qwenimage_grpo*.sh"
QWENIMAGE_EDIT_RECIPE_GLOB = "scripts/finetune/finetune_qwenimage_edit_grpo*.sh"

# Where upstream's README puts the FLUX.1-dev weights, and its recipes point (doctor looks there).
DEFAULT_FLUX_DIR = "data/flux"

# The HPS reward files the trainers read.  Upstream hard-codes them relative to the working
# directory (./hps_ckpt/...); the port makes them arguments with these defaults (contract 3),
# and since the script runs in the run directory, launch passes them resolved against the tree.
HPS_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--hps_open_clip_ckpt", "hps_ckpt/open_clip_pytorch_model.bin"),
    ("--hps_ckpt", "hps_ckpt/HPS_v2.1_compressed.pt"),
)

# upstream scripts/preprocess/preprocess_wan_2_1_rl_embeddings.sh (commit 15cc71d5).
PREPROCESS_WAN_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--model_path", "data/Wan2.1-T2V-1.3B"),
    ("--output_dir", "data/rl_embeddings"),
    ("--prompt_dir", "./assets/prompts.txt"),
)

# upstream scripts/preprocess/preprocess_qwen_image_rl_embeddings.sh (commit 15cc71d5).
PREPROCESS_QWENIMAGE_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--model_path", "data/qwenimage"),
    ("--output_dir", "data/rl_embeddings"),
    ("--prompt_dir", "./assets/prompts.txt"),
)

# upstream scripts/preprocess/preprocess_qwen_image_edit_rl_embeddings.sh (commit 15cc71d5); its
# images are read from --image_dir, the patch's argument for the path the script hard-codes
# (relative to the directory it runs in, as upstream's README lays out data/).
PREPROCESS_QWENIMAGE_EDIT_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--model_path", "data/qwenimage_edit"),
    ("--output_dir", "data/rl_embeddings"),
    ("--prompt_dir", "./assets/edit_data.jsonl"),
    ("--height", "512"),
    ("--width", "512"),
    ("--image_dir", "data/SEED-Data-Edit-Part2-3/real_editing/images"),
)

# upstream scripts/preprocess/preprocess_flux_rl_embeddings.sh (commit 15cc71d5).
PREPROCESS_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--model_path", "data/flux"),
    ("--output_dir", "data/rl_embeddings"),
    ("--prompt_dir", "./assets/prompts.txt"),
)

TRAIN_PATH_FLAGS = (
    "--pretrained_model_name_or_path",
    "--dit_model_name_or_path",
    "--vae_model_path",
    "--cache_dir",
    "--data_json_path",
    "--output_dir",
    "--logging_dir",
    "--resume_from_checkpoint",
    "--resume_from_lora_checkpoint",
    "--hps_open_clip_ckpt",
    "--hps_ckpt",
    "--hps_model",
)


@dataclass(frozen=True)
class ScriptInfo:
    name: str  # what the user types: flux | flux-lora | preprocess
    relpath: str  # the stock script in the patched tree
    defaults: tuple[tuple[str, str | None], ...]  # after the recipe's arguments, if it has recipes
    path_flags: tuple[str, ...]
    # Flags naming things that must exist before the run starts: (flag, kind, what it is); the
    # kinds are run.inputs'.
    required_inputs: tuple[tuple[str, str, str], ...]
    # Whether the script's --output_dir is the run's own output (checkpoints: yes) or a product
    # later runs read (preprocess's embeddings: no, train reads data/rl_embeddings).
    output_in_run_dir: bool
    # upstream's launch scripts holding this script's recipes (run.recipes), None: no recipes.
    # A trainer the port adds gets its recipes by naming its scripts here.
    recipe_glob: str | None = None
    # The dependency set it runs with (run.depsets): the interpreter launch starts it with.
    depset: str = "diffusers-0.32"
    # Checks of the script's arguments taken together, each (flag values) -> one line or None,
    # run with the input checks (run.inputs).
    argument_checks: tuple = ()
    # The model whose RL-embeddings dataset it writes or reads (run.datasets): its own directory.
    dataset: str | None = None


# The HPS reward's files, which every trainer reads.
_HPS_INPUTS = (
    ("--hps_open_clip_ckpt", "file", "open_clip ViT-H-14 weights for the HPS reward"),
    ("--hps_ckpt", "file", "HPS_v2.1_compressed.pt reward weights"),
)

_TRAIN_INPUTS = (
    ("--pretrained_model_name_or_path", "flux", "FLUX.1-dev weights"),
    ("--vae_model_path", "vae", "FLUX.1-dev VAE weights"),
    ("--dit_model_name_or_path", "model", "transformer weights"),
    ("--data_json_path", "embeddings", "RL-embeddings dataset: run `dancegrpo-npu launch preprocess` first"),
    *_HPS_INPUTS,
)

_WAN_INPUTS = (
    ("--pretrained_model_name_or_path", "flux", "Wan2.1-T2V-1.3B weights"),
    ("--vae_model_path", "vae", "Wan2.1-T2V-1.3B VAE weights"),
    ("--data_json_path", "embeddings", "RL-embeddings dataset: run `dancegrpo-npu launch preprocess-wan` first"),
    *_HPS_INPUTS,
)


def _qwen_inputs(model: str, preprocess: str) -> tuple[tuple[str, str, str], ...]:
    return (
        ("--pretrained_model_name_or_path", "flux", f"{model} weights (transformer/, vae/)"),
        ("--data_json_path", "embeddings", f"RL-embeddings dataset: run `dancegrpo-npu launch {preprocess}` first"),
        *_HPS_INPUTS,
    )


_PREPROCESS_INPUTS_PROMPTS = (
    "--prompt_dir",
    "file",
    "prompt file (upstream's is assets/prompts.txt: `dancegrpo-npu fetch --with-assets`)",
)

SCRIPTS: dict[str, ScriptInfo] = {
    "flux": ScriptInfo(
        "flux", "fastvideo/train_grpo_flux.py", HPS_DEFAULTS, TRAIN_PATH_FLAGS, _TRAIN_INPUTS, True, FLUX_RECIPE_GLOB,
        argument_checks=(image_sizes_problem,), dataset="flux",
    ),
    "flux-lora": ScriptInfo(
        "flux-lora",
        "fastvideo/train_grpo_flux_lora.py",
        HPS_DEFAULTS,
        TRAIN_PATH_FLAGS,
        _TRAIN_INPUTS,
        True,
        FLUX_RECIPE_GLOB,
        argument_checks=(image_sizes_problem,),
        dataset="flux",
    ),
    "preprocess": ScriptInfo(
        "preprocess",
        "fastvideo/data_preprocess/preprocess_flux_embedding.py",
        PREPROCESS_DEFAULTS,
        ("--model_path", "--output_dir", "--prompt_dir", "--cache_dir"),
        (
            ("--model_path", "pipeline", "FLUX.1-dev weights"),
            (
                "--prompt_dir",
                "file",
                "prompt file (upstream's is assets/prompts.txt: `dancegrpo-npu fetch --with-assets`)",
            ),
        ),
        False,
        dataset="flux",
    ),
    # Wan2.1-T2V-1.3B: the diffusers-0.35 dependency set (run.depsets, docs/dependencies.md)
    "wan": ScriptInfo(
        "wan", "fastvideo/train_grpo_wan_2_1.py", HPS_DEFAULTS, TRAIN_PATH_FLAGS, _WAN_INPUTS, True, WAN_RECIPE_GLOB,
        depset="diffusers-0.35", argument_checks=(image_sizes_problem,), dataset="wan",
    ),
    # Qwen-Image and Qwen-Image-Edit: the diffusers-0.35 dependency set, as Wan2.1
    "qwenimage": ScriptInfo(
        "qwenimage", "fastvideo/train_grpo_qwenimage.py", HPS_DEFAULTS, TRAIN_PATH_FLAGS,
        _qwen_inputs("Qwen-Image", "preprocess-qwenimage"), True, QWENIMAGE_RECIPE_GLOB, depset="diffusers-0.35",
        argument_checks=(image_sizes_problem,), dataset="qwenimage",
    ),
    "qwenimage-edit": ScriptInfo(
        "qwenimage-edit", "fastvideo/train_grpo_qwenimage_edit.py", HPS_DEFAULTS, TRAIN_PATH_FLAGS,
        _qwen_inputs("Qwen-Image-Edit", "preprocess-qwenimage-edit"), True, QWENIMAGE_EDIT_RECIPE_GLOB,
        depset="diffusers-0.35", argument_checks=(image_sizes_problem, reference_sizes_problem),
        dataset="qwenimage-edit",
    ),
    "preprocess-wan": ScriptInfo(
        "preprocess-wan",
        "fastvideo/data_preprocess/preprocess_wan_2_1_embeddings.py",
        PREPROCESS_WAN_DEFAULTS,
        ("--model_path", "--output_dir", "--prompt_dir", "--cache_dir"),
        (("--model_path", "wan-pipeline", "Wan2.1-T2V-1.3B weights"), _PREPROCESS_INPUTS_PROMPTS),
        False,
        depset="diffusers-0.35",
        dataset="wan",
    ),
    # Qwen-Image and Qwen-Image-Edit: the diffusers-0.35 set, as Wan2.1
    "preprocess-qwenimage": ScriptInfo(
        "preprocess-qwenimage",
        "fastvideo/data_preprocess/preprocess_qwenimage_embedding.py",
        PREPROCESS_QWENIMAGE_DEFAULTS,
        ("--model_path", "--output_dir", "--prompt_dir", "--cache_dir"),
        (("--model_path", "wan-pipeline", "Qwen-Image weights"), _PREPROCESS_INPUTS_PROMPTS),
        False,
        depset="diffusers-0.35",
        dataset="qwenimage",
    ),
    "preprocess-qwenimage-edit": ScriptInfo(
        "preprocess-qwenimage-edit",
        "fastvideo/data_preprocess/preprocess_qwenimage_edit_embeddings.py",
        PREPROCESS_QWENIMAGE_EDIT_DEFAULTS,
        ("--model_path", "--output_dir", "--prompt_dir", "--cache_dir", "--image_dir"),
        (
            ("--model_path", "edit-pipeline", "Qwen-Image-Edit weights"),
            ("--prompt_dir", "file", "edit_data.jsonl (upstream's is assets/edit_data.jsonl: `dancegrpo-npu fetch --with-assets`)"),
            ("--image_dir", "directory", "source-image"),  # edit_data.jsonl's source_image paths are relative to it
        ),
        False,
        depset="diffusers-0.35",
        dataset="qwenimage-edit",
    ),
}

# A Hugging Face hub id ("black-forest-labs/FLUX.1-dev"): left as typed, the script resolves it.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def script_info(name: str) -> ScriptInfo:
    try:
        return SCRIPTS[name]
    except KeyError:
        raise DancegrpoError(f"unknown script {name!r}", f"choose one of: {', '.join(SCRIPTS)}", exit_code=2) from None


def split_flags(args: tuple[str, ...] | list[str]) -> list[tuple[str, str | None, bool]]:
    """``args`` as (flag, value, written_with_equals) items, in order.

    A token starting with ``--`` is a flag; the next token is its value unless it is a flag
    too (``-1`` and ``-0.5`` are values).  A token that is not a flag and follows a flag's
    value is an error: the scripts take no positional arguments.
    """
    items: list[tuple[str, str | None, bool]] = []
    i = 0
    args = list(args)
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--") or tok == "--":
            raise DancegrpoError(
                f"script argument {tok!r} is not a --flag or a flag's value",
                "upstream's scripts take only --flag [value] arguments",
                exit_code=2,
            )
        if "=" in tok:
            flag, value = tok.split("=", 1)
            items.append((flag, value, True))
            i += 1
            continue
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            items.append((tok, args[i + 1], False))
            i += 2
        else:
            items.append((tok, None, False))
            i += 1
    return items


def flag_values(args) -> dict[str, str | None]:
    """Each flag's value as the trainer's argparse sees it: the last occurrence wins (a bare
    flag: None)."""
    return {flag: value for flag, value, _ in split_flags(args)}


def join_flags(items: list[tuple[str, str | None, bool]]) -> list[str]:
    out: list[str] = []
    for flag, value, eq in items:
        if value is None:
            out.append(flag)
        elif eq:
            out.append(f"{flag}={value}")
        else:
            out += [flag, value]
    return out


def _resolve(value: str, base: Path) -> str:
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def _resolve_user_path(flag: str, value: str, cwd: Path) -> str:
    """A path the user typed, made absolute against ``cwd``.

    Model flags may name a hub id instead of a directory; those stay as typed when no such
    local path exists.  ``--hps_model`` is a model name (ViT-H-14) unless it names a file.
    """
    if flag == "--resume_from_checkpoint" and value == "latest":  # upstream's word, not a path
        return value
    candidate = Path(value).expanduser()
    if not candidate.is_absolute():
        candidate = cwd / candidate
    if flag == "--hps_model" and not (value.endswith(".json") or candidate.exists()):
        return value
    model_flag = flag in ("--pretrained_model_name_or_path", "--vae_model_path", "--dit_model_name_or_path")
    if model_flag and not candidate.exists() and _HUB_ID.match(value) and not value.startswith("."):
        return value
    return str(candidate.resolve())


def build_script_args(
    info: ScriptInfo,
    user_args: tuple[str, ...],
    *,
    tree: Path,
    cwd: Path,
    run_dir: Path,
    upstream_defaults: bool,
    recipe_args: tuple[tuple[str, str | None], ...] = (),
) -> list[str]:
    """The script's final argument list: the recipe's arguments, then the port's defaults (both
    tree-relative), each overridden by the user's."""
    user = split_flags(user_args)
    user_flags = {flag for flag, _, _ in user}
    items: list[tuple[str, str | None, bool]] = []
    if upstream_defaults:
        for flag, value in (*recipe_args, *info.defaults):
            if flag in user_flags:
                continue
            if flag == "--output_dir" and info.output_in_run_dir:
                continue  # replaced by the run's own outputs/ below
            if value is not None and flag in info.path_flags:
                value = datasets.default_value(info, flag, tree) or _resolve(value, tree)
            items.append((flag, value, False))
    for flag, value, eq in user:
        if value is not None and flag in info.path_flags:
            value = _resolve_user_path(flag, value, cwd)
        items.append((flag, value, eq))
    if "--output_dir" not in {flag for flag, _, _ in items}:
        items.append(("--output_dir", str(run_dir / "outputs"), False))
    return join_flags(items)


def input_problems(info: ScriptInfo, script_args: list[str]) -> list[str]:
    """What is missing or incomplete among the run's input weights and data, each in one line
    naming the flag; [] when all are there.  Every input is checked (a dry run lists them all)."""
    from dancegrpo_npu.run.inputs import input_problem

    problems = []
    for flag, value, _ in split_flags(script_args):
        for req_flag, kind, what in info.required_inputs:
            if flag != req_flag or value is None:
                continue
            p = Path(value)
            if not p.is_absolute():
                continue  # a hub id: the script downloads or finds it in its cache
            problem = input_problem(kind, p, what)
            if problem:
                problems.append(f"{flag}: {problem}")
    values = flag_values(script_args)
    problems += [p for p in (check(values) for check in info.argument_checks) if p]
    problems += datasets.problems(info, values)
    return problems


# The Flux trainers' own argparse defaults (fastvideo/train_grpo_flux.py and train_grpo_flux_lora.py,
# commit 15cc71d5) for the arguments a replay must match: what the trainer uses when the launch
# passes no such flag (smoke and --no-upstream-defaults pass only what they name).  None: no
# default (upstream's scripts always pass one).
TRAINER_ARGPARSE_DEFAULTS: dict[str, object] = {
    "seed": None,
    "h": None,
    "w": None,
    "num_generations": 16,
    "sampling_steps": None,
    "init_same_noise": False,
    "max_train_steps": None,
}
_STORE_TRUE = ("init_same_noise",)


def trainer_values(script_args: tuple[str, ...] | list[str]) -> dict[str, object]:
    """The values the trainer will run with for TRAINER_ARGPARSE_DEFAULTS' arguments, read from
    the final script arguments as argparse would (the last occurrence wins); ints where they
    parse, else the text (which then differs from any recorded value)."""
    values = dict(TRAINER_ARGPARSE_DEFAULTS)
    for flag, value, _ in split_flags(script_args):
        name = flag[2:]
        if name not in values:
            continue
        if name in _STORE_TRUE:
            values[name] = True
            continue
        try:
            values[name] = int(value) if value is not None else None
        except ValueError:
            values[name] = value
    return values
