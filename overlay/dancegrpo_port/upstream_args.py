"""Checks of upstream's own trainer arguments that upstream does not make, refused at start by
the seam's check_arguments (one line, exit 2) before any model is loaded.

- Each GRPO step trains on train_batch_size x num_generations samples (with --use_group;
  train_batch_size without) and steps the optimizer after every gradient_accumulation_steps of
  them.  When the first is not a multiple of the second, the last samples' gradients are dropped
  by the next step's zero_grad, and when there are fewer samples than accumulation steps the run
  loads every model, samples, and only then stops with "UnboundLocalError: cannot access local
  variable 'grad_norm'".
"""

from __future__ import annotations


def samples_per_step(args) -> int:
    return args.train_batch_size * (args.num_generations if args.use_group else 1)


def accumulation_problem(args) -> str | None:
    # A trainer that trains on a selection of its samples (HunyuanVideo's best-of-n) says how many.
    samples = getattr(args, "trained_samples", None) or samples_per_step(args)
    if samples % args.gradient_accumulation_steps:
        what = "trained" if getattr(args, "trained_samples", None) else "per step"
        return (f"{samples} samples {what} (--train_batch_size{' x --num_generations' if args.use_group else ''}"
                f"{', --bestofn' if what == 'trained' else ''}) "
                f"is not a multiple of --gradient_accumulation_steps {args.gradient_accumulation_steps}: the last "
                "samples of each step would never reach the optimizer")
    return None
