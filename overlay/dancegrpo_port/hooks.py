"""The seam: the fixed call points a trainer makes into the port, and the features behind them.

Each trainer's seam patch adds these calls, and nothing else of the port's, to upstream's
lines.  Every feature of the port (alignment: the noise source, records, replay and GRPO
health; phase times; profiler traces; the background image writer; metrics.jsonl; resume; the
clean exit) plugs in here, so a new feature changes only the overlay and a new trainer needs only its
seam plus its model-specific patches.

Every event also marks this rank's progress (``heartbeat.mark``: its name, the step, the time, in
memory; a background thread writes it to the run directory at most once a second), which the
stall watchdog of the process running torchrun reads (docs/troubleshooting.md).

A feature is a ``feature.Feature`` (one no-op method per event; it overrides those it acts
on) and one row of ``FEATURES`` below: its flags, their check and how a run makes it.
``add_arguments``, ``argument_problem``, ``run_start`` and the bench all read that table.  Each
call point below dispatches one event to the installed features, in the table's order.

Call points, in the order a run makes them::

    add_arguments(parser)            the port's trainer flags, before parse_args
    check_arguments(args)            refuse bad values in one line, exit 2, before anything loads
    run_start(args, rank, world_size, device)
    checkpoint_load(init_steps, **state) -> the step to start after (upstream's resume point;
                                     --resume_from_checkpoint loads the state: checkpoints.py)
      data_pass_begin()              a trainer of several passes: before a pass's DataLoader iterator
      step_begin(step)
        rollout_begin(samples, latent_shape, sampling_steps, same_noise)
        with conditioning(model): ...  a conditioning another model makes (SkyReels-I2V's first
                                     frame), drawing with condition_generator()
          rollout_batch(batch_idx)   the samples (indices into the step's) of the next batch
          initial_latents(shape, device, dtype) / sde_noise(like, index)   the noise source
          with sampling(): ... with model_call("transformer", transformer): ...
            sampling_step(flux_step, ...) a sampling step: upstream's SDE step, or the ODE step
                                     outside an SDE window (sde_step(index); sde-window patch)
          sampled(latents, log_probs)
          with decoding(vae): ...    decoded(images, batch_idx, name); image_file(path)
          with rewarding(model): ...
        rewards_gathered(rewards)    every rank's rewards of the step (metrics.jsonl: reward_mean)
        advantages(rewards, advantages); selection_order(n, device)  (best-of-n)
        timestep_perms(samples, n); trained_order(perms); trained_timesteps(count)  (the SDE window's)
        for item in training(items): ... trained_pair(new, old, ratio, loss); update(grad_norm)
      step_end(step, **figures)      after the step's time is taken (upstream's loss, grad norm, step
                                     time, lr): records, health, times, metrics.jsonl
      checkpoint_save(step, **state) after the step: the resume checkpoint, when due and at the last step
      upstream_checkpoint_save(step) before upstream's own save_checkpoint (and its barrier), at a
                                     step's start: progress for the stall watchdog only
    trained_model(model)             after the training loop (--weights_digest)
    run_end()                        the end of main()

Before ``run_start`` (a module imported by a test, say) every call behaves as upstream: the
device's noise (no feature answers: upstream's draws, which a row of the table gives as its
``upstream_answers``), nothing recorded, timed or written.  The seam names no trainer: each
trainer's seam passes what is its own (``decoded``'s image name).  Self-contained: torch and the standard
library; it never imports the dancegrpo_npu tool.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack, contextmanager

from dancegrpo_port import alignment, checkpoints, heartbeat, phases, rollout, sde_window, upstream_args, weights
from dancegrpo_port.clean_exit import CleanExit
from dancegrpo_port.feature import (
    BENCH_EVERY_STEP, BENCH_TIMED_STEPS, Context, FeatureError, FeatureRow, check_feature,
)
from dancegrpo_port.images import ImageFiles
from dancegrpo_port.metrics import MetricsLog
from dancegrpo_port.resume import Resume

# The seam's table: every feature of the port, in call order (the order its events reach them).
# Its flags and their checks are added and run in this order too.  Image writer first (a write
# error surfaces before the step's records), metrics.jsonl last of those that add figures (it
# writes what the others add); Resume first of all: it restores the generators at rollout_begin,
# before alignment draws; the SDE window before alignment: it sees a step's noise asked for first.  A new feature is one row here (dancegrpo_port/feature.py says what a
# row holds); the bench (dancegrpo_npu/throughput/phases.py) makes its step's features from it.
FEATURES = (
    FeatureRow(name="resume", add_arguments=checkpoints.add_arguments, argument_problem=checkpoints.argument_problem,
               create=lambda c: Resume(c.args, c.rank, c.world_size, c.device, alignment.run_of(c).noise.generator,
                                       on_resume=lambda step: _call("resumed", step))),
    FeatureRow(name="images", create=lambda c: ImageFiles(c.rank)),
    FeatureRow(name="sde-window", add_arguments=sde_window.add_arguments, argument_problem=sde_window.argument_problem,
               create=lambda c: sde_window.SdeWindow(vars(c.args)), bench=BENCH_EVERY_STEP,
               upstream_answers=sde_window.UPSTREAM_STEPS),
    FeatureRow(name="alignment", add_arguments=alignment.add_arguments, argument_problem=alignment.argument_problem,
               create=lambda c: alignment.Alignment(alignment.run_of(c)), bench=BENCH_EVERY_STEP,
               upstream_answers=alignment.UPSTREAM_NOISE),
    FeatureRow(name="batching", add_arguments=rollout.add_arguments, argument_problem=rollout.argument_problem,
               create=lambda c: rollout.Batching(getattr(c.args, "sample_batch_size", 1)), bench=BENCH_EVERY_STEP),
    FeatureRow(name="profile", add_arguments=phases.add_arguments, argument_problem=phases.argument_problem,
               create=lambda c: phases.Profile(phases.StepProfiler(getattr(c.args, "profile_steps", None), "./profile"))),
    FeatureRow(name="phase-times", create=lambda c: phases.PhaseTimes(c.get("phase_timer", phases.PhaseTimer)),
               bench=BENCH_EVERY_STEP),
    FeatureRow(name="metrics", create=lambda c: MetricsLog(c.rank), bench=BENCH_TIMED_STEPS),
    FeatureRow(name="weights", add_arguments=weights.add_arguments,
               create=lambda c: weights.WeightDigest(c.rank, getattr(c.args, "weights_digest", False))),
    FeatureRow(name="clean-exit", create=lambda c: CleanExit()),
)

_FEATURES: list = []  # this process's features, in call order (run_start)
# what answers an answer event where no installed feature does (before run_start, or a test's
# features alone): upstream's draws, as the table's rows give them
_UPSTREAM_ANSWERS = tuple(row.upstream_answers for row in FEATURES if row.upstream_answers is not None)


def features() -> list:
    """This process's features, in call order."""
    return list(_FEATURES)


def install(features: list) -> None:
    """Plug these features in, in call order (run_start does; tests plug in one alone).  Each
    must be a feature.Feature whose public methods are all events: else FeatureError (one line
    naming the class and the method), and nothing is installed."""
    for feature in features:
        check_feature(feature)
    _FEATURES[:] = features


def create(context: Context, rows=None) -> list:
    """The features of ``rows`` (default: the whole table; in its order) made for a run (``context``)."""
    return [row.create(context) for row in (FEATURES if rows is None else rows)]


# ---------------------------------------------------------------- arguments


def add_arguments(parser) -> None:
    """Every feature's trainer flags (--checkpoints_total_limit, --rng, --record..., --replay,
    --sample_batch_size, --vae_decode_chunk, --sde_window_..., --profile_steps, --weights_digest)."""
    for row in FEATURES:
        if row.add_arguments is not None:
            row.add_arguments(parser)


def argument_problem(args, environ=None) -> str | None:
    """The first thing wrong with the port's arguments (one line), or None: upstream's own
    flags' arithmetic first, then every feature's check, in the table's order."""
    environ = os.environ if environ is None else environ
    checks = [lambda a, _: upstream_args.accumulation_problem(a)]
    checks += [row.argument_problem for row in FEATURES if row.argument_problem is not None]
    for check in checks:
        problem = check(args, environ)
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
    """Once, in main(), after the process group is up: the table's features, made for this run
    and installed in call order.  A feature class with a public method that is no event stops
    the run here, in one line naming it (exit 1)."""
    try:
        install(create(Context(args, rank, world_size, device)))
    except FeatureError as exc:
        print(f"{os.path.basename(sys.argv[0])}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    heartbeat.start(rank)  # launch's run directory: this rank's progress and stacks (heartbeat.py)


def trained_model(model) -> None:
    """After the training loop, with the trained model: --weights_digest writes every rank's
    digests (a collective under FSDP: every rank calls it)."""
    _call("trained_model", model)


def run_end() -> None:
    _call("run_end")
    heartbeat.stop()


def _call(name: str, *args, _step=None, **kwargs) -> None:
    heartbeat.mark(name, _step)  # every event is progress (the stall watchdog reads it)
    for feature in _FEATURES:
        getattr(feature, name)(*args, **kwargs)


@contextmanager
def _around(name: str, *args):
    heartbeat.mark(name)
    with ExitStack() as stack:
        for feature in _FEATURES:
            stack.enter_context(getattr(feature, name)(*args))
        yield


def _answer(name: str, *args):
    """The first feature's answer (not None), else upstream's draw (the rows' ``upstream_answers``):
    the noise source's and the SDE window's events."""
    heartbeat.mark(name)
    for source in (*_FEATURES, *_UPSTREAM_ANSWERS):
        method = getattr(source, name, None)  # a row's upstream_answers answers its own events
        answer = None if method is None else method(*args)
        if answer is not None:
            return answer
    return None


# ---------------------------------------------------------------- checkpoints


def checkpoint_load(init_steps: int, **state) -> int:
    """At upstream's resume point, with the training state (transformer, optimizer,
    lr_scheduler, ema, and the sampler where the trainer does not skip the used batches
    itself): the step the run starts after.  On a resume every feature's ``resumed(step)``
    forgets what the run wrote after that step (metrics.jsonl, records), so no step is
    written twice."""
    heartbeat.mark("checkpoint_load", init_steps)
    for feature in _FEATURES:
        init_steps = feature.checkpoint_load(init_steps, **state)
    return init_steps


def checkpoint_save(step: int, **state) -> None:
    """After a step's step_end: the resume checkpoint, when the step is due (dancegrpo_port/checkpoints.py)."""
    _call("checkpoint_save", step, _step=step, **state)


def upstream_checkpoint_save(step: int) -> None:
    """Before upstream's own save_checkpoint at the start of step ``step`` (and the dist.barrier()
    after it): progress only, for the stall watchdog, which names a hang there "checkpoint_save,
    step N" as it names one in the resume checkpoint's save; no feature acts on it."""
    heartbeat.mark("checkpoint_save", step, "upstream's save_checkpoint")


def data_pass_begin() -> None:
    """In a trainer of several passes over the data, before a pass that starts at its first batch
    makes its DataLoader iterator (the seam calls it where qwenimage.resume_pass says 0): a resume's
    generators are restored there, before the iterator draws its seed, as in the run resumed."""
    _call("data_pass_begin")


# ---------------------------------------------------------------- a step


def step_begin(step: int) -> None:
    _call("step_begin", step, _step=step)


def step_end(step: int, **figures) -> dict:
    """After the step and its time: features add their figures (health, phase times) and the
    metrics log writes them.  Every rank calls it (the health figures are a collective)."""
    figures = {"step": step, **figures}
    _call("step_end", step, figures, _step=step)
    return figures


# ---------------------------------------------------------------- the rollout


def rollout_begin(num_samples: int, latent_shape, sampling_steps: int, same_noise: bool, sde_shape=None) -> None:
    """``latent_shape``: one sample's initial latents; ``sde_shape``: one sample's SDE noise at a
    step (None: FLUX's packed latents, see alignment.Noise.begin_rollout)."""
    _call("rollout_begin", num_samples, latent_shape, sampling_steps, same_noise, sde_shape)


def rollout_batch(batch_idx) -> None:
    _call("rollout_batch", batch_idx)


def initial_latents(shape, device, dtype):
    return _answer("initial_latents", shape, device, dtype)


def sde_noise(like, index: int):
    return _answer("sde_noise", like, index)


def sampling():
    """Around a rollout batch's sampling loop."""
    return _around("sampling")


def model_call(name: str, module):
    """Around a call of one of the step's models (``contract.MODULE_GROUPS``)."""
    return _around("model_call", name, module)


def sampling_step(step, model_output, latents, eta, sigmas, index: int):
    """Sampling step ``index`` of a rollout batch, ``step`` the trainer's ``flux_step``:
    upstream's SDE step, ``step(..., prev_sample=None, grpo=True, sde_solver=True)`` (its noise
    from ``sde_noise``), unless a feature says it is an ODE step (``sde_step``: outside the SDE
    window): then upstream's ODE form and a log-prob slot of 0 (sde_window.ode_step).
    (prev_sample, pred_original, log_prob) either way."""
    if _answer("sde_step", index):
        return step(model_output, latents, eta, sigmas=sigmas, index=index, prev_sample=None, grpo=True,
                    sde_solver=True)
    return sde_window.ode_step(step, model_output, latents, eta, sigmas, index)


def sampled(latents, log_probs) -> None:
    _call("sampled", latents, log_probs)


def decoding(vae):
    """Around the VAE decode of a rollout batch."""
    return _around("decoding", vae)


def decoded(images, batch_idx, name: str) -> None:
    """The batch's decoded images (PIL), one per sample of ``batch_idx``: written to
    ./images/<name>_<rank>_<sample>.png (upstream's names: each trainer's seam passes its own
    ``name``) and recorded."""
    _call("decoded", images, batch_idx, name)


def image_file(path: str) -> str:
    """A sample's PNG file, once it is on disk (the writer works in the background)."""
    _call("image_file", path)
    return path


def rewarding(model):
    """Around the reward of a rollout batch."""
    return _around("rewarding", model)


def conditioning(model):
    """Around the step's conditioning made by another model: SkyReels-I2V's first frame, from
    its FLUX pipeline (metrics.jsonl: time_condition)."""
    return _around("conditioning", model)


# ---------------------------------------------------------------- the update


def rewards_gathered(rewards) -> None:
    """Where upstream gathers the step's rewards from every rank (``gathered_reward``): the
    metrics log takes their mean, the step's reward_mean, as upstream writes it to ./reward.txt."""
    _call("rewards_gathered", rewards)


def advantages(rewards, advantages) -> None:
    _call("advantages", rewards, advantages)


def timestep_perms(batch_size: int, n: int):
    return _answer("timestep_perms", batch_size, n)


def trained_order(perms):
    """The timestep permutations (``timestep_perms``'s, (samples, n)) in the order the training
    loop takes them: upstream's, or the SDE window's steps first (in the permutation's order)."""
    return _answer("trained_order", perms)


def trained_timesteps(count: int) -> int:
    """The timesteps each sample trains: upstream's ``count`` (int((steps - 1) * timestep_fraction)),
    or the SDE window's size."""
    return _answer("trained_timesteps", count)


def selection_order(n: int, device):
    """The shuffle of the samples best-of-n keeps (HunyuanVideo's trainer): upstream draws
    ``torch.randperm(n, device=device)``."""
    return _answer("selection_order", n, device)


def condition_generator():
    """The generator a conditioning model's draws take (SkyReels-I2V's first frame: its FLUX
    pipeline's initial latents and the VAE's sample): None, upstream's draws on the device,
    unless the noise source gives one (--rng cpu's)."""
    return _answer("condition_generator")


def training(items):
    """The training loop's items, the loop inside the features' training context."""
    with _around("training"):
        yield from items


def trained_pair(new_log_prob, old_log_prob, ratio, loss) -> None:
    _call("trained_pair", new_log_prob, old_log_prob, ratio, loss)


def update(grad_norm) -> None:
    """Before an optimizer step, with its clipped gradient norm."""
    _call("update", grad_norm)
