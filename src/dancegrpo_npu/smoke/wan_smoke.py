"""The Wan2.1 smoke: the trainer's arguments, its checkpoint check, and the equal-weights check.

``train_grpo_wan_2_1.py`` counts its loop from 0 and runs steps 0..--max_train_steps; it saves
``checkpoint-<step>-0`` at the *start* of each step with ``(step - 1) % --checkpointing_steps ==
0`` other than 1 (so at step 0, before any update, too), and only then stops past
--max_train_steps.  The smoke's ``--steps S`` passes ``--max_train_steps S-1`` and
``--checkpointing_steps 1``: S steps train (the seam numbers them 1..S in metrics.jsonl), and
``checkpoint-S-0``, saved when the loop reaches step S, holds the weights after all S updates
(``checkpoint-0-0`` with S = 1: the starting weights).  The dataloader must have S + 1 batches
on every rank.

Wan runs with the diffusers-0.35 set (run.depsets), so the checkpoint is loaded back
(``WanTransformer3DModel.from_pretrained``) in a child process of that set's interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.smoke.checks import CheckpointCheck, DecayBudget
from dancegrpo_npu.smoke.recipe import shrunk_recipe

UNSYNCED_HINT = ("the ranks train separate copies of the model: their gradients are not synchronised "
                 "(no FSDP, DDP or all-reduce), and only rank 0's copy is saved")


def trainer_args(wan, hps, steps: int, generations: int) -> tuple[str, ...]:
    """Upstream's recipe (finetune_wan_2_1_grpo.sh) shrunk: S steps at 64x64, one frame, 4 sampling
    steps, CFG 5.0 in the rollout as upstream, on the tiny Wan and the HPS fixture."""
    # max_train_steps S - 1: the Wan trainer counts its steps from 0 and stops past S - 1; a
    # checkpoint every step (the smoke checks the last one)
    return (
        *shrunk_recipe(wan.model_dir, wan.data_json, hps, generations, steps - 1, 1),
        "--cfg_infer", "5.0",
        "--weights_digest",
    )  # fmt: skip


def checkpoint_step(steps: int) -> int:
    """The checkpoint the smoke checks (see the module doc)."""
    return steps if steps >= 2 else 0


def steps_problem(steps: int, nproc: int, prompts: int) -> str | None:
    if steps + 1 > prompts // nproc:
        return (f"--steps {steps}: the Wan trainer needs {steps + 1} prompts on each of the {nproc} rank(s) "
                f"(it saves the last checkpoint as it reaches step {steps}), the fixtures have {prompts}")
    return None


def check_checkpoint(outputs: Path, model_dir: Path, steps: int, budget: DecayBudget, python: str) -> CheckpointCheck:
    step = checkpoint_step(steps)
    path = outputs / f"checkpoint-{step}-0"
    if not path.is_dir():
        raise DancegrpoError(f"smoke: the trainer wrote no checkpoint {path}")
    if step == 0:
        budget = DecayBudget(budget.learning_rate, budget.weight_decay, 0)
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (src, os.environ.get("PYTHONPATH")))),
           "PYTHONWARNINGS": "ignore"}
    args = [str(path), str(model_dir), json.dumps([budget.learning_rate, budget.weight_decay, budget.updates])]
    proc = subprocess.run([python, "-m", "dancegrpo_npu.smoke.wan_smoke", *args], env=env, capture_output=True,
                          text=True, timeout=600)
    out = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not out:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise DancegrpoError(f"smoke: {path} does not load with WanTransformer3DModel.from_pretrained: {last}")
    found = json.loads(out[-1])
    return CheckpointCheck(path, "WanTransformer3DModel.from_pretrained", found["changed"], found["total"],
                           found["max_change"], found["decay_max"], budget.updates)


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


def _check_in_child(path: str, model_dir: str, budget_json: str) -> None:
    from diffusers import WanTransformer3DModel

    from dancegrpo_npu.smoke.checks import _compare

    lr, wd, updates = json.loads(budget_json)
    trained = WanTransformer3DModel.from_pretrained(path).state_dict()
    start = WanTransformer3DModel.from_pretrained(model_dir, subfolder="transformer").state_dict()
    changed, total, biggest, decay = _compare(start, trained, "parameter", DecayBudget(lr, wd, updates))
    print(json.dumps({"changed": changed, "total": total, "max_change": biggest, "decay_max": decay}))


if __name__ == "__main__":
    _check_in_child(*sys.argv[1:4])
