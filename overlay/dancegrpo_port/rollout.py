"""Batched rollout: the Flux trainers' ``sample_reference_model`` in batches.

The batched-rollout and rewards-in-batches patches call the helpers here; the ``Batching``
feature on the seam (dancegrpo_port/hooks.py) checks that the trainer samples the batches it
was asked for.  It imports torch and the standard library (PIL through the images it is
given), never the dancegrpo_npu tool.

``--sample_batch_size N`` (default 1: upstream) sends the G generations of a prompt through the
transformer N at a time; ``--vae_decode_chunk K`` (default N) decodes them K at a time; the
rewards score a rollout batch at once from the decoded images in memory.

At N = 1 every helper here does what upstream's code does, op for op: one chunk is the whole
tensor (no split), a batch of one is ``unsqueeze(0)``-shaped, the text ids are repeated as
upstream repeats them.  With ``--rng cpu`` every sample gets the noise it gets at N = 1
(dancegrpo_port/alignment.py draws per sample, whatever the batching).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from dancegrpo_port.feature import Feature

# ---------------------------------------------------------------- arguments


def group_size(args) -> int:
    """The samples a batch must not straddle: a prompt's generations (--use_group), else the
    rank's whole batch."""
    return args.num_generations if args.use_group else args.train_batch_size


def argument_problem(args, environ=None) -> str | None:
    """What is wrong with the rollout arguments (one line), or None (``environ``: not read)."""
    n = getattr(args, "sample_batch_size", 1)
    k = getattr(args, "vae_decode_chunk", None)
    g = group_size(args)
    over = "--num_generations" if args.use_group else "--train_batch_size (no --use_group)"
    if n < 1:
        return f"--sample_batch_size {n} must be at least 1 (1 samples one image at a time, as upstream)"
    if g % n:
        divisors = ", ".join(str(d) for d in range(1, g + 1) if g % d == 0)
        return f"--sample_batch_size {n} does not divide {over} {g}: pick one of {divisors}"
    if k is not None and k < 1:
        return f"--vae_decode_chunk {k} must be at least 1 (default: --sample_batch_size)"
    return None


def add_arguments(parser) -> None:
    parser.add_argument(
        "--sample_batch_size",
        type=int,
        default=1,
        help="generations sampled through the transformer at once (default 1, upstream's); "
        "must divide --num_generations",
    )
    parser.add_argument(
        "--vae_decode_chunk",
        type=int,
        default=None,
        help="images decoded by the VAE at once (default: --sample_batch_size)",
    )


class Batching(Feature):
    """The rollout batches the trainer samples are the ones asked for: a tree whose trainer
    still samples one at a time (without the batched-rollout patch) stops at the first batch
    instead of ignoring --sample_batch_size."""

    def __init__(self, sample_batch_size: int):
        self.size = sample_batch_size

    def rollout_batch(self, batch_idx) -> None:
        if len(batch_idx) != self.size:
            raise RuntimeError(f"--sample_batch_size {self.size}: this trainer sampled a batch of {len(batch_idx)} "
                               "(its rollout is not batched: the batched-rollout patch is not in this tree)")


def decode_chunk(args) -> int:
    k = getattr(args, "vae_decode_chunk", None)
    return getattr(args, "sample_batch_size", 1) if k is None else k


# ---------------------------------------------------------------- the rollout


def txt_ids(text_ids: torch.Tensor, length: int) -> torch.Tensor:
    """The transformer's (length, 3) text ids for a batch of per-sample rows.

    Upstream's ``text_ids.repeat(length, 1)`` is right for one sample only: for n rows it makes
    (n * length, 3).  diffusers' Flux takes one set of text ids for the whole batch (given a
    batch of them it takes the first); Flux's are all zeros.  The first row is used, unchecked:
    a check would synchronise the device at every sampling step."""
    if text_ids.shape[0] == 1:
        return text_ids.repeat(length, 1)  # upstream's op
    return text_ids[:1].repeat(length, 1)


def per_sample(latents: torch.Tensor, n: int) -> torch.Tensor:
    """The batch's initial latents: with --init_same_noise the one shared draw (1, C, h, w)
    for each of the n samples (upstream's batch of one uses it as it is)."""
    if latents.shape[0] == n:
        return latents
    return latents.expand(n, *latents.shape[1:])


def image_ids_per_sample(image_ids: torch.Tensor, n: int) -> list:
    """One entry per sample for ``all_image_ids`` (upstream appends one per batch, which at
    n > 1 leaves fewer image ids than samples: the training loop then skips samples)."""
    return [image_ids] * n


def decode(vae, latents: torch.Tensor, chunk: int, postprocess) -> list:
    """``postprocess(vae.decode(latents))`` K samples at a time; one call when K covers the
    batch (upstream's ops).  Chunks of more than one image are decoded with the decoder's
    attention outputs made contiguous (``contiguous_attention``): then a chunk decodes, on the
    CPU, bit for bit as its images do one at a time."""
    if latents.shape[0] == 1:
        return postprocess(vae.decode(latents, return_dict=False)[0])  # upstream's ops, exactly
    images = []
    with contiguous_attention(vae, chunk > 1):
        for part in latents.split(chunk):  # one part, the whole batch, when chunk covers it
            images.extend(postprocess(vae.decode(part, return_dict=False)[0]))
    return images


@contextmanager
def contiguous_attention(vae, on: bool = True):
    """The VAE decoder's attention blocks return ``(B, HW, C) -> (B, C, H, W)`` reshaped
    tensors with channels-last strides.  For a batch of one PyTorch carries on in NCHW (a
    size-1 batch's strides are ambiguous); for a batch of more it carries on channels-last, so
    the GroupNorms and convolutions after the block run their channels-last CPU kernels, which
    round bfloat16 differently: images off by up to 0.035 (a pixel value of 3-7), rewards by
    ~0.3%.  Made contiguous, the batch takes the kernels a single image takes."""
    hooks = [m.register_forward_hook(_contiguous_output) for m in vae.decoder.modules()
             if on and type(m).__name__ == "Attention"]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def _contiguous_output(module, args, output):
    return output.contiguous() if torch.is_tensor(output) else output


@contextmanager
def contiguous_projections(transformer, on: bool = True):
    """A joint attention's output projections (``to_out[0]`` for the image or video tokens,
    ``to_add_out`` for the text: Qwen-Image's, HunyuanVideo's double blocks) get a slice of the
    attention output.  For one sample that slice is contiguous; for a batch it is a strided
    view, and a bfloat16 ``Linear`` on a strided input takes another GEMM path on the CPU, which
    rounds differently (measured: up to 0.008 on the tiny Qwen-Image's outputs, rewards 0.1%
    apart after 4 sampling steps; HunyuanVideo's VideoAlign rewards 0.2-3%).  Made contiguous,
    the batch takes the kernel a single sample takes."""
    handles = []
    if on:
        for module in transformer.modules():
            to_out, to_add_out = getattr(module, "to_out", None), getattr(module, "to_add_out", None)
            if isinstance(to_out, torch.nn.ModuleList) and isinstance(to_add_out, torch.nn.Module):
                for projection in (to_out[0], to_add_out):
                    handles.append(projection.register_forward_pre_hook(_contiguous_input))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _contiguous_input(module, args):
    return tuple(a.contiguous() if torch.is_tensor(a) else a for a in args)


def hps_inputs(images, captions, preprocess_val, tokenizer, device):
    """HPSv2's image batch and tokens from the decoded images in memory (upstream: one image,
    ``preprocess_val(image).unsqueeze(0)`` and ``tokenizer([caption])``)."""
    image = torch.stack([preprocess_val(im) for im in images]).to(device=device, non_blocking=True)
    text = tokenizer(list(captions)).to(device=device, non_blocking=True)
    return image, text


class PickScoreText:
    """PickScore's text embeddings of a step's captions, encoded once.  Upstream encodes ALL the
    step's captions for every image and scores it against the first one; the text depends only
    on the captions (and the frozen reward model), so it is encoded once and each image is
    scored against its own caption."""

    def __init__(self):
        self.key, self.embs = None, None

    def __call__(self, processor, model, captions, device) -> torch.Tensor:
        key = (id(model), tuple(captions))
        if self.key != key:
            text_inputs = processor(text=list(captions), padding=True, truncation=True, max_length=77,
                                    return_tensors="pt").to(device)
            with torch.no_grad():
                embs = model.get_text_features(**text_inputs)
                self.embs = embs / torch.norm(embs, dim=-1, keepdim=True)
            self.key = key
        return self.embs


PICKSCORE_TEXT = PickScoreText()


def pickscore(processor, model, captions, images, batch_idx, device) -> torch.Tensor:
    """Each image of the batch against its own caption (row batch_idx[j] of the step's
    ``captions``), the captions' embeddings encoded once a step."""
    text_embs = PICKSCORE_TEXT(processor, model, captions, device)
    image_inputs = processor(images=images, padding=True, truncation=True, max_length=77,
                             return_tensors="pt").to(device)
    with torch.no_grad():
        image_embs = model.get_image_features(**image_inputs)
        image_embs = image_embs / torch.norm(image_embs, dim=-1, keepdim=True)
        scores = text_embs @ image_embs.T  # (captions, images): upstream's product
    rows = torch.as_tensor(batch_idx, device=scores.device).reshape(-1)
    return scores[rows, torch.arange(len(rows), device=scores.device)]
