"""Tiny, randomly initialised text encoders, tokenizers and the HPSv2 reward every smoke shares.

Every model here is a real transformers / open_clip (hpsv2) class with a small configuration,
written with the library's own ``save_pretrained`` / ``torch.save``, so that upstream's loading
code reads it exactly as it reads the real checkpoints.  Only the sizes differ; the interfaces the
trainers rely on are kept: T5 sequences of 512 tokens, CLIP's 77-token context and its full
49408-entry vocabulary (the tokenizers emit ids up to 49407, the end-of-text token).  The
denoisers and VAEs are each family's (``trainers/<family>/``), built from these encoders.

The configurations are plain data (``PARAMS``): their hash decides whether a
built fixture directory is still current.  torch, transformers and
hpsv2 are imported inside the functions, so importing this module stays cheap.
"""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

# CLIP-L's text tower, narrow: the vocabulary and 77 positions are kept.
CLIP_TEXT_CONFIG = {
    "vocab_size": 49408,
    "hidden_size": 16,
    "intermediate_size": 32,
    "projection_dim": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "bos_token_id": 49406,
    "eos_token_id": 49407,
    "pad_token_id": 1,
}

# T5 v1.1 (gated-gelu) encoder, narrow; vocab_size is the tokenizer's length.
T5_CONFIG = {
    "d_model": 16,
    "d_kv": 8,
    "d_ff": 32,
    "num_layers": 1,
    "num_heads": 2,
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.0,
    "tie_word_embeddings": False,
    "is_encoder_decoder": False,
    "use_cache": False,
}
T5_MAX_LENGTH = 512  # the T5 pipelines' encode_prompt max_sequence_length
T5_SPM_VOCAB = 256

# An open_clip model config shaped like ViT-H-14.json, tiny.  The text vocabulary
# and context length must stay: hpsv2's tokenizer emits ids up to 49407.  The
# vision tower sees 32x32 images: preprocess_val resizes the decoded 64x64 image.
HPS_MODEL_NAME = "tiny-hps-vit"
HPS_MODEL_CONFIG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 16, "head_width": 8, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1},
}

# A few hundred words of plain English for the T5 sentencepiece model: enough
# pieces that prompts tokenize into words and subwords rather than characters.
T5_CORPUS = """\
a photo of a cat sitting on a red chair next to a window
an astronaut riding a horse on the moon, oil painting
a bowl of fresh fruit on a wooden table in soft morning light
a watercolor landscape with mountains and a lake at sunrise
a portrait of an old man with a grey beard, dramatic lighting
a futuristic city at night with neon signs and flying cars
a small house in a snowy forest, smoke rising from the chimney
a close-up of a dog wearing sunglasses on the beach
a field of sunflowers under a blue sky with white clouds
a cup of coffee and a book on a table by the fireplace
the quick brown fox jumps over the lazy dog
a detailed drawing of a dragon flying over a castle
a bicycle leaning against a yellow wall in an old town
a still life painting of flowers in a glass vase
children playing football in a park on a summer afternoon
a sailing boat on a calm sea at sunset, highly detailed
a robot reading a newspaper in a busy train station
a mountain road winding through green hills and valleys
a plate of pasta with tomato sauce and basil leaves
a lighthouse on a rocky coast during a storm
"""

SEEDS = {"hps_open_clip": 5, "hps": 6}

PARAMS = {
    "clip_text": CLIP_TEXT_CONFIG,
    "t5": T5_CONFIG,
    "t5_max_length": T5_MAX_LENGTH,
    "t5_spm_vocab": T5_SPM_VOCAB,
    "t5_corpus": T5_CORPUS,
    "hps_model_name": HPS_MODEL_NAME,
    "hps_model": HPS_MODEL_CONFIG,
    "seeds": SEEDS,
}


def seeded(seed: int) -> None:
    """torch's global generator seeded: each model of a fixture is made from a seed of its own."""
    import torch

    torch.manual_seed(seed)


def clip_tokenizer_files(bpe_gz: Path, out_dir: Path) -> None:
    """CLIP's ``vocab.json``/``merges.txt`` from OpenAI's BPE file, as HF lays them out.

    The same construction as CLIP's ``SimpleTokenizer``: 256 byte symbols, the
    same with ``</w>``, one entry per merge, then the two special tokens (49408).
    """
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    lines = gzip.decompress(bpe_gz.read_bytes()).decode("utf-8").split("\n")
    merges = lines[1 : 49152 - 256 - 2 + 1]
    symbols = list(bytes_to_unicode().values())
    vocab = symbols + [s + "</w>" for s in symbols]
    vocab += ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False))
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")


def build_clip_tokenizer(bpe_gz: Path, work_dir: Path):
    from transformers import CLIPTokenizer

    clip_tokenizer_files(bpe_gz, work_dir)
    # as the released pipelines' tokenizer/tokenizer_config.json: pad and unk are end-of-text.
    return CLIPTokenizer(
        vocab_file=str(work_dir / "vocab.json"),
        merges_file=str(work_dir / "merges.txt"),
        model_max_length=77,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


def build_t5_tokenizer(work_dir: Path):
    """A T5TokenizerFast over a unigram sentencepiece model trained on ``T5_CORPUS``.

    T5's special ids (pad 0, eos 1, unk 2, no bos) and its 100 sentinel tokens are
    kept.  One thread makes the training reproducible.
    """
    import sentencepiece as spm
    from transformers import T5TokenizerFast

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(T5_CORPUS.splitlines()),
        model_writer=model,
        vocab_size=T5_SPM_VOCAB,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        hard_vocab_limit=False,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    work_dir.mkdir(parents=True, exist_ok=True)
    spiece = work_dir / "spiece.model"
    spiece.write_bytes(model.getvalue())
    tokenizer = T5TokenizerFast(vocab_file=str(spiece), extra_ids=100, model_max_length=T5_MAX_LENGTH, legacy=True)
    # Converting from the slow tokenizer records add_prefix_space, and a saved
    # add_prefix_space makes every later load convert again from sentencepiece
    # (slower, and it needs protobuf); tokenizer.json already holds the result.
    tokenizer.init_kwargs.pop("add_prefix_space", None)
    return tokenizer


def write_hps_checkpoints(config_path: Path, open_clip_ckpt: Path, hps_ckpt: Path) -> None:
    """The two files upstream's HPSv2 loading reads, for the tiny CLIP at ``config_path``.

    ``open_clip_ckpt`` stands for the pretrained open_clip weights (a bare state
    dict, passed as ``pretrained``); ``hps_ckpt`` for ``HPS_v2.1_compressed.pt``
    (``{'state_dict': ...}``, loaded over them).  Different seeds make the two
    differ, so a loader that skipped the second file would be seen.
    """
    import torch
    from hpsv2.src.open_clip import create_model
    from hpsv2.src.open_clip.factory import add_model_config

    config_path.write_text(json.dumps(HPS_MODEL_CONFIG, indent=4) + "\n")
    add_model_config(config_path)
    for seed, path, wrap in ((SEEDS["hps_open_clip"], open_clip_ckpt, False), (SEEDS["hps"], hps_ckpt, True)):
        seeded(seed)
        model = create_model(config_path.stem, None, precision="fp32", device="cpu")
        state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        torch.save({"state_dict": state} if wrap else state, path)
