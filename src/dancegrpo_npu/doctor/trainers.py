"""doctor's checks of what a trainer needs on this host: its inputs, its dependency set, the disk.

Which trainers: ``--trainer NAME`` (repeatable), else every GRPO trainer of the tree whose
dependency set is installed here.  A trainer's inputs and dependency set are checked the way
``launch NAME --dry-run`` checks them (``run.launch.build_plan``: upstream's recipe, the port's
defaults, the trainer's own parser, each input's expected contents), so doctor and launch never
disagree; the disk check asks the runs directory for one resume checkpoint of the largest
trainer checked.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dancegrpo_npu import registry
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import Project
from dancegrpo_npu.registry import TrainerSpec
from dancegrpo_npu.run import depsets

# A resume checkpoint holds a trainable parameter in float32 and AdamW's two float32 moments
# (dancegrpo_port.resume), and the save wants 5 % over its size (checkpoints.MARGIN).
RESUME_BYTES_PER_PARAMETER = 12
SAVE_MARGIN = 1.05


def grpo_trainers() -> list[str]:
    """The registry's trainers (not the preprocessing scripts)."""
    return registry.trainers()


def installed(project: Project, environ: dict[str, str]) -> list[str]:
    """The GRPO trainers this host can run: the script is in the tree and its set is installed."""
    found = []
    for name in grpo_trainers():
        info = registry.get(name)
        if not (project.workdir / info.relpath).is_file():
            continue
        try:
            depsets.python_for(info.depset, environ)
        except DancegrpoError:
            continue
        found.append(name)
    return found


# doctor's own flags for a trainer's inputs: (doctor's flag, whether an input of a trainer's row
# is one it stands for).  A trainer takes the flag only where it has such an input.
DOCTOR_FLAGS = (
    ("--weights", lambda required: required.weights),  # the model's own weights directory (Input.weights)
    ("--hps-ckpt", lambda required: required.flag == "--hps_ckpt"),
    ("--hps-open-clip-ckpt", lambda required: required.flag == "--hps_open_clip_ckpt"),
)


def doctor_inputs(info: TrainerSpec) -> dict[str, list[str]]:
    """{doctor's flag: the trainer's input flags it stands for}, for the flags the trainer's inputs have."""
    found = {flag: [r.flag for r in info.required_inputs if stands_for(r)] for flag, stands_for in DOCTOR_FLAGS}
    return {flag: inputs for flag, inputs in found.items() if inputs}


def input_fix(names: list[str]) -> str:
    """How to name the inputs of trainers ``names``: doctor's flags for the inputs they have, and
    `launch NAME --dry-run -- ...` with the trainer's own flags for the rest."""
    parts = []
    for name in names:
        info = registry.get(name)
        covered = doctor_inputs(info)
        rest = [r.flag for r in info.required_inputs if not any(r.flag in inputs for inputs in covered.values())]
        said = [f"doctor {'/'.join(covered)}"] if covered else []
        if rest:
            said.append(f"`dancegrpo-npu launch {name} --dry-run -- {' '.join(f + ' ...' for f in dict.fromkeys(rest))}`")
        parts.append(f"{name}: {', '.join(said)}")
    return "put the inputs where docs/weights.md says, or pass their flags (" + "; ".join(parts) + ")"


def _user_args(info: TrainerSpec, weights_dir: Path | None, hps_ckpt: Path | None,
               clip: Path | None) -> tuple[str, ...]:
    """doctor's --weights, --hps-ckpt and --hps-open-clip-ckpt as the trainer's own flags, for the
    inputs the trainer has."""
    given = {"--weights": weights_dir, "--hps-ckpt": hps_ckpt, "--hps-open-clip-ckpt": clip}
    args: list[str] = []
    for flag, inputs in doctor_inputs(info).items():
        if given[flag] is not None:
            for required in inputs:
                args += [required, str(given[flag])]
    return tuple(args)


def trainer_problems(project: Project, name: str, environ: dict[str, str], *, weights_dir: Path | None = None,
                     hps_ckpt: Path | None = None, hps_open_clip_ckpt: Path | None = None) -> list[str]:
    """What would stop ``launch NAME`` here before its job starts (empty: nothing)."""
    problems, refusal = trainer_check(project, name, environ, weights_dir=weights_dir, hps_ckpt=hps_ckpt,
                                      hps_open_clip_ckpt=hps_open_clip_ckpt)
    return [refusal.one_line()] if refusal is not None else problems


def trainer_check(project: Project, name: str, environ: dict[str, str], *, weights_dir: Path | None = None,
                  hps_ckpt: Path | None = None,
                  hps_open_clip_ckpt: Path | None = None) -> tuple[list[str], DancegrpoError | None]:
    """(what in the trainer's inputs and dependency set would stop ``launch NAME`` here, the
    refusal that stopped its dry run before its inputs were looked at, or None)."""
    from dancegrpo_npu.run.launch import build_plan
    from dancegrpo_npu.run.plan import LaunchSpec

    info = registry.get(name, "trainer")
    spec = LaunchSpec(name, args=_user_args(info, weights_dir, hps_ckpt, hps_open_clip_ckpt), device="cpu")
    try:  # the inputs are the device's own business nowhere: the CPU plan lists the same ones
        plan = build_plan(project, spec, project.runs_dir / "doctor-probe", environ=environ, dry_run=True)
    except DancegrpoError as e:
        return [], e
    return list(plan.problems), None


def resume_checkpoint_bytes(name: str) -> int | None:
    """About one resume checkpoint of trainer ``name`` (full fine-tuning), from plan's model shapes;
    None where plan has no model of that name (the LoRA trainer's checkpoint is small)."""
    from dancegrpo_npu.plan import memory, models

    if registry.get(name).plan is None:
        return None
    return int(memory.denoiser_parameters(models.model_of(name)) * RESUME_BYTES_PER_PARAMETER * SAVE_MARGIN)


def disk_need(names: list[str], floor_gb: float) -> tuple[float, str]:
    """GiB the runs directory should have free, and why."""
    sizes = {name: size for name in names if (size := resume_checkpoint_bytes(name))}
    if not sizes:
        return floor_gb, "--min-free-gb"
    largest = max(sizes, key=sizes.get)
    gib = sizes[largest] / 2**30
    if gib <= floor_gb:
        return floor_gb, "--min-free-gb"
    return gib, f"one resume checkpoint of {largest}: its fp32 weights and AdamW's two moments, 12 bytes a parameter"


def free_gib(path: Path) -> tuple[float, Path]:
    """Free space where ``path`` is or will be made (its nearest existing parent)."""
    where = path
    while not where.exists() and where != where.parent:
        where = where.parent
    return shutil.disk_usage(where).free / 2**30, where
