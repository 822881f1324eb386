"""What a smoke checks after training, beside the metrics: every rank holds the same weights, and
the checkpoint of a trainer of another dependency set loads and moved.

A trainer of another dependency set saves a model class the tool's diffusers may not have: its
checkpoint is loaded back in a child process of that set's interpreter
(``python -m dancegrpo_npu.smoke.trained``).  The trainers whose loop counts from 0 and saves as it
reaches a pass's step (a row's ``Smoke.loop_below``) name their last checkpoint here too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.smoke.checks import CheckpointCheck, DecayBudget, decay_budget

UNSYNCED_HINT = ("the ranks train separate copies of the model: their gradients are not synchronised "
                 "(no FSDP, DDP or all-reduce), and only rank 0's copy is saved")


def last_checkpoint(steps: int, passes: int = 1) -> tuple[str, int]:
    """The checkpoint a smoke of ``steps`` steps checks, and the updates it holds.  The trainers
    whose loop counts from 0 save checkpoint-<step>-<pass> as their loop reaches step S of a pass of
    S steps (never checkpoint-1-<pass>, and checkpoint-0-<pass> before the pass's first update); a
    trainer may make several passes (its registry row's smoke.passes)."""
    per_pass = steps // passes
    if per_pass >= 2:
        return f"checkpoint-{per_pass}-{passes - 1}", steps
    return f"checkpoint-0-{passes - 1}", steps - per_pass  # the last pass's start


def steps_problem(steps: int, nproc: int, prompts: int, trainer: str, passes: int = 1) -> str | None:
    """Why the fixtures' prompts are too few for ``steps`` steps on ``nproc`` ranks, or None: the
    loop reaches step S of a pass (S + 1 batches on every rank) before it saves the last checkpoint."""
    per_pass = steps // passes
    if per_pass + 1 > prompts // nproc:
        where = f"step {per_pass} of each of its {passes} passes" if passes > 1 else f"step {steps}"
        return (f"--steps {steps}: the {trainer} trainer needs {per_pass + 1} prompts "
                f"{'on its one rank' if nproc == 1 else f'on each of the {nproc} ranks'} "
                f"(it saves the last checkpoint as it reaches {where}), the fixtures have {prompts}")
    return None


def check_last_checkpoint(run_dir: Path, model_dir: Path, options, spec, args) -> CheckpointCheck:
    """The checkpoint of the last step a trainer whose loop counts from 0 saves (``last_checkpoint``),
    against the fixture's ``model_dir/transformer``, loaded by the interpreter of the row's
    dependency set; the decay budget from the trainer's arguments ``args``."""
    from dancegrpo_npu.run.depsets import python_for

    python = python_for(spec.depset, needed_by=spec.name)
    checkpoint, updates = last_checkpoint(options.steps, spec.smoke.passes)
    return check_checkpoint(run_dir / "outputs" / checkpoint, model_dir, spec.smoke.model_class,
                            decay_budget(args, updates + 1), python)


def check_checkpoint(path: Path, model_dir: Path, model_class: str, budget: DecayBudget,
                     python: str) -> CheckpointCheck:
    """``path`` (upstream's checkpoint-<step>-<pass>) against the fixture's ``model_dir/transformer``,
    both loaded with diffusers' ``model_class`` in the interpreter ``python``."""
    if not path.is_dir():
        raise DancegrpoError(f"smoke: the trainer wrote no checkpoint {path}")
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (src, os.environ.get("PYTHONPATH")))),
           "PYTHONWARNINGS": "ignore"}
    args = [str(path), str(model_dir), model_class,
            json.dumps([budget.learning_rate, budget.weight_decay, budget.updates])]
    proc = subprocess.run([python, "-m", "dancegrpo_npu.smoke.trained", *args], env=env, capture_output=True,
                          text=True, timeout=600)
    out = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not out:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise DancegrpoError(f"smoke: {path} does not load with {model_class}.from_pretrained: {last}")
    found = json.loads(out[-1])
    return CheckpointCheck(path, f"{model_class}.from_pretrained", found["changed"], found["total"],
                           found["max_change"], found["decay_max"], budget.updates, tuple(found.get("unchanged", ())))


def check_equal_weights(run_dir: Path, nproc: int) -> int:
    """Every rank's --weights_digest after training is the same; the number of tensors."""
    directory = run_dir / "weights"
    digests = {}
    for rank in range(nproc):
        path = directory / f"rank{rank}.json"
        try:
            digests[rank] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DancegrpoError(f"smoke: rank {rank} wrote no weights digest {path} ({exc})",
                                 f"see the rank logs in {run_dir / 'logs'}") from None
    first = digests[0]
    for rank, found in digests.items():
        differ = sorted(n for n in set(first) | set(found) if first.get(n) != found.get(n))
        if differ:
            raise DancegrpoError(
                f"smoke: after training, rank {rank} holds other weights than rank 0: {len(differ)} of "
                f"{len(first)} tensors differ (first: {differ[0]})", UNSYNCED_HINT)
    return len(first)


def _check_in_child(path: str, model_dir: str, model_class: str, budget_json: str) -> None:
    import diffusers

    from dancegrpo_npu.smoke.checks import compare_weights, unmoved

    cls = getattr(diffusers, model_class)
    lr, wd, updates = json.loads(budget_json)
    trained = cls.from_pretrained(path).state_dict()
    start = cls.from_pretrained(model_dir, subfolder="transformer").state_dict()
    budget = DecayBudget(lr, wd, updates)
    changed, total, biggest, decay = compare_weights(start, trained, "parameter", budget)
    print(json.dumps({"changed": changed, "total": total, "max_change": biggest, "decay_max": decay,
                      "unchanged": unmoved(start, trained, budget)}))


if __name__ == "__main__":
    _check_in_child(*sys.argv[1:5])
