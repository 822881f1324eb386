"""MindStudio Probe (msprobe) dumps beside ``--record_modules`` (issue 9: msprobe as an optional extra).

``--record_modules`` keeps our own record of every module's output (float32 safetensors, read by
``dancegrpo-npu compare``).  Ascend support engineers read msprobe's dumps instead, so with
``DANCEGRPO_MSPROBE`` set (``dancegrpo-npu launch|smoke --msprobe TASK`` sets it) the same three
calls -- step 1's first transformer forward, first VAE decode and first reward call -- are also
dumped by msprobe's own ``PrecisionDebugger`` (level L0: modules; forward inputs, outputs and
parameters) under ``records/msprobe/``.  msprobe keeps one debugger per process and counts its
dumps in steps, so each call is one msprobe step: ``step0`` the transformer, ``step1`` the VAE,
``step2`` the reward model; ``records/msprobe/index.json`` says so.  ``msprobe compare`` of two
runs' ``dump.json`` files then gives msprobe's own CSV (docs/alignment.md, section 7).

Values of ``DANCEGRPO_MSPROBE``: ``statistics`` (max, min, mean and norm per tensor: small) or
``tensor`` (every tensor in full: for FLUX.1-dev the 12B parameters alone are 24-48 GB, an
estimate, not measured).
This module imports msprobe only when a dump is asked for; it never imports dancegrpo_npu.
"""

from __future__ import annotations

import importlib.util
import json
import os
from contextlib import contextmanager
from pathlib import Path

from dancegrpo_port.contract import MODULE_GROUPS as ORDER  # the three calls, in the order a step makes them
from dancegrpo_port.contract import MSPROBE_ENV as ENV
from dancegrpo_port.contract import MSPROBE_TASKS as TASKS


def task_from_env(environ=None) -> str | None:
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    return value or None


def problem(task: str | None, record_modules: bool) -> str | None:
    """What is wrong with asking for msprobe dumps (one line), or None."""
    if task is None:
        return None
    if task not in TASKS:
        return f"{ENV}={task!r} is not one of {', '.join(TASKS)}"
    if not record_modules:
        return f"{ENV}={task} needs --record_modules (msprobe dumps the calls that --record_modules records)"
    if importlib.util.find_spec("msprobe") is None:
        return f"{ENV}={task}: MindStudio Probe is not installed in this Python (pip install mindstudio-probe)"
    return None


def config(task: str, dump_path: Path) -> dict:
    """msprobe's config.json for a module-level (L0) dump of forward passes, every rank."""
    return {
        "task": task,
        "dump_path": str(dump_path),
        "rank": [],
        "step": [],
        "level": "L0",
        task: {"scope": [], "list": [], "data_mode": ["forward"],
               **({"file_format": "pt"} if task == "tensor" else {"summary_mode": "statistics"})},
    }


class MsprobeDump:
    """One msprobe ``PrecisionDebugger`` for the run; ``capture(name, root)`` dumps one call."""

    def __init__(self, task: str, root: Path, rank: int):
        from msprobe.pytorch import PrecisionDebugger

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        config_path = self.root / f"config.rank{rank}.json"
        config_path.write_text(json.dumps(config(task, self.root), indent=1) + "\n")
        self.debugger = PrecisionDebugger(config_path=str(config_path))
        self.task = task
        self.steps: dict[str, str] = {}

    @contextmanager
    def capture(self, name: str, model):
        self.debugger.start(model=model)
        try:
            yield
        finally:
            self.debugger.stop()
            self.steps[name] = f"step{len(self.steps)}"
            self.debugger.step()
            self._write_index()

    def _write_index(self) -> None:
        index = {"task": self.task, "level": "L0", "data_mode": ["forward"], "steps": self.steps,
                 "what": "each msprobe step is one call of step 1: the first transformer forward, VAE decode "
                         "and reward call, in that order"}
        (self.root / "index.json").write_text(json.dumps(index, indent=1) + "\n")
