"""The tool contains no GRPO step and no clipped loss: the bench runs the trainer's own
``train_one_step``, so what it times is what a training run runs.

The check reads every module of src/ as a syntax tree and refuses what only a re-written GRPO
update needs: the trainer's per-timestep ``grpo_one_step`` (or its ``flux_step``) called from the
tool, a clamp of a probability ratio, arithmetic on a clip range, a backward pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "dancegrpo_npu"
TRAINER_STEP_FUNCTIONS = {"grpo_one_step", "flux_step"}


def _names(node: ast.AST) -> set[str]:
    """Every identifier and attribute name in an expression, lower-cased."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id.lower())
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr.lower())
    return out


def grpo_math(source: str) -> list[str]:
    """What in ``source`` belongs to a GRPO update (line: what), empty when nothing does."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in TRAINER_STEP_FUNCTIONS:
                found.add(f"{node.lineno}: calls the trainer's {name}")
            if name in ("clamp", "clip", "clamp_") and node.args and any("ratio" in n for n in _names(node.args[0])):
                found.add(f"{node.lineno}: clamps a ratio")
            if name == "backward":
                found.add(f"{node.lineno}: a backward pass")
        if isinstance(node, ast.BinOp) and any("clip_range" in n for n in _names(node)):
            found.add(f"{node.lineno}: arithmetic on a clip range")
    return sorted(found, key=lambda w: int(w.split(":")[0]))


def test_src_has_no_grpo_update():
    found = {str(p.relative_to(SRC)): grpo_math(p.read_text()) for p in sorted(SRC.rglob("*.py"))}
    assert {path: what for path, what in found.items() if what} == {}


OLD_BENCH_UPDATE = '''
def train(self, trajectory, log_probs, rewards):
    for j in perm:
        new_log_prob = t.grpo_one_step(self.args, trajectory[i : i + 1, j], trajectory[i : i + 1, j + 1])
        ratio = torch.exp(new_log_prob - log_probs[i : i + 1, j])
        unclipped = -advantages[i] * ratio
        clipped = -advantages[i] * torch.clamp(ratio, 1.0 - CLIP_RANGE, 1.0 + CLIP_RANGE)
        loss = torch.mean(torch.maximum(unclipped, clipped))
        loss.backward()
'''


@pytest.mark.parametrize("what", [
    "4: calls the trainer's grpo_one_step", "7: clamps a ratio", "7: arithmetic on a clip range", "9: a backward pass",
])  # fmt: skip
def test_the_check_finds_the_update_the_bench_had(what):
    """The update the bench used to carry (its own copy of train_one_step's loop) is found."""
    assert what in grpo_math(OLD_BENCH_UPDATE)


def test_values_of_the_recipe_are_not_math():
    """The recipe's clip range handed to the trainer as a flag is not an update."""
    assert grpo_math("args = SimpleNamespace(clip_range=CLIP_RANGE, adv_clip_max=5.0)\nx = advantages.clamp(-5, 5)") == []
