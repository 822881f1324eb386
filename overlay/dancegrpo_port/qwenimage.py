"""Qwen-Image's rollout helpers: a batch's prompt length (and the Edit trainer's reference
image size), its decoded images, and the Edit trainer's passes after a resume.

Added to the upstream tree by dancegrpo-npu (overlay).  Upstream's Qwen-Image trainers
sample one generation a batch and cut its prompt embeddings to the prompt's own length,
``[:, :original_length[batch_idx]]``, which takes a one-element index only.  A batch of the
batched rollout (``--sample_batch_size``, which divides --num_generations) holds generations
of one prompt: one length.  diffusers' Qwen-Image transformer does not apply
``encoder_hidden_states_mask`` in its attention, so a batch of prompts of different lengths
cannot be padded to one: it is refused.  On the CPU a batch samples bit for bit as its
generations do one at a time (``rollout.contiguous_projections`` says what that takes).  The Edit
trainer's batch also holds one reference image: one ``calculated_height``/``_width``.
"""

from __future__ import annotations

import torch


def text_length(original_length: torch.Tensor, batch_idx) -> torch.Tensor:
    """The prompt length of a rollout batch: upstream's ``original_length[batch_idx]`` for one
    sample, the batch's one length (a one-element tensor, as upstream's) for more
    (``original_length`` is on the CPU)."""
    return one_value(original_length, batch_idx, "lengths")


def one_value(values: torch.Tensor, batch_idx, what: str) -> torch.Tensor:
    """A rollout batch's per-sample figure (the prompt's length; the Edit trainer's reference
    image ``calculated_height`` or ``calculated_width``, of which upstream takes
    ``values[batch_idx].item()``): upstream's one-sample index exactly, and for a batch (its
    samples are generations of one prompt) its one value as a one-element tensor."""
    picked = values[batch_idx]
    if picked.numel() == 1:
        return picked  # upstream's index, exactly
    if not bool((picked == picked[0]).all()):
        raise RuntimeError(f"a rollout batch holds prompts of different {what} {picked.tolist()}: "
                           "a batch must hold generations of one prompt (--sample_batch_size divides "
                           "--num_generations, with --use_group)")
    return picked[:1]


def resume_pass(init_steps: int, epoch: int, steps_per_epoch: int, sampler, batch_size: int) -> int:
    """The Edit trainer's passes over the data (upstream's ``for epoch in range(3)``, each pass
    its own order, ``sampler.set_epoch(epoch)``) after a resume from step ``init_steps``: how
    many of pass ``epoch``'s ``steps_per_epoch`` steps the run had trained (0 without a resume,
    ``steps_per_epoch`` for a pass it had finished).  For the pass it stopped in, ``sampler``'s
    next pass starts after the batches it had used.  A pass that starts afresh (0) is where the
    seam calls ``hooks.data_pass_begin()``: a resume's generators are restored there, before the
    pass's DataLoader iterator draws its seed from torch's generator (the run resumed drew it
    after its checkpoint); inside the pass it stopped in they wait for the first rollout."""
    done = max(0, min(init_steps - epoch * steps_per_epoch, steps_per_epoch))
    if 0 < done < steps_per_epoch:
        from dancegrpo_port.resume import skip_batches

        skip_batches(sampler, done, batch_size)
    return done


def first_frames(postprocess):
    """Upstream's ``postprocess(vae.decode(latents)[0][:, :, 0])``: the Qwen-Image VAE decodes
    (B, C, 1, H, W) videos; their one frame is the image."""
    return lambda videos: postprocess(videos[:, :, 0])
