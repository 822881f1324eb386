"""preprocess-order-by-prompt: the embeddings preprocessing writes the same dataset at any world
size, its entries in the order of their prompts' indices, each prompt once.

The ranks' shares are DistributedSampler's, as the scripts make them (FLUX's shuffled, the
others' in order; padded with the first prompts again where the prompts do not divide); the
gathered entries go through the overlay's ``dataset_index.in_prompt_order``.  The real 2-rank
FLUX preprocessing run is tests/patches/test_preprocess.py's."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _dataset_index():
    spec = importlib.util.spec_from_file_location("_dataset_index", ROOT / "overlay" / "dancegrpo_port" / "dataset_index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dataset_index = _dataset_index()


def entry(i: int) -> dict:
    """One prompt's entry as the FLUX script writes it (the others' keys differ, the file names not)."""
    name = f"{i}.pt"
    return {"prompt_embed_path": name, "text_ids": name, "pooled_prompt_embeds_path": name, "caption": f"prompt {i}"}


def gathered(prompts: int, world_size: int, shuffle: bool) -> list[list[dict]]:
    """What all_gather_object hands rank 0: each rank's entries in its sampler's order."""
    from torch.utils.data.distributed import DistributedSampler

    return [[entry(i) for i in DistributedSampler(range(prompts), num_replicas=world_size, rank=rank, shuffle=shuffle)]
            for rank in range(world_size)]


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "flux-shuffled"])
@pytest.mark.parametrize("prompts", [6, 7])
def test_the_written_index_is_the_same_at_any_world_size(prompts, shuffle):
    expected = [entry(i) for i in range(prompts)]
    for world_size in (1, 2, 3, 4):
        assert dataset_index.in_prompt_order(gathered(prompts, world_size, shuffle)) == expected, world_size


def test_an_entry_not_named_by_its_prompt_index_is_refused():
    with pytest.raises(ValueError, match="not <prompt index>.pt"):
        dataset_index.in_prompt_order([[{"prompt_embed_path": "cat.pt"}]])


def preprocessing_scripts() -> list[str]:
    from dancegrpo_npu import registry
    return sorted({registry.get(name).relpath for name in registry.preprocessing()})


@pytest.mark.upstream
@pytest.mark.parametrize("script", preprocessing_scripts())
def test_every_preprocessing_script_orders_what_it_gathers(patched_tree, script):
    """Each script a launch runs imports the overlay's function and orders the gathered entries
    with it between the gather and rank 0's write."""
    text = (patched_tree.tree / script).read_text()
    assert "\nfrom dancegrpo_port.dataset_index import in_prompt_order\n" in text
    gather = re.search(r"\n( +)dist\.all_gather_object\(gathered_data, local_data\)\n(.*)\n", text)
    assert gather, "no gather of the entries"
    assert gather.group(2).startswith(gather.group(1) + "gathered_data = [in_prompt_order(gathered_data)]")
    assert text.index(gather.group(0)) < text.index("json.dump(all_json_data")
