"""Tiny, randomly initialised stand-ins for Qwen-Image and Qwen-Image-Edit, and their datasets.

Real diffusers / transformers classes with small configurations, written with the libraries'
own ``save_pretrained``, so that ``DiffusionPipeline.from_pretrained`` (upstream's
preprocessing) and the trainers read them as they read the real checkpoints: a
``QwenImagePipeline`` directory (``QwenImageTransformer2DModel``, ``AutoencoderKLQwenImage``, a
``Qwen2_5_VLForConditionalGeneration`` text encoder, a byte-level BPE ``Qwen2TokenizerFast``,
the flow-match Euler scheduler) or, for the Edit trainer, a ``QwenImageEditPipeline`` directory
(the same parts, plus the Qwen2-VL processor).  What the trainers rely on is kept: 16 latent
channels, 8x spatial downsampling, the VAE's latents_mean/std, 2x2 packing into 64 channels, and
a tokenizer under which the pipelines' prompt templates drop exactly their system prefix (34
tokens, 64 for Edit) as the real Qwen2.5-VL tokenizer does.

The datasets are written (``trainers.qwenimage.embeddings``) as upstream's preprocessing writes them:
preprocess_qwenimage_embedding.py (``prompt_embed/``, ``prompt_attention_mask/``,
``videos2caption.json`` with ``caption`` and ``original_length``, embeddings padded to 1024
tokens) and preprocess_qwenimage_edit_embeddings.py (plus ``image_latents/``, ``calculated_height``/``calculated_width``, padded to 5000 tokens) from
the source images and ``edit_data.jsonl`` written here.  The HPS reward files and the prompts
are the smoke's shared reward fixtures (``smoke.fixtures``).

Qwen-Image needs the diffusers-0.35 dependency set: the tool builds these in a child process of
that set's interpreter, ``python -m dancegrpo_npu.trainers.qwenimage.embeddings DEST PROMPTS [--edit]``,
which also checks the transformer's forward with the trainer's call and the VAE's decode.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

# Qwen-Image's VAE is Wan2.1's architecture (8x spatial, 4x temporal downsampling, 16 latent
# channels, the class's own latents_mean / latents_std): the same tiny configuration.
from dancegrpo_npu.trainers.wan.fixtures import VAE_CONFIG

# Qwen-Image's MMDiT, narrow: 2 heads x 16, the RoPE axes (4, 6, 6) add up to the head dim as
# (16, 56, 56) add up to 128; two blocks, so selective checkpointing has one to take.
TRANSFORMER_CONFIG = {
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,  # = TEXT_CONFIG["hidden_size"]
    "guidance_embeds": False,
    "axes_dims_rope": [4, 6, 6],
}

# Qwen2.5-VL's language model, narrow; its M-RoPE sections add up to half the head dim (16).
TEXT_CONFIG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 8192,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "tie_word_embeddings": False,
}

# Its vision tower: 14-pixel patches, 2x2 merge, window attention as the real one; one block.
VISION_CONFIG = {
    "depth": 1,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_heads": 2,
    "out_hidden_size": 32,  # = TEXT_CONFIG["hidden_size"]
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [0],
}

# The Qwen2-VL image processor: the real one's patching, with a small pixel budget, so a
# reference image is seen as at most 112x112 (16 vision tokens; upstream's 1024x1024 reference
# gives the real processor 1369).
IMAGE_PROCESSOR_CONFIG = {"min_pixels": 3136, "max_pixels": 112 * 112, "patch_size": 14, "merge_size": 2,
                          "temporal_patch_size": 2}

# Qwen-Image's scheduler/scheduler_config.json.
SCHEDULER_CONFIG = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}

# Qwen2's special tokens (ids 0.. here), its pre-tokenizer split, and a vocabulary trained on the
# pipelines' templates (so their system prompts tokenize word by word) and plain English.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]
PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BPE_VOCAB_SIZE = 800

EMBED_LENGTH = 1024  # preprocess_qwenimage_embedding.py pads to it
EDIT_EMBED_LENGTH = 5000  # preprocess_qwenimage_edit_embeddings.py pads to it
# The reference image's area: upstream's calculate_embeds uses 1024x1024 whatever the target size
# (4096 reference tokens, 10 s a forward and backward of the tiny transformer here); the smoke's is
# shrunk as its 64x64 target is from the recipe's 512x512: 128x128, 64 reference tokens.  The
# preprocessing script itself keeps upstream's (tests/smoke/test_qwen_fixtures.py runs it).
EDIT_TARGET_AREA = 128 * 128
SOURCE_IMAGE_SIZE = 64  # the reference images written here (square: 128x128 once resized)

# What the build checks: the trainer's 64x64 (latents 8x8, 4x4 packed tokens).
CHECK_SIZE = 64

# The pipelines' prompt templates (diffusers 0.35's prompt_template_encode, the tokenizer's
# training text) and the prefix length their encode_prompt drops; the build checks both.
TEMPLATES = {  # by pipeline: the text-to-image one, and the edit one
    "text": "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
                 "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}"
                 "<|im_end|>\n<|im_start|>assistant\n",
    "edit": "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
                      "objects, background), then explain how the user's text instruction should alter or modify the "
                      "image. Generate a new image that meets the user's requirements while maintaining consistency "
                      "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n"
                      "<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n",
}
DROP_IDX = {"text": 34, "edit": 64}

SEEDS = {"transformer": 21, "vae": 22, "text_encoder": 23, "images": 24}
PARAMS = {"transformer": TRANSFORMER_CONFIG, "vae": VAE_CONFIG, "text": TEXT_CONFIG, "vision": VISION_CONFIG,
          "image_processor": IMAGE_PROCESSOR_CONFIG, "scheduler": SCHEDULER_CONFIG, "special": SPECIAL_TOKENS,
          "bpe": [PRETOKENIZE_REGEX, BPE_VOCAB_SIZE], "templates": TEMPLATES, "seeds": SEEDS}
CHECKS_NAME = "checks.json"


@dataclass(frozen=True)
class QwenFixtures:
    model_dir: Path  # the tiny QwenImagePipeline (or QwenImageEditPipeline) directory
    data_json: Path  # videos2caption.json of its RL-embeddings dataset
    prompt_file: Path  # the preprocessing's --prompt_dir: prompts.txt, or edit_data.jsonl for Edit
    image_dir: Path | None  # the Edit reference images (edit_data.jsonl names them relative to it)

    @property
    def root(self) -> Path:
        return self.model_dir.parent

    @property
    def edit(self) -> bool:
        return self.image_dir is not None


def qwen_fixtures_at(dest: Path, edit: bool = False) -> QwenFixtures:
    dest = Path(dest)
    if edit:
        return QwenFixtures(dest / "edit-pipeline", dest / "rl_embeddings" / "videos2caption.json",
                            dest / "edit_data.jsonl", dest / "images")
    return QwenFixtures(dest / "pipeline", dest / "rl_embeddings" / "videos2caption.json", dest / "prompts.txt", None)


def params_sha256(python: str, edit: bool) -> str:
    h = hashlib.sha256(json.dumps({"params": PARAMS, "edit": edit}, sort_keys=True).encode())
    h.update(Path(__file__).read_bytes())
    h.update((Path(__file__).parent / "embeddings.py").read_bytes())
    h.update(python.encode())
    return h.hexdigest()


def build_qwen_fixtures(dest: Path, prompts: Path, python: str, edit: bool = False) -> QwenFixtures:
    """The Qwen-Image (``edit``: Qwen-Image-Edit) fixtures at ``dest``, built with ``python``
    (the diffusers-0.35 set's) unless they are there and current; staged, then swapped in whole."""
    from dancegrpo_npu.smoke.child_build import build_in_child

    want = params_sha256(python, edit) + hashlib.sha256(Path(prompts).read_bytes()).hexdigest()
    args = [str(Path(prompts).resolve())] + (["--edit"] if edit else [])
    dest = build_in_child(dest, want, python, "dancegrpo_npu.trainers.qwenimage.embeddings", args,
                          "Qwen-Image-Edit" if edit else "Qwen-Image")
    return qwen_fixtures_at(dest, edit)


# ---- run in the diffusers-0.35 interpreter ------------------------------------------------------


def build_tokenizer(corpus: list[str], vocab_size: int = BPE_VOCAB_SIZE):
    """A Qwen2TokenizerFast over a byte-level BPE of ``vocab_size`` trained on ``corpus`` (one
    thread: reproducible); Qwen2's special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = Qwen2TokenizerFast(tokenizer_object=bpe, unk_token=None, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", model_max_length=32768,
                                   additional_special_tokens=SPECIAL_TOKENS[1:])
    return tokenizer


def build_parts(edit: bool):
    """The tiny pipeline's components (same seeds for both pipelines: Edit adds the processor)."""
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from dancegrpo_npu.smoke.tiny_models import T5_CORPUS

    templates = [TEMPLATES["text"], TEMPLATES["edit"]]
    tokenizer = build_tokenizer([t.format("") for t in templates] * 20 + T5_CORPUS.splitlines())
    ids = dict(zip(SPECIAL_TOKENS, tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS)))
    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": len(tokenizer), **TEXT_CONFIG}, vision_config=VISION_CONFIG,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    torch.manual_seed(SEEDS["text_encoder"])
    parts = {"tokenizer": tokenizer, "text_encoder": Qwen2_5_VLForConditionalGeneration(config)}
    torch.manual_seed(SEEDS["transformer"])
    parts["transformer"] = QwenImageTransformer2DModel(**TRANSFORMER_CONFIG)
    torch.manual_seed(SEEDS["vae"])
    parts["vae"] = AutoencoderKLQwenImage(**VAE_CONFIG)
    parts["scheduler"] = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    if edit:
        from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

        parts["processor"] = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**IMAGE_PROCESSOR_CONFIG),
                                              tokenizer=tokenizer, video_processor=Qwen2VLVideoProcessor())
    return parts


def build_pipeline(edit: bool):
    """The tiny QwenImagePipeline or QwenImageEditPipeline; refuses a tokenizer under which the
    pipeline's encode_prompt would not drop exactly its template's system turn."""
    from diffusers import QwenImageEditPipeline, QwenImagePipeline

    parts = build_parts(edit)
    pipe = (QwenImageEditPipeline if edit else QwenImagePipeline)(**parts)
    name = "edit" if edit else "text"
    if pipe.prompt_template_encode != TEMPLATES[name] or pipe.prompt_template_encode_start_idx != DROP_IDX[name]:
        raise RuntimeError(f"this diffusers' {type(pipe).__name__} prompt template is not the one the tokenizer is built for")
    system_turn = TEMPLATES[name].split("<|im_start|>user\n")[0] + "<|im_start|>user\n"
    dropped = len(parts["tokenizer"](system_turn)["input_ids"])
    if dropped != DROP_IDX[name]:
        raise RuntimeError(f"the tiny tokenizer reads the {name} pipeline's system turn as {dropped} tokens, not {DROP_IDX[name]}")
    return pipe


def check_pipeline(model_dir: Path, edit: bool) -> dict:
    """Load the written directory as the preprocessing does; run the transformer with the
    trainer's call at 64x64 (packed latents, timestep, encoder_hidden_states_mask, img_shapes,
    txt_seq_lens; for Edit the reference image's tokens appended) and decode a [1,16,1,8,8]
    latent with the VAE.  Returns the shapes seen; raises when one is not the trainer's."""
    import torch
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(model_dir), torch_dtype=torch.bfloat16)
    side = CHECK_SIZE // 8 // 2  # packed tokens per side
    z = torch.randn(1, side * side, 64, dtype=torch.bfloat16)
    text = torch.randn(1, 7, TEXT_CONFIG["hidden_size"], dtype=torch.bfloat16)
    img_shapes = [[(1, side, side)] + ([(1, side, side)] if edit else [])]
    hidden = torch.cat([z, torch.randn_like(z)], dim=1) if edit else z
    with torch.no_grad():
        pred = pipe.transformer(hidden_states=hidden, timestep=torch.tensor([0.5]), guidance=None,
                                encoder_hidden_states_mask=torch.ones(1, 7, dtype=torch.long),
                                encoder_hidden_states=text, img_shapes=img_shapes, txt_seq_lens=[7],
                                attention_kwargs=None, return_dict=False)[0]
        image = pipe.vae.decode(torch.randn(1, 16, 1, CHECK_SIZE // 8, CHECK_SIZE // 8, dtype=torch.bfloat16),
                                return_dict=False)[0]
    seen = {"transformer_out": list(pred.shape), "vae_decoded": list(image.shape),
            "pipeline": type(pipe).__name__}
    want = {"transformer_out": list(hidden.shape[:2]) + [64], "vae_decoded": [1, 3, 1, CHECK_SIZE, CHECK_SIZE]}
    if any(seen[k] != v for k, v in want.items()) or not torch.isfinite(pred.float()).all():
        raise RuntimeError(f"the tiny Qwen-Image parts give {seen}, the trainer needs {want} (finite)")
    return seen
