"""Each model's RL-embeddings dataset in a directory of its own, and a record of what made it.

Upstream's preprocessing scripts all write ``data/rl_embeddings/`` and its trainers all read
``data/rl_embeddings/videos2caption.json``: preprocessing one model after another replaces the
first one's embeddings, and the first one's trainer then trains on the other's text embeddings (or
stops on their shapes, after loading every model).  With upstream's defaults, launch gives each model's
preprocessing its own ``--output_dir``, ``data/rl_embeddings/<model>/``, and that model's
trainers read their ``--data_json_path`` from there (a trainer's dry run lists it among the
values that differ from upstream's script; a preprocessing run has no recipe to differ from).  Upstream's own layout stays reachable by naming it after ``--``.

After a preprocessing run succeeds, launch writes ``dataset.json`` beside the JSON: the model,
the preprocessing and its arguments, the run.  A trainer given a dataset recorded for another
model is refused in one line (dry run and start), and so is preprocessing into a directory that
holds another model's dataset.  A dataset without the record (upstream's layout, or one made by
hand) is taken as it is.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu import registry
from dancegrpo_npu.rundirs.rundir import read_json

RECORD = "dataset.json"
DATASETS_DIR = "data/rl_embeddings"  # upstream's, relative to the patched tree
DATA_JSON = "videos2caption.json"


@dataclass(frozen=True)
class Model:
    name: str  # the dataset directory's name under data/rl_embeddings/
    title: str  # in messages
    preprocess: str  # launch's script that makes its dataset


def model(name: str) -> Model | None:
    """The model whose dataset is ``name``, from the trainer registry: its title, and the
    preprocessing row that writes the dataset."""
    rows = [spec for spec in registry.REGISTRY.values() if spec.dataset == name]
    if not rows:
        return None
    preprocess = next((spec.name for spec in rows if not spec.is_trainer), rows[0].preprocess or "")
    return Model(name, rows[0].title, preprocess)


def dataset_dir(tree: Path, name: str) -> Path:
    return tree / DATASETS_DIR / model(name).name


def default_value(info, flag: str, tree: Path) -> str | None:
    """The per-model value launch gives ``flag`` instead of upstream's shared path, or None."""
    if info.dataset is None:
        return None
    if flag == "--data_json_path" and info.output_in_run_dir:
        return str(dataset_dir(tree, info.dataset) / DATA_JSON)
    if flag == "--output_dir" and not info.output_in_run_dir:
        return str(dataset_dir(tree, info.dataset))
    return None


def recorded_model(directory: Path) -> dict | None:
    """The dataset.json record of the dataset in ``directory``, or None."""
    record = read_json(directory / RECORD)
    return record if isinstance(record, dict) and record.get("model") else None


def _made(record: dict) -> str:
    made_for = model(record["model"])
    title = made_for.title if made_for else record["model"]
    how = f"`dancegrpo-npu launch {record.get('preprocessing')}`" if record.get("preprocessing") else "preprocessing"
    run = f", run {Path(record['run']).name}" if record.get("run") else ""
    return f"the {title} dataset (made by {how}{run})"


def problems(info, values: dict) -> list[str]:
    """A dataset recorded for another model than ``info``'s: given to a trainer as
    --data_json_path, or preprocessing's --output_dir (it would be overwritten)."""
    if info.dataset is None:
        return []
    model_ = model(info.dataset)
    out = []
    if info.output_in_run_dir and values.get("--data_json_path"):
        path = Path(values["--data_json_path"])
        record = recorded_model(path.parent)
        if record and record["model"] != model_.name:
            out.append(f"--data_json_path: {path} is {_made(record)}, not {model_.title}'s; run `dancegrpo-npu "
                       f"launch {model_.preprocess}` (it writes {DATASETS_DIR}/{model_.name}/) or give this "
                       "model's dataset")
    if not info.output_in_run_dir and values.get("--output_dir"):
        path = Path(values["--output_dir"])
        record = recorded_model(path)
        if record and record["model"] != model_.name:
            out.append(f"--output_dir: {path} holds {_made(record)}, which preprocessing {model_.title} there would "
                       f"overwrite; give another --output_dir (the default is {DATASETS_DIR}/{model_.name}/)")
    return out


def output_of(info, values: dict) -> Path | None:
    """The dataset directory a preprocessing run writes, or None for another script."""
    if info.dataset is None or info.output_in_run_dir or not values.get("--output_dir"):
        return None
    return Path(values["--output_dir"])


def forget(directory: Path) -> None:
    """Before preprocessing rewrites a dataset: its record goes, until the run has succeeded."""
    try:
        (directory / RECORD).unlink()
    except FileNotFoundError:
        pass


def record(directory: Path, info, values: dict, run_dir: Path) -> None:
    """dataset.json beside a dataset preprocessing has just written."""
    from dancegrpo_npu.run.directory import write_json

    keep = ("--model_path", "--prompt_dir", "--image_dir", "--height", "--width")
    write_json(directory / RECORD, {
        "model": model(info.dataset).name,
        "model_title": model(info.dataset).title,
        "preprocessing": info.name,
        "script": info.relpath,
        "arguments": {flag: values[flag] for flag in keep if flag in values},
        "run": str(run_dir),
        "made": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    })
