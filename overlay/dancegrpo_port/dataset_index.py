"""The RL-embeddings dataset's index (``videos2caption.json``): the order preprocessing writes
it in.

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

Self-contained: the standard library only.
"""

from __future__ import annotations

import os

KEY = "prompt_embed_path"  # every preprocessing script names an entry's files <index>.pt under this key


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

