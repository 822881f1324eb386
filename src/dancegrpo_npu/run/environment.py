"""The environment a launched job gets, and the launch written out as a shell script.

Precedence, lowest first: launch's defaults (WANDB_MODE=offline; on NPU, Ascend's settings
from ``ascend.NPU_ENV_DEFAULTS`` and one visible NPU per process), then the user's own
environment, then ``--env NAME=VALUE``.  PYTHONPATH always starts with the patched tree;
DANCEGRPO_DEVICE always comes from ``--device``.

accelerate (``accelerate.logging`` in preprocessing) chooses its backend from
``torch.cuda.is_available()``, which ``transfer_to_npu`` makes True; torch_npu's
``transfer_to_npu`` rewrites ``nccl`` to ``hccl`` in ``init_process_group`` and wraps
accelerate's backend choice, so nothing is set for it here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
from pathlib import Path

from dancegrpo_npu.host import ascend
from dancegrpo_npu.contract import DEVICE_ENV, STRICT_ENV
from dancegrpo_npu.errors import DancegrpoError

from dancegrpo_npu.run.plan import LaunchPlan, LaunchSpec

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env_assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not _ENV_NAME.match(name):
        raise DancegrpoError(f"bad environment assignment {text!r}", "write --env NAME=VALUE", exit_code=2)
    return name, value


def _npu_profile(spec: LaunchSpec, npus: int) -> bool:
    """Whether the job runs on NPUs as far as the launcher can tell (without importing torch)."""
    if spec.device == "npu":
        return True
    return spec.device == "auto" and npus > 0 and importlib.util.find_spec("torch_npu") is not None


def plan_environment(
    spec: LaunchSpec, tree: Path, environ: dict[str, str], dev_dir: Path
) -> tuple[dict[str, str], list[tuple[str, str, str]], str, int]:
    """The job's environment, what launch set in it and why, the device profile, and how many
    NPUs this host shows.

    An NPU plan on a host that shows none (a login node preparing a job) is still made in
    full; ``no_npu_here`` says why it cannot start here, and only a real launch refuses.
    """
    extra = dict(spec.env)
    env = dict(environ)
    entries: dict[str, tuple[str, str]] = {}

    def default(name: str, value: str, why: str) -> None:
        if name in extra:
            return
        if name in environ:
            entries[name] = (environ[name], "your environment (launch default: " + value + ")")
        else:
            entries[name] = (value, "launch default: " + why)

    inherited_pp = extra.get("PYTHONPATH", environ.get("PYTHONPATH", ""))
    entries["PYTHONPATH"] = (
        os.pathsep.join([str(tree)] + ([inherited_pp] if inherited_pp else [])),
        "the patched tree first (CANN's python paths from set_env.sh stay after it)",
    )
    entries[DEVICE_ENV] = (spec.device, "--device")
    if spec.strict:
        entries[STRICT_ENV] = ("1", "--strict")
    default(
        "WANDB_MODE",
        "offline",
        "no network on most clusters; WANDB_MODE=online to sync (wandb >= 0.31 ignores WANDB_DISABLED)",
    )
    npus = ascend.davinci_count(dev_dir)
    npu = _npu_profile(spec, npus)
    if npu:
        for d in ascend.NPU_ENV_DEFAULTS:
            default(d.name, d.value, d.why)
        default(
            "ASCEND_RT_VISIBLE_DEVICES",
            ",".join(str(i) for i in range(spec.nproc_per_node)),
            "one NPU per process, the first --nproc-per-node of them",
        )
    for name, value in spec.env:
        if name != "PYTHONPATH":
            entries[name] = (value, "--env")
    if npu:
        # With no NPU here the plan is for another host: check the list, not against this host.
        ascend.check_visible_devices(
            entries["ASCEND_RT_VISIBLE_DEVICES"][0], spec.nproc_per_node, npus if npus else None
        )
    for name, (value, _) in entries.items():
        env[name] = value
    return env, [(n, v, why) for n, (v, why) in entries.items()], "npu" if npu else spec.device, npus


def no_npu_here(plan: LaunchPlan) -> DancegrpoError | None:
    """Why an NPU plan cannot start on this host (it shows no NPU), or None.

    A dry run prints the message as a warning; a real launch raises it.
    """
    if plan.profile != "npu" or plan.npus_here > 0:
        return None
    return DancegrpoError(
        f"--device npu, but this host shows no NPU ({plan.dev_dir}/davinci* missing)",
        "run on a 910B node (in a container, map the NPUs with --device /dev/davinciN), or use --device cpu|cuda",
        exit_code=2,
    )


def _command_lines(command: tuple[str, ...], script: str) -> list[str]:
    """The command, shell-quoted, one option (with its value) a line."""
    script_at = command.index(script)
    lines = [" ".join(shlex.quote(t) for t in command[:3])]
    i = 3
    while i < len(command):
        tok = command[i]
        if (
            i != script_at
            and tok.startswith("--")
            and i + 1 < len(command)
            and not command[i + 1].startswith("--")
            and i + 1 != script_at
        ):
            lines.append(f"{shlex.quote(tok)} {shlex.quote(command[i + 1])}")
            i += 2
        else:
            lines.append(shlex.quote(tok))
            i += 1
    return lines


# Whole name parts, so WANDB_API_KEY and HF_TOKEN are hidden but TOKENIZERS_PARALLELISM is not.
_SECRET = re.compile(r"(?:^|_)(?:[A-Z]*KEY|[A-Z]*TOKEN|SECRET|PASSW(?:OR)?D?|CREDENTIALS?)(?:_|$)", re.IGNORECASE)


def recorded_value(name: str, value: str) -> str:
    """A variable's value as records and printouts show it: secrets (WANDB_API_KEY...) hidden."""
    return "<redacted>" if _SECRET.search(name) else value


def shell_script(plan: LaunchPlan, *, dry_run: bool = False, problems: list[str] | tuple[str, ...] = ()) -> str:
    """The plan as a shell script: what --dry-run prints and command.sh holds.  It runs as it
    is: it stops at the first failing command and creates the run directory it works in."""
    lines = [
        "#!/usr/bin/env bash",
        f"# dancegrpo-npu launch {plan.spec.script}: torchrun on {plan.script_path}",
    ]
    if dry_run and plan.spec.resume_of is not None:
        lines.append(f"# dry run: nothing was started; the run continues in its own directory {plan.run_dir}")
    elif dry_run:
        lines.append(f"# dry run: nothing was started, and the run directory {plan.run_dir} was not created")
    if plan.resume_from:
        lines.append(f"# resume: {plan.resume_from}")
    if plan.arguments_checked:
        lines.append(f"# the script's arguments: {plan.arguments_checked}")
    if plan.recipe is not None:
        from dancegrpo_npu.run.recipes import recipe_line

        lines.append(f"# {recipe_line(plan)}")
        if plan.recipe_notes:
            lines.append("# values that differ from the recipe's script:")
            lines += [f"#   {note}" for note in plan.recipe_notes]
    if problems:
        lines.append("# could not start here:")
        lines += [f"#   - {problem}" for problem in problems]
    lines += [
        "set -euo pipefail",
        f"mkdir -p {shlex.quote(str(plan.run_dir))}",
        f"cd {shlex.quote(str(plan.run_dir))}",
        "# The variables launch sets; everything else is inherited from the calling shell.",
    ]
    for name, value, why in plan.env_set:
        shown = recorded_value(name, value)
        if shown != value:
            lines.append(f"# export {name}=...  # {why}; not recorded: set it in your shell")
        else:
            lines.append(f"export {name}={shlex.quote(value)}  # {why}")
    lines.append("mkdir -p images  # upstream writes ./images/*.png and ./reward.txt in its working directory")
    lines.append("exec " + " \\\n    ".join(_command_lines(plan.command, str(plan.script_path))))
    return "\n".join(lines) + "\n"
