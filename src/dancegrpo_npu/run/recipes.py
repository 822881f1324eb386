"""Upstream's training recipes: the trainer arguments of its own launch scripts, read from the
patched tree (a row's ``recipe_glob``: ``scripts/finetune/finetune_<model>_grpo*.sh``), so that a rebase onto an upstream
that changes a recipe changes what ``launch`` runs.

A recipe is named after its file: ``finetune_<model>_grpo_8gpus.sh`` is ``8gpus``,
``finetune_<model>_grpo_8gpus_lora.sh`` is ``8gpus-lora``; the file without a suffix
(``finetune_<model>_grpo.sh``, say a 2-node script) is named after its torchrun layout: ``2nodes``.
A script belongs to the trainer its torchrun line starts (the row's ``relpath``, dancegrpo_npu.registry).

A launch whose world size no recipe has runs the nearest recipe scaled to it, keeping what a
GRPO step means (``scale``):

- prompts per step = world size x --train_batch_size (each rank takes its own prompts)
- each prompt is sampled --num_generations times (with --use_group), and every sample is one
  micro-batch: the optimizer steps after --gradient_accumulation_steps of a rank's samples, so
  the effective batch = world size x --gradient_accumulation_steps samples per optimizer step.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError


# torchrun's options that take no value (the rest take one, as --opt=value or --opt value).
_TORCHRUN_SWITCHES = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m", "--module"}
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Recipe:
    name: str  # what --recipe takes: 8gpus, 2nodes, 8gpus-lora
    path: Path  # the script in the patched tree
    trainer: str  # the script its torchrun line starts, relative to the tree
    nnodes: int
    nproc_per_node: int
    args: tuple[tuple[str, str | None], ...]  # the trainer's arguments, in the script's order

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def values(self) -> dict[str, str | None]:
        return dict(self.args)


def _unparseable(path: Path, why: str) -> DancegrpoError:
    return DancegrpoError(
        f"upstream's launch script {path} cannot be read as a recipe: {why}",
        "pass the trainer's arguments yourself: `dancegrpo-npu launch ... --no-upstream-defaults -- ARGS`",
    )


def _torchrun_line(text: str) -> tuple[list[str], dict[str, str]]:
    """The torchrun command's words (variables substituted) and the variables set before it."""
    joined = re.sub(r"\\\s*\n", " ", text + "\n")
    variables: dict[str, str] = {}
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if len(words) == 1 and _ASSIGNMENT.match(words[0]):
            name, value = _ASSIGNMENT.match(words[0]).groups()
            variables[name] = value
            continue
        if words[0] == "torchrun":
            return words[1:], variables
    raise ValueError("it has no torchrun command")


def _substitute(word: str, variables: dict[str, str]) -> str:
    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in variables:
            raise ValueError(f"${name} is not set in the script")
        return variables[name]

    return _VARIABLE.sub(value, word)


def parse_recipe(path: Path, name: str) -> Recipe:
    """The recipe in upstream's script ``path``; one error naming the file if it cannot be read."""
    from dancegrpo_npu.run.upstream_args import split_flags

    try:
        text = path.read_text()
    except OSError as e:
        raise _unparseable(path, e.strerror or str(e)) from None
    try:
        words, variables = _torchrun_line(text)
        words = [_substitute(w, variables) for w in words]
        options: dict[str, str] = {}
        i = 0
        while i < len(words) and words[i].startswith("-"):
            opt, eq, value = words[i].partition("=")
            if eq or opt in _TORCHRUN_SWITCHES:
                i += 1
            elif i + 1 < len(words):
                value, i = words[i + 1], i + 2
            else:
                raise ValueError(f"torchrun option {opt} has no value")
            options[opt.replace("-", "_").lstrip("_")] = value
        if i >= len(words) or not words[i].endswith(".py"):
            raise ValueError("torchrun starts no .py script")
        trainer, rest = words[i], words[i + 1 :]
        args = tuple((flag, value) for flag, value, _ in split_flags(rest))
        nnodes = int(options.get("nnodes", "1"))
        nproc = int(options.get("nproc_per_node", "1"))
    except DancegrpoError as e:
        raise _unparseable(path, e.message) from None
    except ValueError as e:  # shlex's "No closing quotation", int("1:2"), the checks above
        raise _unparseable(path, str(e)) from None
    if not name:
        name = f"{nnodes}nodes" if nnodes > 1 else f"{nproc}gpus"
    return Recipe(name, path, trainer, nnodes, nproc, args)


def recipe_name(path: Path, glob: str) -> str:
    """``finetune_<model>_grpo_8gpus_lora.sh`` -> ``8gpus-lora``; "" for the glob's bare name."""
    prefix = Path(glob).name.split("*")[0]
    return path.stem[len(prefix) :].strip("_").replace("_", "-")


def recipes_for(tree: Path, trainer: str, glob: str) -> list[Recipe]:
    """Every recipe in ``tree`` whose script starts ``trainer``, by world size then name."""
    found = [parse_recipe(p, recipe_name(p, glob)) for p in sorted(tree.glob(glob))]
    return sorted((r for r in found if r.trainer == trainer), key=lambda r: (r.world_size, r.name))


# ------------------------------------------------------------------ batch arithmetic and scaling


@dataclass(frozen=True)
class Batch:
    """What one GRPO step of a recipe is, at a world size (see the module doc)."""

    world_size: int
    train_batch_size: int
    accumulation: int
    samples_per_rank: int  # per step: train_batch_size x num_generations

    @property
    def prompts_per_step(self) -> int:
        return self.world_size * self.train_batch_size

    @property
    def effective_batch(self) -> int:
        return self.world_size * self.accumulation

    def describe(self) -> str:
        prompts = f"{self.prompts_per_step} prompt{'' if self.prompts_per_step == 1 else 's'}"
        return (f"{prompts} per step, accumulation {self.accumulation}, "
                f"effective batch {self.effective_batch} samples per optimizer step")


def _int(values: dict[str, str | None], flag: str, default: int) -> int:
    value = values.get(flag)
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def batch_of(values: dict[str, str | None], world_size: int) -> Batch:
    tb = _int(values, "--train_batch_size", 1)
    generations = _int(values, "--num_generations", 16) if "--use_group" in values else 1
    return Batch(world_size, tb, _int(values, "--gradient_accumulation_steps", 1), tb * generations)


@dataclass(frozen=True)
class Scaling:
    recipe: Recipe
    world_size: int
    changes: tuple[tuple[str, str], ...]  # (flag, new value)
    before: Batch
    after: Batch

    def describe(self) -> str:
        changed = ", ".join(f"{flag} {self.recipe.values()[flag]} -> {v}" for flag, v in self.changes) or "nothing"
        return (
            f"world size {self.world_size} is not recipe {self.recipe.name}'s ({self.recipe.world_size}): scaled it "
            f"({changed}): {self.after.describe()}; the script has {self.before.describe()}"
        )


def scale(recipe: Recipe, world_size: int) -> Scaling:
    """``recipe`` at ``world_size``: the same prompts per step and effective batch where the
    world size divides them; else the nearest, with the accumulation a divisor of each rank's
    samples per step (the trainers refuse anything else)."""
    values = recipe.values()
    before = batch_of(values, recipe.world_size)
    tb = max(1, round(before.prompts_per_step / world_size))
    generations = before.samples_per_rank // before.train_batch_size
    samples = tb * generations
    target = before.effective_batch / world_size
    divisors = [d for d in range(1, samples + 1) if samples % d == 0]
    accumulation = min(divisors, key=lambda d: (abs(d - target), -d))
    changes = []
    if tb != before.train_batch_size:
        changes.append(("--train_batch_size", str(tb)))
        if values.get("--train_sp_batch_size") == values.get("--train_batch_size"):
            changes.append(("--train_sp_batch_size", str(tb)))
    if accumulation != before.accumulation:
        changes.append(("--gradient_accumulation_steps", str(accumulation)))
    after = Batch(world_size, tb, accumulation, samples)
    return Scaling(recipe, world_size, tuple(changes), before, after)


def choose(recipes: list[Recipe], name: str | None, world_size: int, script: str,
           scalable: bool = True) -> tuple[Recipe, Scaling | None]:
    """The recipe named, else the one for this world size, else the nearest one (scaled, unless
    the trainer's batch is per rank: ``scalable`` False)."""
    names = ", ".join(f"{r.name} ({r.world_size} ranks)" for r in recipes)
    if not recipes:
        raise DancegrpoError(
            f"the patched tree has no recipe for {script} (no scripts/finetune/*.sh of it)",
            "pass the trainer's arguments yourself: `dancegrpo-npu launch ... --no-upstream-defaults -- ARGS`",
        )
    if name is not None:
        chosen = [r for r in recipes if r.name == name]
        if not chosen:
            raise DancegrpoError(f"{script} has no recipe {name!r}", f"choose one of: {names}", exit_code=2)
        recipe = chosen[0]
    else:
        same = [r for r in recipes if r.world_size == world_size]
        if same:
            return same[0], None
        import math

        recipe = min(recipes, key=lambda r: (abs(math.log(r.world_size / world_size)), r.world_size))
    if recipe.world_size == world_size or not scalable or "--train_batch_size" not in recipe.values():
        # a recipe without the batch flags keeps its batch per rank elsewhere (an absl configuration's
        # sample.batch_size is per GPU): it runs at any world size as it is
        return recipe, None
    return recipe, scale(recipe, world_size)


def differences(recipe: Recipe, final: list[tuple[str, str | None]], reasons: dict[str, str]) -> list[str]:
    """Every value of the final arguments that is not the script's, with why."""
    script = recipe.values()
    lines = []
    for flag, value in final:
        if flag in script and script[flag] == value:
            continue
        shown = flag if value is None else f"{flag} {value}"
        why = reasons.get(flag, "set by launch")
        if flag in script:
            was = "present" if script[flag] is None else script[flag]
            lines.append(f"{shown} (script: {was}; {why})")
        else:
            lines.append(f"{shown} (not in the script; {why})")
    final_flags = {flag for flag, _ in final}
    lines += [f"{flag} dropped ({reasons.get(flag, 'set by launch')})" for flag in script if flag not in final_flags]
    return lines


# ------------------------------------------------------------------ in a launch plan


def plan_recipe(spec, info, tree: Path):
    """(recipe, its arguments as this launch scales them, the Scaling or None); all None/() for a
    script without recipes or a launch --no-upstream-defaults."""
    if info.recipe_glob is None or not spec.upstream_defaults:
        return None, (), None
    found = recipes_for(tree, info.relpath, info.recipe_glob)
    recipe, scaling = choose(found, spec.recipe, spec.nproc_per_node * spec.nnodes, info.name,
                             scalable=not info.per_rank_batch)
    changes = dict(scaling.changes) if scaling else {}
    return recipe, tuple((flag, changes.get(flag, value)) for flag, value in recipe.args), scaling


def batch_line(info, recipe, scaling, world_size: int) -> str | None:
    """How the recipe's global batch is kept at the launch's world size: rescaled (``Scaling``), or
    kept per rank (the row's ``per_rank_batch``, or a recipe whose batch is in its configuration),
    so that a step takes world size / recipe ranks of the recipe's global batch.  None when the
    world size is the recipe's."""
    if recipe is None or recipe.world_size == world_size:
        return None
    if scaling is not None:
        return scaling.describe()
    why = info.per_rank_batch or "the recipe sets no --train_batch_size: its configuration's batch sizes are a rank's"
    text = (f"world size {world_size} is not recipe {recipe.name}'s ({recipe.world_size}): its batch is kept per rank "
            f"({why}), so a step takes {world_size}/{recipe.world_size} of the recipe's global batch")
    values = recipe.values()
    if "--train_batch_size" in values:
        text += (f": {batch_of(values, world_size).describe()}; the script has "
                 f"{batch_of(values, recipe.world_size).describe()}")
    return text


def recipe_notes(spec, info, recipe, scaling, script_args) -> tuple[str, ...]:
    """Every final value that is not the recipe script's, with why."""
    if recipe is None:
        return ()
    from dancegrpo_npu.run.align_flags import TRAINER_FLAGS
    from dancegrpo_npu.run.upstream_args import split_flags

    user = {flag for flag, _, _ in split_flags(spec.args)}
    reasons = {flag: f"scaled to world size {scaling.world_size}" for flag, _ in scaling.changes} if scaling else {}
    reasons.update({flag: "resolved in the patched tree" for flag in info.path_flags})
    reasons.update({flag: "the port's flag for a path upstream hard-codes (in the working directory)"
                    for flag, _ in info.defaults})
    reasons["--output_dir"] = "the run's own outputs/"
    if info.dataset is not None:  # run.datasets: each model's dataset in its own directory
        from dancegrpo_npu.run.datasets import model

        reasons["--data_json_path"] = (f"this model's own dataset, resolved in the patched tree (`launch "
                                       f"{model(info.dataset).preprocess}` writes it)")
    reasons.update({flag: "launch's alignment or --profile options" for flag in (*TRAINER_FLAGS, "--profile_steps")})
    reasons.update({flag: "given after --" for flag in user})
    final = [(flag, value) for flag, value, _ in split_flags(script_args)]
    return tuple(differences(recipe, final, reasons))


def recipe_line(plan) -> str:
    """Which upstream recipe the plan runs, and how it was scaled to the launch's world size."""
    recipe = plan.recipe
    text = f"recipe {recipe.name}: {recipe.path} ({recipe.world_size} ranks)"
    return text + (f"; {plan.recipe_scaling}" if plan.recipe_scaling else "")
