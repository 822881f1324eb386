"""``dancegrpo-npu doctor``: can training start here?  Each check PASS, FAIL or SKIP, with the fix.

The NPU checks (torch_npu, CANN, NPUs, matmul on each NPU, HCCL all_reduce) run when this
machine has the NPU stack; elsewhere doctor says so and runs the CUDA or CPU equivalents
(matmul on each GPU or the CPU; an NCCL or gloo all_reduce).  Exit code 0 only if nothing
FAILed.  torch is imported inside the checks, never when the CLI starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dancegrpo_npu import ascend
from dancegrpo_npu.doctor_checks import (
    ALLREDUCE_WORKER,
    FLUX_LAYOUT,
    KNOWN_GOOD,
    MIN_PYTHON,
    TORCH_NPU_TABLE,
    base_version,
    table_row,
)
from dancegrpo_npu.project import Project, project_from_args

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
CHECK_NAMES = ("python", "torch", "torch_npu", "cann", "accelerate", "devices", "matmul", "all_reduce", "disk", "tree", "weights")


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class DoctorOptions:
    device: str = "auto"  # what training will use: npu makes the NPU checks mandatory
    flux_dir: Path | None = None  # default: <tree>/data/flux
    hps_ckpt: Path | None = None  # default: <tree>/hps_ckpt/HPS_v2.1_compressed.pt
    hps_open_clip_ckpt: Path | None = None  # default: <tree>/hps_ckpt/open_clip_pytorch_model.bin
    min_free_gb: float = 50.0
    timeout: float = 180.0
    skip: tuple[str, ...] = ()
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    dev_dir: Path = Path("/dev")
    driver_file: Path = ascend.DRIVER_VERSION_FILE


@dataclass
class _Facts:
    """What earlier checks found, for the later ones."""

    torch: object = None
    npu: bool = False  # torch_npu imported and the run is meant for NPUs
    kind: str = "cpu"  # npu | cuda | cpu: where the compute checks run
    count: int = 0


def check_python() -> Check:
    v = sys.version_info
    text = f"{v.major}.{v.minor}.{v.micro} ({sys.executable})"
    if (v.major, v.minor) < MIN_PYTHON:
        return Check("python", FAIL, text, "use Python 3.10 or newer (README, Running on Ascend 910B)")
    return Check("python", PASS, text)


def check_torch(facts: _Facts) -> Check:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure is the answer
        return Check("torch", FAIL, f"import torch failed: {type(e).__name__}: {e}", "install the torch build the README's version table names for this machine")
    facts.torch = torch
    return Check("torch", PASS, torch.__version__)


def check_torch_npu(facts: _Facts, opts: DoctorOptions) -> Check:
    want_npu = opts.device == "npu"
    if importlib.util.find_spec("torch_npu") is None:
        if want_npu:
            return Check("torch_npu", FAIL, "torch_npu is not installed", f"pip install torch-npu=={KNOWN_GOOD['torch_npu']} (matching your torch; README version table)")
        return Check("torch_npu", SKIP, "not installed: no NPU stack on this machine, the CUDA/CPU checks run instead")
    if facts.torch is None:
        return Check("torch_npu", FAIL, "torch does not import", "fix torch first")
    try:
        import torch_npu
    except Exception as e:  # noqa: BLE001
        return Check("torch_npu", FAIL, f"import torch_npu failed: {type(e).__name__}: {e}", "source /usr/local/Ascend/ascend-toolkit/set_env.sh, then check torch/torch_npu/CANN versions (README table)")
    npu_version = getattr(torch_npu, "__version__", "?")
    torch_version = facts.torch.__version__
    if base_version(npu_version) != base_version(torch_version):
        return Check(
            "torch_npu", FAIL, f"torch_npu {npu_version} is built for torch {base_version(npu_version)}, but torch is {torch_version}",
            f"install the pair: torch=={base_version(npu_version)} with torch_npu {npu_version}, or the torch_npu built for torch {base_version(torch_version)}",
        )  # fmt: skip
    facts.npu = opts.device in ("auto", "npu")
    note = "" if table_row(npu_version) else " (not a row of the README's table: untested here)"
    return Check("torch_npu", PASS, f"{npu_version} matches torch {torch_version}{note}")


def check_cann(facts: _Facts, opts: DoctorOptions) -> Check:
    home = ascend.cann_home(opts.environ)
    needed = facts.npu or opts.device == "npu"
    if home is None:
        if needed:
            return Check("cann", FAIL, "ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH are not set", "source /usr/local/Ascend/ascend-toolkit/set_env.sh (CANN's environment) in this shell")
        return Check("cann", SKIP, "CANN not in the environment (not needed off NPU)")
    if not home.is_dir():
        return Check("cann", FAIL, f"{home} (from ASCEND_TOOLKIT_HOME/ASCEND_HOME_PATH) does not exist", "source the set_env.sh of an installed toolkit")
    version, source = ascend.cann_version(home)
    if version is None:
        return Check("cann", FAIL, f"no ascend_toolkit_install.info with a version under {home}", "reinstall the CANN toolkit, or source the right set_env.sh")
    driver = ascend.driver_version(opts.driver_file) or "unknown"
    detail = f"CANN {version} ({source}); driver {driver}"
    npu_version = _module_version("torch_npu")
    row = table_row(npu_version) if npu_version else None
    if row and not version.upper().startswith(row[2].upper()):
        detail += f"; note: Ascend's table pairs torch_npu {row[0]} with CANN {row[2]}"
    return Check("cann", PASS, detail)


def _module_version(name: str) -> str | None:
    module = sys.modules.get(name)
    return getattr(module, "__version__", None) if module else None


def check_accelerate(facts: _Facts) -> Check:
    """accelerate picks its backend from torch.cuda.is_available(), which transfer_to_npu makes True."""
    try:
        import importlib.metadata as md

        version = md.version("accelerate")
    except Exception:  # noqa: BLE001
        return Check("accelerate", SKIP, "not installed")
    if not facts.npu:
        return Check("accelerate", PASS, f"{version}")
    ok = tuple(int(x) for x in re.findall(r"\d+", version)[:2]) >= (0, 34)
    if not ok:
        return Check("accelerate", FAIL, f"{version} picks nccl under transfer_to_npu (accelerate issue #3020)", "pip install 'accelerate>=1.0.1'")
    return Check("accelerate", PASS, f"{version} (checks NPU before CUDA, so hccl under transfer_to_npu)")


def check_devices(facts: _Facts, opts: DoctorOptions) -> Check:
    torch = facts.torch
    if torch is None:
        return Check("devices", FAIL, "torch does not import", "fix torch first")
    if facts.npu:
        visible = opts.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        present = ascend.davinci_count(opts.dev_dir)
        try:
            if visible is not None:
                ascend.parse_visible_devices(visible)
                bad = [i for i in ascend.parse_visible_devices(visible) if i >= present]
                if bad:
                    return Check("devices", FAIL, f"ASCEND_RT_VISIBLE_DEVICES={visible} names device {bad[0]}; this host shows {present} NPU(s)", "list only existing NPUs (npu-smi info)")
            n = torch.npu.device_count()
            names = [f"{torch.npu.get_device_name(i)} {torch.npu.get_device_properties(i).total_memory / 2**30:.0f} GiB" for i in range(n)]
        except Exception as e:  # noqa: BLE001
            return Check("devices", FAIL, f"NPU query failed: {type(e).__name__}: {e}", "check `npu-smi info`, the driver, and ASCEND_RT_VISIBLE_DEVICES")
        if n == 0:
            return Check("devices", FAIL, "torch_npu sees no NPU", "check `npu-smi info`; in a container map /dev/davinci* and the driver")
        facts.kind, facts.count = "npu", n
        shown = f" (ASCEND_RT_VISIBLE_DEVICES={visible})" if visible is not None else ""
        return Check("devices", PASS, f"{n} NPU(s){shown}: " + "; ".join(f"{i}: {s}" for i, s in enumerate(names)))
    if opts.device == "npu":
        return Check("devices", FAIL, "no NPU stack here (torch_npu missing or failed)", "run doctor on the 910B node, with CANN's set_env.sh sourced")
    if opts.device in ("auto", "cuda") and torch.cuda.is_available():
        n = torch.cuda.device_count()
        names = [f"{torch.cuda.get_device_name(i)} {torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB" for i in range(n)]
        facts.kind, facts.count = "cuda", n
        return Check("devices", PASS, f"no NPU on this machine; {n} CUDA GPU(s): " + "; ".join(names))
    if opts.device == "cuda":
        return Check("devices", FAIL, "torch sees no CUDA GPU", "check nvidia-smi and the torch build (a +cpu build has no CUDA)")
    facts.kind, facts.count = "cpu", 1
    return Check("devices", PASS, f"no NPU or GPU on this machine: the CPU checks run instead ({os.cpu_count()} cores)")


def check_matmul(facts: _Facts) -> Check:
    torch = facts.torch
    if torch is None or facts.count == 0:
        return Check("matmul", SKIP, "no device to run on (see devices)")
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    b = torch.randn(256, 256, generator=torch.Generator().manual_seed(1))
    expected = a @ b
    done = []
    for i in range(facts.count):
        device = "cpu" if facts.kind == "cpu" else f"{facts.kind}:{i}"
        try:
            got = (a.to(device) @ b.to(device)).cpu()
        except Exception as e:  # noqa: BLE001
            return Check("matmul", FAIL, f"matmul on {device} failed: {type(e).__name__}: {e}", _device_fix(facts.kind))
        err = (got - expected).abs().max().item()
        if not err < 1e-2:  # TF32/HF32 matmuls differ from the CPU in the 3rd digit, not more
            return Check("matmul", FAIL, f"matmul on {device} is off by {err:.3g}", _device_fix(facts.kind))
        done.append(device)
    return Check("matmul", PASS, f"256x256 float32 on {', '.join(done)} agrees with the CPU")


def _device_fix(kind: str) -> str:
    return {
        "npu": "check `npu-smi info` for the device's health; match torch/torch_npu/CANN (README table)",
        "cuda": "check nvidia-smi and the CUDA driver",
    }.get(kind, "reinstall torch")


def check_all_reduce(facts: _Facts, opts: DoctorOptions) -> Check:
    if facts.torch is None or facts.count == 0:
        return Check("all_reduce", SKIP, "no device to run on (see devices)")
    backend = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[facts.kind]
    world = facts.count if facts.kind != "cpu" else 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {**opts.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        procs.append(subprocess.Popen([sys.executable, "-c", ALLREDUCE_WORKER, backend, facts.kind], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs, timed_out = [], False
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=opts.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            for p in procs:
                p.kill()
            out, _ = proc.communicate()
        outputs.append((proc.returncode, out or ""))
    fix = {"hccl": "check HCCL_CONNECT_TIMEOUT, HCCL_SOCKET_IFNAME/HCCL_IF_IP, `npu-smi info` and the hccn network tool", "nccl": "check NCCL_SOCKET_IFNAME and nvidia-smi topo -m", "gloo": "check that 127.0.0.1 is reachable"}[backend]
    if timed_out:
        return Check("all_reduce", FAIL, f"{backend} all_reduce over {world} process(es) did not finish in {opts.timeout:.0f} s", fix)
    for rank, (rc, out) in enumerate(outputs):
        if rc != 0 or "ALLREDUCE_OK" not in out:
            last = [ln for ln in out.strip().splitlines() if ln.strip()][-1:] or [f"exit {rc}"]
            return Check("all_reduce", FAIL, f"{backend} all_reduce, rank {rank}: {last[0]}", fix)
    return Check("all_reduce", PASS, f"{backend} all_reduce across {world} local process(es) ({facts.kind}) gave the right sum")


def check_disk(project: Project, opts: DoctorOptions) -> Check:
    where = project.root
    free = shutil.disk_usage(where).free / 2**30
    detail = f"{free:.0f} GiB free under {where}"
    if free < opts.min_free_gb:
        return Check("disk", FAIL, detail, f"free at least {opts.min_free_gb:.0f} GiB: a full FLUX transformer checkpoint is tens of GB (or --min-free-gb)")
    return Check("disk", PASS, detail)


def check_tree(project: Project) -> Check:
    from dancegrpo_npu import treecheck

    state = treecheck.tree_state(project, "fastvideo/train_grpo_flux.py")
    status = {"verified": PASS, "unknown": SKIP}.get(state["state"], FAIL)
    fix = None if status != FAIL else (treecheck.FIX if state["state"] == "missing" else "see `dancegrpo-npu status`, then `dancegrpo-npu apply`")
    return Check("tree", status, state["detail"], fix)


def check_weights(project: Project, opts: DoctorOptions) -> Check:
    tree = project.workdir
    flux = opts.flux_dir or tree / "data" / "flux"
    hps = opts.hps_ckpt or tree / "hps_ckpt" / "HPS_v2.1_compressed.pt"
    clip = opts.hps_open_clip_ckpt or tree / "hps_ckpt" / "open_clip_pytorch_model.bin"
    problems = []
    if not flux.is_dir():
        problems.append(f"FLUX.1-dev directory {flux} is missing")
    else:
        missing = [part for part in FLUX_LAYOUT if not (flux / part).exists()]
        if missing:
            problems.append(f"{flux} lacks {', '.join(missing)}")
    for path, what in ((hps, "HPS_v2.1_compressed.pt"), (clip, "open_clip ViT-H-14 weights")):
        if not path.is_file() or path.stat().st_size == 0:
            problems.append(f"{what} {path} is missing")
    if problems:
        return Check("weights", FAIL, "; ".join(problems), "put the weights where the README's weights layout says, or pass --flux/--hps-ckpt/--hps-open-clip-ckpt")
    return Check("weights", PASS, f"FLUX.1-dev at {flux}; HPS at {hps}; open_clip at {clip}")


def run_checks(project: Project, opts: DoctorOptions) -> list[Check]:
    facts = _Facts()
    steps = (
        ("python", check_python),
        ("torch", lambda: check_torch(facts)),
        ("torch_npu", lambda: check_torch_npu(facts, opts)),
        ("cann", lambda: check_cann(facts, opts)),
        ("accelerate", lambda: check_accelerate(facts)),
        ("devices", lambda: check_devices(facts, opts)),
        ("matmul", lambda: check_matmul(facts)),
        ("all_reduce", lambda: check_all_reduce(facts, opts)),
        ("disk", lambda: check_disk(project, opts)),
        ("tree", lambda: check_tree(project)),
        ("weights", lambda: check_weights(project, opts)),
    )
    results = []
    for name, fn in steps:
        results.append(Check(name, SKIP, "skipped by --skip") if name in opts.skip else fn())
    return results


def format_report(checks: list[Check]) -> str:
    lines = ["dancegrpo-npu doctor: can training start here?"]
    for c in checks:
        lines.append(f"  {c.status}  {c.name:<11} {c.detail}")
        if c.fix and c.status == FAIL:
            lines.append(f"        {'':<11} fix: {c.fix}")
    counts = {s: sum(1 for c in checks if c.status == s) for s in (PASS, FAIL, SKIP)}
    verdict = "training can start" if not counts[FAIL] else "fix the FAILs before training"
    lines.append(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped: {verdict}")
    return "\n".join(lines)


def register(sub, common) -> None:
    p = sub.add_parser("doctor", parents=[common], help="check that training can start here (NPU stack, devices, HCCL, disk, tree, weights)", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("--device", choices=("auto", "cpu", "cuda", "npu"), default="auto", help="what training will run on (npu: the NPU checks must pass)")
    p.add_argument("--flux", type=Path, metavar="DIR", help="FLUX.1-dev directory (default: <tree>/data/flux, upstream's)")
    p.add_argument("--hps-ckpt", type=Path, metavar="FILE", help="default: <tree>/hps_ckpt/HPS_v2.1_compressed.pt")
    p.add_argument("--hps-open-clip-ckpt", type=Path, metavar="FILE", help="default: <tree>/hps_ckpt/open_clip_pytorch_model.bin")
    p.add_argument("--min-free-gb", type=float, default=50.0, metavar="GB", help="free disk the check asks for (default 50)")
    p.add_argument("--timeout", type=float, default=180.0, metavar="S", help="seconds the all_reduce may take (default 180)")
    p.add_argument("--skip", action="append", choices=CHECK_NAMES, default=None, metavar="CHECK", help=f"skip a check ({', '.join(CHECK_NAMES)}); repeatable")
    p.add_argument("--json", action="store_true", help="the checks as JSON")
    p.set_defaults(func=_cmd_doctor)


def _cmd_doctor(args) -> int:
    project = project_from_args(args)
    here = Path.cwd()
    resolve = lambda p: None if p is None else (p if p.is_absolute() else here / p).resolve()  # noqa: E731
    opts = DoctorOptions(
        device=args.device, flux_dir=resolve(args.flux), hps_ckpt=resolve(args.hps_ckpt), hps_open_clip_ckpt=resolve(args.hps_open_clip_ckpt),
        min_free_gb=args.min_free_gb, timeout=args.timeout, skip=tuple(args.skip or ()),
    )  # fmt: skip
    checks = run_checks(project, opts)
    if args.json:
        print(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        print(format_report(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0
