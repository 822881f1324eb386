"""What makes a smoke run pass, read back from what the trainer itself wrote.

* ``metrics.jsonl`` has every step, with a finite reward and loss and a finite, *non-zero*
  grad norm, and no step whose rewards are all equal (every advantage 0: nothing to learn from,
  named by its step).  The loss cannot be the check: at GRPO's first inner iteration the policy is
  the sampling policy, the ratio is 1 and the loss of a group is -mean(advantages) = 0 - a
  logged loss of 0 is normal.  The grad norm of ratio's gradient is not 0 unless no gradient
  reaches the trainable weights (or every group's rewards were equal).
* The checkpoint loads back the way upstream and diffusers intend, and its trainable weights
  moved further than AdamW's weight decay alone can move them (``DecayBudget``).  AdamW shrinks
  every weight by lr x weight_decay per update whether or not a gradient arrived, so "the
  weights changed" proves nothing by itself: with a zeroed backward, every tensor "changed",
  by about 1e-7.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError

NO_GRADIENT_HINT = (
    "no gradient reached the trainable weights (a loss detached from them, a zeroed backward, "
    "an update that drops the gradient), or every group's rewards were equal (all advantages 0)"
)


EQUAL_REWARDS_HINT = (
    "GRPO learns from the differences between a group's rewards: the reward scores every image alike (a "
    "constant or broken reward model, images that do not depend on the noise), or every generation drew "
    "the same noise"
)


SATURATED_HINT = (
    "GRPO learns from the differences between a group's rewards; a tiny reward of random weights can score one "
    "step's group alike and tell the others apart: its fixture needs a reward that depends more on the samples "
    "(trainers/<family>/fixtures.py), and more --generations make such a step rarer"
)


def _num(x) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _steps_text(rows: list[dict]) -> str:
    """Steps 1, 2 and 4."""
    steps = [str(row.get("step")) for row in rows]
    return steps[0] if len(steps) == 1 else f"{', '.join(steps[:-1])} and {steps[-1]}"


def _equal_rewards(row: dict) -> str | None:
    """Why a step's metrics row shows no learning signal - every reward of the step equal, so every
    advantage is 0 (the port's GRPO health figures: reward_std, adv_min, adv_max) - or None."""
    reward_std, adv_min, adv_max = row.get("reward_std"), row.get("adv_min"), row.get("adv_max")
    if reward_std == 0:
        return f"its rewards are all equal (reward_std 0, reward_mean {row.get('reward_mean')}), so every advantage is 0"
    if adv_min == 0 and adv_max == 0:
        return (f"every group's rewards are equal ({row.get('zero_std_groups')} group(s) of std 0), "
                "so every advantage is 0")
    return None


@dataclass(frozen=True)
class StepFigures:
    step: int
    reward_mean: float
    loss: float
    grad_norm: float
    step_time: float


@dataclass(frozen=True)
class DecayBudget:
    """How far AdamW's decoupled weight decay alone can move a weight before the checkpoint.

    One update without a gradient is ``w <- fl(w * fl(1 - lr*wd))`` (Adam's own term is
    exactly 0: its moments stay 0), so it moves ``w`` by at most ``|w| * (lr*wd + eps)``,
    eps covering the two roundings.  Over ``updates`` updates, with lr never above the base lr
    (diffusers' schedulers only scale it down), ``|w0| * updates * (lr*wd + eps)`` bounds it,
    and twice that is the line.  Adam moves a weight that gets any gradient by about lr per
    update (1e-3 in the smoke) - thousands of times the line (about 4e-7 x |w0| per update) -
    so the margin costs nothing and no real gradient is mistaken for decay.
    """

    learning_rate: float
    weight_decay: float
    updates: int  # optimizer updates before the checkpoint was saved

    def bound(self, start, end):
        """Per element of ``start``: the largest change decay (and rounding) can explain."""
        import torch

        eps = max(torch.finfo(start.dtype).eps, torch.finfo(end.dtype).eps)
        per_update = abs(self.learning_rate * self.weight_decay) + eps
        return 2 * self.updates * per_update * start.float().abs()


def decay_budget(args, steps: int) -> DecayBudget:
    """What weight decay alone can do before checkpoint ``steps``, from the arguments the
    trainer got: updates a step = samples a step / accumulation steps (the trainers' loop)."""
    from dancegrpo_npu.run.upstream_args import flag_values

    v = flag_values(args)
    try:
        samples = int(v["--train_batch_size"]) * (int(v["--num_generations"]) if "--use_group" in v else 1)
        per_step = samples // int(v["--gradient_accumulation_steps"])
        return DecayBudget(float(v["--learning_rate"]), float(v["--weight_decay"]), (steps - 1) * per_step)
    except (KeyError, TypeError, ValueError) as exc:
        raise DancegrpoError(f"smoke: cannot read the optimizer settings from the trainer's arguments ({exc})",
                             "give --learning_rate, --weight_decay, --train_batch_size and "
                             "--gradient_accumulation_steps numbers", exit_code=2) from None


@dataclass(frozen=True)
class CheckpointCheck:
    path: Path
    loaded_with: str
    changed: int  # trainable tensors moved beyond what weight decay alone explains
    total: int
    max_change: float
    decay_max: float  # the largest change weight decay alone could explain (DecayBudget.bound)
    updates: int  # optimizer updates the checkpoint has seen (0: saved before any)
    unchanged: tuple[str, ...] = ()  # the trainable tensors that did not move beyond weight decay


def read_metrics(run_dir: Path, steps: int) -> tuple[StepFigures, ...]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise DancegrpoError(f"smoke: the trainer wrote no {path}", f"see the rank logs in {run_dir / 'logs'}")
    figures, rows = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            rows.append(row)
            figures.append(StepFigures(int(row["step"]), float(row["reward_mean"]), float(row["loss"]),
                                       float(row["grad_norm"]), float(row["step_time"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise DancegrpoError(f"smoke: {path} line {n} is not a metrics record ({exc})") from None
    if [s.step for s in figures] != list(range(1, steps + 1)):
        raise DancegrpoError(f"smoke: {path} has steps {[s.step for s in figures]}, expected 1..{steps}")
    for s in figures:
        bad = [name for name in ("reward_mean", "loss", "grad_norm") if not math.isfinite(getattr(s, name))]
        if bad:
            raise DancegrpoError(f"smoke: step {s.step} has non-finite {', '.join(bad)} ({s})",
                                 f"see the rank logs in {run_dir / 'logs'}")
    equal = [(row, why) for row in rows for why in [_equal_rewards(row)] if why]
    if equal:
        row, why = equal[0]
        # steps whose groups' rewards differ: the reward depends on the samples
        told_apart = [other for other in rows if (_num(other.get("reward_std")) or 0.0) > 0 and not _equal_rewards(other)]
        if not told_apart:
            raise DancegrpoError(f"smoke: step {row['step']} learned nothing: {why}", EQUAL_REWARDS_HINT)
        spread = max((_num(other.get("reward_std")) or 0.0) for other in told_apart)
        raise DancegrpoError(
            f"smoke: step {row['step']} learned nothing: {why}; the tiny reward saturated there: it told the "
            f"samples apart at step{'s' if len(told_apart) > 1 else ''} {_steps_text(told_apart)} "
            f"(reward_std up to {spread:.3g}) and scored this step's alike", SATURATED_HINT)
    for s in figures:
        if not s.grad_norm > 0:
            raise DancegrpoError(f"smoke: training did nothing: the grad norm of step {s.step} is {s.grad_norm:g}",
                                 NO_GRADIENT_HINT)
    return tuple(figures)


def compare_weights(start: dict, end: dict, what: str, budget: DecayBudget) -> tuple[int, int, float, float]:
    """(tensors moved beyond the decay bound, tensors, max |change|, max decay bound)."""
    if set(start) != set(end):
        raise DancegrpoError(f"smoke: the checkpoint's {what} names differ from the model's",
                             f"missing {sorted(set(start) - set(end))[:3]}, extra {sorted(set(end) - set(start))[:3]}")
    moved, biggest, decay_max = 0, 0.0, 0.0
    for name in start:
        change = (end[name].float() - start[name].float()).abs()
        bound = budget.bound(start[name], end[name])
        if not bool(change.isfinite().all()):
            raise DancegrpoError(f"smoke: the checkpoint's {what} {name} is not finite")
        moved += bool((change > bound).any())
        biggest = max(biggest, change.max().item() if change.numel() else 0.0)
        decay_max = max(decay_max, bound.max().item() if bound.numel() else 0.0)
    return moved, len(start), biggest, decay_max


def unmoved(start: dict, end: dict, budget: DecayBudget) -> tuple[str, ...]:
    """The tensors of ``start`` that ``end`` moved no further than weight decay alone can."""
    return tuple(name for name in start
                 if not bool(((end[name].float() - start[name].float()).abs() > budget.bound(start[name], end[name])).any()))


def check_saved_model(path: Path, start_dir: Path, model_class: str, budget: DecayBudget,
                      subfolder: str = "transformer") -> CheckpointCheck:
    """The model upstream saved at ``path``, loaded with diffusers' ``model_class`` (the class the
    released weights load with), against the fixture's ``start_dir/subfolder``."""
    import diffusers

    if not path.is_dir():
        raise DancegrpoError(f"smoke: the trainer wrote no checkpoint {path}")
    cls = getattr(diffusers, model_class)
    try:
        trained = cls.from_pretrained(str(path)).state_dict()
    except (OSError, ValueError, RuntimeError) as exc:
        raise DancegrpoError(f"smoke: {path} does not load with {model_class}.from_pretrained: {exc}") from None
    start = cls.from_pretrained(str(start_dir), subfolder=subfolder).state_dict()
    changed, total, biggest, decay = compare_weights(start, trained, "parameter", budget)
    return CheckpointCheck(path, f"{model_class}.from_pretrained", changed, total, biggest, decay, budget.updates,
                           unmoved(start, trained, budget))


def check_full_checkpoint(outputs: Path, model_dir: Path, step: int, budget: DecayBudget,
                          model_class: str) -> CheckpointCheck:
    """Upstream's full checkpoint of step ``step`` (``outputs/checkpoint-<step>-0``, as the trainers
    whose loop counts from 1 save it) against the fixture's ``model_dir/transformer``."""
    return check_saved_model(outputs / f"checkpoint-{step}-0", model_dir, model_class, budget)


def check_training_moved(check: CheckpointCheck) -> None:
    """Refuse a checkpoint whose weights only weight decay moved (or, saved before any update,
    one that differs from the start)."""
    if check.updates == 0:
        if check.changed:
            raise DancegrpoError(f"smoke: {check.path} was saved before any update, yet {check.changed} of its "
                                 f"{check.total} trainable tensors differ from the starting weights "
                                 f"(max |change| {check.max_change:.3g})",
                                 "saving or loading the checkpoint changes the weights")
        return
    if check.changed == 0:
        raise DancegrpoError(
            f"smoke: training did nothing: none of the {check.total} trainable tensors in {check.path} moved "
            f"beyond what AdamW's weight decay alone does over {check.updates} update(s) "
            f"(max |change| {check.max_change:.3g}, decay alone up to {check.decay_max:.3g})",
            "the grad norm was not 0, so the gradient is computed but the update does not use it "
            "(zeroed or replaced before optimizer.step, or the optimizer holds other tensors than the model's)")
