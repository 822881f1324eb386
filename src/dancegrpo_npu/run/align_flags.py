"""The alignment flags of ``launch`` and ``smoke``, the trainer arguments they become, and the
replay check made before anything starts.

=====================  ==============================================================
tool flag              trainer argument (the alignment contract)
=====================  ==============================================================
``--rng device|cpu``   ``--rng device|cpu``
``--record``           ``--record``
``--record-steps S``   ``--record --record_steps S`` (implies --record)
``--record-modules``   ``--record --record_modules`` (implies --record)
``--replay RUN``       ``--replay <RUN>/records`` after ``check_replay`` says it fits
``--msprobe TASK``     ``--record --record_modules`` and DANCEGRPO_MSPROBE=TASK in the job's
                       environment (the overlay's alignment_msprobe.py reads it)
=====================  ==============================================================

Only the GRPO trainers whose seam has the alignment feature know these arguments (the registry's
rows with ``aligns``, ``trainers.aligning()``); preprocessing refuses them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.contract import MSPROBE_ENV, MSPROBE_TASKS, REPLAY_FIT, RNG_CHOICES, parse_step_spec, shown_steps
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.rundirs.records import records_index

TRAINER_FLAGS = ("--rng", "--record", "--record_steps", "--record_modules", "--replay")


@dataclass(frozen=True)
class AlignOptions:
    rng: str | None = None  # None: the trainer's default (device)
    record: bool = False
    record_steps: str | None = None  # a validated SPEC, passed as typed
    record_modules: bool = False
    replay: str | None = None  # a run directory or name, as typed
    msprobe: str | None = None  # an msprobe task: also dump the --record-modules calls with msprobe

    def given(self) -> list[str]:
        names = [("--rng", self.rng), ("--record", self.record), ("--record-steps", self.record_steps),
                 ("--record-modules", self.record_modules), ("--replay", self.replay),
                 ("--msprobe", self.msprobe)]  # fmt: skip
        return [name for name, value in names if value not in (None, False)]

    def check(self) -> None:
        if self.rng is not None and self.rng not in RNG_CHOICES:
            raise DancegrpoError(f"--rng {self.rng!r} is not a choice", f"choose one of: {', '.join(RNG_CHOICES)}", 2)
        if self.record_steps is not None:
            parse_step_spec(self.record_steps)
        if self.msprobe is not None:
            if self.msprobe not in MSPROBE_TASKS:
                raise DancegrpoError(f"--msprobe {self.msprobe!r} is not a task",
                                     f"choose one of: {', '.join(MSPROBE_TASKS)}", 2)
            # the job runs this Python (torchrun from sys.executable), so msprobe must import here
            if importlib.util.find_spec("msprobe") is None:
                raise DancegrpoError("--msprobe: MindStudio Probe (msprobe) is not installed in this Python",
                                     "pip install 'dancegrpo-npu[msprobe]' (the mindstudio-probe package), "
                                     "or drop --msprobe", 2)

    def recording(self) -> bool:
        return self.record or self.record_steps is not None or self.modules()

    def modules(self) -> bool:
        return self.record_modules or self.msprobe is not None

    def env(self) -> tuple[tuple[str, str], ...]:
        """What the job's environment gets (before the user's --env, which wins)."""
        return ((MSPROBE_ENV, self.msprobe),) if self.msprobe is not None else ()

    def trainer_args(self, replay_records: Path | None) -> tuple[str, ...]:
        """The contract's trainer arguments; ``replay_records`` is ``<run>/records`` (checked)."""
        out: list[str] = []
        if self.rng is not None:
            out += ["--rng", self.rng]
        if self.recording():
            out.append("--record")
        if self.record_steps is not None:
            out += ["--record_steps", self.record_steps]
        if self.modules():
            out.append("--record_modules")
        if replay_records is not None:
            out += ["--replay", str(replay_records)]
        return tuple(out)


def add_align_options(p: argparse.ArgumentParser, default=lambda v: v) -> None:
    """The flags, on ``launch`` and ``smoke``.  Values are checked by ``AlignOptions.check`` (a
    one-line error) rather than by argparse, whose errors print the whole usage."""
    p.add_argument("--rng", default=default(None), metavar="{device,cpu}",
                   help="where the trainer draws its noise: device (upstream's draws, the default) or cpu "
                   "(one CPU generator seeded from --seed and the rank: the same noise on CPU, CUDA and NPU)")
    p.add_argument("--record", action="store_true", default=default(False),
                   help="record every stage (noise, latents, log-probs, images, rewards, advantages, ratios, "
                   "loss, grad norm) per rank and step into <run>/records/ (docs/alignment.md)")
    p.add_argument("--record-steps", default=default(None), metavar="SPEC",
                   help="record only these steps, e.g. 1-10,50 (implies --record; default: every step)")
    p.add_argument("--record-modules", action="store_true", default=default(False),
                   help="also record every module's output of step 1's first transformer forward, VAE decode "
                   "and reward call (implies --record)")
    p.add_argument("--replay", default=default(None), metavar="RUN",
                   help="take every noise tensor from RUN's records instead of drawing it (a run directory or "
                   "name; refused before anything starts when RUN does not fit this launch)")
    p.add_argument("--msprobe", default=default(None), metavar="{statistics,tensor}",
                   help="also dump the --record-modules calls with MindStudio Probe (msprobe, level L0) into "
                   "<run>/records/msprobe/, for `msprobe compare` and Ascend support: statistics (per-tensor "
                   "max/min/mean/norm) or tensor (every tensor in full); implies --record-modules; needs the "
                   "msprobe extra (docs/alignment.md)")


def options_from_args(args) -> AlignOptions:
    options = AlignOptions(
        rng=getattr(args, "rng", None),
        record=bool(getattr(args, "record", False)),
        record_steps=getattr(args, "record_steps", None),
        record_modules=bool(getattr(args, "record_modules", False)),
        replay=getattr(args, "replay", None),
        msprobe=getattr(args, "msprobe", None),
    )
    options.check()
    return options


# ---------------------------------------------------------------- replay


def check_replay(run_dir: Path, planned: dict) -> Path:
    """Refuse, in one line, a replay whose records do not fit ``planned`` (REPLAY_FIT and
    ``max_train_steps``); return the records directory to pass to the trainer."""
    index = records_index(run_dir)
    differ = [(key, index.get(key), planned.get(key)) for key in REPLAY_FIT if index.get(key) != planned.get(key)]
    if differ:
        recorded = ", ".join(f"{k} {_show(r)}" for k, r, _ in differ)
        here = ", ".join(f"{k} {_show(p)}" for k, _, p in differ)
        raise DancegrpoError(
            f"--replay {run_dir.name}: it was recorded with {recorded}, but this launch has {here}",
            "launch with the recorded settings, or record a run with these",
            exit_code=2,
        )
    max_steps = planned.get("max_train_steps")
    if not isinstance(max_steps, int):
        raise DancegrpoError(
            "--replay: this launch does not set --max_train_steps, so the steps to replay are unknown",
            "pass --max_train_steps N after --",
            exit_code=2,
        )
    recorded_steps = {s for s in index.get("steps") or [] if isinstance(s, int)}
    missing = [s for s in range(1, max_steps + 1) if s not in recorded_steps]
    if missing:
        raise DancegrpoError(
            f"--replay {run_dir.name}: steps {shown_steps(missing)} of this launch (max_train_steps {max_steps}) "
            f"were not recorded (recorded: {shown_steps(recorded_steps)})",
            "lower --max_train_steps, or record those steps",
            exit_code=2,
        )
    return run_dir / "records"


def _show(value) -> str:
    return "not set" if value is None else json.dumps(value)
