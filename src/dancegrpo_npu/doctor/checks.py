"""doctor's checks of the software stack: Python, torch, torch_npu, CANN, accelerate, devices.

Each returns a Check (PASS / FAIL / SKIP, what was found, the fix).  ``Facts`` carries what
an earlier check found (torch, whether this is an NPU run, the devices) to the later ones.
torch and torch_npu are imported here, inside the checks, never when the CLI starts.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.host import ascend, torch_stack
from dancegrpo_npu.host.torch_stack import base_version

PASS, FAIL, SKIP, WARN = "PASS", "FAIL", "SKIP", "WARN"  # WARN: worth reading, training can start


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str | None = None
    notes: tuple[str, ...] = ()  # lines printed under the check (numerics: one per op)


@dataclass(frozen=True)
class DoctorOptions:
    device: str = "auto"  # what training will use: npu makes the NPU checks mandatory
    weights_dir: Path | None = None  # the one trainer's weights (its rows' Input.weights); default: its recipe's
    hps_ckpt: Path | None = None  # default: <tree>/hps_ckpt/HPS_v2.1_compressed.pt
    hps_open_clip_ckpt: Path | None = None  # default: <tree>/hps_ckpt/open_clip_pytorch_model.bin
    min_free_gb: float = 50.0  # the floor; the disk check also asks for one resume checkpoint
    trainers: tuple[str, ...] = ()  # () : every GRPO trainer of the tree whose dependency set is installed
    timeout: float = 180.0
    skip: tuple[str, ...] = ()
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    dev_dir: Path = Path("/dev")
    driver_file: Path = ascend.DRIVER_VERSION_FILE


@dataclass
class Facts:
    """What earlier checks found, for the later ones."""

    torch: object = None
    wanted_npu: bool = False  # --device npu: training will not start without an NPU
    npu: bool = False  # torch_npu imported and the run is meant for NPUs
    kind: str = "cpu"  # npu | cuda | cpu: where the compute checks run
    count: int = 0


# The Pythons scripts/bootstrap.sh installs for (Ascend's CANN images ship 3.11 and 3.12).
PYTHONS = ((3, 10), (3, 11), (3, 12))


def check_python() -> Check:
    v = sys.version_info
    text = f"{v.major}.{v.minor}.{v.micro} ({sys.executable})"
    if (v.major, v.minor) < PYTHONS[0]:
        return Check("python", FAIL, text, "use Python 3.10, 3.11 or 3.12 (docs/ascend-910b.md)")
    if (v.major, v.minor) > PYTHONS[-1]:
        return Check("python", WARN, f"{text}: newer than 3.12, the newest Python the port is set up and tested on")
    return Check("python", PASS, text)


def set_env_hint(environ) -> str:
    """Which ``set_env.sh`` to source: the ones this host has, else where CANN puts it."""
    found = torch_stack.set_env_scripts(environ)
    if found:
        return f"source {found[0]} (CANN's environment)"
    return ("source CANN's set_env.sh (CANN's environment: /usr/local/Ascend/cann/set_env.sh from CANN 8.5 on, "
            "/usr/local/Ascend/ascend-toolkit/set_env.sh before; none was found on this host)")


# torch alone (doctor, the tool) starts with autoload off; the trainers' diffusers imports torch_npu itself
CPU_ONLY = ("for CPU-only work on this Ascend host: TORCH_DEVICE_BACKEND_AUTOLOAD=0 lets torch start (the trainers "
            "also need a virtualenv without torch_npu: diffusers imports it)")
# torch (>= 2.5) imports torch_npu inside `import torch` through its `torch.backends` entry point
# and wraps what it raised in this RuntimeError (torch/__init__.py, _import_device_backends).
AUTOLOAD_FAILED = "Failed to load the backend extension: torch_npu"
# What torch_npu says when CANN's environment is missing: its libraries (libhccl.so,
# libascendcl.so) are not on the loader path (2.7.1.post10, 2.10.0.post6, 2.10.0.post7: the
# loader's bare ImportError for torch_npu's _C module, nothing added), or its package check finds no
# ASCEND_* paths (a bare Exception whose text names set_env.sh).
CANN_MISSING_MARKS = ("libhccl.so", "libascendcl.so", "set_env.sh")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def torch_npu_failure(error: BaseException, what: str, environ) -> Check:
    """The check for an import that failed inside torch_npu: CANN's environment missing, or a
    torch_npu that is broken otherwise (torch itself is fine in both cases)."""
    cause = error.__cause__ if AUTOLOAD_FAILED in str(error) and error.__cause__ is not None else error
    if any(mark in str(cause) for mark in CANN_MISSING_MARKS):
        return Check(what, FAIL, f"CANN's environment is missing: torch_npu does not load ({_first_line(cause)})",
                     f"{set_env_hint(environ)} in this shell; {CPU_ONLY}")
    return Check(what, FAIL, f"torch_npu does not load ({_first_line(cause)}); torch itself is not the problem",
                 f"install the pair for this host's CANN (./scripts/bootstrap.sh; docs/ascend-910b.md, Versions); {CPU_ONLY}")


def check_torch(facts: Facts, opts: DoctorOptions) -> Check:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure is the answer
        if AUTOLOAD_FAILED in str(e):
            return torch_npu_failure(e, "torch", opts.environ)
        return Check(
            "torch",
            FAIL,
            f"import torch failed: {type(e).__name__}: {e}",
            "install the torch build docs/ascend-910b.md's version table names for this machine",
        )
    facts.torch = torch
    return Check("torch", PASS, torch.__version__)


def stack_pair(environ, line: str | None = None) -> str:
    """What to install: the pair this host's CANN takes by Ascend's table, as ``torch==X
    torch-npu==Y``, in ``line`` where the CANN's rows list it, else the default line; what to do
    first when no CANN (or no usable row) is found."""
    clean = {**environ, "DANCEGRPO_TORCH": ""}
    try:
        try:
            choice = torch_stack.choose(clean, line=line)
        except DancegrpoError:
            if line is None:
                raise
            line, choice = None, torch_stack.choose(clean)
    except DancegrpoError as e:
        return e.one_line()
    if choice.torch_npu is None:
        return "no CANN on this host: install CANN first (docs/ascend-910b.md), then ./scripts/bootstrap.sh"
    return (f"install torch=={choice.torch} torch-npu=={choice.torch_npu} (the CPU build of torch; "
            f"./scripts/bootstrap.sh{' --torch ' + line if line else ''} installs the pair for this CANN)")


def check_torch_npu(facts: Facts, opts: DoctorOptions) -> Check:
    want_npu = opts.device == "npu"
    if importlib.util.find_spec("torch_npu") is None:
        if want_npu:
            return Check(
                "torch_npu",
                FAIL,
                "torch_npu is not installed",
                stack_pair(opts.environ),
            )
        return Check("torch_npu", SKIP, "not installed: no NPU stack on this machine, the CUDA/CPU checks run instead")
    if facts.torch is None:
        return Check("torch_npu", FAIL, "torch does not import", "see the torch check")
    try:
        import torch_npu
    except Exception as e:  # noqa: BLE001 - ImportError (libhccl.so), or the bare Exception of CANN's package check
        return torch_npu_failure(e, "torch_npu", opts.environ)
    npu_version = getattr(torch_npu, "__version__", "?")
    torch_version = facts.torch.__version__
    built_for, have = base_version(npu_version), base_version(torch_version)
    if built_for != have:
        return Check(
            "torch_npu",
            FAIL,
            f"torch_npu {npu_version} is built for torch {built_for}, but torch is {torch_version}",
            stack_pair(opts.environ, _line_of(torch_version)),
        )
    facts.npu = opts.device in ("auto", "npu")
    return Check("torch_npu", PASS, f"{npu_version} matches torch {torch_version}")


def _line_of(torch_version: str | None) -> str | None:
    line = torch_stack.load_table().line_of(torch_version or "")
    return line.name if line else None


def check_cann(facts: Facts, opts: DoctorOptions) -> Check:
    """CANN's version (the file the torch pair is chosen by), and torch / torch_npu against the
    rows of Ascend's table for it."""
    needed = facts.npu or opts.device == "npu"
    home = torch_stack.active_home(opts.environ)
    cann = torch_stack.find_cann(opts.environ)
    if home is None:
        if not needed:
            return Check("cann", SKIP, "CANN not in the environment (not needed off NPU)")
        installed = f"CANN {cann.version} is installed ({cann.info_file}) but " if cann else ""
        return Check("cann", FAIL, f"{installed}ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME are not set",
                     f"{set_env_hint(opts.environ)} in this shell")
    if not Path(home).is_dir():
        return Check("cann", FAIL, f"{home} (from ASCEND_HOME_PATH/ASCEND_TOOLKIT_HOME) does not exist",
                     "source the set_env.sh of an installed CANN")
    if cann is None:
        return Check("cann", FAIL, f"no {torch_stack.INFO_FILE} with a version under {home}",
                     "reinstall the CANN toolkit, or source the right set_env.sh")
    driver = ascend.driver_version(opts.driver_file) or "unknown"
    detail = f"CANN {cann.version} ({cann.info_file}); driver {driver}"
    npu_version = _module_version("torch_npu")
    torch_version = getattr(facts.torch, "__version__", None)
    if not (npu_version and torch_version):
        return Check("cann", PASS, detail)
    table = torch_stack.load_table()
    try:
        torch_stack.usable_rows(table, cann)
    except DancegrpoError as e:
        return Check("cann", FAIL, f"{detail}; {e.message}", e.hint)
    problem = torch_stack.pair_problem(table, cann, torch_version, npu_version)
    if problem:
        return Check("cann", FAIL, f"{detail}; torch {torch_version} with torch_npu {npu_version}: {problem}",
                     stack_pair(opts.environ, _line_of(torch_version)))
    untabled = torch_stack.untabled_warning(table, cann)
    if untabled:  # bootstrap installed this pair with the same warning
        return Check("cann", WARN, f"{detail}; torch_npu {npu_version} is a wheel of the row used for it: {untabled}")
    return Check("cann", PASS, f"{detail}; torch_npu {npu_version} is a wheel of this CANN's row")


def _module_version(name: str) -> str | None:
    module = sys.modules.get(name)
    return getattr(module, "__version__", None) if module else None


def check_accelerate(facts: Facts) -> Check:
    """accelerate's version, for the record.  Under transfer_to_npu no accelerate picks nccl on the
    NPU: torch_npu's transfer_to_npu rewrites ``nccl`` to ``hccl`` in ``init_process_group`` and wraps
    accelerate's backend choice (``PartialState._prepare_backend``, accelerate >= 0.22)."""
    try:
        import importlib.metadata as md

        version = md.version("accelerate")
    except Exception:  # noqa: BLE001
        return Check("accelerate", SKIP, "not installed")
    if not facts.npu:
        return Check("accelerate", PASS, f"{version}")
    return Check("accelerate", PASS, f"{version} (transfer_to_npu rewrites nccl to hccl in init_process_group)")


def check_visible_devices(opts: DoctorOptions) -> Check:
    """ASCEND_RT_VISIBLE_DEVICES by its own rule (each NPU once, ascending; else torch_npu counts
    none), whether or not torch_npu is installed here, and against the NPUs /dev shows."""
    visible = opts.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if visible is None:
        return Check("visible", SKIP, "ASCEND_RT_VISIBLE_DEVICES is not set (every NPU is visible)")
    try:
        ids = ascend.parse_visible_devices(visible)
    except DancegrpoError as e:
        return Check("visible", FAIL, e.message, e.hint)
    present = ascend.davinci_count(opts.dev_dir)
    bad = [i for i in ids if i >= present]
    if present and bad:
        return Check("visible", FAIL, f"ASCEND_RT_VISIBLE_DEVICES={visible} names device {bad[0]}; this host shows "
                     f"{present} NPU(s)", "list only existing NPUs (npu-smi info)")
    shown = f"; this host shows {present} NPU(s)" if present else "; no /dev/davinci* here to check the ids against"
    return Check("visible", PASS, f"ASCEND_RT_VISIBLE_DEVICES={visible}: each NPU once, ascending{shown}")


def check_devices(facts: Facts, opts: DoctorOptions) -> Check:
    torch = facts.torch
    if torch is None:
        return Check("devices", FAIL, "torch does not import", "fix torch first")
    if facts.npu:
        visible = opts.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        try:
            n = torch.npu.device_count()
            names = [
                f"{torch.npu.get_device_name(i)} {torch.npu.get_device_properties(i).total_memory / 2**30:.0f} GiB"
                for i in range(n)
            ]
        except Exception as e:  # noqa: BLE001
            return Check(
                "devices",
                FAIL,
                f"NPU query failed: {type(e).__name__}: {e}",
                "check `npu-smi info`, the driver, and ASCEND_RT_VISIBLE_DEVICES",
            )
        if n == 0:
            return Check(
                "devices",
                FAIL,
                "torch_npu sees no NPU",
                "check ASCEND_RT_VISIBLE_DEVICES and `npu-smi info`; in a container map /dev/davinci* and the driver",
            )
        facts.kind, facts.count = "npu", n
        shown = f" (ASCEND_RT_VISIBLE_DEVICES={visible})" if visible is not None else ""
        return Check("devices", PASS, f"{n} NPU(s){shown}: " + "; ".join(f"{i}: {s}" for i, s in enumerate(names)))
    if opts.device == "npu":
        return Check(
            "devices",
            FAIL,
            "no NPU stack here (torch_npu missing or failed)",
            "run doctor on the 910B node, with CANN's set_env.sh sourced",
        )
    if opts.device in ("auto", "cuda") and torch.cuda.is_available():
        n = torch.cuda.device_count()
        names = [
            f"{torch.cuda.get_device_name(i)} {torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB"
            for i in range(n)
        ]
        facts.kind, facts.count = "cuda", n
        return Check("devices", PASS, f"no NPU on this machine; {n} CUDA GPU(s): " + "; ".join(names))
    if opts.device == "cuda":
        return Check(
            "devices", FAIL, "torch sees no CUDA GPU", "check nvidia-smi and the torch build (a +cpu build has no CUDA)"
        )
    facts.kind, facts.count = "cpu", 1
    return Check("devices", PASS, f"no NPU or GPU on this machine: the CPU checks run instead ({os.cpu_count()} cores)")
