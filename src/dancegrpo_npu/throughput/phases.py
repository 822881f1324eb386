"""GRPO steps of the patched trainer, timed phase by phase by the trainer's own PhaseTimer.

A bench step is one call of the trainer's ``train_one_step`` for one prompt, between the seam's
``step_begin`` and ``step_end`` (dancegrpo_port/hooks.py), as the trainer's ``main`` makes them;
the GRPO arithmetic (advantages, the clipped loss, the update) is the trainer's, none of it is
here.  What the bench gives it in place of ``main``'s set-up:

- the trainer's arguments for one prompt's G generations (upstream's recipe and the preset's
  sizes; ``--sample_batch_size N``, ``--vae_decode_chunk K``),
- a loader that yields the same random prompt embeddings and caption every step,
- the models of ``models.build_models`` (random weights): the transformer unwrapped (one
  process: no FSDP), with FSDP's ``clip_grad_norm_`` for a single rank,
- AdamW and a constant learning rate, as the recipe's,
- a process group of one rank (the trainer gathers rewards and averages the loss).

So rollout (``run_sample_step`` and its sampler step, N samples a transformer call), decode
(``dancegrpo_port.rollout.decode``, its contiguous attention for chunks of more than one),
reward (``rollout.hps_inputs``, HPSv2 as the trainer scores it) and train (``grpo_one_step``,
the clipped loss, backward, AdamW) are the code a training run runs.  The seam's features
installed for a bench step are alignment (upstream's noise, the GRPO health figures; nothing
recorded), the batching check, the SDE window (``--sde-window-size``: its steps, from step 0),
``PhaseTimes(PhaseTimer())`` and, for the timed steps, ``MetricsLog`` into the run directory's
metrics.jsonl.

Every trainer with in-process bench facts in its registry row is driven the same way: the row
says how a prompt is built (``bench.prompt``: a video trainer's the negative prompt's embeddings
too, zeros here, as its recipe's CFG needs a second batch), how its ``train_one_step`` is called
(``bench.train``), the flags it needs beyond the shared ones (``bench.extra_args``: its CFG) and
the directories its main makes (``bench.run_dirs``: a video trainer's ./videos/ for each
sample's mp4); a video trainer runs one frame (``--t 1``).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from dancegrpo_npu.contract import DEVICE_ENV, PHASES
from dancegrpo_npu.errors import DancegrpoError

# upstream's recipes (their learning rate and weight decay) and the trainers' defaults
LEARNING_RATE, WEIGHT_DECAY, MAX_GRAD_NORM, CLIP_RANGE, ADV_CLIP_MAX = 1e-5, 1e-4, 1.0, 1e-4, 5.0
CAPTION = "a photo of a red fox in the snow"  # every step's prompt (its tokens go to HPS)
LIBRARY_LOGGERS = ("diffusers", "transformers")  # their warnings during a step go to console.log


def load_trainer(tree: Path, device: str, relpath: str):
    """The patched trainer module (``relpath``), imported from ``tree``, and the device kind it resolved.

    Importing it runs the overlay's ``activate()`` (DANCEGRPO_DEVICE), which on Ascend
    imports torch_npu's transfer_to_npu first.
    """
    if not (tree / relpath).is_file():
        raise DancegrpoError(f"bench: {tree} has no {relpath}", "run `dancegrpo-npu fetch && dancegrpo-npu apply` first")
    os.environ[DEVICE_ENV] = device
    if str(tree) not in sys.path:
        sys.path.insert(0, str(tree))
    from dancegrpo_port import device as device_module

    try:
        kind = device_module.activate().kind
    except device_module.DeviceSelectionError as e:
        raise DancegrpoError(f"bench: --device {device}: {e}", "choose another --device (auto takes what is there)", exit_code=2) from None
    import importlib

    return importlib.import_module(relpath.removesuffix(".py").replace("/", ".")), kind


def trainer_args(sizes, n: int, decode_chunk: int, extra=(), sde_window_size: int = 0) -> SimpleNamespace:
    """The trainer flags ``train_one_step`` and ``sample_reference_model`` read: upstream's
    recipe (``--use_group --use_hpsv2 --init_same_noise``, its clip ranges) at the bench's sizes,
    the trainer's ``extra`` ones (its registry row's ``bench.extra_args``), and the seam's SDE
    window (``--sde_window_size``; 0: none, upstream's)."""
    return SimpleNamespace(**dict(extra), **dict(
        h=sizes.height, w=sizes.width, t=1, sampling_steps=sizes.sampling_steps, eta=sizes.eta, shift=sizes.shift,
        num_generations=sizes.generations, use_group=True, train_batch_size=1, init_same_noise=True,
        use_hpsv2=True, use_pickscore=False, timestep_fraction=sizes.timestep_fraction, seed=None,
        clip_range=CLIP_RANGE, adv_clip_max=ADV_CLIP_MAX, gradient_accumulation_steps=sizes.gradient_accumulation_steps,
        sample_batch_size=n, vae_decode_chunk=decode_chunk, sde_window_size=sde_window_size,
    ))  # fmt: skip


def prompt_batch(transformer_cfg, sizes, device, dtype, spec) -> tuple:
    """One prompt as the trainer's loader yields it (its registry row's ``bench.prompt``)."""
    return spec.bench.prompt(transformer_cfg, sizes, device, dtype, CAPTION)


def single_rank_clip_grad_norm(module) -> None:
    """FSDP's ``clip_grad_norm_``, which the trainer calls on its wrapped transformer, for the
    unwrapped one: with one rank it is torch's norm over the trainable parameters."""
    import torch

    params = [p for p in module.parameters() if p.requires_grad]
    module.clip_grad_norm_ = lambda max_norm: torch.nn.utils.clip_grad_norm_(params, max_norm)


@contextlib.contextmanager
def single_rank_group():
    """A process group of this process alone, on the device's backend, for the trainer's
    gather, all_reduce and barrier; none is made when one is up already."""
    import torch.distributed as dist
    from dancegrpo_port.device import dist_backend

    if dist.is_initialized():
        yield
        return
    os.environ.setdefault("RANK", "0")  # sample_reference_model reads it
    dist.init_process_group(dist_backend(), store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class FailedPhase:
    """The trainer's PhaseTimer, remembering the phase a step failed in (the timer forgets it
    on the way out): what an out-of-memory message names."""

    def __init__(self, timer):
        self.timer, self.phase_failed = timer, None

    @contextlib.contextmanager
    def phase(self, name: str):
        with self.timer.phase(name):
            try:
                yield
            except BaseException:
                self.phase_failed = name
                raise

    def step_metrics(self) -> dict:
        return self.timer.step_metrics()


class Bench:
    """The models, prompt, optimizer and seam features shared by every step at every N."""

    def __init__(self, trainer, models, prompt, sizes, kind, device, run_dir: Path, recorded_steps: int = 0,
                 spec=None):
        import torch
        from dancegrpo_port import phases as port_phases

        self.trainer, self.models, self.sizes, self.device, self.run_dir = trainer, models, sizes, device, run_dir
        self.prompt, self.spec = prompt, spec
        for name in spec.bench.run_dirs:  # what the trainer's main makes in the run directory
            (run_dir / name).mkdir(exist_ok=True)
        single_rank_clip_grad_norm(models.transformer)
        params = [p for p in models.transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE, betas=(0.9, 0.999), weight_decay=WEIGHT_DECAY, eps=1e-8)
        self.lr_scheduler = trainer.get_scheduler("constant", optimizer=self.optimizer)
        self.timer = FailedPhase(port_phases.PhaseTimer(kind))
        from dancegrpo_port import alignment  # main's run_start: upstream's noise, GRPO health

        # Nothing recorded, unless ``recorded_steps``: then the timed steps 1..recorded_steps (the
        # warm-up steps are step 0) go to records/ in the run directory, as a launch's with --record.
        args = trainer_args(sizes, 1, 1)
        if recorded_steps:
            args = SimpleNamespace(**vars(args), record=True, record_steps=f"1-{recorded_steps}")
        with self.in_run_dir():
            self.alignment_run = alignment.start(args, 0, 1, device)
        self.logged_steps = 0

    def features(self, n: int, logged: bool, sde_window_size: int = 0) -> list:
        """The seam's features for a step at N, made from the seam's table (dancegrpo_port/hooks.py
        FEATURES) in its order: the rows a bench step takes (alignment: upstream's noise and the
        GRPO health figures; the batching check; the SDE window, of ``sde_window_size`` steps from
        step 0, or none; the phase times) and, for a timed step, those that log it (metrics.jsonl).  Every step shares the bench's alignment run and phase
        timer; a step runs in the run directory, where metrics.jsonl is written."""
        from dancegrpo_port import feature, hooks

        wanted = (feature.BENCH_EVERY_STEP, feature.BENCH_TIMED_STEPS) if logged else (feature.BENCH_EVERY_STEP,)
        context = feature.Context(trainer_args(self.sizes, n, 1, sde_window_size=sde_window_size), 0, 1, self.device,
                                  shared={"alignment": self.alignment_run, "phase_timer": self.timer})
        return hooks.create(context, [row for row in hooks.FEATURES if row.bench in wanted])

    def step(self, n: int, decode_chunk: int, logged: bool, sde_window_size: int = 0) -> dict:
        """One ``train_one_step`` between the seam's step_begin and step_end: its figures
        (time_<phase>, peak_memory_bytes, loss, grad_norm, reward_mean, ..., and with an SDE window
        sde_window and timesteps_trained)."""
        hooks = self.trainer.hooks
        hooks.install(self.features(n, logged, sde_window_size))
        step = self.logged_steps + 1 if logged else 0
        args = trainer_args(self.sizes, n, decode_chunk, self.spec.bench.extra_args, sde_window_size)
        start = time.time()
        with self.in_run_dir():  # records/ (with --record) is written relative to it, as in a launch
            hooks.step_begin(step)
            loss, grad_norm = self.train_one_step(args)  # its rewards_gathered gives the metrics log reward_mean
            figures = hooks.step_end(step, loss=loss, grad_norm=grad_norm,
                                     step_time=time.time() - start, lr=self.lr_scheduler.get_last_lr()[0],
                                     sample_batch_size=n, vae_decode_chunk=decode_chunk)
        self.logged_steps += int(logged)
        return figures

    def train_one_step(self, args):
        """The trainer's train_one_step, called as its main calls it (its registry row's ``bench.train``)."""
        return self.spec.bench.train(self.trainer.train_one_step, args, self.device, self.models, self.optimizer,
                                     self.lr_scheduler, self.prompt, MAX_GRAD_NORM)

    @contextlib.contextmanager
    def in_run_dir(self):
        """Where a launch runs the trainer: in the run directory (its ./reward.txt), its prints
        and progress bars in logs/console.log (the bench's own lines stay on the terminal), and
        so are the libraries' log lines (their handlers hold the stderr of their import)."""
        import logging

        previous = os.getcwd()
        handlers = [h for name in LIBRARY_LOGGERS for h in logging.getLogger(name).handlers
                    if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
        with open(self.run_dir / "logs" / "console.log", "a") as log:
            os.chdir(self.run_dir)
            streams = [h.setStream(log) for h in handlers]
            try:
                with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                    yield
            finally:
                for handler, stream in zip(handlers, streams):
                    handler.setStream(stream)
                os.chdir(previous)

    def release(self) -> None:
        """Free what one sample batch size left behind before the next is measured."""
        import torch

        gc.collect()
        module = getattr(torch, self.device.type, None) if self.device.type != "cpu" else None
        if module is not None:
            module.empty_cache()


@dataclass(frozen=True)
class Result:
    sample_batch_size: int
    phases_s: dict
    peak_memory_bytes: dict
    generations: int
    rewards_finite: bool
    sde_window_size: int = 0  # the SDE window's steps (0: none, every step an SDE step: upstream's)

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
            "sde_window_size": self.sde_window_size,
            "rollout_samples_per_s": self.rollout_samples_per_s,
            "step_samples_per_s": self.step_samples_per_s,
            "phases_s": dict(self.phases_s),
            "peak_memory_bytes": dict(self.peak_memory_bytes),
        }


def result_of(n: int, generations: int, figures: list[dict], sde_window_size: int = 0) -> Result:
    """The timed steps' figures at N (and SDE window): mean seconds and the largest peak, per phase."""
    seconds = {p: sum(f[f"time_{p}"] for f in figures) / len(figures) for p in PHASES}
    peaks = {}
    for p in PHASES:
        values = [f["peak_memory_bytes"][p] for f in figures if f["peak_memory_bytes"].get(p) is not None]
        peaks[p] = max(values) if values else None
    finite = all(math.isfinite(f["reward_mean"]) for f in figures)
    return Result(n, seconds, peaks, generations, finite, sde_window_size)


def measure(bench: Bench, n: int, decode_chunk: int, progress=None, windows=(0,)) -> list[Result]:
    """Warm-up steps (timed, not logged), then the timed ones, logged to metrics.jsonl: each
    step once for each SDE window size of ``windows`` (0: none, upstream's), one after the
    other, so that a change in the machine's load reaches each of them alike.  A Result each."""
    sizes = bench.sizes

    def label(window: int) -> str:
        return f"N={n}" + (f", W={window}" if window else "")

    for k in range(sizes.warmup_steps):
        for window in windows:
            if progress:
                progress(f"{label(window)}: warm-up step {k + 1}/{sizes.warmup_steps}")
            bench.step(n, decode_chunk, logged=False, sde_window_size=window)
    figures = {window: [] for window in windows}
    for k in range(sizes.steps):
        for window in windows:
            if progress:
                progress(f"{label(window)}: timed step {k + 1}/{sizes.steps}")
            figures[window].append(bench.step(n, decode_chunk, logged=True, sde_window_size=window))
    bench.release()
    return [result_of(n, sizes.generations, figures[window], window) for window in windows]


OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


def is_out_of_memory(error: BaseException) -> bool:
    import torch

    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t)
    if isinstance(error, (MemoryError, *oom_types)):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error).lower() for m in OOM_MARKERS)
