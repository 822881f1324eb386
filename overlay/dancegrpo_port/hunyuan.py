"""The HunyuanVideo and SkyReels-I2V trainers' names for what the features read.

Upstream's video trainers (``train_grpo_hunyuan.py``, ``train_grpo_skyreels_i2v.py``) are the
FLUX trainer's loop with other names and a few constants in the code:

- ``--use_same_noise`` (HunyuanVideo) is the FLUX trainers' ``--init_same_noise``: one initial
  latent for every generation of a rank's rollout;
- the PPO clip range (1e-4) and the advantage clip (5.0) are literals of the training loop;
- HunyuanVideo scores each video twice (VideoAlign's VQ and MQ heads), normalises each within
  the prompt's generations, and trains on ``--vq_coef`` x VQ + ``--mq_coef`` x MQ; with
  ``--bestofn`` below ``--num_generations`` it trains only the ``bestofn // 2`` best and
  ``bestofn // 2`` worst samples of the rank's step.

:func:`settle` gives the features those names (``args.init_same_noise``, ``args.clip_range``,
``args.trained_samples``) before the seam checks the arguments; :func:`reward` is the reward the
run's metrics and records report.  :func:`video_paths`, :func:`reward_videos` and
:func:`sample_names` are a rollout batch's files, what VideoAlign scores and how a failed
sample is named; :func:`tokenizer_dir` lets the embeddings preprocessing read the weights'
tokenizers where they are, without upstream's copy into the text encoders' folders.
"""

from __future__ import annotations

import os

# The video helpers the Wan trainer's seam uses: a rollout batch decoded K videos at a time, and
# each video's first frame as an image (the records, ./images).
from dancegrpo_port.wan import decode, frames_as_images

__all__ = ["ADV_CLIP_MAX", "CLIP_RANGE", "add_reward_arguments", "decode", "frames_as_images", "reward", "reward_videos", "sample_names",
           "settle", "tokenizer_dir", "trained_samples", "video_paths", "write_empty_prompt"]

CLIP_RANGE = 1e-4  # upstream's training loop: clip_range = 1e-4
ADV_CLIP_MAX = 5.0  # upstream's training loop: adv_clip_max = 5.0


def trained_samples(args) -> int:
    """The samples a rank trains on in a step: all its generations, or best-of-n's selection."""
    generated = args.train_batch_size * (args.num_generations if args.use_group else 1)
    bestofn = getattr(args, "bestofn", None)
    if bestofn is None or bestofn == args.num_generations:
        return generated
    return 2 * min(bestofn // 2, generated)


def settle(args) -> None:
    """The features' names for this trainer's flags and literals (see the module doc)."""
    if not hasattr(args, "init_same_noise"):
        args.init_same_noise = bool(getattr(args, "use_same_noise", False))
    args.clip_range = CLIP_RANGE
    args.adv_clip_max = ADV_CLIP_MAX
    args.trained_samples = trained_samples(args)


def reward(args, vq, mq):
    """The reward the run trains on, as its advantages weigh it: vq_coef x VQ + mq_coef x MQ."""
    return args.vq_coef * vq + args.mq_coef * mq


def video_paths(prefix: str, rank: int, batch_idx) -> list[str]:
    """Each sample's mp4, upstream's name at a batch of one (``./videos/<prefix>_<rank>_<index>.mp4``,
    the batch index being the sample's); at larger batches, the sample's index in the step."""
    return [f"./videos/{prefix}_{rank}_{int(i)}.mp4" for i in batch_idx]


def sample_names(rank: int, batch_idx) -> list[str]:
    """How a reward error names a sample: its rank and its index in the rank's step."""
    return [f"{int(i)} of rank {rank}" for i in batch_idx]


def add_reward_arguments(parser) -> None:
    parser.add_argument(
        "--reward_from_mp4", action="store_true", default=False,
        help="score each video read back from the mp4 written with export_to_video (upstream's way: the reward then "
        "depends on the video encoder); default: the frames as decoded, in memory")


def reward_videos(args, videos, prefix: str, rank: int, batch_idx) -> list:
    """What VideoAlign scores for each video of the batch: its frames as decoded, at the run's
    --fps (``videoalign.Frames``), or with --reward_from_mp4 the mp4 upstream reads back (the
    reward then depends on the video encoder)."""
    if getattr(args, "reward_from_mp4", False):
        return [os.path.abspath(path) for path in video_paths(prefix, rank, batch_idx)]
    from dancegrpo_port.videoalign import Frames

    return [Frames(video, fps=args.fps) for video in videos]


def tokenizer_dir(weights: str, encoder: str, tokenizer: str) -> str:
    """The folder a text encoder's tokenizer is read from: the encoder's own when it holds one
    (upstream's scripts copy ``tokenizer/*`` into ``text_encoder/``), else the weights'
    tokenizer folder, read where it is (nothing is written into the weights)."""
    encoder_dir = os.path.join(weights, encoder)
    if os.path.isfile(os.path.join(encoder_dir, "tokenizer_config.json")):
        return encoder_dir
    return os.path.join(weights, tokenizer)


def write_empty_prompt(text_encoder, out_dir: str, autocast) -> None:
    """The empty prompt's embeddings in ``out_dir`` as upstream's second SkyReels-I2V
    preprocessing run writes them (over ``assets/empty.txt``, one empty line):
    ``prompt_embed/0.pt``, ``prompt_attention_mask/0.pt`` and ``videos2caption.json``.  Every
    rank of that run wrote the same sample 0; here rank 0 writes it once."""
    import json

    import torch

    for sub in ("prompt_embed", "prompt_attention_mask"):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    with torch.inference_mode(), autocast(torch.float16):  # the script's: upstream's autocast("cuda")
        prompt_embeds, prompt_attention_mask = text_encoder.encode_prompt(prompt=[""])
    torch.save(prompt_embeds[0], os.path.join(out_dir, "prompt_embed", "0.pt"))
    torch.save(prompt_attention_mask[0], os.path.join(out_dir, "prompt_attention_mask", "0.pt"))
    entry = {"prompt_embed_path": "0.pt", "prompt_attention_mask": "0.pt", "caption": ""}
    with open(os.path.join(out_dir, "videos2caption.json"), "w") as f:
        json.dump([entry], f, indent=4)
