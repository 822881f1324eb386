"""Whether a launch's inputs are there and whole: weights, the embeddings dataset, reward files.

All of them are checked in one pass, so that a dry run on a login node lists everything a job
still lacks, and a real launch refuses with all of it in one line.  A directory that exists is
not enough: weights need each component's ``config.json`` and weight files (what
``from_pretrained`` reads), the embeddings directory its JSON, a file some bytes.

Kinds (a registry row's ``required_inputs``, dancegrpo_npu.trainers):

- ``weights``: a model directory as the trainers read it: ``transformer/`` and ``vae/``
- ``vae``: a directory holding ``vae/`` (the trainers' --vae_model_path)
- ``model``: one model's directory: config.json and weights at its top
- ``pipeline``: the whole FLUX.1-dev pipeline, as preprocessing loads it
- ``wan-pipeline``: a pipeline with one text encoder and tokenizer (Wan2.1, Qwen-Image)
- ``edit-pipeline``: the same with the Qwen2-VL ``processor/`` (Qwen-Image-Edit)
- ``unet-pipeline``: a UNet pipeline with one text encoder and tokenizer (Stable Diffusion)
- ``directory``: a directory that is not empty (source images)
- ``embeddings``: the embeddings dataset's JSON (preprocessing writes it), a non-empty list
- ``file``: a file that is not empty
"""

from __future__ import annotations

import json
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
FLUX_MODELS = ("transformer", "vae")
PIPELINE_MODELS = ("transformer", "vae", "text_encoder", "text_encoder_2")
PIPELINE_TOKENIZERS = ("tokenizer", "tokenizer_2")
WAN_PIPELINE_MODELS = ("transformer", "vae", "text_encoder")  # Wan2.1: one (UMT5) text encoder
UNET_PIPELINE_MODELS = ("unet", "vae", "text_encoder")  # Stable Diffusion: a UNet, one (CLIP) text encoder
# The embeddings JSON is read whole only below this size (a full dataset is a few MB).
_JSON_READ_LIMIT = 256 * 2**20


def _model_problem(d: Path) -> str | None:
    """What a model directory lacks for ``from_pretrained``, or None."""
    if not d.is_dir():
        return f"{d.name}/ is missing"
    lacks = []
    if not (d / "config.json").is_file():
        lacks.append("config.json")
    if not any(p.is_file() and p.name.endswith(WEIGHT_SUFFIXES) for p in d.iterdir()):
        lacks.append("weight files (*.safetensors)")
    return f"{d.name}/ has no {' and no '.join(lacks)}" if lacks else None


def _dir_problems(p: Path, kind: str) -> list[str]:
    if kind == "model":
        problem = _model_problem(p)
        return [problem.replace(f"{p.name}/ ", "", 1)] if problem else []
    if kind == "directory":
        return [] if any(p.iterdir()) else ["it is empty"]
    models = {"weights": FLUX_MODELS, "vae": ("vae",), "pipeline": PIPELINE_MODELS, "wan-pipeline": WAN_PIPELINE_MODELS,
              "edit-pipeline": WAN_PIPELINE_MODELS, "unet-pipeline": UNET_PIPELINE_MODELS}[kind]
    problems = [m for m in (_model_problem(p / name) for name in models) if m]
    if kind in ("pipeline", "wan-pipeline", "edit-pipeline", "unet-pipeline"):
        if not (p / "model_index.json").is_file():
            problems.insert(0, "model_index.json is missing")
        tokenizers = {"pipeline": PIPELINE_TOKENIZERS, "edit-pipeline": ("tokenizer", "processor")}.get(kind, ("tokenizer",))
        for name in tokenizers:
            if not (p / name).is_dir() or not any((p / name).iterdir()):
                problems.append(f"{name}/ is missing or empty")
    return problems


def _embeddings_problem(p: Path) -> str | None:
    if not p.is_file():
        where = p.parent
        if where.is_dir():
            return f"the embeddings directory {where} has no {p.name}"
        return f"{p} does not exist"
    size = p.stat().st_size
    if size == 0:
        return f"{p} is empty"
    if size > _JSON_READ_LIMIT:
        return None
    try:
        data = json.loads(p.read_text(errors="replace"))
    except (OSError, ValueError) as e:
        return f"{p} is not JSON ({e})"
    if not isinstance(data, list) or not data:
        return f"{p} holds no embeddings (a JSON list of them is expected)"
    return None


def input_problem(kind: str, path: Path, what: str) -> str | None:
    """One line saying what is wrong with one input, or None when it is there and whole."""
    if kind == "file":
        if not path.is_file():
            return f"{path} does not exist ({what})"
        if path.stat().st_size == 0:
            return f"{path} is empty ({what})"
        return None
    if kind == "embeddings":
        problem = _embeddings_problem(path)
        return f"{problem} ({what})" if problem else None
    if not path.is_dir():
        return f"the {what} directory {path} does not exist"
    problems = _dir_problems(path, kind)
    return f"the {what} directory {path} is incomplete: {', '.join(problems)}" if problems else None


def reference_sizes_problem(values: dict) -> str | None:
    """The Qwen-Image-Edit trainer's batches (its ``argument_checks``, given the flag values):
    torch's default collate stacks a batch's reference latents, so prompts of --train_batch_size
    > 1 must share their reference size (``calculated_height`` x ``calculated_width``), or the
    first batch that mixes two stops the run with a traceback."""
    try:
        train_batch_size = int(values.get("--train_batch_size") or 1)
    except ValueError:
        return None  # the trainer's argparse refuses it
    data_json = Path(values.get("--data_json_path") or "")
    if train_batch_size <= 1 or not data_json.is_file() or data_json.stat().st_size > _JSON_READ_LIMIT:
        return None
    try:
        data = json.loads(data_json.read_text(errors="replace"))
        sizes = sorted({(int(d["calculated_height"]), int(d["calculated_width"])) for d in data})
    except (OSError, ValueError, TypeError, KeyError):
        return None  # _embeddings_problem says what is wrong with the file itself
    if len(sizes) <= 1:
        return None
    shown = ", ".join(f"{h}x{w}" for h, w in sizes[:4]) + (", ..." if len(sizes) > 4 else "")
    return (f"--train_batch_size {train_batch_size}: {data_json} holds reference images of {len(sizes)} sizes "
            f"({shown}), which torch's default collate cannot stack in one batch; give --train_batch_size 1, "
            "or a dataset of one reference size")


def image_sizes_problem(values: dict, sizes) -> str | None:
    """A trainer's --h / --w against its row's ``image_sizes`` (trainers.ImageSizes): positive
    multiples of the VAE's downsampling times the latent patch; anything else fails inside the
    model, after every rank has loaded it.  None when they fit, or the script takes no sizes."""
    if sizes is None:
        return None
    multiple = sizes.multiple
    for flag in ("--h", "--w"):
        value = values.get(flag)
        try:
            size = int(value) if value is not None else None
        except ValueError:
            continue  # the trainer's parser refuses it
        if size is not None and (size < multiple or size % multiple):
            return (f"{flag} {size} is not a positive multiple of {multiple} ({sizes.why}); "
                    f"give e.g. {flag} {max(multiple, size // multiple * multiple)}")
    return None


# The checks a registry row names in its ``argument_checks``: name -> (flag values) -> one line or None.
ARGUMENT_CHECKS = {"reference-sizes": reference_sizes_problem}


def argument_problems(names, values: dict) -> list[str]:
    """The named checks' findings on the script's flag values, in the row's order."""
    return [p for p in (ARGUMENT_CHECKS[name](values) for name in names) if p]
