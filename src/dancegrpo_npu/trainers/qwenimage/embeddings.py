"""The tiny Qwen-Image pipelines' RL-embeddings datasets, written as upstream's preprocessing writes
them (run in the diffusers-0.35 interpreter by ``trainers.qwenimage.fixtures``): the same pipeline calls,
padding, file names and JSON entries as preprocess_qwenimage_embedding.py and
preprocess_qwenimage_edit_embeddings.py on one CPU rank, in file order.  It is also the child
build's entry point (``_main``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from dancegrpo_npu.trainers.qwenimage.fixtures import (CHECKS_NAME, EDIT_EMBED_LENGTH, EDIT_TARGET_AREA, EMBED_LENGTH, SEEDS,
                                               SOURCE_IMAGE_SIZE, QwenFixtures, build_pipeline,
                                               check_pipeline, qwen_fixtures_at)


def contains_chinese(text: str) -> bool:
    """Upstream's preprocessing drops prompts with CJK ideographs (its T5dataset)."""
    return bool(re.search(r"[\u4e00-\u9fff]", text))


def pad_tokens(prompt_embeds, prompt_attention_mask, length: int):
    """As both preprocessing scripts: right-pad the token dimension with zeros to ``length``."""
    import torch.nn.functional as F

    pad_len = length - prompt_embeds.shape[1]
    return (F.pad(prompt_embeds, (0, 0, 0, pad_len), "constant", 0),
            F.pad(prompt_attention_mask, (0, pad_len), "constant", 0))


def write_rl_embeddings(model_dir: Path, prompts: list[str], out_dir: Path) -> None:
    """As upstream's preprocess_qwenimage_embedding.py on one CPU rank: the pipeline in bfloat16,
    prompts with CJK ideographs left out, ``encode_prompt(prompt=)`` on a batch of one under
    autocast, padded to 1024 tokens, the ``[idx]`` views saved, ``<i>.pt`` names."""
    import torch
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(model_dir), torch_dtype=torch.bfloat16)
    for sub in ("prompt_embed", "prompt_attention_mask"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    entries = []
    for i, caption in enumerate(p for p in prompts if not contains_chinese(p)):
        with torch.inference_mode(), torch.autocast("cpu"):
            prompt_embeds, prompt_attention_mask = pipe.encode_prompt(prompt=[caption])
            original_length = prompt_embeds.shape[1]
            prompt_embeds, prompt_attention_mask = pad_tokens(prompt_embeds, prompt_attention_mask, EMBED_LENGTH)
            name = f"{i}.pt"
            torch.save(prompt_embeds[0], out_dir / "prompt_embed" / name)
            torch.save(prompt_attention_mask[0], out_dir / "prompt_attention_mask" / name)
        entries.append({"prompt_embed_path": name, "prompt_attention_mask": name, "caption": caption,
                        "original_length": original_length})
    (out_dir / "videos2caption.json").write_text(json.dumps(entries, indent=4))


def write_edit_inputs(fixtures: QwenFixtures, prompts: list[str]) -> None:
    """The Edit preprocessing's inputs: one reference image per prompt (seeded colour fields)
    and edit_data.jsonl, whose source_image is relative to the image directory."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(SEEDS["images"])
    fixtures.image_dir.mkdir(parents=True)
    lines = []
    for i, instruction in enumerate(prompts):
        low = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        image = Image.fromarray(low).resize((SOURCE_IMAGE_SIZE, SOURCE_IMAGE_SIZE), Image.BILINEAR)
        image.save(fixtures.image_dir / f"{i}.png")
        lines.append(json.dumps({"source_image": f"{i}.png", "instruction": instruction}))
    fixtures.prompt_file.write_text("".join(line + "\n" for line in lines))


def calculate_dimensions(target_area: float, ratio: float) -> tuple[int, int]:
    """The Edit preprocessing's (and QwenImageEditPipeline's): width, height near ``target_area``."""
    import math

    width = math.sqrt(target_area * ratio)
    return round(width / 32) * 32, round(width / ratio / 32) * 32


def write_edit_rl_embeddings(model_dir: Path, fixtures: QwenFixtures, out_dir: Path) -> None:
    """As upstream's preprocess_qwenimage_edit_embeddings.py on one CPU rank: the reference image
    resized to about EDIT_TARGET_AREA (upstream: 1024x1024; its ratio kept), encode_prompt with the image and the instruction,
    the image's VAE latents (``_encode_vae_image``, normalised), embeddings padded to 5000 tokens."""
    import torch
    from diffusers import QwenImageEditPipeline
    from PIL import Image

    pipe = QwenImageEditPipeline.from_pretrained(str(model_dir)).to(torch.bfloat16)
    pipe.vae.to(torch.float32)
    for sub in ("prompt_embed", "prompt_attention_mask", "image_latents"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    entries = []
    for i, line in enumerate(fixtures.prompt_file.read_text().splitlines()):
        item = json.loads(line)
        image = Image.open(fixtures.image_dir / item["source_image"]).convert("RGB")
        width, height = calculate_dimensions(EDIT_TARGET_AREA, image.size[0] / image.size[1])
        with torch.inference_mode(), torch.autocast("cpu"):
            prompt_image = pipe.image_processor.resize(image, height, width)
            pixels = pipe.image_processor.preprocess(prompt_image, height, width).unsqueeze(2)
            prompt_embeds, prompt_attention_mask = pipe.encode_prompt(image=prompt_image, prompt=item["instruction"],
                                                                      device=torch.device("cpu"))
        # The script encodes in bfloat16; bfloat16 3-D convolutions on the CPU take minutes at
        # 1024x1024, float32 seconds: the latents are computed in float32, stored in bfloat16.
        with torch.inference_mode():
            image_latents = pipe._encode_vae_image(image=pixels.float(), generator=None).to(torch.bfloat16)
        original_length = prompt_embeds.shape[1]
        prompt_embeds, prompt_attention_mask = pad_tokens(prompt_embeds, prompt_attention_mask, EDIT_EMBED_LENGTH)
        name = f"{i}.pt"
        torch.save(prompt_embeds[0], out_dir / "prompt_embed" / name)
        torch.save(prompt_attention_mask[0], out_dir / "prompt_attention_mask" / name)
        torch.save(image_latents[0], out_dir / "image_latents" / name)
        entries.append({"prompt_embed_path": name, "prompt_attention_mask": name, "image_latents": name,
                        "caption": item["instruction"], "original_length": original_length,
                        "calculated_height": height, "calculated_width": width})
    (out_dir / "videos2caption.json").write_text(json.dumps(entries, indent=4))


def _main(argv: list[str]) -> int:
    """The child build (``python -m dancegrpo_npu.trainers.qwenimage.embeddings STAGING PROMPTS [--edit]``):
    the pipeline, its checks, its dataset."""
    import torch

    dest, prompts, edit = Path(argv[0]), Path(argv[1]).read_text().splitlines(), "--edit" in argv[2:]
    fixtures = qwen_fixtures_at(dest, edit)
    dest.mkdir(parents=True)
    with torch.random.fork_rng(devices=[]):
        build_pipeline(edit).save_pretrained(str(fixtures.model_dir))
        checks = check_pipeline(fixtures.model_dir, edit)
    (dest / CHECKS_NAME).write_text(json.dumps(checks, indent=2) + "\n")
    if edit:
        write_edit_inputs(fixtures, prompts)
        write_edit_rl_embeddings(fixtures.model_dir, fixtures, fixtures.data_json.parent)
    else:
        fixtures.prompt_file.write_text("".join(p + "\n" for p in prompts))
        write_rl_embeddings(fixtures.model_dir, prompts, fixtures.data_json.parent)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
