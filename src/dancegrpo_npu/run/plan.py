"""What a launch is: the request (LaunchSpec), the plan made from it (LaunchPlan) and
what a finished run leaves (RunRecord).  Data only, so that the launcher, its
environment and the runner share it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dancegrpo_npu.registry import TrainerSpec
from dancegrpo_npu.run.align_flags import AlignOptions
from dancegrpo_npu.run.recipes import Recipe


@dataclass(frozen=True)
class LaunchSpec:
    script: str  # a registry row's name (dancegrpo_npu.registry)
    args: tuple[str, ...] = ()  # script arguments; override upstream's defaults
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None  # None: 127.0.0.1 (one node; several nodes must name node 0's)
    master_port: int | None = None  # None: a free port (single node), 29500 (several nodes)
    ifname: str | None = None  # --ifname: checked here; launch's CLI turns it into *_SOCKET_IFNAME
    device: str = "auto"  # auto|cpu|cuda|npu -> DANCEGRPO_DEVICE
    name: str | None = None  # run directory suffix; default: the script's name
    env: tuple[tuple[str, str], ...] = ()  # extra environment; wins over everything
    upstream_defaults: bool = True  # False: pass exactly `args` (smoke does this)
    strict: bool = False  # DANCEGRPO_NPU_STRICT=1
    align: AlignOptions = AlignOptions()  # --rng/--record.../--replay (trainers that align)
    profile_steps: str | None = None  # --profile STEPS: a validated step list, passed as typed (trainers that align)
    recipe: str | None = None  # upstream's recipe (run.recipes); None: the one for the world size
    max_restarts: int = 0  # torchrun's elastic --max-restarts; each restart resumes from latest
    stall_timeout: object = None  # --stall-timeout: seconds, "off", or None (derived from the run: run.watchdog)
    resume_of: Path | None = None  # --resume: the run directory this launch continues (run.resume)
    verb: str = "launch"  # the command that started it, and continues it: launch | smoke


@dataclass(frozen=True)
class RunRecord:
    run_dir: Path
    returncode: int
    command: tuple[str, ...]
    summary: dict


@dataclass(frozen=True)
class LaunchPlan:
    spec: LaunchSpec
    script: TrainerSpec
    run_dir: Path
    script_path: Path
    script_args: tuple[str, ...]
    command: tuple[str, ...]
    env_set: tuple[tuple[str, str, str], ...]  # (name, value, where it came from)
    env: dict[str, str] = field(repr=False)  # the whole environment the job gets
    profile: str  # "npu" when the NPU environment was applied, else the requested device
    tree_state: dict
    npus_here: int = 0  # NPUs the planning host shows; a dry run may plan a job for another host
    dev_dir: Path = Path("/dev")  # where they were counted (davinci<N> nodes)
    recipe: Recipe | None = None  # the upstream recipe the arguments start from
    recipe_scaling: str | None = None  # how it was scaled to the launch's world size, if it was
    recipe_notes: tuple[str, ...] = ()  # every value that differs from the recipe's script, with why
    problems: tuple[str, ...] = ()  # inputs missing or incomplete (a dry run lists them; launch refuses)
    arguments_checked: str | None = None  # what checked the script's arguments (run.script_parser)
    resume_from: str | None = None  # --resume: the checkpoint the run continues from, in words
    devices: dict | None = None  # the job's devices, probed with its arguments' check (None: at the launch)

    @property
    def world_size(self) -> int:
        return self.spec.nproc_per_node * self.spec.nnodes
