"""What upstream's launch scripts do around a trainer, done by the trainer itself, so that a run
started any other way (``torchrun`` by hand, a cluster's job script) runs too.

* ``make_sample_dirs(*dirs)``: upstream's scripts ``mkdir images`` (Wan: ``mkdir videos``)
  before they start the trainer, which saves every rank's samples there; started otherwise, a
  run loads every model and samples, then stops at the first file it cannot write.  Each rank
  makes them (exist_ok) at start.
* ``wandb_mode()``: upstream's scripts export ``WANDB_DISABLED=true`` (next to
  ``WANDB_MODE=online``) to run without wandb; wandb 0.31 no longer reads it, and rank 0's
  ``wandb.init`` goes online and, without an API key, stops ("No API key configured").  The
  trainers pass ``mode=wandb_mode()``: ``"disabled"`` when WANDB_DISABLED is 1/true/yes/on, as
  older wandb did by itself; otherwise None (wandb reads WANDB_MODE and its settings).

Standard library only.
"""

from __future__ import annotations

import os

TRUE_WORDS = ("1", "true", "yes", "on")


def make_sample_dirs(*dirs: str) -> None:
    for directory in dirs:
        os.makedirs(directory, exist_ok=True)


def wandb_mode(environ=None) -> str | None:
    environ = os.environ if environ is None else environ
    return "disabled" if environ.get("WANDB_DISABLED", "").lower() in TRUE_WORDS else None
