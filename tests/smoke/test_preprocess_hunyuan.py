"""``dancegrpo-npu launch preprocess-hunyuan`` and ``preprocess-skyreels-i2v``: upstream's
preprocess_hunyuan_embeddings.py from the patched tree on the tiny HunyuanVideo and SkyReels-I2V
pipelines (trainers.hunyuan.fixtures), on the CPU.

The pipelines hold their tokenizers only in ``tokenizer/`` and ``tokenizer_2/`` (upstream's script
first copies them into the text encoders' folders): the runs read them where they are and write
nothing into the weights.  What they write is the fixtures' dataset, bit for bit (the fixtures
encode from a copied layout with upstream's own wrapper), and the trainers' LatentDataset reads
it.  The SkyReels-I2V run also writes the empty prompt's embeddings, as upstream's second run
does (``--empty_output_dir``).
"""

from __future__ import annotations

import hashlib
import json

import pytest

torch = pytest.importorskip("torch")

CHINESE = "一只猫坐在红色的椅子上"


def tree_digest(directory) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(directory)).encode() + path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def hunyuan(patched_tree, shared_runs):
    import sys

    from shared_runs import smoke_fixtures

    from dancegrpo_npu.smoke.fixtures import PROMPTS, build_reward_fixtures
    from dancegrpo_npu.trainers.hunyuan.fixtures import build_hunyuan_fixtures

    smoke_fixtures(shared_runs, patched_tree.project, "hunyuan")  # the smoke's, built once a test run
    build_dir = patched_tree.project.build_dir
    prompts = build_reward_fixtures(build_dir / "fixtures-reward").prompts
    return build_hunyuan_fixtures(build_dir / "fixtures-hunyuan", prompts, sys.executable, patched_tree.tree), PROMPTS


def run(project, script, *args) -> int:
    from dancegrpo_npu.cli import main

    return main(["-C", str(project.root), "launch", script, "--device", "cpu", "--", *map(str, args)])


def read_dataset(tree, data_json):
    import importlib.util

    spec = importlib.util.spec_from_file_location("_rl_datasets", tree / "fastvideo" / "dataset" / "latent_rl_datasets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dataset = module.LatentDataset(str(data_json), 2, 0.0)
    return module.latent_collate_function([dataset[i] for i in range(len(dataset))])


@pytest.mark.slow
@pytest.mark.upstream
def test_preprocess_hunyuan_writes_the_fixtures_dataset_without_touching_the_weights(patched_tree, hunyuan, tmp_path):
    fixtures, prompts = hunyuan
    (tmp_path / "prompts.txt").write_text("".join(p + "\n" for p in (*prompts[:3], CHINESE)))
    before = tree_digest(fixtures.model_dir)
    out = tmp_path / "rl_embeddings"
    assert run(patched_tree.project, "preprocess-hunyuan", "--model_path", fixtures.model_dir,
               "--prompt_dir", tmp_path / "prompts.txt", "--output_dir", out) == 0
    assert tree_digest(fixtures.model_dir) == before  # no tokenizer copied into the weights
    assert not (fixtures.model_dir / "text_encoder" / "tokenizer_config.json").exists()
    entries = json.loads((out / "videos2caption.json").read_text())
    assert [e["caption"] for e in entries] == list(prompts[:3])  # the Chinese prompt dropped, as upstream does
    embeds, masks, captions = read_dataset(patched_tree.tree, out / "videos2caption.json")
    ref_embeds, ref_masks, _ = read_dataset(patched_tree.tree, fixtures.data_json)
    assert captions == list(prompts[:3]) and embeds.shape[1] == 257  # the CLIP token + 256 LLaMA tokens
    assert torch.equal(embeds, ref_embeds[: len(captions)]) and torch.equal(masks, ref_masks[: len(captions)])


@pytest.mark.slow
@pytest.mark.extended  # CI keeps preprocess-hunyuan, the same script
@pytest.mark.upstream
def test_preprocess_skyreels_writes_the_empty_prompt_in_the_same_run(patched_tree, hunyuan, tmp_path):
    fixtures, prompts = hunyuan
    (tmp_path / "prompts.txt").write_text("".join(p + "\n" for p in prompts[:2]))
    out, empty = tmp_path / "rl_embeddings", tmp_path / "empty"
    assert run(patched_tree.project, "preprocess-skyreels-i2v", "--model_path", fixtures.skyreels_model_dir,
               "--prompt_dir", tmp_path / "prompts.txt", "--output_dir", out, "--empty_output_dir", empty) == 0
    assert json.loads((empty / "videos2caption.json").read_text()) == [
        {"prompt_embed_path": "0.pt", "prompt_attention_mask": "0.pt", "caption": ""}]
    for sub in ("prompt_embed", "prompt_attention_mask"):  # as the fixtures' second, upstream-style run wrote it
        got = torch.load(empty / sub / "0.pt", weights_only=True)
        want = torch.load(fixtures.skyreels_empty_dir / sub / "0.pt", weights_only=True)
        assert torch.equal(got, want), sub
    assert [e["caption"] for e in json.loads((out / "videos2caption.json").read_text())] == list(prompts[:2])


def test_the_skyreels_preprocessing_writes_the_empty_prompt_where_its_trainer_reads_it():
    from dancegrpo_npu import registry
    preprocess = dict(registry.get("preprocess-skyreels-i2v").defaults)
    trainer = dict(registry.get("skyreels-i2v").defaults)
    assert preprocess["--empty_output_dir"] == trainer["--empty_embeddings_dir"] == "data/empty"
