"""The RL-embeddings dataset's index (``videos2caption.json``): the order preprocessing writes
it in, and the digest of it that a recorded run keeps.

**Order.**  Upstream's embeddings preprocessing shares the prompts out with a
``DistributedSampler``: rank r encodes every world_size-th prompt from the r-th (FLUX's script
over a shuffled order, the others' in the file's order), the last ranks take prompts again from
the start where the prompts do not divide evenly, each prompt's tensors are saved as
``<index>.pt`` (its index in the prompt file, once Chinese lines are dropped), and rank 0 writes
the entries of every rank, rank 0's first.  The dataset then depends on the world size: at 2
ranks its entries are prompts 0, 2, 4, ... 1, 3, 5, ..., with a prompt twice when they do not
divide, and a trainer whose sampler draws by position trains on other prompts than after a
1-rank preprocessing.  :func:`in_prompt_order` puts every rank's entries in the order of their
prompt's index, each prompt once: the same index at any rank count.

**Digest.**  :func:`digest` describes the dataset a run reads (:func:`source`: the trainers'
``--data_json_path``, the Stable Diffusion trainer's ``--prompt_dir``): the index file's sha256
and rows, and the sha256 of the tensor files its rows name (the ``.pt`` values, each under the
folder its key names: ``prompt_embed_path`` -> ``prompt_embed/``).  A recorded run keeps it in
``records/index.json`` (``contract.RECORD_DATASET``); ``compare`` shows it for each run and says
when two runs read different data.  A prompt file (one prompt a line, the Stable Diffusion
trainer's) is its sha256 and its lines.  Files are hashed up to ``FILES_BUDGET`` bytes in the
index's order (a real dataset's tensors run to hundreds of GB): the digest says how many of them
it covers.

Self-contained: the standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os

KEY = "prompt_embed_path"  # every preprocessing script names an entry's files <index>.pt under this key
FILES_BUDGET = 1 << 30  # bytes of tensor files a digest reads at most
_CHUNK = 1 << 20


def prompt_index(entry: dict, key: str = KEY) -> int:
    """The index of the prompt an entry was made from: the stem of its ``<index>.pt`` file."""
    value = entry[key]
    stem = os.path.splitext(os.path.basename(value))[0]
    if not stem.isdigit():
        raise ValueError(f"dataset entry {key}={value!r} is not <prompt index>.pt, as preprocessing names it")
    return int(stem)


def in_prompt_order(gathered, key: str = KEY) -> list:
    """Every rank's entries (``all_gather_object``'s list of lists) as one list, by prompt
    index, each prompt once (the sampler's repeats dropped): what one rank writes."""
    by_index: dict[int, dict] = {}
    for entries in gathered:
        for entry in entries:
            by_index.setdefault(prompt_index(entry, key), entry)
    return [by_index[i] for i in sorted(by_index)]


def source(args) -> str | None:
    """The file a trainer reads its dataset from: ``--data_json_path``, or the Stable Diffusion
    trainer's prompt file (``--prompt_dir``); None when it has neither."""
    return getattr(args, "data_json_path", None) or getattr(args, "prompt_dir", None)


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _named_files(rows: list) -> list[tuple[str, str]]:
    """(folder, file name) of every tensor file the rows name, in row order, each once."""
    out, seen = [], set()
    for row in rows:
        if not isinstance(row, dict):
            continue
        for key in sorted(row):
            value = row[key]
            if isinstance(value, str) and value.endswith(".pt"):
                folder = key[: -len("_path")] if key.endswith("_path") else key
                if (folder, value) not in seen:
                    seen.add((folder, value))
                    out.append((folder, value))
    return out


def digest(path, files_budget: int = FILES_BUDGET) -> dict:
    """What a run records of the dataset at ``path`` (see the module doc); ``problem`` says why
    a part could not be read, and the rest is what could."""
    path = os.path.abspath(str(path))
    out: dict = {"path": path}
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        out["problem"] = f"cannot read {path}: {exc.strerror or exc}"
        return out
    out["sha256"] = hashlib.sha256(data).hexdigest()
    try:
        rows = json.loads(data)
    except ValueError:
        rows = None
    if not isinstance(rows, list):  # a prompt file: one prompt a line
        out["rows"] = len(data.decode("utf-8", "replace").splitlines())
        return out
    out["rows"] = len(rows)
    named = _named_files(rows)
    combined, hashed, missing, read = hashlib.sha256(), 0, [], 0
    root = os.path.dirname(path)
    for folder, name in named:
        file = os.path.join(root, folder, name)
        try:
            size = os.path.getsize(file)
            if hashed and read + size > files_budget:
                break
            combined.update(f"{folder}/{name}\0{_sha256_file(file)}\n".encode())
        except OSError:
            missing.append(f"{folder}/{name}")
            continue
        hashed, read = hashed + 1, read + size
    out.update(files=len(named), files_hashed=hashed, files_sha256=combined.hexdigest())
    if missing:
        out["files_missing"] = len(missing)
        out["problem"] = f"{len(missing)} file(s) the index names are missing, e.g. {missing[0]}"
    return out
