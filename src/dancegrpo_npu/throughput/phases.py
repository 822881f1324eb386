"""One GRPO step, timed phase by phase, with the patched trainer's own building blocks.

The step is what ``train_one_step`` does for one prompt, with the G generations taken N at a
time instead of upstream's hard-coded 1:

rollout  ``run_sample_step`` over all sampling steps, N samples a transformer call
         (noise from ``pack_latents``, ids from ``prepare_latent_image_ids``, the sigmas
         from ``sd3_time_shift``; ``flux_step`` inside draws the SDE noise and log-probs);
decode   the VAE on the final latents (``unpack_latents``, the scale and shift), in chunks;
reward   HPSv2 on the decoded images, N at a time, kept on the device (upstream goes
         through PIL and a PNG file, one image at a time);
train    the trainer's loop: per sample (batch 1, the training layout), the first
         ``int((S-1) * timestep_fraction)`` of a random permutation of the timesteps through
         ``grpo_one_step``, the clipped GRPO loss, backward (activation checkpointing), and an
         AdamW step every ``gradient_accumulation_steps`` samples after clipping the grad norm.

Each phase starts and ends with a device synchronisation; its peak memory is the device
allocator's ``max_memory_allocated`` after a reset, or on the CPU the process's peak RSS
(``VmHWM`` after resetting it through ``/proc/self/clear_refs``), which includes the weights.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from dancegrpo_npu.contract import DEVICE_ENV, PHASES
from dancegrpo_npu.errors import DancegrpoError

TRAINER = "fastvideo/train_grpo_flux.py"
# upstream's recipe (finetune_flux_grpo.sh) and the trainer's defaults
LEARNING_RATE, WEIGHT_DECAY, MAX_GRAD_NORM, CLIP_RANGE, ADV_CLIP_MAX, GUIDANCE = 1e-5, 1e-4, 1.0, 1e-4, 5.0, 3.5


def load_trainer(tree: Path, device: str):
    """The patched trainer module, imported from ``tree``, and the device kind it resolved.

    Importing it runs the overlay's ``activate()`` (DANCEGRPO_DEVICE), which on Ascend
    imports torch_npu's transfer_to_npu first.  It needs no process group: only
    ``main`` and ``train_one_step`` use torch.distributed, and the bench calls neither.
    """
    if not (tree / TRAINER).is_file():
        raise DancegrpoError(f"bench: {tree} has no {TRAINER}", "run `dancegrpo-npu fetch && dancegrpo-npu apply` first")
    os.environ[DEVICE_ENV] = device
    if str(tree) not in sys.path:
        sys.path.insert(0, str(tree))
    from dancegrpo_port import device as device_module

    try:
        kind = device_module.activate().kind
    except device_module.DeviceSelectionError as e:
        raise DancegrpoError(f"bench: --device {device}: {e}", "choose another --device (auto takes what is there)", exit_code=2) from None
    import fastvideo.train_grpo_flux as trainer

    return trainer, kind


class Meter:
    """Wall clock and peak memory of a phase, with the device synchronised at both ends."""

    def __init__(self, kind: str):
        import torch

        self.kind = kind
        self.module = None if kind == "cpu" else getattr(torch, kind)
        self.phase: str | None = None  # where we are, for an out-of-memory message

    def sync(self) -> None:
        if self.module is not None:
            self.module.synchronize()

    def reset_peak(self) -> None:
        if self.module is not None:
            self.module.reset_peak_memory_stats()
            return
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS

    def peak(self) -> int | None:
        if self.module is not None:
            return int(self.module.max_memory_allocated())
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return None

    @contextlib.contextmanager
    def measure(self, phase: str, record: "StepRecord"):
        self.phase = phase
        self.sync()
        self.reset_peak()
        start = time.perf_counter()
        yield
        self.sync()
        record.seconds[phase] = time.perf_counter() - start
        record.peak_bytes[phase] = self.peak()
        self.phase = None


@dataclass
class StepRecord:
    seconds: dict = field(default_factory=dict)
    peak_bytes: dict = field(default_factory=dict)
    rewards: list = field(default_factory=list)
    loss: float = 0.0


@dataclass
class Inputs:
    """One prompt's inputs, G times (upstream repeats a prompt's embeddings per generation)."""

    encoder_hidden_states: object  # (G, text_tokens, joint_attention_dim)
    pooled_prompt_embeds: object  # (G, pooled_projection_dim)
    text_ids: object  # (1, 3): see make_inputs
    hps_tokens: object  # (G, context_length)


def make_inputs(transformer_cfg, hps_cfg, sizes, device, dtype) -> Inputs:
    """Random prompt embeddings in the dataset's layout, and a tokenized caption for HPS.

    text_ids are all zeros (FluxPipeline.encode_prompt); the trainer repeats them
    ``encoder_hidden_states.shape[1]`` times along dim 0, so one (1, 3) row makes the
    (text_tokens, 3) the transformer needs for any batch size.
    """
    import torch

    g = sizes.generations
    embed = torch.randn(1, sizes.text_tokens, transformer_cfg["joint_attention_dim"], device=device, dtype=dtype)
    pooled = torch.randn(1, transformer_cfg["pooled_projection_dim"], device=device, dtype=dtype)
    context = hps_cfg["text_cfg"]["context_length"]
    # A caption's ids as hpsv2's tokenizer lays them out: start, words, end, zero padding.
    tokens = torch.zeros(1, context, dtype=torch.long)
    words = torch.arange(1000, 1000 + min(12, context - 2))
    tokens[0, 0], tokens[0, 1 : 1 + len(words)], tokens[0, 1 + len(words)] = 49406, words, 49407
    return Inputs(
        encoder_hidden_states=embed.repeat(g, 1, 1),
        pooled_prompt_embeds=pooled.repeat(g, 1),
        text_ids=torch.zeros(1, 3, device=device, dtype=dtype),
        hps_tokens=tokens.repeat(g, 1).to(device),
    )


def hps_preprocess(hps):
    """preprocess_val's tensor steps on the device: bicubic resize of the short side, centre
    crop, CLIP's normalisation (upstream applies them to a PIL image of the decoded tensor)."""
    from torchvision import transforms

    size = hps.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    return transforms.Compose([
        transforms.Resize(size, interpolation=transforms.InterpolationMode.BICUBIC, antialias=True),
        transforms.CenterCrop(size),
        transforms.Normalize(hps.visual.image_mean, hps.visual.image_std),
    ])  # fmt: skip


class Bench:
    """The models, inputs and optimizer shared by every step at every sample batch size."""

    def __init__(self, trainer, models, inputs, sizes, kind, device, dtype, autocast):
        import torch

        self.trainer, self.models, self.inputs, self.sizes = trainer, models, inputs, sizes
        self.device, self.dtype, self.autocast = device, dtype, autocast
        self.meter = Meter(kind)
        self.args = SimpleNamespace(eta=sizes.eta)  # what run_sample_step / grpo_one_step read
        self.params = [p for p in models.transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=LEARNING_RATE, betas=(0.9, 0.999), weight_decay=WEIGHT_DECAY, eps=1e-8)
        self.preprocess = hps_preprocess(models.hps)
        self.sigmas = trainer.sd3_time_shift(sizes.shift, torch.linspace(1, 0, sizes.sampling_steps + 1))

    def step(self, n: int, decode_chunk: int) -> StepRecord:
        record = StepRecord()
        with self.meter.measure("rollout", record):
            latents, trajectory, log_probs = self.rollout(n)
        with self.meter.measure("decode", record):
            images = self.decode(latents, decode_chunk)
        with self.meter.measure("reward", record):
            rewards = self.reward(images, n)
        del images
        with self.meter.measure("train", record):
            record.loss = self.train(trajectory, log_probs, rewards)
        record.rewards = rewards.float().tolist()
        return record

    def rollout(self, n: int):
        import torch

        t = self.trainer
        s, g, inp = self.sizes, self.sizes.generations, self.inputs
        h, w = s.height // 8, s.width // 8
        image_ids = t.prepare_latent_image_ids(n, h // 2, w // 2, self.device, torch.bfloat16)
        finals, trajectories, log_probs = [], [], []
        for first in range(0, g, n):
            rows = slice(first, first + n)
            noise = torch.randn((n, 16, h, w), device=self.device, dtype=self.dtype)
            z = t.pack_latents(noise, n, 16, h, w)
            with torch.no_grad():
                _z, final, trajectory, log_prob = t.run_sample_step(
                    self.args, z, range(s.sampling_steps), self.sigmas, self.models.transformer,
                    inp.encoder_hidden_states[rows], inp.pooled_prompt_embeds[rows], inp.text_ids, image_ids, True)
            finals.append(final)
            trajectories.append(trajectory)
            log_probs.append(log_prob)
        return torch.cat(finals), torch.cat(trajectories), torch.cat(log_probs)

    def decode(self, latents, chunk: int):
        import torch

        vae, s = self.models.vae, self.sizes
        images = []
        with torch.inference_mode(), self.autocast(torch.bfloat16):
            for first in range(0, latents.shape[0], chunk):
                x = self.trainer.unpack_latents(latents[first : first + chunk], s.height, s.width, 8)
                x = x / vae.config.scaling_factor + vae.config.shift_factor
                images.append(vae.decode(x.to(self.dtype), return_dict=False)[0])
        return torch.cat(images)

    def reward(self, images, n: int):
        import torch

        scores = []
        with torch.no_grad(), self.autocast():
            for first in range(0, images.shape[0], n):
                pixels = self.preprocess(((images[first : first + n].float() + 1) / 2).clamp(0, 1))
                out = self.models.hps(pixels, self.inputs.hps_tokens[first : first + n])
                scores.append(torch.diagonal(out["image_features"] @ out["text_features"].T))
        return torch.cat(scores).float()

    def train(self, trajectory, log_probs, rewards) -> float:
        """train_one_step's update, samples one at a time (see the module docstring)."""
        import torch

        s, inp, t = self.sizes, self.inputs, self.trainer
        g, steps = rewards.shape[0], s.sampling_steps - 1
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        advantages = torch.nan_to_num(advantages).clamp(-ADV_CLIP_MAX, ADV_CLIP_MAX)
        timestep_values = torch.tensor([int(sigma * 1000) for sigma in self.sigmas][:steps], device=self.device)
        h, w = s.height // 8, s.width // 8
        image_ids = t.prepare_latent_image_ids(1, h // 2, w // 2, self.device, torch.bfloat16)[None]
        total = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for i in range(g):
            perm = torch.randperm(steps)
            for j in perm[: s.train_timesteps].tolist():
                new_log_prob = t.grpo_one_step(
                    self.args, trajectory[i : i + 1, j], trajectory[i : i + 1, j + 1],
                    inp.encoder_hidden_states[i : i + 1], inp.pooled_prompt_embeds[i : i + 1], inp.text_ids,
                    image_ids, self.models.transformer, timestep_values[j : j + 1], j, self.sigmas)
                ratio = torch.exp(new_log_prob - log_probs[i : i + 1, j])
                unclipped = -advantages[i] * ratio
                clipped = -advantages[i] * torch.clamp(ratio, 1.0 - CLIP_RANGE, 1.0 + CLIP_RANGE)
                loss = torch.mean(torch.maximum(unclipped, clipped)) / (s.gradient_accumulation_steps * s.train_timesteps)
                loss.backward()
                total += loss.item()
            if (i + 1) % s.gradient_accumulation_steps == 0:
                torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        return total

    def release(self) -> None:
        """Free what one sample batch size left behind before the next is measured."""
        gc.collect()
        if self.meter.module is not None:
            self.meter.module.empty_cache()


@dataclass(frozen=True)
class Result:
    sample_batch_size: int
    phases_s: dict
    peak_memory_bytes: dict
    generations: int
    rewards_finite: bool

    @property
    def rollout_s(self) -> float:
        return self.phases_s["rollout"] + self.phases_s["decode"] + self.phases_s["reward"]

    @property
    def rollout_samples_per_s(self) -> float:
        return self.generations / self.rollout_s

    @property
    def step_samples_per_s(self) -> float:
        return self.generations / sum(self.phases_s.values())

    def as_json(self) -> dict:
        return {
            "sample_batch_size": self.sample_batch_size,
            "rollout_samples_per_s": self.rollout_samples_per_s,
            "step_samples_per_s": self.step_samples_per_s,
            "phases_s": dict(self.phases_s),
            "peak_memory_bytes": dict(self.peak_memory_bytes),
        }


def measure(bench: Bench, n: int, decode_chunk: int, progress=None) -> Result:
    """Warm-up steps, then the timed ones: mean seconds and the largest peak, per phase."""
    import math

    sizes = bench.sizes
    for k in range(sizes.warmup_steps):
        if progress:
            progress(f"N={n}: warm-up step {k + 1}/{sizes.warmup_steps}")
        bench.step(n, decode_chunk)
    records = []
    for k in range(sizes.steps):
        if progress:
            progress(f"N={n}: timed step {k + 1}/{sizes.steps}")
        records.append(bench.step(n, decode_chunk))
    bench.release()
    seconds = {p: sum(r.seconds[p] for r in records) / len(records) for p in PHASES}
    peaks = {}
    for p in PHASES:
        values = [r.peak_bytes[p] for r in records if r.peak_bytes[p] is not None]
        peaks[p] = max(values) if values else None
    finite = all(math.isfinite(x) for r in records for x in r.rewards)
    return Result(n, seconds, peaks, sizes.generations, finite)


OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


def is_out_of_memory(error: BaseException) -> bool:
    import torch

    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t)
    if isinstance(error, (MemoryError, *oom_types)):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error).lower() for m in OOM_MARKERS)
