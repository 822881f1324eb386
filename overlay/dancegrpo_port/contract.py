"""The vocabulary that the trainers and the ``dancegrpo-npu`` tool share, defined once.

The patched tree imports this module as ``dancegrpo_port.contract``; the tool loads the same
file from ``overlay/dancegrpo_port/contract.py`` (``dancegrpo_npu.contract``), so the tool never
lives in the tree and the tree never imports the tool.  Nothing here may import anything but
the standard library: the tool reads it without torch.

What is defined here, and nowhere else:

- ``DEVICE_KINDS`` / ``DEVICE_CHOICES``: where a run trains (``auto`` picks one of the kinds), and
  the environment variables that choose it (``DEVICE_ENV``) and strict mode (``STRICT_ENV``).
- ``RNG_CHOICES``: ``--rng`` (upstream's device draws, or one CPU generator for every device).
- ``PHASES``: the phases of a GRPO step that metrics.jsonl times (``time_<phase>``);
  ``OPTIONAL_PHASES`` those it times only where a trainer has them.
- ``HEALTH_KEYS``: the GRPO health figures of every metrics.jsonl line.
- ``RECORDS_FORMAT``, ``REPLAY_FIT``, ``MODULE_GROUPS``: the ``records/`` format, what a replay
  must share with the run it replays, and the models whose module outputs are recorded, in the
  order a step calls them.
- ``RECORD_NOISE``, ``OPTIONAL_RECORD_NOISE``: the noise tensors of a step's record (a replay
  reads them), and those only some trainers draw.
- ``RECORD_DATASET``: the records index's digest of the dataset the run read, which compare shows.
- ``MSPROBE_ENV``, ``MSPROBE_TASKS``: msprobe dumps beside the module records.
- ``CHECKPOINT_DIR``, ``CHECKPOINT_MANIFEST``, ``CHECKPOINT_FORMAT``, ``CHECKPOINT_FIT``,
  ``CHECKPOINT_FAULT_ENV``: resume checkpoints (``dancegrpo_port/checkpoints.py``): where they are
  under --output_dir, the manifest that makes one complete, what a resumed run must share with
  it, and the variable a test injects a fault during a save with.
- ``RUN_DIR_ENV``, ``HEARTBEAT_DIR``, ``HEARTBEAT_FILE``, ``STACKS_DIR``, ``STACKS_FILE``,
  ``STACKS_SIGNAL``, ``STALLED``: the stall watchdog (``dancegrpo_port/heartbeat.py`` writes, the
  tool's ``run/watchdog.py`` reads): where each rank's heartbeat and its stacks go in the run
  directory, the signal that asks a rank for its stacks, and the status of a run it ended.
- the step-list syntax (``--record_steps``, ``--profile_steps``, ``compare --steps``,
  ``launch --profile``) and its one parser, ``parse_steps``, with ``format_steps`` back.
- ``arguments_problem``: the checks of the port's trainer flags that need no torch, which the
  tool runs too, on the arguments launch gives the script, before anything starts (a dry run
  included): the trainer's features run the same at start.
- ``SDE_WINDOW_FLAGS``, ``SDE_WINDOW_METRICS``: the SDE window's trainer flags
  (``dancegrpo_port/sde_window.py``) and what metrics.jsonl says of it; ``sde_window_problem``, the
  flags' one check, ``sde_window``, the window of a GRPO step, and ``sde_window_fit``, what a
  replay and its records must share of it.
"""

from __future__ import annotations

import re

DEVICE_KINDS = ("cpu", "cuda", "npu")
DEVICE_CHOICES = ("auto",) + DEVICE_KINDS
DEVICE_ENV = "DANCEGRPO_DEVICE"  # the run's device (one of DEVICE_CHOICES), as launch and smoke set it
STRICT_ENV = "DANCEGRPO_NPU_STRICT"  # 1: stop at the first op that would leave the device

RNG_CHOICES = ("device", "cpu")

PHASES = ("rollout", "decode", "reward", "train")
# Phases only some trainers have, timed (time_<phase>) where the trainer enters them: "condition",
# the step's conditioning made by another model (SkyReels-I2V's first frame, from FLUX).
OPTIONAL_PHASES = ("condition",)

# Over every rank's samples; a figure with nothing to go over is None (JSON null).  grad_norm,
# which upstream logs already, is read beside them.
HEALTH_KEYS = ("reward_std", "adv_min", "adv_max", "zero_std_groups", "ratio_min", "ratio_max", "ratio_mean",
               "clip_frac", "approx_kl", "logprob_diff_max", "logprob_diff_mean", "clip_frac_first")

RECORDS_FORMAT = 1
# sde_window: sde_window_fit's list, None without a window (records made before it have none: they fit)
REPLAY_FIT = ("world_size", "h", "w", "num_generations", "sampling_steps", "init_same_noise", "sde_window")
MODULE_GROUPS = ("transformer", "vae", "reward")
RECORD_NOISE = ("noise.init", "noise.sde", "noise.perms")
OPTIONAL_RECORD_NOISE = ("noise.order",)  # best-of-n's order: only a trainer with best-of-n (HunyuanVideo) draws it
RECORD_DATASET = "dataset"  # records/index.json: the digest of the dataset the run read (dataset_index.digest)

MSPROBE_ENV = "DANCEGRPO_MSPROBE"
MSPROBE_TASKS = ("statistics", "tensor")

CHECKPOINT_DIR = "resume"  # under the trainer's --output_dir
CHECKPOINT_MANIFEST = "manifest.json"
CHECKPOINT_FORMAT = 1
CHECKPOINT_FIT = ("world_size", "num_generations", "h", "w", "t", "sampling_steps", "train_batch_size", "code")
CHECKPOINT_FAULT_ENV = "DANCEGRPO_CHECKPOINT_FAULT"  # STEP: SIGKILL between the shard writes of that save

# The stall watchdog.  Launch sets RUN_DIR_ENV to the run directory; each rank then marks its
# progress (the seam's last event, its step and time) in <run>/HEARTBEAT_DIR/HEARTBEAT_FILE, at most
# once a second, and dumps every thread's stack into <run>/STACKS_DIR/STACKS_FILE when it gets
# STACKS_SIGNAL (faulthandler).  A run the watchdog ended has the status STALLED (summary.json).
RUN_DIR_ENV = "DANCEGRPO_RUN_DIR"
HEARTBEAT_DIR = "heartbeats"
HEARTBEAT_FILE = "rank-{rank}.json"
STACKS_DIR = "stacks"
STACKS_FILE = "rank-{rank}.txt"
STACKS_SIGNAL = "SIGUSR1"  # torchrun forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to its workers, not this
STALLED = "stalled"

STEPS_SYNTAX = "a step N, a range A-B, a comma list of those (1,3-5), or all"
_STEP_ITEM = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")


def parse_steps(text, what: str = "steps") -> frozenset | None:
    """``"3"``, ``"2-4"``, ``"1, 3 - 5"`` -> the step numbers (counted from 1); ``None`` or
    ``"all"`` -> None (every step).  Anything else: ValueError naming ``what``."""
    if text is None or str(text).strip().lower() == "all":
        return None
    steps: set[int] = set()
    for item in str(text).split(","):
        match = _STEP_ITEM.fullmatch(item)
        if not match:
            raise ValueError(f"{what} {text!r}: {item.strip()!r} is not understood; give {STEPS_SYNTAX}")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if first < 1 or last < first:
            raise ValueError(f"{what} {text!r}: {item.strip()!r} is not a step or an increasing range of "
                             f"steps counted from 1; give {STEPS_SYNTAX}")
        steps.update(range(first, last + 1))
    return frozenset(steps)


def format_steps(steps) -> str:
    """[1, 2, 3, 5] -> "1-3,5" (the syntax ``parse_steps`` reads)."""
    out, steps = [], sorted(steps)
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ",".join(out)


# The SDE window (dancegrpo_port/sde_window.py).  Sampling steps are counted from 0; upstream trains
# steps 0 .. sampling_steps - 2 (never the last), so only those can be in the window.  The window of
# GRPO step n (from 1) is [s, s + size), s = start + (n - 1) // shift_every * stride, never ending
# past ``end`` (default: the last trainable step): once there it stays, as the paper's window does.
SDE_WINDOW_FLAGS = ("sde_window_size", "sde_window_start", "sde_window_end", "sde_window_shift_every",
                    "sde_window_stride")
SDE_WINDOW_METRICS = ("sde_window", "timesteps_trained")  # [start, end) of the step's window; timesteps a sample


def sde_window_problem(values: dict) -> str | None:
    """What is wrong with the SDE window flags among a trainer's parsed arguments (``values``:
    name -> value; a flag absent is not given), in one line, or None."""
    size = values.get("sde_window_size") or 0
    start, end = values.get("sde_window_start"), values.get("sde_window_end")
    every, stride = values.get("sde_window_shift_every"), values.get("sde_window_stride")
    given = [f"--{name}" for name in SDE_WINDOW_FLAGS[1:] if values.get(name) is not None]
    if size < 0:
        return f"--sde_window_size {size} must be 0 (no window: every sampling step an SDE step, upstream's) or more"
    if size == 0:
        return f"{given[0]} needs --sde_window_size W (W > 0: without it there is no window)" if given else None
    steps = values.get("sampling_steps")
    if not isinstance(steps, int):
        return f"--sde_window_size {size} needs --sampling_steps (the window is a range of sampling steps)"
    last = steps - 2
    start = 0 if start is None else start
    if start < 0:
        return f"--sde_window_start {start} must be a sampling step, counted from 0"
    if start + size > steps - 1:
        return (f"--sde_window_size {size} --sde_window_start {start}: the window [{start}, {start + size}) ends past "
                f"the last trainable step {last} of --sampling_steps {steps} (upstream trains steps 0..{last}, never "
                f"the last); make the window smaller or start it earlier")
    if every is None and (end is not None or stride is not None):
        return (f"{'--sde_window_end' if end is not None else '--sde_window_stride'} needs --sde_window_shift_every K "
                "(the window moves every K GRPO steps; without it the window stays where it starts)")
    if every is not None and every < 1:
        return f"--sde_window_shift_every {every} must be at least 1 (GRPO steps between two moves of the window)"
    if stride is not None and stride < 1:
        return f"--sde_window_stride {stride} must be at least 1 (sampling steps the window moves by)"
    if end is not None and not start + size - 1 <= end <= last:
        return (f"--sde_window_end {end} must be a step from the starting window's last, {start + size - 1}, to the "
                f"last trainable step {last} of --sampling_steps {steps}")
    return None


def arguments_problem(values: dict) -> str | None:
    """The first problem of a trainer's parsed arguments (name -> value) that the shared checks
    find (one line), or None: the SDE window's."""
    return sde_window_problem(values)


def sde_window(values: dict, step: int) -> tuple[int, int] | None:
    """[start, end) of the SDE window of GRPO step ``step`` (from 1; a step before the first, the
    bench's warm-up 0, has the first's), for arguments ``sde_window_problem`` passes; None without
    a window."""
    fit = sde_window_fit(values)
    if fit is None:
        return None
    size, start, end, every, stride = fit
    if every:
        start = min(start + max(step - 1, 0) // every * stride, end - size + 1)
    return start, start + size


def sde_window_fit(values: dict) -> list | None:
    """The window's schedule, every default resolved: [size, start, end, shift_every, stride]
    (shift_every 0: the window stays), or None without a window.  A replay and its records must
    have the same (REPLAY_FIT's sde_window)."""
    size = values.get("sde_window_size") or 0
    if size <= 0:
        return None
    every = values.get("sde_window_shift_every") or 0
    end = values.get("sde_window_end")
    return [size, values.get("sde_window_start") or 0,
            (values["sampling_steps"] - 2 if end is None else end) if every else None, every,
            (values.get("sde_window_stride") or 1) if every else None]
