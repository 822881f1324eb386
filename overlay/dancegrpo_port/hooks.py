"""The seam: the fixed call points a trainer makes into the port, and the features behind them.

Each trainer's seam patch adds these calls, and nothing else of the port's, to upstream's
lines.  Every feature of the port (alignment: the noise source, records, replay and GRPO
health; phase times; profiler traces; the background image writer; metrics.jsonl; resume; the
clean exit) plugs in here, so a new feature changes only the overlay and a new trainer needs only its
seam plus its model-specific patches.

Call points, in the order a run makes them::

    add_arguments(parser)            the port's trainer flags, before parse_args
    check_arguments(args)            refuse bad values in one line, exit 2, before anything loads
    run_start(args, rank, world_size, device)
    checkpoint_load(init_steps, **state) -> the step to start after (upstream's resume point;
                                     --resume_from_checkpoint loads the state: checkpoints.py)
      step_begin(step)
        rollout_begin(samples, latent_shape, sampling_steps, same_noise)
          rollout_batch(batch_idx)   the samples (indices into the step's) of the next batch
          initial_latents(shape, device, dtype) / sde_noise(like, index)   the noise source
          with sampling(): ... with model_call("transformer", transformer): ...
          sampled(latents, log_probs)
          with decoding(vae): ...    decoded(images, batch_idx); image_file(path)
          with rewarding(model): ...
        advantages(rewards, advantages); timestep_perms(samples, n)
        for item in training(items): ... trained_pair(new, old, ratio, loss); update(grad_norm)
      step_end(step, **figures)      after the step's time is taken: records, health, times, metrics.jsonl
      checkpoint_save(step, **state) after the step: the resume checkpoint, when due and at the last step
    trained_model(model)             after the training loop (--weights_digest)
    run_end()                        the end of main()

Before ``run_start`` (a module imported by a test, say) every call behaves as upstream: the
device's noise, nothing recorded, timed or written.  Self-contained: torch and the standard
library; it never imports the dancegrpo_npu tool.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack, contextmanager

from dancegrpo_port import alignment, checkpoints, phases, rollout, upstream_args, weights
from dancegrpo_port.clean_exit import CleanExit
from dancegrpo_port.images import ImageFiles
from dancegrpo_port.metrics import MetricsLog
from dancegrpo_port.resume import Resume

_FEATURES: list = []  # this process's features, in call order (run_start)


def features() -> list:
    """This process's features, in call order."""
    return list(_FEATURES)


def install(features: list) -> None:
    """Plug these features in, in call order (run_start does; tests plug in one alone)."""
    _FEATURES[:] = features


# ---------------------------------------------------------------- arguments


def add_arguments(parser) -> None:
    """Every feature's trainer flags (--rng, --record..., --replay, --sample_batch_size,
    --vae_decode_chunk, --profile_steps, --checkpoints_total_limit, --weights_digest)."""
    for module in (alignment, rollout, phases, checkpoints, weights):
        module.add_arguments(parser)


def argument_problem(args, environ=None) -> str | None:
    """The first thing wrong with the port's arguments (one line), or None."""
    checks = (upstream_args.accumulation_problem, rollout.argument_problem, phases.argument_problem,
              checkpoints.argument_problem,
              lambda a: alignment.argument_problem(a, environ))
    for check in checks:
        problem = check(args)
        if problem:
            return problem
    return None


def refuse(problem: str | None) -> None:
    """A trainer argument problem, before anything is loaded: one line on stderr as argparse
    words it (without the usage), exit 2; nothing when ``problem`` is None."""
    if problem:
        print(f"{os.path.basename(sys.argv[0])}: error: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)


def check_arguments(args) -> None:
    refuse(argument_problem(args))


# ---------------------------------------------------------------- the run


def run_start(args, rank: int, world_size: int, device) -> None:
    """Once, in main(), after the process group is up: the run's features, in call order.  The
    image writer comes first (a write error surfaces before the step's records), metrics.jsonl
    last (it writes what the others add to the step's figures).  Resume is the first after
    the alignment run exists: it restores the generators at step_begin before anything draws."""
    run = alignment.start(args, rank, world_size, device)
    install([
        Resume(args, rank, world_size, device, run.noise.generator, on_resume=lambda step: _call("resumed", step)),
        ImageFiles(rank),
        alignment.Alignment(run),
        rollout.Batching(getattr(args, "sample_batch_size", 1)),
        phases.Profile(phases.StepProfiler(getattr(args, "profile_steps", None), "./profile")),
        phases.PhaseTimes(phases.PhaseTimer()),
        MetricsLog(rank),
        weights.WeightDigest(rank, getattr(args, "weights_digest", False)),
        CleanExit(),
    ])


def trained_model(model) -> None:
    """After the training loop, with the trained model: --weights_digest writes every rank's
    digests (a collective under FSDP: every rank calls it)."""
    _call("trained_model", model)


def run_end() -> None:
    _call("run_end")


def _call(name: str, *args, **kwargs) -> None:
    for feature in _FEATURES:
        method = getattr(feature, name, None)
        if method is not None:
            method(*args, **kwargs)


@contextmanager
def _around(name: str, *args):
    with ExitStack() as stack:
        for feature in _FEATURES:
            method = getattr(feature, name, None)
            if method is not None:
                stack.enter_context(method(*args))
        yield


# ---------------------------------------------------------------- checkpoints


def checkpoint_load(init_steps: int, **state) -> int:
    """At upstream's resume point, with the training state (transformer, optimizer,
    lr_scheduler, ema, and the sampler where the trainer does not skip the used batches
    itself): the step the run starts after.  On a resume every feature's ``resumed(step)``
    forgets what the run wrote after that step (metrics.jsonl, records), so no step is
    written twice."""
    for feature in _FEATURES:
        method = getattr(feature, "checkpoint_load", None)
        if method is not None:
            init_steps = method(init_steps, **state)
    return init_steps


def checkpoint_save(step: int, **state) -> None:
    """After a step's step_end: the resume checkpoint, when the step is due (dancegrpo_port/checkpoints.py)."""
    _call("checkpoint_save", step, **state)


def data_pass_begin() -> None:
    """In a trainer of several passes over the data, before a pass that starts at its first batch
    makes its DataLoader iterator (the seam calls it where qwenimage.resume_pass says 0): a resume's
    generators are restored there, before the iterator draws its seed, as in the run resumed."""
    _call("data_pass_begin")


# ---------------------------------------------------------------- a step


def step_begin(step: int) -> None:
    _call("step_begin", step)


def step_end(step: int, **figures) -> dict:
    """After the step and its time: features add their figures (health, phase times) and the
    metrics log writes them.  Every rank calls it (the health figures are a collective)."""
    figures = {"step": step, **figures}
    _call("step_end", step, figures)
    return figures


# ---------------------------------------------------------------- the rollout


def rollout_begin(num_samples: int, latent_shape, sampling_steps: int, same_noise: bool, sde_shape=None) -> None:
    """``latent_shape``: one sample's initial latents; ``sde_shape``: one sample's SDE noise at a
    step (None: FLUX's packed latents, see alignment.Noise.begin_rollout)."""
    _call("rollout_begin", num_samples, latent_shape, sampling_steps, same_noise, sde_shape)


def rollout_batch(batch_idx) -> None:
    _call("rollout_batch", batch_idx)


def initial_latents(shape, device, dtype):
    return alignment.noise_source().initial_latents(shape, device, dtype)


def sde_noise(like, index: int):
    return alignment.noise_source().sde_noise(like, index)


def sampling():
    """Around a rollout batch's sampling loop."""
    return _around("sampling")


def model_call(name: str, module):
    """Around a call of one of the step's models (``contract.MODULE_GROUPS``)."""
    return _around("model_call", name, module)


def sampled(latents, log_probs) -> None:
    _call("sampled", latents, log_probs)


def decoding(vae):
    """Around the VAE decode of a rollout batch."""
    return _around("decoding", vae)


def decoded(images, batch_idx, name: str = "flux") -> None:
    """The batch's decoded images (PIL), one per sample of ``batch_idx``: written to
    ./images/<name>_<rank>_<sample>.png (upstream's names) and recorded."""
    _call("decoded", images, batch_idx, name)


def image_file(path: str) -> str:
    """A sample's PNG file, once it is on disk (the writer works in the background)."""
    _call("image_file", path)
    return path


def rewarding(model):
    """Around the reward of a rollout batch."""
    return _around("rewarding", model)


# ---------------------------------------------------------------- the update


def advantages(rewards, advantages) -> None:
    _call("advantages", rewards, advantages)


def timestep_perms(batch_size: int, n: int):
    return alignment.noise_source().timestep_perms(batch_size, n)


def training(items):
    """The training loop's items, the loop inside the features' training context."""
    with _around("training"):
        yield from items


def trained_pair(new_log_prob, old_log_prob, ratio, loss) -> None:
    _call("trained_pair", new_log_prob, old_log_prob, ratio, loss)


def update(grad_norm) -> None:
    """Before an optimizer step, with its clipped gradient norm."""
    _call("update", grad_norm)
