"""``dancegrpo-npu launch preprocess-wan``: upstream's preprocess_wan_2_1_embeddings.py from the
patched tree, run with the diffusers-0.35 set on the tiny Wan pipeline (trainers.wan.fixtures).

One run, one rank, on the CPU, of three prompts and a Chinese one (upstream's dataset drops
it).  What it writes is what the trainer reads: the patched tree's own
``fastvideo/dataset/latent_wan_2_1_rl_datasets.py`` loads the JSON and the embedding files, in
the shapes the tiny Wan's text_dim and WanPipeline's 226 tokens give, and the embeddings are
the ones the smoke's fixture writer made of the same prompts, bit for bit.  A missing prompts
file or model directory is refused before anything starts, in one line.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

torch = pytest.importorskip("torch")

WAN_TEXT_TOKENS = 226  # WanPipeline.encode_prompt's max_sequence_length
CHINESE = "一只猫坐在红色的椅子上"


@pytest.fixture(scope="module")
def wan(patched_tree, shared_runs):
    from depset_035 import diffusers_035_python
    from shared_runs import smoke_fixtures

    from dancegrpo_npu.smoke.fixtures import PROMPTS, build_reward_fixtures
    from dancegrpo_npu.trainers.wan.fixtures import build_wan_fixtures

    python = diffusers_035_python()
    smoke_fixtures(shared_runs, patched_tree.project, "wan")  # the smoke's, built once a test run
    build_dir = patched_tree.project.build_dir
    hps = build_reward_fixtures(build_dir / "fixtures-reward")  # the smoke's: built once a session
    return build_wan_fixtures(build_dir / "fixtures-wan", hps.prompts, python), PROMPTS


def preprocess(project, *args) -> list[str]:
    """The command line of ``launch preprocess-wan`` on the CPU with these script arguments."""
    return ["-C", str(project.root), "launch", "preprocess-wan", "--device", "cpu", "--", *map(str, args)]


@pytest.fixture(scope="module")
def preprocessed(patched_tree, wan, tmp_path_factory):
    from dancegrpo_npu.cli import main

    fixtures, prompts = wan
    work = tmp_path_factory.mktemp("preprocess-wan")
    (work / "prompts.txt").write_text("".join(p + "\n" for p in (*prompts[:3], CHINESE)))
    out = work / "rl_embeddings"
    code = main(preprocess(patched_tree.project, "--model_path", fixtures.model_dir,
                           "--prompt_dir", work / "prompts.txt", "--output_dir", out))
    assert code == 0, "launch preprocess-wan failed"
    return out


def trainers_dataset(tree):
    path = tree / "fastvideo" / "dataset" / "latent_wan_2_1_rl_datasets.py"
    spec = importlib.util.spec_from_file_location("_wan_rl_datasets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports only torch, json, os, random
    return module


@pytest.mark.slow
@pytest.mark.upstream
def test_what_preprocessing_writes_is_what_the_trainer_reads(patched_tree, wan, preprocessed):
    from dancegrpo_npu.trainers.wan.fixtures import TRANSFORMER_CONFIG

    fixtures, prompts = wan
    entries = json.loads((preprocessed / "videos2caption.json").read_text())
    assert entries == [{"prompt_embed_path": f"{i}.pt", "negative_prompt_embeds_path": f"{i}.pt", "caption": p}
                       for i, p in enumerate(prompts[:3])]  # the Chinese prompt dropped, as upstream does
    module = trainers_dataset(patched_tree.tree)
    dataset = module.LatentDataset(str(preprocessed / "videos2caption.json"), 1, 0.0)
    embeds, negative, captions = module.latent_collate_function([dataset[i] for i in range(len(dataset))])
    shape = (3, WAN_TEXT_TOKENS, TRANSFORMER_CONFIG["text_dim"])
    assert tuple(embeds.shape) == shape and tuple(negative.shape) == shape and captions == list(prompts[:3])
    assert embeds.dtype == negative.dtype == torch.bfloat16  # the pipeline runs in bfloat16, as upstream's
    assert torch.isfinite(embeds.float()).all() and torch.isfinite(negative.float()).all()
    smoke_data = fixtures.data_json.parent
    for i in range(3):
        for sub in ("prompt_embed", "negative_prompt_embeds"):
            ours = torch.load(preprocessed / sub / f"{i}.pt", weights_only=True)
            assert torch.equal(ours, torch.load(smoke_data / sub / f"{i}.pt", weights_only=True)), (sub, i)


@pytest.mark.slow  # the tiny Wan pipeline is built (once a session, shared with the Wan smoke)
@pytest.mark.upstream
@pytest.mark.parametrize("missing", ["prompts", "model"])
def test_a_missing_input_is_refused_in_one_line(patched_tree, wan, tmp_path, capsys, missing):
    from dancegrpo_npu.cli import main

    fixtures, prompts = wan
    (tmp_path / "prompts.txt").write_text(prompts[0] + "\n")
    paths = {"prompts": tmp_path / "prompts.txt", "model": fixtures.model_dir}
    paths[missing] = tmp_path / "absent"
    capsys.readouterr()
    code = main(preprocess(patched_tree.project, "--model_path", paths["model"], "--prompt_dir", paths["prompts"],
                           "--output_dir", tmp_path / "out"))
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and err.startswith("dancegrpo-npu: error:"), err
    assert str(tmp_path / "absent") in err
    assert not (tmp_path / "out").exists()
