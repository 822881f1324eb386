"""The arguments launch gives the scripts of the trainer registry, and path handling.

The trainers' defaults are upstream's own recipes, read from its launch scripts in the patched
tree (``run.recipes``), so that ``launch NAME --nproc-per-node 8`` runs what upstream's
one-node script (``bash scripts/finetune/finetune_*_8gpus.sh``) runs; the port adds the reward paths
(the families' ``HPS_DEFAULTS``).  Preprocessing's defaults are the registry's rows' data,
copied from upstream's script (each row names the file).  The user's arguments override them flag by flag.  The
torchrun options (nodes, processes, master) are launch's own options.

Relative paths: upstream's defaults (``data/<model>``, ``data/rl_embeddings/...``) are relative to
the upstream checkout, where upstream's README puts the weights, so they are resolved against
the patched tree; relative paths the user types are resolved against the directory the command
was run from.  The script itself runs in the run directory, so every path it gets is absolute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu import registry
from dancegrpo_npu.contract import REPLAY_FIT, SDE_WINDOW_FLAGS
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.run import datasets

# What launch runs is the trainer registry's (dancegrpo_npu.registry): a row's script, defaults,
# path flags, inputs and checks; ``script_info`` is its look-up as launch's scripts.
TrainerSpec = registry.TrainerSpec


# A Hugging Face hub id ("organisation/model"): left as typed, the script resolves it.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def script_info(name: str) -> TrainerSpec:
    """The registry's row for ``name``; an unknown name is refused in one line (exit 2)."""
    return registry.get(name)


def split_flags(args: tuple[str, ...] | list[str]) -> list[tuple[str, str | None, bool]]:
    """``args`` as (flag, value, written_with_equals) items, in order.

    A token starting with ``--`` is a flag; the next token is its value unless it is a flag
    too (``-1`` and ``-0.5`` are values).  A token that is not a flag and follows a flag's
    value is an error: the scripts take no positional arguments.
    """
    items: list[tuple[str, str | None, bool]] = []
    i = 0
    args = list(args)
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--") or tok == "--":
            raise DancegrpoError(
                f"script argument {tok!r} is not a --flag or a flag's value",
                "upstream's scripts take only --flag [value] arguments",
                exit_code=2,
            )
        if "=" in tok:
            flag, value = tok.split("=", 1)
            items.append((flag, value, True))
            i += 1
            continue
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            items.append((tok, args[i + 1], False))
            i += 2
        else:
            items.append((tok, None, False))
            i += 1
    return items


def flag_values(args) -> dict[str, str | None]:
    """Each flag's value as the trainer's argparse sees it: the last occurrence wins (a bare
    flag: None)."""
    return {flag: value for flag, value, _ in split_flags(args)}


def without_flags(args, flags: tuple[str, ...]) -> list[str]:
    """``args`` less each of ``flags`` and its ``FLAG.KEY=VALUE`` forms (a row's foreign flags)."""
    def foreign(flag: str) -> bool:
        return any(flag == f or flag.startswith(f + ".") for f in flags)

    return join_flags([item for item in split_flags(args) if not foreign(item[0])])


def join_flags(items: list[tuple[str, str | None, bool]]) -> list[str]:
    out: list[str] = []
    for flag, value, eq in items:
        if value is None:
            out.append(flag)
        elif eq:
            out.append(f"{flag}={value}")
        else:
            out += [flag, value]
    return out


def _resolve(value: str, base: Path) -> str:
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def _resolve_user_path(flag: str, value: str, cwd: Path) -> str:
    """A path the user typed, made absolute against ``cwd``.

    Model flags may name a hub id instead of a directory; those stay as typed when no such
    local path exists.  ``--hps_model`` is a model name (ViT-H-14) unless it names a file.
    """
    if flag == "--resume_from_checkpoint" and value == "latest":  # upstream's word, not a path
        return value
    candidate = Path(value).expanduser()
    if not candidate.is_absolute():
        candidate = cwd / candidate
    if flag == "--hps_model" and not (value.endswith(".json") or candidate.exists()):
        return value
    model_flag = flag in ("--pretrained_model_name_or_path", "--vae_model_path", "--dit_model_name_or_path")
    if model_flag and not candidate.exists() and _HUB_ID.match(value) and not value.startswith("."):
        return value
    return str(candidate.resolve())


def _resolve_config_path(value: str, cwd: Path, tree: Path) -> str:
    """An absl configuration file, ``FILE[:NAME]`` (``fastvideo/<configs>/<file>.py:<name>``): the file
    where the command was run from if it is there, else in the patched tree (upstream's recipes
    name it relative to the tree); the ``:NAME`` stays."""
    file, colon, name = value.partition(":")
    path = Path(file).expanduser()
    if not path.is_absolute():
        path = cwd / path if (cwd / path).exists() or not (tree / path).exists() else tree / path
    return str(path.resolve()) + colon + name


def build_script_args(
    info: TrainerSpec,
    user_args: tuple[str, ...],
    *,
    tree: Path,
    cwd: Path,
    run_dir: Path,
    upstream_defaults: bool,
    recipe_args: tuple[tuple[str, str | None], ...] = (),
) -> list[str]:
    """The script's final argument list: the recipe's arguments, then the port's defaults (both
    tree-relative), each overridden by the user's."""
    user = split_flags(user_args)
    user_flags = {flag for flag, _, _ in user}
    items: list[tuple[str, str | None, bool]] = []
    if upstream_defaults:
        for flag, value in (*recipe_args, *info.defaults):
            if flag in user_flags:
                continue
            if flag == "--output_dir" and info.output_in_run_dir:
                continue  # replaced by the run's own outputs/ below
            if value is not None and flag in info.path_flags:
                value = datasets.default_value(info, flag, tree) or _resolve(value, tree)
            items.append((flag, value, False))
    for flag, value, eq in user:
        if value is not None and flag in info.foreign_flags and flag in info.path_flags:
            value = _resolve_config_path(value, cwd, tree)
        elif value is not None and flag in info.path_flags:
            value = _resolve_user_path(flag, value, cwd)
        items.append((flag, value, eq))
    if "--output_dir" not in {flag for flag, _, _ in items}:
        items.append(("--output_dir", str(run_dir / "outputs"), False))
    return join_flags(items)


def input_problems(info: TrainerSpec, script_args: list[str]) -> list[str]:
    """What is missing or incomplete among the run's input weights and data, each in one line
    naming the flag; [] when all are there.  Every input is checked (a dry run lists them all)."""
    from dancegrpo_npu.run.inputs import argument_problems, input_problem

    problems = []
    for flag, value, _ in split_flags(script_args):
        for required in info.required_inputs:
            if flag != required.flag or value is None:
                continue
            p = Path(value)
            if not p.is_absolute():
                continue  # a hub id: the script downloads or finds it in its cache
            problem = input_problem(required, p)
            if problem:
                problems.append(f"{flag}: {problem}")
    values = flag_values(script_args)
    problems += argument_problems(info.argument_checks, values)
    problems += datasets.problems(info, values)
    return problems


# What a replay must match that the trainer's arguments hold (contract.REPLAY_FIT but the world
# size, and the SDE window's flags in place of its schedule, which launch.replay_values makes of
# them), the steps it replays, and the seed ``--rng cpu`` seeds its generator from.
REPLAY_ARGUMENTS = (*(name for name in REPLAY_FIT if name not in ("world_size", "sde_window")), *SDE_WINDOW_FLAGS,
                    "max_train_steps", "seed")


def trainer_values(info: TrainerSpec, script_args, parsed: dict | None) -> dict[str, object]:
    """The values the trainer runs with for REPLAY_ARGUMENTS, read as the trainer reads them: from
    the namespace its own parser makes of the final script arguments (``parsed``: run.script_parser,
    its defaults for the flags not given), each under the name the contract gives it (the row's
    ``renamed_values``: a trainer's ``use_same_noise`` can be ``init_same_noise``, as the overlay's
    settle for it reads it).  Without that namespace (a script whose parser cannot be read) the
    arguments as given: a bare flag True, a number where it parses, else the text; None for the
    rest."""
    own = {name: flag for flag, name in info.renamed_values}  # the contract's name -> the script's
    if parsed is not None:
        return {name: parsed.get(own.get(name, name)) for name in REPLAY_ARGUMENTS}
    renamed = dict(info.renamed_values)
    values: dict[str, object] = dict.fromkeys(REPLAY_ARGUMENTS)
    for flag, value, _ in split_flags(script_args):
        name = renamed.get(flag[2:], flag[2:])
        if name not in values:
            continue
        if value is None:
            values[name] = True
            continue
        try:
            values[name] = int(value)
        except ValueError:
            values[name] = value
    return values
