"""Alignment with a reference run: one noise source, stage records, GRPO health.

A feature on the seam (dancegrpo_port/hooks.py): the trainers reach it through the hooks only.
It imports only torch, safetensors and the standard library, never the dancegrpo_npu tool.
``hooks.run_start`` makes the run's ``Run`` (``run_of``) and installs its ``Alignment`` feature,
which answers the seam's noise events (``hooks.initial_latents``, ``sde_noise``,
``timestep_perms``: upstream draws its SDE noise deep inside ``flux_step``, which calls the seam).
Where no feature answers (before ``run_start``), the draws are upstream's (``UPSTREAM_NOISE``,
``--rng device``) and nothing is recorded.

Noise (``--rng``, ``--replay``)
  device  upstream's draws, call for call: ``torch.randn(shape, device=, dtype=bfloat16)``
          for the initial latents (one (1, 16, h/8, w/8) draw before the rollout with
          --init_same_noise, else one (n, 16, h/8, w/8) draw per rollout batch of n),
          ``torch.randn_like(prev_sample_mean)`` for the SDE noise of every sampling step (of the
          SDE window's steps only, with one: the ODE steps draw nothing),
          ``torch.randperm(S - 1)`` on the global CPU generator, one per sample, for the
          timestep permutations.
  cpu     ONE ``torch.Generator("cpu")`` seeded ``seed * 1000 + rank`` for the whole run.
          Each step draws, in this order, in float32 on the CPU (B samples on the rank,
          S sampling steps, tokens = (h/16) * (w/16)):
            with --init_same_noise: randn((1, 16, h/8, w/8))          shared initial latents
            for each sample b = 0..B-1:
              without --init_same_noise: randn((1, 16, h/8, w/8))     its initial latents
              randn((S, tokens, 64))                                   its SDE noise, steps 0..S-1
                (with an SDE window of W steps, randn((W, tokens, 64)): the window's steps only)
            the conditioning's draws, where a trainer has one (SkyReels-I2V's first frame:
              its FLUX pipeline's initial latents, then the VAE's sample), in the order the
              pipelines draw them
            with best-of-n (HunyuanVideo): randperm(K)                 the order of the K kept
            for each sample b = 0..B-1: randperm(S - 1)                its timestep permutation
          The draws are then cast to the dtype upstream uses (bfloat16 initial latents,
          float32 SDE noise) and moved to the device.  A sample's noise does not depend on
          how the rollout is batched.
  replay  ``noise.init``, ``noise.sde``, ``noise.perms`` and ``noise.order`` (best-of-n's) of a
          recorded run, cast and moved the same way.  A conditioning's draws are not recorded:
          under --replay they are the device's, as upstream's (SkyReels-I2V's first frame).

Records (``--record``, ``--record_steps``, ``--record_modules``): see ``alignment_records``;
with DANCEGRPO_MSPROBE also msprobe's own dumps of the same calls: ``alignment_msprobe``.
GRPO health (metrics.jsonl): ``step_health()``.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from dancegrpo_port import alignment_msprobe as msprobe_dump
from dancegrpo_port import alignment_records as records
from dancegrpo_port import dataset_index
from dancegrpo_port import upstream_args
from dancegrpo_port.alignment_health import Health
from dancegrpo_port.contract import (RECORD_DATASET, RNG_CHOICES, SDE_WINDOW_FLAGS, parse_steps, sde_window,
                                     sde_window_fit)
from dancegrpo_port.feature import Feature


@dataclass(frozen=True)
class Settings:
    """What this module needs of the trainer's arguments (defaults: upstream's behaviour)."""

    rng: str = "device"
    seed: int | None = None
    rank: int = 0
    world_size: int = 1
    record: bool = False
    record_steps: frozenset | None = None  # None: every step
    record_modules: bool = False
    replay: str | None = None
    clip_range: float = 1e-4
    group_size: int | None = None  # --num_generations with --use_group, else None (one group)
    msprobe: str | None = None  # DANCEGRPO_MSPROBE: also dump the --record_modules calls with msprobe
    window_values: dict | None = None  # the SDE window's flags and --sampling_steps (None: no window)

    @classmethod
    def from_args(cls, args, rank: int, world_size: int) -> "Settings":
        return cls(
            rng=getattr(args, "rng", "device"), seed=args.seed, rank=rank, world_size=world_size,
            record=bool(getattr(args, "record", False)),
            record_steps=parse_steps(getattr(args, "record_steps", None), "--record_steps"),
            record_modules=bool(getattr(args, "record_modules", False)),
            replay=getattr(args, "replay", None), clip_range=args.clip_range,
            group_size=args.num_generations if args.use_group else None,
            msprobe=msprobe_dump.task_from_env(),
            window_values={name: getattr(args, name, None) for name in (*SDE_WINDOW_FLAGS, "sampling_steps")})


# ---------------------------------------------------------------- arguments


def argument_problem(args, environ=None) -> str | None:
    """What is wrong with the alignment arguments (one line), or None.  Replay is checked
    against this rank's files before anything is loaded."""
    environ = os.environ if environ is None else environ
    if getattr(args, "rng", "device") not in RNG_CHOICES:
        return f"--rng {args.rng!r} is not one of {', '.join(RNG_CHOICES)}"
    if getattr(args, "rng", "device") == "cpu" and args.seed is None:
        return "--rng cpu needs --seed (the CPU generator is seeded seed * 1000 + rank)"
    record = bool(getattr(args, "record", False))
    if getattr(args, "record_modules", False) and not record:
        return "--record_modules needs --record"
    problem = msprobe_dump.problem(msprobe_dump.task_from_env(environ), bool(getattr(args, "record_modules", False)))
    if problem:
        return problem
    if getattr(args, "record_steps", None) is not None:
        if not record:
            return "--record_steps needs --record"
        try:
            parse_steps(args.record_steps, "--record_steps")
        except ValueError as exc:
            return str(exc)
    if getattr(args, "replay", None):
        world_size, rank = int(environ.get("WORLD_SIZE", "1")), int(environ.get("RANK", "0"))
        return records.replay_problem(args.replay, run_fields(args, world_size), rank,
                                      upstream_args.samples_per_step(args), args.max_train_steps or 0)
    return None


def run_fields(args, world_size: int) -> dict:
    """The run's description in records/index.json (the replay check compares some of it)."""
    return {
        "format": records.FORMAT, "script": os.path.basename(sys.argv[0]), "world_size": world_size,
        "rng": getattr(args, "rng", "device"), "seed": args.seed, "h": args.h, "w": args.w, "t": args.t,
        "num_generations": args.num_generations, "sampling_steps": args.sampling_steps,
        "init_same_noise": bool(args.init_same_noise), "eta": args.eta, "clip_range": args.clip_range,
        "timestep_fraction": args.timestep_fraction, "sde_window": sde_window_fit(vars(args)),
        "replayed_from": os.path.abspath(args.replay) if getattr(args, "replay", None) else None,
    }


# ---------------------------------------------------------------- noise


class Noise:
    """The random draws of the training path (see the module doc for modes and order)."""

    def __init__(self, mode: str, seed: int | None = None, rank: int = 0, replay_dir: str | None = None,
                 window_values: dict | None = None):
        self.mode = "replay" if replay_dir else mode
        self.generator = torch.Generator("cpu").manual_seed(seed * 1000 + rank) if self.mode == "cpu" else None
        self.replay_dir, self.rank = replay_dir, rank
        self.window_values = window_values or {}  # the SDE window's flags (contract.sde_window)
        self.keep = False  # keep this step's noise for the record
        self.step = None
        self.window = None  # [start, end) of the step's SDE window: its noise only is drawn; None: every step's
        self._clear()

    def _clear(self):
        self.init = self.sde = self.perms = self.order = None  # float32 / int64, on the CPU
        self.same = False
        self.batch = None
        self._init_parts = []

    def begin_step(self, step: int, keep: bool) -> None:
        self.step, self.keep = step, keep
        self.window = sde_window(self.window_values, step)
        self._clear()
        if self.mode == "replay":
            self.init, self.sde, self.perms, self.order = records.load_noise(self.replay_dir, step, self.rank)

    def begin_rollout(self, num_samples: int, latent_shape, sampling_steps: int, same_noise: bool,
                      sde_shape=None) -> None:
        """Before the rollout of a step: B samples, a sample's initial latents ``latent_shape``
        (FLUX: C, h/8, w/8; Wan: C, frames, h/8, w/8), S steps.  A sample's SDE noise has
        ``sde_shape``; None: FLUX's packed latents, (h/16 * w/16, 4C).  With an SDE window, only
        its steps have SDE noise."""
        if sde_shape is None:
            channels, lh, lw = latent_shape
            sde_shape = ((lh // 2) * (lw // 2), channels * 4)
        one = (1, *latent_shape)
        sde_steps = sampling_steps if self.window is None else self.window[1] - self.window[0]
        sde_shape = (num_samples, sde_steps, *sde_shape)
        init_shape = (1 if same_noise else num_samples, *latent_shape)
        self.same = same_noise
        if self.mode == "cpu":
            g = self.generator
            shared = torch.randn(one, generator=g) if same_noise else None
            init, sde = [], []
            for _ in range(num_samples):
                if not same_noise:
                    init.append(torch.randn(one, generator=g))
                sde.append(torch.randn(sde_shape[1:], generator=g))
            self.init = shared if same_noise else torch.cat(init)
            self.sde = torch.stack(sde)
        elif self.mode == "replay":
            for name, have, want in (("noise.init", self.init, init_shape), ("noise.sde", self.sde, sde_shape)):
                if tuple(have.shape) != want:
                    raise RuntimeError(f"--replay {self.replay_dir}: step {self.step} {name} has shape "
                                       f"{tuple(have.shape)}, this rollout needs {want}")
        elif self.keep:  # device: keep the draws as they are made
            self.sde = torch.zeros(sde_shape)

    def select(self, batch_idx) -> None:
        """The samples (indices into the step's B) of the rollout batch about to be sampled."""
        self.batch = batch_idx

    def initial_latents(self, shape, device, dtype) -> torch.Tensor:
        if self.mode == "device":
            latents = torch.randn(shape, device=device, dtype=dtype)
            if self.keep:
                self._init_parts.append(latents.detach().to("cpu", torch.float32))
            return latents
        drawn = self.init if self.same else self.init[self.batch]
        _same_shape("initial latents", drawn, shape)
        return drawn.to(device=device, dtype=dtype)

    def sde_noise(self, like: torch.Tensor, index: int) -> torch.Tensor:
        slot = self._slot(index)
        if self.mode == "device":
            noise = torch.randn_like(like)
            if self.keep and self.sde is not None:
                self.sde[self.batch, slot] = noise.detach().to("cpu", torch.float32)
            return noise
        if self.batch is None:
            raise RuntimeError("SDE noise asked for outside a rollout batch (alignment.rollout_batch not called)")
        drawn = self.sde[self.batch, slot]
        _same_shape("SDE noise", drawn, like.shape)
        return drawn.to(device=like.device, dtype=like.dtype)

    def _slot(self, index: int) -> int:
        """Where sampling step ``index``'s noise is in a step's SDE noise: the step itself, or its
        place in the SDE window (a step outside it draws none)."""
        if self.window is None:
            return index
        start, end = self.window
        if not start <= index < end:
            raise RuntimeError(f"SDE noise asked for at sampling step {index}, outside step {self.step}'s SDE window "
                               f"[{start}, {end}) (an ODE step draws none)")
        return index - start

    def timestep_perms(self, batch_size: int, n: int) -> torch.Tensor:
        if self.mode == "device":
            perms = torch.stack([torch.randperm(n) for _ in range(batch_size)])
        elif self.mode == "cpu":
            perms = torch.stack([torch.randperm(n, generator=self.generator) for _ in range(batch_size)])
        else:
            perms = self.perms
            _same_shape("timestep permutations", perms, (batch_size, n))
            perms = perms.clone()
        if self.keep:
            self.perms = perms.clone()
        return perms

    def selection_order(self, n: int, device) -> torch.Tensor:
        if self.mode == "device":
            order = torch.randperm(n, device=device)
        elif self.mode == "cpu":
            order = torch.randperm(n, generator=self.generator)
        else:
            if self.order is None:
                raise RuntimeError(f"--replay {self.replay_dir}: step {self.step} has no noise.order "
                                   f"(best-of-n's order; record the run again with this port)")
            order = self.order
            _same_shape("best-of-n order", order, (n,))
            order = order.clone()
        if self.keep:
            self.order = order.to("cpu")
        return order.to(device)

    def condition_generator(self):
        return self.generator  # --rng cpu's; None (the device's draws) otherwise

    def recorded(self) -> dict:
        """This step's noise as the record keeps it: as drawn, float32 (int64 permutations)."""
        init = torch.cat(self._init_parts) if self.mode == "device" and self._init_parts else self.init
        out = {"noise.init": init, "noise.sde": self.sde, "noise.perms": self.perms, "noise.order": self.order}
        return {k: v.contiguous() for k, v in out.items() if v is not None}


def _same_shape(what: str, tensor: torch.Tensor, shape) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise RuntimeError(f"alignment: the {what} prepared have shape {tuple(tensor.shape)}, "
                           f"the trainer asks for {tuple(shape)}")


# ---------------------------------------------------------------- the run


class Run:
    def __init__(self, settings: Settings, device=None, fields: dict | None = None):
        self.settings, self.device = settings, device
        self.noise = Noise(settings.rng, settings.seed, settings.rank, settings.replay, settings.window_values)
        self.health = Health(settings.clip_range, settings.group_size)
        self.recorder = None
        if settings.record:
            self.recorder = records.Recorder(Path("records"), settings.rank, settings.world_size,
                                             settings.record_steps, settings.record_modules, fields or {})
        self.msprobe = None
        if settings.msprobe and settings.record_modules:
            self.msprobe = msprobe_dump.MsprobeDump(settings.msprobe, Path("records") / "msprobe", settings.rank)
        self.step = None

    def begin_step(self, step: int) -> None:
        self.step = step
        keep = bool(self.recorder and self.recorder.begin(step))
        self.noise.begin_step(step, keep)
        self.health.reset()

    def end_step(self) -> None:
        if self.recorder:
            self.recorder.end(self.noise.recorded() if self.noise.keep else {})


UPSTREAM_NOISE = Noise("device")  # the seam's draws where no feature answers: upstream's, nothing kept


def start(args, rank: int, world_size: int, device=None) -> Run:
    """A run's alignment: its noise source, recorder and GRPO health (``run_of`` makes it once a run)."""
    settings, fields = Settings.from_args(args, rank, world_size), run_fields(args, world_size)
    if settings.record and rank == 0 and dataset_index.source(args):  # what compare shows of the data read
        fields[RECORD_DATASET] = dataset_index.digest(dataset_index.source(args))
    return Run(settings, device, fields)


def run_of(context) -> Run:
    """The run's alignment ``Run``, made once per run start (feature.Context): the Alignment
    feature and Resume (which saves and restores its generator) share it."""
    return context.get("alignment", lambda: start(context.args, context.rank, context.world_size, context.device))


@contextmanager
def capture_modules(run: Run, prefix: str, root):
    """Around the first transformer forward, VAE decode and reward call: with
    --record_modules, every module's output the first time through (then the hooks go); with
    DANCEGRPO_MSPROBE, msprobe dumps the same call."""
    recorder = run.recorder
    if recorder is None or not recorder.modules_due(prefix):
        yield
        return
    capture = records.ModuleCapture(prefix, root)
    try:
        with run.msprobe.capture(prefix, root) if run.msprobe else nullcontext():
            yield
    finally:
        capture.remove()
        recorder.add_modules(prefix, capture)


class Alignment(Feature):
    """The alignment feature on the seam (dancegrpo_port/hooks.py): the run's noise source
    (--rng, --replay), and what the trainer reports goes to the GRPO health figures and, with
    --record, to the step's record."""

    def __init__(self, run: Run):
        self.run = run

    def _observe(self, name: str, tensor) -> None:
        self.run.health.observe(name, tensor)
        if self.run.recorder:
            self.run.recorder.add(name, tensor)

    def step_begin(self, step: int) -> None:
        self.run.begin_step(step)

    def rollout_begin(self, num_samples: int, latent_shape, sampling_steps: int, same_noise: bool,
                      sde_shape=None) -> None:
        self.run.noise.begin_rollout(num_samples, latent_shape, sampling_steps, same_noise, sde_shape)

    def rollout_batch(self, batch_idx) -> None:
        self.run.noise.select(batch_idx)

    def initial_latents(self, shape, device, dtype):
        return self.run.noise.initial_latents(shape, device, dtype)

    def sde_noise(self, like, index: int):
        return self.run.noise.sde_noise(like, index)

    def timestep_perms(self, batch_size: int, n: int):
        return self.run.noise.timestep_perms(batch_size, n)

    def selection_order(self, n: int, device):
        return self.run.noise.selection_order(n, device)

    def condition_generator(self):
        return self.run.noise.condition_generator()

    def model_call(self, name: str, module):
        return capture_modules(self.run, name, module)

    def decoding(self, vae):
        return capture_modules(self.run, "vae", vae)

    def rewarding(self, model):
        return capture_modules(self.run, "reward", model)

    def sampled(self, latents, log_probs) -> None:
        self._observe("latents", latents)
        self._observe("log_probs", log_probs)

    def decoded(self, images, batch_idx, name: str) -> None:
        recorder = self.run.recorder
        if recorder and recorder.active:
            recorder.add("images", torch.stack([records.image_tensor(im) for im in images]))

    def advantages(self, rewards, advantages) -> None:
        self._observe("rewards", rewards)
        self._observe("advantages", advantages)

    def trained_pair(self, new_log_prob, old_log_prob, ratio, loss) -> None:
        """One trained (sample, timestep): its recomputed and sampling log-probs, ratio, loss."""
        self.run.health.pair(new_log_prob, old_log_prob, ratio)
        if self.run.recorder:
            for name, value in (("train.log_prob", new_log_prob), ("train.old_log_prob", old_log_prob),
                                ("train.ratio", ratio), ("train.loss", loss)):
                self.run.recorder.add(name, value.reshape(-1))

    def update(self, grad_norm) -> None:
        self.run.health.stepped()
        if self.run.recorder:
            self.run.recorder.add("grad_norm", torch.as_tensor(grad_norm).reshape(-1))

    def resumed(self, step: int) -> None:
        if self.run.recorder:
            self.run.recorder.resumed(step)

    def step_end(self, step: int, figures: dict) -> None:
        """The step's record is written; its GRPO health figures, over all ranks (a collective:
        every rank takes part), join the step's figures."""
        self.run.end_step()
        figures.update(self.run.health.metrics(self.run.device))


# ---------------------------------------------------------------- trainer flags


def add_arguments(parser) -> None:
    parser.add_argument(
        "--rng",
        choices=RNG_CHOICES,
        default="device",
        help="where the random draws of training come from: device (upstream's) or cpu "
        "(one CPU generator seeded from --seed and the rank: the same noise on every device)",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="record the stages of each step (noise, latents, log-probs, images, rewards, "
        "advantages, trained ratios and losses, grad norms) in ./records/ (safetensors)",
    )
    parser.add_argument(
        "--record_steps",
        type=str,
        default=None,
        help="with --record: the steps to record, e.g. 1-10,50 (default: every step)",
    )
    parser.add_argument(
        "--record_modules",
        action="store_true",
        help="with --record: also every module's output of step 1's first transformer "
        "forward, first VAE decode and first reward call",
    )
    parser.add_argument(
        "--replay",
        type=str,
        default=None,
        help="the records/ directory of a recorded run: take every noise tensor from it "
        "instead of drawing it",
    )
