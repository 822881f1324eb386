"""A tiny VideoAlign checkpoint, laid out as upstream's ``VideoVLMRewardInference`` loads it.

Upstream (``fastvideo/models/videoalign``) reads, relative to the directory it runs in:

- ``./Qwen2-VL-2B-Instruct``: the base model (``Qwen2VLRewardModelBT.from_pretrained``, a
  ``Qwen2VLForConditionalGeneration`` with a reward head ``rm_head``) and its processor
  (``AutoProcessor.from_pretrained``: the Qwen2 tokenizer, the Qwen2-VL image processor, the
  chat template);
- ``<checkpoint>/model_config.json``: ``data_config``, ``model_config``, ``peft_lora_config``
  (and ``inference_config``, the reward's means and deviations), as VideoAlign's training writes
  them;
- ``<checkpoint>/checkpoint-<step>/``: ``adapter_model.safetensors`` (the LoRA weights, peft's
  names without the adapter) and ``non_lora_state_dict.pth`` (the rest), or ``model.pth``.

Here every part is tiny and built from transformers' and peft's real classes: a Qwen2-VL of one
vision block (16 wide) and two text layers (32 wide), a byte-level BPE tokenizer of a few hundred
tokens with Qwen2-VL's special tokens, the configuration of the released VideoAlign checkpoint
(special reward tokens, ``detailed_special`` prompt, LoRA r=64 on the language model), with
seeded random weights and non-zero LoRA B matrices, so the LoRA path changes the rewards.
Videos are seen at 56x56 (``max_frame_pixels``), 4 patches a side.

Run in the default dependency set's interpreter (transformers 4.46.1, peft 0.13.2):
``python -m dancegrpo_npu.trainers.hunyuan.videoalign DEST`` writes ``DEST/Qwen2-VL-2B-Instruct``
and ``DEST/videoalign_ckpt``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

BASE_DIR = "Qwen2-VL-2B-Instruct"  # upstream's hard-coded ./Qwen2-VL-2B-Instruct
VIDEOALIGN_CKPT_DIR = "videoalign_ckpt"  # the trainers' ./videoalign_ckpt
STEP = 7

REWARD_TOKENS = ["<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>"]  # upstream adds them at load
BPE_VOCAB_SIZE = 400

# Qwen2-VL-2B-Instruct's chat template (its chat_template.json).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: "
    "{% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TEXT_CONFIG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},  # head_dim 16: 8 pairs
    "tie_word_embeddings": False,
}
VISION_CONFIG = {"depth": 1, "embed_dim": 16, "hidden_size": 32, "mlp_ratio": 2, "num_heads": 2,
                 "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}
IMAGE_PROCESSOR_CONFIG = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280, "patch_size": 14, "merge_size": 2,
                          "temporal_patch_size": 2}

# The released checkpoint's model_config.json, sizes aside (its meta_data/data_dir are deleted
# at load; training_args is not read).
DATA_CONFIG = {
    "meta_data": "/path/to/dataset/meta_data.csv",
    "data_dir": "/path/to/dataset",
    "meta_data_test": None,
    "max_frame_pixels": 56 * 56,
    "num_frames": None,
    "fps": 2.0,
    "p_shuffle_frames": 0.0,
    "p_color_jitter": 0.0,
    "eval_dim": ["VQ", "MQ", "TA"],
    "prompt_template_type": "detailed_special",
    "add_noise": False,
    "sample_type": "uniform",
    "use_tied_data": True,
}
MODEL_CONFIG = {
    "model_name_or_path": "Qwen/Qwen2-VL-2B-Instruct",
    "model_revision": "main",
    "output_dim": 1,
    "use_special_tokens": True,
    "freeze_vision_tower": False,
    "freeze_llm": False,
    "tune_merger": True,
    "torch_dtype": "bfloat16",
    "trust_remote_code": False,
    "attn_implementation": None,
    "load_in_8bit": False,
    "load_in_4bit": False,
    "bnb_4bit_quant_type": "nf4",
    "use_bnb_nested_quant": False,
    "reward_token": "special",
    "loss_type": "btt",
}
PEFT_LORA_CONFIG = {
    "lora_enable": True,
    "vision_lora": False,
    "lora_r": 64,
    "lora_alpha": 128,
    "lora_dropout": 0.05,
    "lora_target_modules": None,
    # what VideoAlign's train() saves: the exclusions given, "visual" added without vision_lora
    "lora_namespan_exclude": ["lm_head", "rm_head", "embed_tokens", "visual"],
    "lora_modules_to_save": None,
    "lora_task_type": "CAUSAL_LM",
    "use_rslora": False,
    "num_lora_modules": -1,
}
INFERENCE_CONFIG = {"VQ_mean": 0.1, "VQ_std": 2.0, "MQ_mean": -0.2, "MQ_std": 1.5, "TA_mean": 0.3, "TA_std": 2.5}
SEED = 31
CORPUS = [
    "You are a helpful assistant.",
    "You are tasked with evaluating a generated video based on three distinct criteria: Visual Quality, "
    "Motion Quality, and Text Alignment. Please provide a rating from 0 to 10 for each of the three categories.",
    "A cat walks on the grass. A red car drives along the coast at sunset. The camera remains still.",
] * 10


def build_tokenizer():
    """Qwen2's tokenizer over a byte-level BPE trained on a small corpus (reproducible): the
    Qwen-Image fixtures' builder, at this vocabulary."""
    from dancegrpo_npu.trainers.qwenimage.fixtures import build_tokenizer as build_qwen_tokenizer

    return build_qwen_tokenizer(CORPUS, BPE_VOCAB_SIZE)


def target_modules(model, exclude) -> list[str]:
    """The LoRA targets as VideoAlign's ``find_target_linear_names`` picks them: every Linear and
    Embedding module whose name contains none of ``exclude``."""
    import torch

    return [name for name, module in model.named_modules()
            if not any(word in name for word in exclude)
            and isinstance(module, (torch.nn.Linear, torch.nn.Embedding))]


# The language model's attention queries and keys: at unit deviation their dot products (16 wide)
# are tens, the softmax saturates and the reward token attends to one text token, so the video
# moved the reward by a bfloat16 step or two and a group's two videos often scored alike (a step
# with every advantage 0, step 3 of a 4-step HunyuanVideo smoke).  At 1/sqrt(hidden size) the
# reward token attends over the video's tokens as well.
SOFT_ATTENTION = re.compile(r"^model\.layers\.\d+\.self_attn\.[qk]_proj\.")


def weight_deviation(name: str, hidden_size: int) -> float:
    """The deviation a weight of the tiny Qwen2-VL is drawn at (before the LoRA is added): 1, and
    1/sqrt(hidden size) for the language model's queries and keys (``SOFT_ATTENTION``)."""
    return hidden_size ** -0.5 if SOFT_ATTENTION.match(name) else 1.0


def build(dest: Path) -> tuple[Path, Path]:
    """Write ``dest/Qwen2-VL-2B-Instruct`` and ``dest/videoalign_ckpt``; returns both paths."""
    import safetensors.torch
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor, Qwen2VLProcessor

    from dancegrpo_npu.trainers.qwenimage.fixtures import SPECIAL_TOKENS

    dest = Path(dest)
    base, ckpt = dest / BASE_DIR, dest / VIDEOALIGN_CKPT_DIR
    tokenizer = build_tokenizer()
    ids = dict(zip(SPECIAL_TOKENS, tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS)))
    config = Qwen2VLConfig(
        vocab_size=len(tokenizer), vision_config=VISION_CONFIG, **TEXT_CONFIG,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        torch_dtype="bfloat16")
    torch.manual_seed(SEED)
    model = Qwen2VLForConditionalGeneration(config)
    model.save_pretrained(base, safe_serialization=True)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**IMAGE_PROCESSOR_CONFIG),
                                 tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(base)

    # The trained reward model: the reward tokens added (upstream's use_special_tokens), a
    # reward head, LoRA on the language model; every weight drawn here.
    tokenizer.add_special_tokens({"additional_special_tokens": REWARD_TOKENS})
    model.resize_token_embeddings(len(tokenizer))
    model.rm_head = torch.nn.Linear(config.hidden_size, MODEL_CONFIG["output_dim"], bias=False)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            # unit deviations: at 0.2 the reward barely depended on the video (random clips scored within
            # one bfloat16 step of each other), and a smoke's group of videos scored alike
            parameter.normal_(0.0, weight_deviation(name, config.hidden_size))
    lora = LoraConfig(target_modules=target_modules(model, PEFT_LORA_CONFIG["lora_namespan_exclude"]),
                      r=PEFT_LORA_CONFIG["lora_r"], lora_alpha=PEFT_LORA_CONFIG["lora_alpha"],
                      lora_dropout=PEFT_LORA_CONFIG["lora_dropout"], task_type="CAUSAL_LM", bias="none")
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: the adapter would change nothing
                parameter.normal_(0.0, 0.05)
    step_dir = ckpt / f"checkpoint-{STEP}"
    step_dir.mkdir(parents=True, exist_ok=True)
    adapter = {k: v.to(torch.bfloat16).contiguous() for k, v in get_peft_model_state_dict(peft_model).items()}
    safetensors.torch.save_file(adapter, str(step_dir / "adapter_model.safetensors"))
    non_lora = {k: v.detach().to(torch.bfloat16).clone() for k, v in peft_model.named_parameters() if "lora_" not in k}
    torch.save(non_lora, step_dir / "non_lora_state_dict.pth")
    (ckpt / "model_config.json").write_text(json.dumps({
        "data_config": DATA_CONFIG, "training_args": {"output_dir": str(ckpt)}, "model_config": MODEL_CONFIG,
        "peft_lora_config": PEFT_LORA_CONFIG, "inference_config": INFERENCE_CONFIG}, indent=4))
    return base, ckpt


if __name__ == "__main__":
    for path in build(Path(sys.argv[1])):
        print(path)
