"""./metrics.jsonl: one JSON object per step, rank 0's, for tools (dancegrpo-npu runs, plot,
compare): a feature on the seam.

Upstream reports loss, grad norm, learning rate and step time only to wandb (often disabled
on air-gapped clusters) and the progress bar, and the mean reward to ./reward.txt.  The seam's
``step_end`` hands over the step's figures (upstream's, then what the other features add:
GRPO health, phase times); this writes them as one line.  The mean reward is taken here, from
the rewards the seam's ``rewards_gathered`` hands over where upstream gathers them (its
``gathered_reward.mean().item()``, the value of ./reward.txt), and goes into the figures after
the grad norm, where the line has always had it.  Self-contained: the standard library.
"""

from __future__ import annotations

import json
import os

from dancegrpo_port.feature import Feature

PATH = "./metrics.jsonl"


class MetricsLog(Feature):
    def __init__(self, rank: int, path: str = PATH):
        self.rank, self.path = rank, path
        self.reward_mean = None  # the step's, from rewards_gathered; None until its rewards are in

    def rewards_gathered(self, rewards) -> None:
        self.reward_mean = rewards.mean().item()

    def step_end(self, step: int, figures: dict) -> None:
        if self.reward_mean is not None:  # on every rank: the figures step_end returns have it
            _put_after(figures, "grad_norm", "reward_mean", self.reward_mean)
            self.reward_mean = None  # a step without rewards reports none, not the last step's
        if self.rank <= 0:
            with open(self.path, "a") as f:
                f.write(json.dumps(figures) + "\n")

    def resumed(self, step: int) -> None:
        """A resumed run continues the file: the lines of steps after ``step`` (written before
        the run stopped, after its last checkpoint) go, as the run does them again."""
        if self.rank > 0 or not os.path.exists(self.path):
            return
        with open(self.path) as f:
            lines = f.read().splitlines()
        kept = [line for line in lines if _step(line) is not None and _step(line) <= step]
        with open(self.path + ".tmp", "w") as f:
            f.write("".join(line + "\n" for line in kept))
        os.replace(self.path + ".tmp", self.path)


def _put_after(figures: dict, key: str, name: str, value) -> None:
    """``figures[name] = value``, placed right after ``key`` (at the end without it): the dict
    is changed in place, as every feature's step_end adds to the one the seam returns."""
    items = [(k, v) for k, v in figures.items() if k != name]
    figures.clear()
    for k, v in items:
        figures[k] = v
        if k == key:
            figures[name] = value
    figures.setdefault(name, value)


def _step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None
