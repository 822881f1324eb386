"""The FLUX smoke's inputs: a tiny FLUX.1-dev pipeline, the HPSv2-shaped reward, a dataset.

``build_fixtures(dest)`` writes, under ``dest`` (default ``<project>/build/fixtures``)::

    pipeline/                  FluxPipeline.from_pretrained() reads it (model_index.json,
                               transformer/ vae/ text_encoder/ text_encoder_2/
                               tokenizer/ tokenizer_2/ scheduler/)
    hps_ckpt/, prompts.txt     the reward fixtures every smoke shares (smoke.fixtures)
    rl_embeddings/             what preprocess_flux_embedding.py writes: prompt_embed/<i>.pt,
                               pooled_prompt_embeds/<i>.pt, text_ids/<i>.pt, videos2caption.json
    fixtures.stamp.json        written last: parameters hash and the sha256 of every file

Built offline from fixed seeds and swapped in whole, as every fixture directory
(``smoke.fixtures.build_stamped``).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.smoke.fixtures import (
    PROMPTS,
    REWARD_NAMES,
    build_stamped,
    clip_bpe_path,
    params_sha256 as fixture_params_sha256,
    reward_fixtures_at,
    write_reward_fixtures,
)

# What a fixtures directory holds at its top level (anything else there is not ours).
LAYOUT_NAMES = ("pipeline", "rl_embeddings", *REWARD_NAMES)


@dataclass(frozen=True)
class Fixtures:
    model_dir: Path  # tiny FLUX.1-dev-shaped pipeline directory
    hps_model_config: Path  # open_clip model-config JSON of the tiny HPS CLIP
    hps_open_clip_ckpt: Path  # the open_clip weights file upstream's loader reads
    hps_ckpt: Path  # the HPS_v2.1_compressed.pt-shaped file ({'state_dict': ...})
    data_json: Path  # videos2caption.json of an RL-embeddings dataset
    prompts: Path  # the prompts the dataset was made from

    @property
    def root(self) -> Path:
        return self.model_dir.parent

    @property
    def hps_model_name(self) -> str:
        """The name hpsv2's open_clip knows the config by once it is added."""
        return self.hps_model_config.stem


def fixtures_at(dest: Path) -> Fixtures:
    """The paths of the fixtures under ``dest`` (built or not)."""
    dest = Path(dest)
    reward = reward_fixtures_at(dest)
    return Fixtures(
        model_dir=dest / "pipeline",
        hps_model_config=reward.hps_model_config,
        hps_open_clip_ckpt=reward.hps_open_clip_ckpt,
        hps_ckpt=reward.hps_ckpt,
        data_json=dest / "rl_embeddings" / "videos2caption.json",
        prompts=reward.prompts,
    )


def build_fixtures(dest: Path, tree: Path | None = None) -> Fixtures:
    """Build the fixtures at ``dest``, or reuse them when they are complete and current.

    With ``tree`` (a patched upstream tree), the dataset is also read back through
    that tree's own ``LatentDataset`` before it is returned.
    """
    fixtures = fixtures_at(build_stamped(dest, params_sha256(), _write_all, LAYOUT_NAMES))
    if tree is not None:
        check_dataset_with_tree(fixtures, Path(tree))
    return fixtures


def params_sha256() -> str:
    """What the fixtures depend on: the parameters, the builders' code, the libraries' versions."""
    from dancegrpo_npu.smoke import fixtures as shared, tiny_models as shared_models
    from dancegrpo_npu.trainers.flux import tiny_models

    return fixture_params_sha256({"params": tiny_models.PARAMS, "prompts": PROMPTS},
                                 (Path(__file__), Path(tiny_models.__file__), Path(shared.__file__),
                                  Path(shared_models.__file__)))


def write_rl_embeddings(model_dir: Path, prompts: list[str], out_dir: Path) -> None:
    """The RL-embeddings dataset, written as upstream's preprocess_flux_embedding.py writes it.

    Same pipeline load (bfloat16), same ``encode_prompt(prompt=, prompt_2=)``
    call on a batch of one, same ``torch.save`` of the ``[idx]`` views, same
    names (``<i>.pt``) and JSON entries; in file order rather than shuffled.
    """
    import torch
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(model_dir), torch_dtype=torch.bfloat16)
    for sub in ("prompt_embed", "text_ids", "pooled_prompt_embeds"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    entries = []
    with torch.inference_mode():
        for i, caption in enumerate(prompts):
            captions, idx, name = [caption], 0, f"{i}.pt"
            prompt_embeds, pooled_prompt_embeds, text_ids = pipe.encode_prompt(prompt=captions, prompt_2=captions)
            torch.save(prompt_embeds[idx], out_dir / "prompt_embed" / name)
            torch.save(pooled_prompt_embeds[idx], out_dir / "pooled_prompt_embeds" / name)
            torch.save(text_ids[idx], out_dir / "text_ids" / name)
            entries.append({"prompt_embed_path": name, "text_ids": name, "pooled_prompt_embeds_path": name, "caption": captions[idx]})
    (out_dir / "videos2caption.json").write_text(json.dumps(entries, indent=4))


def check_dataset_with_tree(fixtures: Fixtures, tree: Path) -> None:
    """Read the dataset back through ``tree``'s own LatentDataset and collate function."""
    module_path = tree / "fastvideo" / "dataset" / "latent_flux_rl_datasets.py"
    if not module_path.is_file():
        raise DancegrpoError(f"{tree} has no {module_path.relative_to(tree)}", "run `dancegrpo-npu fetch` and `apply` first")
    import torch

    spec = importlib.util.spec_from_file_location("_dancegrpo_latent_flux_rl_datasets", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports only torch, json, os, random
    dataset = module.LatentDataset(str(fixtures.data_json), 1, 0.0)
    batch = module.latent_collate_function([dataset[i] for i in range(min(2, len(dataset)))])
    prompt_embeds, pooled, text_ids, captions = batch
    from dancegrpo_npu.smoke.tiny_models import CLIP_TEXT_CONFIG, T5_CONFIG, T5_MAX_LENGTH

    n = len(captions)
    expected = ((n, T5_MAX_LENGTH, T5_CONFIG["d_model"]), (n, CLIP_TEXT_CONFIG["hidden_size"]), (n, 3))
    got = (tuple(prompt_embeds.shape), tuple(pooled.shape), tuple(text_ids.shape))
    if got != expected or not all(torch.isfinite(t.float()).all() for t in batch[:3]):
        raise DancegrpoError(
            f"{tree}'s LatentDataset reads {fixtures.data_json} as shapes {got}, expected {expected} (all finite)",
            f"delete {fixtures.root} to rebuild the fixtures",
        )


def _write_all(root: Path) -> None:
    """Everything but the stamp, into the empty directory ``root``."""
    from dancegrpo_npu.trainers.flux import tiny_models

    fixtures = fixtures_at(root)
    scratch = root / ".scratch"
    pipe = tiny_models.build_flux_pipeline(clip_bpe_path(), scratch)
    pipe.save_pretrained(str(fixtures.model_dir))
    del pipe
    write_reward_fixtures(root)
    prompts = fixtures.prompts.read_text().splitlines()
    write_rl_embeddings(fixtures.model_dir, prompts, fixtures.data_json.parent)
    shutil.rmtree(scratch)
