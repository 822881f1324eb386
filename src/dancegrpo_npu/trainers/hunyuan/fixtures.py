"""Tiny, randomly initialised stand-ins for HunyuanVideo and SkyReels-V1-Hunyuan-I2V, and their datasets.

Real diffusers / transformers classes with small configurations, written with the libraries'
own ``save_pretrained``, laid out as ``hunyuanvideo-community/HunyuanVideo`` (a
``HunyuanVideoPipeline`` directory: ``HunyuanVideoTransformer3DModel``,
``AutoencoderKLHunyuanVideo``, a LLaMA text encoder and tokenizer, a CLIP text encoder and
tokenizer, the flow-match Euler scheduler), so that upstream's loaders read them as they read the
real checkpoints: ``load_transformer("hunyuan_hf")`` (the repo-local transformer class),
``load_vae("hunyuan_hf")``, ``load_text_encoder("hunyuan_hf")``.  What the trainers rely on is
kept: 16 latent channels, 8x spatial and 4x temporal compression, guidance embeddings, the
LLaMA's third-from-last hidden state (``hidden_state_skip_layer=2``), and a LLaMA tokenizer under
which the video prompt template's system turn is 95 tokens, the ``crop_start`` upstream drops:
LLaMA-3's pre-tokenizer over a byte-level BPE trained on the template, so every word of the
template is one token as in the real tokenizer.  SkyReels-I2V's transformer takes 32 input
channels (the noise and the first frame's latents).

The datasets are written as upstream's ``preprocess_hunyuan_embeddings.py`` writes them, with
upstream's own ``HunyuanTextEncoderWrapper.encode_prompt`` from the patched tree (one prompt a
batch, Chinese prompts dropped, ``prompt_embed/<i>.pt``, ``prompt_attention_mask/<i>.pt``,
``videos2caption.json``); SkyReels' ``empty/`` is the empty prompt's, as its second
preprocessing run writes ``data/empty``.  Upstream's preprocessing script copies ``tokenizer/*``
into ``text_encoder/`` first (its loader reads the tokenizer from the encoder's directory); the
pipelines here keep the tokenizers in ``tokenizer/`` and ``tokenizer_2/`` only, and the datasets
are encoded from a scratch copy laid out as that copy leaves it (``with_tokenizers_copied``).

Also under the fixtures directory: the tiny FLUX pipeline SkyReels makes its first frame with
(``trainers.flux.tiny_models``, the FLUX smoke's), and the tiny VideoAlign reward
(``trainers.hunyuan.videoalign``) at ``Qwen2-VL-2B-Instruct/`` and ``videoalign_ckpt/``.

Built in a child process of the default dependency set's interpreter (diffusers 0.32,
transformers 4.46.1): ``python -m dancegrpo_npu.trainers.hunyuan.fixtures DEST PROMPTS TREE``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

# HunyuanVideo's transformer, narrow: 2 heads x 16 (the RoPE splits 16 as 4 + 6 + 6 over frames,
# height, width, as 128 as 16 + 56 + 56), one block of each kind; text_embed_dim is the LLaMA's
# hidden size, pooled_projection_dim the CLIP's.
TRANSFORMER_CONFIG = {
    "in_channels": 16,
    "out_channels": 16,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "num_layers": 1,
    "num_single_layers": 1,
    "num_refiner_layers": 1,
    "mlp_ratio": 2.0,
    "patch_size": 2,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "guidance_embeds": True,
    "text_embed_dim": 32,  # = LLAMA_CONFIG["hidden_size"]
    "pooled_projection_dim": 16,  # = tiny_models.CLIP_TEXT_CONFIG["hidden_size"]
    "rope_theta": 256.0,
    "rope_axes_dim": [4, 6, 6],
}
# SkyReels-V1-Hunyuan-I2V: the noise and the first frame's latents, concatenated on channels.
SKYREELS_TRANSFORMER_CONFIG = {**TRANSFORMER_CONFIG, "in_channels": 32}

# Four blocks: 8x spatial and 4x temporal compression (the trainers hard-code both), 16 latent
# channels, HunyuanVideo's scaling factor.
VAE_CONFIG = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "down_block_types": ["HunyuanVideoDownBlock3D"] * 4,
    "up_block_types": ["HunyuanVideoUpBlock3D"] * 4,
    "block_out_channels": [8, 8, 16, 16],
    "layers_per_block": 1,
    "act_fn": "silu",
    "norm_num_groups": 4,
    "scaling_factor": 0.476986,
    "spatial_compression_ratio": 8,
    "temporal_compression_ratio": 4,
    "mid_block_add_attention": True,
}

# llava-llama-3-8b's language model, narrow; three layers, so hidden_state_skip_layer=2
# (hidden_states[-3]) is a layer's output, not the embeddings.  vocab_size is the tokenizer's.
LLAMA_CONFIG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,  # upstream tokenizes to 256 + 95 = 351
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}

# LLaMA-3's special tokens (ids 0.. here), its pre-tokenizer split, and a BPE trained on the
# prompt template (so its system turn tokenizes word by word) and plain English.
LLAMA_SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>"]
LLAMA_PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_BPE_VOCAB_SIZE = 600

# Upstream's PROMPT_TEMPLATE["dit-llm-encode-video"] (fastvideo/utils/load.py): the tokenizer is
# trained on it; the build checks that the tree's is this one and that its system turn is
# crop_start tokens under the tokenizer.
VIDEO_TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following aspects: "
    "1. The main content and theme of the video."
    "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects."
    "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects."
    "4. background environment, light, style and atmosphere."
    "5. camera angles, movements, and transitions used in the video:<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>")
CROP_START = 95
TEXT_LEN = 256  # upstream's text_len: the LLaMA embeddings kept after the crop

# hunyuanvideo-community/HunyuanVideo's scheduler/scheduler_config.json.
SCHEDULER_CONFIG = {"num_train_timesteps": 1000, "shift": 7.0}

SEEDS = {"transformer": 41, "skyreels_transformer": 42, "vae": 43, "text_encoder": 44, "text_encoder_2": 45}
PARAMS = {"transformer": TRANSFORMER_CONFIG, "skyreels_transformer": SKYREELS_TRANSFORMER_CONFIG,
          "vae": VAE_CONFIG, "llama": LLAMA_CONFIG, "special": LLAMA_SPECIAL_TOKENS,
          "bpe": [LLAMA_PRETOKENIZE_REGEX, LLAMA_BPE_VOCAB_SIZE], "template": [VIDEO_TEMPLATE, CROP_START],
          "scheduler": SCHEDULER_CONFIG, "seeds": SEEDS}

# Upstream files whose code writes the datasets (a change rebuilds).
UPSTREAM_ENCODER_FILES = ("fastvideo/utils/load.py", "fastvideo/models/hunyuan/text_encoder/__init__.py")


@dataclass(frozen=True)
class HunyuanFixtures:
    model_dir: Path  # the tiny HunyuanVideo pipeline directory (diffusers format)
    data_json: Path  # videos2caption.json of its RL-embeddings dataset
    vae_dir: Path  # model_dir / "vae" (the trainer's --vae_model_path is the pipeline directory)
    videoalign_ckpt: Path  # the trainers' ./videoalign_ckpt
    videoalign_base: Path  # VideoAlign's ./Qwen2-VL-2B-Instruct
    skyreels_model_dir: Path  # the tiny SkyReels-I2V pipeline directory (32 input channels)
    skyreels_data_json: Path  # videos2caption.json of its RL-embeddings dataset
    skyreels_empty_dir: Path  # the empty prompt's embeddings (the trainer's ./data/empty)
    flux_dir: Path  # the tiny FLUX pipeline SkyReels makes first frames with (./data/flux)

    @property
    def root(self) -> Path:
        return self.model_dir.parent


def hunyuan_fixtures_at(dest: Path) -> HunyuanFixtures:
    from dancegrpo_npu.trainers.hunyuan.videoalign import BASE_DIR, VIDEOALIGN_CKPT_DIR

    dest = Path(dest)
    sky = dest / "skyreels"
    return HunyuanFixtures(
        model_dir=dest / "pipeline", data_json=dest / "rl_embeddings" / "videos2caption.json",
        vae_dir=dest / "pipeline" / "vae", videoalign_ckpt=dest / VIDEOALIGN_CKPT_DIR,
        videoalign_base=dest / BASE_DIR, skyreels_model_dir=sky / "pipeline",
        skyreels_data_json=sky / "rl_embeddings" / "videos2caption.json", skyreels_empty_dir=sky / "empty",
        flux_dir=sky / "first_frame_flux")


def params_sha256(python: str, tree: Path) -> str:
    """What the build depends on: the parameters, this builder and the ones it reuses, the
    interpreter, and upstream's encoding code in ``tree``."""
    from dancegrpo_npu.smoke import tiny_models as shared
    from dancegrpo_npu.trainers.flux import tiny_models
    from dancegrpo_npu.trainers.hunyuan import videoalign
    from dancegrpo_npu.trainers.qwenimage import fixtures as qwen

    h = hashlib.sha256(json.dumps(PARAMS, sort_keys=True).encode())
    for module in (__file__, shared.__file__, tiny_models.__file__, videoalign.__file__, qwen.__file__):
        h.update(Path(module).read_bytes())
    for rel in UPSTREAM_ENCODER_FILES:
        path = Path(tree) / rel
        h.update(path.read_bytes() if path.is_file() else b"")
    h.update(python.encode())
    return h.hexdigest()


def build_hunyuan_fixtures(dest: Path, prompts: Path, python: str, tree: Path) -> HunyuanFixtures:
    """The HunyuanVideo / SkyReels-I2V fixtures at ``dest``, built with ``python`` (the default
    set's interpreter) and the patched upstream ``tree``'s text encoder unless they are there and
    current; built into a staging directory, then swapped in whole."""
    from dancegrpo_npu.errors import DancegrpoError
    from dancegrpo_npu.smoke.child_build import build_in_child

    tree = Path(tree).resolve()
    if not all((tree / rel).is_file() for rel in UPSTREAM_ENCODER_FILES):
        raise DancegrpoError(f"{tree} is not a patched upstream tree (no {UPSTREAM_ENCODER_FILES[0]})",
                             "run `dancegrpo-npu fetch` and `apply` first")
    want = params_sha256(python, tree) + hashlib.sha256(Path(prompts).read_bytes()).hexdigest()
    dest = build_in_child(dest, want, python, "dancegrpo_npu.trainers.hunyuan.fixtures",
                          [str(Path(prompts).resolve()), str(tree)], "HunyuanVideo",
                          hint="run ./scripts/bootstrap.sh --deps-only (docs/dependencies.md)")
    return hunyuan_fixtures_at(dest)


# ---- run in the child interpreter ---------------------------------------------------------------


def build_llama_tokenizer():
    """A LlamaTokenizerFast over a byte-level BPE with LLaMA-3's pre-tokenizer, trained on the
    video template and plain English (one thread: reproducible); it adds ``<|begin_of_text|>``
    in front, as LLaMA-3's does, and pads with ``<|end_of_text|>``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizerFast

    from dancegrpo_npu.smoke.tiny_models import T5_CORPUS

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=LLAMA_BPE_VOCAB_SIZE, special_tokens=LLAMA_SPECIAL_TOKENS,
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([VIDEO_TEMPLATE.format("")] * 20 + T5_CORPUS.splitlines(), trainer)
    tokenizer = LlamaTokenizerFast(tokenizer_object=bpe, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                   pad_token="<|end_of_text|>", unk_token=None, add_bos_token=True,
                                   add_eos_token=False, model_max_length=131072, legacy=False)
    dropped = len(tokenizer(VIDEO_TEMPLATE.split("{}")[0])["input_ids"])
    if dropped != CROP_START:
        raise RuntimeError(f"the tiny LLaMA tokenizer reads the video template's system turn as {dropped} tokens, "
                           f"not upstream's crop_start {CROP_START}")
    return tokenizer


def build_pipeline(in_channels: int, work_dir: Path):
    """The tiny HunyuanVideoPipeline, its transformer taking ``in_channels`` (16, or 32 for
    SkyReels-I2V); the same text encoders, tokenizers and VAE whatever the channels."""
    import torch
    from diffusers import (AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline,
                           HunyuanVideoTransformer3DModel)
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    from dancegrpo_npu.smoke.fixtures import clip_bpe_path
    from dancegrpo_npu.smoke.tiny_models import CLIP_TEXT_CONFIG, build_clip_tokenizer

    tokenizer = build_llama_tokenizer()
    ids = dict(zip(LLAMA_SPECIAL_TOKENS, tokenizer.convert_tokens_to_ids(LLAMA_SPECIAL_TOKENS)))
    torch.manual_seed(SEEDS["text_encoder"])
    text_encoder = LlamaModel(LlamaConfig(vocab_size=len(tokenizer), bos_token_id=ids["<|begin_of_text|>"],
                                          eos_token_id=ids["<|end_of_text|>"], pad_token_id=ids["<|end_of_text|>"],
                                          torch_dtype="float16", **LLAMA_CONFIG))
    tokenizer_2 = build_clip_tokenizer(clip_bpe_path(), work_dir / "clip")
    torch.manual_seed(SEEDS["text_encoder_2"])
    text_encoder_2 = CLIPTextModel(CLIPTextConfig(**CLIP_TEXT_CONFIG))
    config = SKYREELS_TRANSFORMER_CONFIG if in_channels == 32 else TRANSFORMER_CONFIG
    if config["in_channels"] != in_channels:
        raise ValueError(f"no tiny HunyuanVideo transformer takes {in_channels} channels (16, or 32 for SkyReels)")
    torch.manual_seed(SEEDS["skyreels_transformer" if in_channels == 32 else "transformer"])
    transformer = HunyuanVideoTransformer3DModel(**config)
    torch.manual_seed(SEEDS["vae"])
    vae = AutoencoderKLHunyuanVideo(**VAE_CONFIG)
    return HunyuanVideoPipeline(text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
                                text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2)


def with_tokenizers_copied(pipeline_dir: Path, dest: Path) -> Path:
    """A copy of ``pipeline_dir`` at ``dest`` laid out as upstream's preprocessing script leaves
    the weights folder (``cp -rf tokenizer/* text_encoder``, ``cp -rf tokenizer_2/*
    text_encoder_2``): what upstream's HunyuanTextEncoderWrapper reads its tokenizers from."""
    shutil.copytree(pipeline_dir, dest)
    for tokenizer, encoder in (("tokenizer", "text_encoder"), ("tokenizer_2", "text_encoder_2")):
        for path in sorted((dest / tokenizer).iterdir()):
            shutil.copy2(path, dest / encoder / path.name)
    return dest


def contains_chinese(text: str) -> bool:
    """Upstream's filter (preprocess_hunyuan_embeddings.py drops these prompts)."""
    return bool(re.search(r"[\u4e00-\u9fff]", text))


def check_upstream_template() -> None:
    from fastvideo.utils.load import PROMPT_TEMPLATE

    video = PROMPT_TEMPLATE["dit-llm-encode-video"]
    if video["template"] != VIDEO_TEMPLATE or video["crop_start"] != CROP_START:
        raise RuntimeError("the tree's HunyuanVideo prompt template is not the one the tiny tokenizer is built for")


def write_rl_embeddings(text_encoder, prompts: list[str], out_dir: Path) -> None:
    """As upstream's preprocess_hunyuan_embeddings.py on one rank: Chinese prompts dropped, one
    prompt a batch, ``encode_prompt(prompt=[caption])``, the ``[idx]`` views saved as
    ``<i>.pt``, the JSON entries in its order."""
    import torch

    for sub in ("prompt_embed", "prompt_attention_mask"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    entries = []
    captions = [line for line in prompts if not contains_chinese(line)]
    with torch.inference_mode():
        for i, caption in enumerate(captions):
            batch, idx, name = [caption], 0, f"{i}.pt"
            prompt_embeds, prompt_attention_mask = text_encoder.encode_prompt(prompt=batch)
            torch.save(prompt_embeds[idx], out_dir / "prompt_embed" / name)
            torch.save(prompt_attention_mask[idx], out_dir / "prompt_attention_mask" / name)
            entries.append({"prompt_embed_path": name, "prompt_attention_mask": name, "caption": batch[idx]})
    (out_dir / "videos2caption.json").write_text(json.dumps(entries, indent=4))


def _encode_datasets(pipeline_dir: Path, scratch: Path, datasets: list[tuple[list[str], Path]]) -> None:
    from fastvideo.utils.load import load_text_encoder

    copied = with_tokenizers_copied(pipeline_dir, scratch / pipeline_dir.name)
    text_encoder = load_text_encoder("hunyuan_hf", str(copied), device="cpu")
    for prompts, out_dir in datasets:
        write_rl_embeddings(text_encoder, prompts, out_dir)
    del text_encoder
    shutil.rmtree(copied)


def _main(argv: list[str]) -> int:
    import torch

    from dancegrpo_npu.smoke.fixtures import clip_bpe_path
    from dancegrpo_npu.trainers.flux import tiny_models
    from dancegrpo_npu.trainers.hunyuan import videoalign

    dest, prompts, tree = Path(argv[0]), Path(argv[1]).read_text().splitlines(), Path(argv[2])
    sys.path.insert(0, str(tree))
    check_upstream_template()
    fixtures = hunyuan_fixtures_at(dest)
    scratch = dest / ".scratch"
    dest.mkdir(parents=True)
    with torch.random.fork_rng(devices=[]):
        build_pipeline(16, scratch / "t2v").save_pretrained(str(fixtures.model_dir))
        build_pipeline(32, scratch / "skyreels").save_pretrained(str(fixtures.skyreels_model_dir))
        tiny_models.build_flux_pipeline(clip_bpe_path(), scratch / "first_frame").save_pretrained(str(fixtures.flux_dir))
        _encode_datasets(fixtures.model_dir, scratch / "encode", [(prompts, fixtures.data_json.parent)])
        _encode_datasets(fixtures.skyreels_model_dir, scratch / "encode",
                         [(prompts, fixtures.skyreels_data_json.parent), ([""], fixtures.skyreels_empty_dir)])
        videoalign.build(dest)
    shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
