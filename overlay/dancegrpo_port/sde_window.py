"""The SDE window: mixed ODE-SDE sampling and training on a window of steps; a feature on the seam.

Upstream samples every step of a flow trainer's rollout as an SDE step (``flux_step(...,
grpo=True, sde_solver=True)``, its noise scaled by ``--eta``) and trains every sample on
``int((sampling_steps - 1) * timestep_fraction)`` of its steps, drawn at random (the last step is
never trained): FLUX's recipe (16 steps, 0.6) makes 9 forward-and-backward passes a sample.
MixGRPO (arXiv 2507.21802) samples a short window of steps as the SDE and the rest as the ODE,
and trains only the window's steps; the window may slide over training.  ``--sde_window_size W``
does that on upstream's own sampler (docs/sde-window.md):

- rollout: a step inside the window is upstream's SDE step, unchanged; a step outside it is
  upstream's ODE form of the same function, ``flux_step(..., grpo=False, sde_solver=False)``
  (the Euler step of the flow: ``eta = 0`` would not give it, as every copy of ``flux_step``
  takes ``math.log`` of the noise scale).  The rollout keeps a log-prob for every step, as its
  callers expect; an ODE step's slot holds 0 (the step is never trained).  The noise source
  (dancegrpo_port/alignment.py) draws SDE noise for the window's steps only, so --rng cpu,
  --record and --replay keep working: a record's ``noise.sde`` is (samples, W, ...).
- training: each sample trains the window's W timesteps, in the order of the noise source's
  permutation (upstream shuffles its timesteps with it; the window's come first, in the order
  it gives them); ``--timestep_fraction`` is not used, and the loss is normalised by W, as
  upstream normalises by its count.  The old log-probs are the rollout's, as upstream's.
- the schedule: the window of GRPO step n (from 1) starts at
  ``S + (n - 1) // K * D`` (``--sde_window_start S``, ``--sde_window_shift_every K``,
  ``--sde_window_stride D``) and never ends past ``--sde_window_end E`` (default: the last
  trainable step); once it reaches E it stays there.  The window is a function of the step
  number, so a resumed run (whose step comes from its checkpoint) continues the schedule exactly.
  The check and the schedule are the contract's (``sde_window_problem``, ``sde_window``): launch
  refuses a bad window before anything starts, a dry run too.
- metrics.jsonl: the step's ``sde_window`` [start, end) and ``timesteps_trained`` (contract
  SDE_WINDOW_METRICS), with a window only: without one the run is upstream's, line for line.

Without --sde_window_size (0, the default) no event here answers: the rollout and the training
are upstream's, op for op.  Self-contained: torch and the standard library.
"""

from __future__ import annotations

import torch

from dancegrpo_port.contract import SDE_WINDOW_METRICS, sde_window, sde_window_problem
from dancegrpo_port.feature import Feature


def add_arguments(parser) -> None:
    parser.add_argument(
        "--sde_window_size", type=int, default=0, metavar="W",
        help="sample only W consecutive steps as the SDE (the rest as the ODE) and train only those W "
        "timesteps of each sample; --timestep_fraction is then not used (default 0: no window, every step "
        "an SDE step and --timestep_fraction of them trained, upstream's)")
    parser.add_argument(
        "--sde_window_start", type=int, default=None, metavar="S",
        help="the window's first sampling step, counted from 0 (default 0); only steps 0 .. --sampling_steps - 2 "
        "are trained, so S + W must be at most --sampling_steps - 1")
    parser.add_argument(
        "--sde_window_end", type=int, default=None, metavar="E",
        help="with --sde_window_shift_every: the last step the sliding window may hold; once there it stays "
        "(default: the last trainable step, --sampling_steps - 2)")
    parser.add_argument(
        "--sde_window_shift_every", type=int, default=None, metavar="K",
        help="slide the window every K GRPO steps: step n's starts at S + (n - 1) // K * D (default: it stays at S)")
    parser.add_argument(
        "--sde_window_stride", type=int, default=None, metavar="D",
        help="with --sde_window_shift_every: the sampling steps the window moves by (default 1)")


def argument_problem(args, environ=None) -> str | None:
    """What is wrong with the window's flags (one line), or None (``environ``: not read)."""
    return sde_window_problem(vars(args))


def ode_step(step, model_output, latents, eta, sigmas, index: int):
    """Sampling step ``index`` as the ODE: the trainer's ``flux_step`` (``step``) in upstream's
    ODE form, and a log-prob slot of 0 for each sample (float32, as the SDE step's)."""
    prev_sample, pred_original = step(model_output, latents, eta, sigmas=sigmas, index=index, prev_sample=None,
                                      grpo=False, sde_solver=False)
    return prev_sample, pred_original, torch.zeros(latents.shape[0], dtype=torch.float32, device=latents.device)


def window_first(perms: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Each row of ``perms`` (a sample's permutation of its trainable steps) with the steps of
    [start, end) first, in the row's order, then the others in theirs."""
    outside = ((perms < start) | (perms >= end)).to(torch.int8)
    return torch.gather(perms, 1, torch.argsort(outside, dim=1, stable=True))


class UpstreamSteps:
    """Upstream's answers to the window's events where no feature answers (the seam's row's
    upstream_answers): every sampling step an SDE step, the permutations as drawn, its count."""

    def sde_step(self, index: int) -> bool:
        return True

    def trained_order(self, perms):
        return perms

    def trained_timesteps(self, count: int) -> int:
        return count


UPSTREAM_STEPS = UpstreamSteps()


class SdeWindow(Feature):
    """The window of each GRPO step: which sampling steps are SDE steps, which timesteps are
    trained, and the step's figures.  A tree whose trainer does not ask (without the sde-window
    patch) stops at its first SDE step instead of ignoring --sde_window_size: the seam's table
    puts this feature before the noise source, so it sees the noise asked for first."""

    def __init__(self, values: dict):
        self.values = dict(values)  # the trainer's parsed arguments
        self.window = None  # [start, end) of this step's window; None: no window (upstream's)
        self.asked = False  # the trainer asked sde_step in this rollout batch

    def step_begin(self, step: int) -> None:
        self.window = sde_window(self.values, step)

    def rollout_batch(self, batch_idx) -> None:
        self.asked = False

    def sde_step(self, index: int):
        if self.window is None:
            return None
        self.asked = True
        return self.window[0] <= index < self.window[1]

    def sde_noise(self, like, index: int):
        if self.window is not None and not self.asked:
            raise RuntimeError(f"--sde_window_size {self.values['sde_window_size']}: this trainer sampled every step "
                               "as an SDE step (its rollout has no SDE window: the sde-window patch is not in this tree)")
        return None  # the noise source's to answer

    def trained_order(self, perms):
        return None if self.window is None else window_first(perms, *self.window)

    def trained_timesteps(self, count: int):
        return None if self.window is None else self.window[1] - self.window[0]

    def step_end(self, step: int, figures: dict) -> None:
        if self.window is not None:
            window, trained = SDE_WINDOW_METRICS
            figures[window] = list(self.window)
            figures[trained] = self.window[1] - self.window[0]
