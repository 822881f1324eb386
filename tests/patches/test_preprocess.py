"""device-backend.patch and preprocess-model-path.patch on the preprocessing script: the PATCHED stock
preprocess_flux_embedding.py, launched like any run, over the fixture pipeline, writes
the dataset the fixtures hold - same layout, same tensors, the same index in the same order at
2 ranks as one process writes it - and the tree's LatentDataset reads it."""

from __future__ import annotations

import importlib.util
import json

import pytest
from patched_tree_runner import shared_preprocessing

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


@pytest.mark.slow
@pytest.mark.upstream
def test_patched_preprocessing_writes_the_fixture_dataset(patched_tree, shared_runs):
    _, fixtures, out = shared_preprocessing(shared_runs, patched_tree.project)  # test_clean_exit.py's run too

    ours = json.loads((out / "videos2caption.json").read_text())
    # the fixtures' index is one process's, in the prompts' order: 2 ranks write it byte for byte
    # (preprocess-order-by-prompt; without it rank 0's share came first)
    assert [e["caption"] for e in ours] == [e["caption"] for e in json.loads(fixtures.data_json.read_text())]
    assert (out / "videos2caption.json").read_bytes() == fixtures.data_json.read_bytes()
    # and launch's record of what made it (run.datasets)
    assert json.loads((out / "dataset.json").read_text())["preprocessing"] == "preprocess"
    written = sorted(p.name for p in out.iterdir() if p.name != "dataset.json")
    assert written == sorted(p.name for p in fixtures.data_json.parent.iterdir())
    for entry in ours:  # the same file names hold the same tensors (bf16, batch of one, same model)
        for sub, key in (("prompt_embed", "prompt_embed_path"), ("pooled_prompt_embeds", "pooled_prompt_embeds_path"),
                         ("text_ids", "text_ids")):
            a = torch.load(out / sub / entry[key], weights_only=True)
            b = torch.load(fixtures.data_json.parent / sub / entry[key], weights_only=True)
            assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b), (sub, entry)

    module_path = patched_tree.tree / "fastvideo" / "dataset" / "latent_flux_rl_datasets.py"
    spec = importlib.util.spec_from_file_location("_patched_latent_flux_rl_datasets", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dataset = module.LatentDataset(str(out / "videos2caption.json"), 1, 0.0)
    prompt_embeds, pooled, text_ids, captions = module.latent_collate_function([dataset[0], dataset[1]])
    assert text_ids.shape == (2, 3)  # upstream's format: one (3,) row per prompt
    assert prompt_embeds.shape[:1] == pooled.shape[:1] == (2,) and isinstance(captions, list)
