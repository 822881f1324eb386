"""Wan2.1's rollout helpers: videos decoded a chunk at a time, and their frames as images.

Added to the upstream tree by dancegrpo-npu (overlay).  Upstream's Wan trainer decodes one
video a batch (``video_processor.postprocess_video(vae.decode(latents))``), writes it to an
mp4 with ``export_to_video`` and scores the first frame read back with ``cv2.VideoCapture``.
``decode`` keeps those ops for a batch of one and decodes larger batches ``chunk`` videos at a
time; ``frames_as_images`` turns one frame of each video into the PIL image the reward scores,
with the uint8 conversion ``export_to_video`` makes (``(frame * 255).astype(uint8)``), so that
scoring it from memory differs from upstream's round trip only by the video codec.
"""

from __future__ import annotations

import numpy as np
import torch


def decode(vae, latents: torch.Tensor, chunk: int, postprocess_video):
    """``postprocess_video(vae.decode(latents))``, ``chunk`` videos at a time: an array
    (B, frames, H, W, 3) of floats in [0, 1], upstream's ``output_type="np"``."""
    if latents.shape[0] == 1 or chunk >= latents.shape[0]:
        return postprocess_video(vae.decode(latents, return_dict=False)[0])  # upstream's ops
    parts = [postprocess_video(vae.decode(part, return_dict=False)[0]) for part in latents.split(chunk)]
    return np.concatenate(parts)


def frames_as_images(videos, index: int = 0) -> list:
    """Frame ``index`` of each video as an RGB PIL image (uint8 as export_to_video writes it)."""
    from PIL import Image

    return [Image.fromarray((np.asarray(video[index]) * 255).astype(np.uint8)) for video in videos]
