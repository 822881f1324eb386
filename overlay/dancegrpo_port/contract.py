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
REPLAY_FIT = ("world_size", "h", "w", "num_generations", "sampling_steps", "init_same_noise")
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
