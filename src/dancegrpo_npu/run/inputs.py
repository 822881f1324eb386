"""Whether a launch's inputs are there and whole: weights, the embeddings dataset, reward files.

All of them are checked in one pass, so that a dry run on a login node lists everything a job
still lacks, and a real launch refuses with all of it in one line.  A directory that exists is
not enough: weights need each component's ``config.json`` and weight files (what
``from_pretrained`` reads), the embeddings directory its JSON, a file some bytes.

Kinds (a registry row's ``required_inputs``: ``registry.Input``, whose ``models`` and
``folders`` say what a directory of models must hold):

- ``models``: a directory of models as the trainers read it: each of the input's ``models``
  a subfolder with its config.json and weights (``transformer/`` and ``vae/``; ``vae/`` alone)
- ``pipeline``: a whole pipeline as preprocessing loads it: ``model_index.json``, the input's
  ``models`` as above, and its ``folders`` (tokenizers, processors) not empty
- ``model``: one model's directory: config.json and weights at its top
- ``directory``: a directory that is not empty (source images)
- ``embeddings``: the embeddings dataset's JSON (preprocessing writes it), a non-empty list
- ``file``: a file that is not empty
"""

from __future__ import annotations

import json
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
KINDS = ("models", "pipeline", "model", "directory", "embeddings", "file")
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


def _dir_problems(p: Path, required) -> list[str]:
    if required.kind == "model":
        problem = _model_problem(p)
        return [problem.replace(f"{p.name}/ ", "", 1)] if problem else []
    if required.kind == "directory":
        return [] if any(p.iterdir()) else ["it is empty"]
    problems = [m for m in (_model_problem(p / name) for name in required.models) if m]
    if required.kind == "pipeline":
        if not (p / "model_index.json").is_file():
            problems.insert(0, "model_index.json is missing")
        for name in required.folders:
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


def input_problem(required, path: Path) -> str | None:
    """One line saying what is wrong with one input (a row's ``registry.Input``) at ``path``, or
    None when it is there and whole."""
    kind, what = required.kind, required.what
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
    problems = _dir_problems(path, required)
    return f"the {what} directory {path} is incomplete: {', '.join(problems)}" if problems else None


def reference_sizes_problem(values: dict) -> str | None:
    """An edit trainer's batches (the ``argument_checks`` of its row, given the flag values):
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
