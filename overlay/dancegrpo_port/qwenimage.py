"""Qwen-Image's rollout helpers: a batch's prompt length, and its decoded images.

Added to the upstream tree by dancegrpo-npu (overlay).  Upstream's Qwen-Image trainers
sample one generation a batch and cut its prompt embeddings to the prompt's own length,
``[:, :original_length[batch_idx]]``, which takes a one-element index only.  A batch of the
batched rollout (``--sample_batch_size``, which divides --num_generations) holds generations
of one prompt: one length.  diffusers' Qwen-Image transformer does not apply
``encoder_hidden_states_mask`` in its attention, so a batch of prompts of different lengths
cannot be padded to one: it is refused.  On the CPU a batch samples bit for bit as its
generations do one at a time (``contiguous_attention`` says what that takes).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def text_length(original_length: torch.Tensor, batch_idx):
    """The prompt length of a rollout batch: upstream's ``original_length[batch_idx]`` for one
    sample, the batch's one length for more (``original_length`` is on the CPU)."""
    lengths = original_length[batch_idx]
    if lengths.numel() == 1:
        return lengths  # upstream's index, exactly
    if not bool((lengths == lengths[0]).all()):
        raise RuntimeError(f"a rollout batch holds prompts of different lengths {lengths.tolist()}: "
                           "a batch must hold generations of one prompt (--sample_batch_size divides "
                           "--num_generations, with --use_group)")
    return int(lengths[0])


def first_frames(postprocess):
    """Upstream's ``postprocess(vae.decode(latents)[0][:, :, 0])``: the Qwen-Image VAE decodes
    (B, C, 1, H, W) videos; their one frame is the image."""
    return lambda videos: postprocess(videos[:, :, 0])


@contextmanager
def contiguous_attention(transformer, on: bool = True):
    """The joint attention's output projections (``to_out[0]`` for the image tokens,
    ``to_add_out`` for the text) get a slice of the attention output.  For one sample that
    slice is contiguous; for a batch it is a strided view, and a bfloat16 ``Linear`` on a
    strided input takes another GEMM path on the CPU, which rounds differently (measured: up
    to 0.008 on the tiny model's outputs, rewards 0.1 % apart after 4 sampling steps).
    Made contiguous, the batch takes the kernel a single sample takes."""
    handles = []
    if on:
        for module in transformer.modules():
            if hasattr(module, "to_add_out") and hasattr(module, "to_out"):
                for projection in (module.to_out[0], module.to_add_out):
                    handles.append(projection.register_forward_pre_hook(_contiguous_input))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _contiguous_input(module, args):
    return tuple(a.contiguous() if torch.is_tensor(a) else a for a in args)
