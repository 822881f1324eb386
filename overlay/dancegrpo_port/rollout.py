"""Batched rollout (issue 10): the Flux trainers' ``sample_reference_model`` in batches.

Patches 0021 and 0022 call this module; it imports torch, the standard library (PIL through the
images it is given) and the overlay's alignment module (for ``refuse``), never the dancegrpo_npu
tool.

``--sample_batch_size N`` (default 1: upstream) sends the G generations of a prompt through the
transformer N at a time; ``--vae_decode_chunk K`` (default N) decodes them K at a time; the
rewards score a rollout batch at once from the decoded images in memory; the PNG files
(``./images/flux_{rank}_{sample}.png``, at N = 1 upstream's names) are written by a background
thread, off the critical path, and waited for before the step ends.

At N = 1 every helper here does what upstream's code does, op for op: one chunk is the whole
tensor (no split), a batch of one is ``unsqueeze(0)``-shaped, the text ids are repeated as
upstream repeats them.  With ``--rng cpu`` every sample gets the noise it gets at N = 1
(dancegrpo_port/alignment.py draws per sample, whatever the batching).
"""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager, nullcontext

import torch

from dancegrpo_port.alignment import refuse
from dancegrpo_port.contract import parse_steps

# ---------------------------------------------------------------- arguments


def group_size(args) -> int:
    """The samples a batch must not straddle: a prompt's generations (--use_group), else the
    rank's whole batch."""
    return args.num_generations if args.use_group else args.train_batch_size


def argument_problem(args) -> str | None:
    """What is wrong with the rollout arguments (one line), or None."""
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


def check_args(args) -> None:
    """Refuse bad rollout arguments before anything is loaded: one line on stderr, exit 2."""
    refuse(argument_problem(args))


def decode_chunk(args) -> int:
    k = getattr(args, "vae_decode_chunk", None)
    return getattr(args, "sample_batch_size", 1) if k is None else k


# ---------------------------------------------------------------- the rollout


def batches(num_samples: int, batch_size: int):
    """The rollout batches, as upstream builds them (``torch.chunk`` of the sample indices)."""
    return torch.chunk(torch.arange(num_samples), num_samples // batch_size)


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


def image_path(rank: int, sample: int) -> str:
    return f"./images/flux_{rank}_{sample}.png"


def hps_inputs(images, captions, preprocess_val, tokenizer, device):
    """HPSv2's image batch and tokens from the decoded images in memory (upstream: one image,
    ``preprocess_val(image).unsqueeze(0)`` and ``tokenizer([caption])``)."""
    image = torch.stack([preprocess_val(im) for im in images]).to(device=device, non_blocking=True)
    text = tokenizer(list(captions)).to(device=device, non_blocking=True)
    return image, text


class PickScoreText:
    """PickScore's text embeddings, once per step.  Upstream encodes ALL the step's captions
    for every image and scores it against the first one; the text only depends on the
    captions, so it is encoded once and each image is scored against its own caption."""

    def __init__(self):
        self.captions, self.embs = None, None

    def __call__(self, processor, model, captions, device) -> torch.Tensor:
        if self.captions != list(captions):
            text_inputs = processor(text=captions, padding=True, truncation=True, max_length=77,
                                    return_tensors="pt").to(device)
            with torch.no_grad():
                embs = model.get_text_features(**text_inputs)
                self.embs = embs / torch.norm(embs, dim=-1, keepdim=True)
            self.captions = list(captions)
        return self.embs


def pickscore(processor, model, text_embs: torch.Tensor, images, batch_idx, device) -> torch.Tensor:
    """Each image of the batch against its own caption's embedding (row batch_idx[j])."""
    image_inputs = processor(images=images, padding=True, truncation=True, max_length=77,
                             return_tensors="pt").to(device)
    with torch.no_grad():
        image_embs = model.get_image_features(**image_inputs)
        image_embs = image_embs / torch.norm(image_embs, dim=-1, keepdim=True)
        scores = text_embs @ image_embs.T  # (captions, images): upstream's product
    rows = torch.as_tensor(batch_idx, device=scores.device).reshape(-1)
    return scores[rows, torch.arange(len(rows), device=scores.device)]


# ---------------------------------------------------------------- PNG files, off the critical path


class ImageWriter:
    """Saves PIL images on a background thread.  ``wait()`` blocks until every image handed
    over is on disk and raises the first error the thread met (a full disk must not vanish)."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def save(self, image, path: str) -> None:
        self._raise()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="rollout-png-writer", daemon=True)
            self._thread.start()
        self._queue.put((image, path))

    def _work(self) -> None:
        while True:
            image, path = self._queue.get()
            try:
                if self._error is None:
                    image.save(path)
            except BaseException as exc:  # noqa: BLE001  (handed to the trainer by wait())
                self._error = RuntimeError(f"writing {path} failed: {exc}")
                self._error.__cause__ = exc
            finally:
                self._queue.task_done()

    def wait(self) -> None:
        self._queue.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


WRITER = ImageWriter()


def save_images(images, rank: int, batch_idx) -> None:
    """One PNG per sample, ./images/flux_{rank}_{sample}.png, in the background."""
    for image, sample in zip(images, torch.as_tensor(batch_idx).reshape(-1).tolist()):
        WRITER.save(image, image_path(rank, sample))


def wait_images() -> None:
    """Before the step ends (and before anything reads the PNG files back)."""
    WRITER.wait()


# ---------------------------------------------------------------- phase times (patch 0022)

TIMER = None  # the run's dancegrpo_port.phases.PhaseTimer (time_phases()); None: nothing timed


def time_phases(timer):
    """Once, in main(): the timer the trainer's phases report to (kept here because upstream's
    sample_reference_model and train_one_step have no handle on the run)."""
    global TIMER
    TIMER = timer
    return timer


def phase(name: str):
    """``with rollout.phase("decode"): ...`` - timed by the run's PhaseTimer, if any."""
    return TIMER.phase(name) if TIMER is not None else nullcontext()


def timed(name: str, items):
    """The items of a loop, the whole loop timed as one phase (the training loop: one line of
    the trainer changes instead of its whole body's indentation)."""
    with phase(name):
        yield from items


def check_profile_steps(args) -> None:
    """Refuse bad --profile_steps text before anything is loaded: one line on stderr, exit 2."""
    steps = getattr(args, "profile_steps", None)
    if steps in (None, ""):
        return
    try:
        parse_steps(steps, "--profile_steps")
    except ValueError as exc:
        refuse(str(exc))
