"""./metrics.jsonl: one JSON object per step, rank 0's, for tools (dancegrpo-npu runs, plot,
compare): a feature on the seam.

Upstream reports loss, grad norm, learning rate and step time only to wandb (often disabled
on air-gapped clusters) and the progress bar, and the mean reward to ./reward.txt.  The seam's
``step_end`` hands over the step's figures (upstream's, then what the other features add:
GRPO health, phase times); this writes them as one line.  Self-contained: the standard library.
"""

from __future__ import annotations

import json

PATH = "./metrics.jsonl"


class MetricsLog:
    def __init__(self, rank: int, path: str = PATH):
        self.rank, self.path = rank, path

    def step_end(self, step: int, figures: dict) -> None:
        if self.rank <= 0:
            with open(self.path, "a") as f:
                f.write(json.dumps(figures) + "\n")
