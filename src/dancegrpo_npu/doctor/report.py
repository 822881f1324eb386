"""``dancegrpo-npu doctor``: can training start here?  Each check PASS, FAIL or SKIP, with the fix.

The NPU checks (torch_npu, CANN, NPUs, matmul on each NPU, the numerics self-check of NPU 0
against the CPU, HCCL all_reduce) run when this machine has the NPU stack; elsewhere doctor says so and runs the CUDA or CPU equivalents
(matmul on each GPU or the CPU; an NCCL or gloo all_reduce).  Exit code 0 only if nothing
FAILed.  torch is imported inside the checks, never when the CLI starts.
"""

from __future__ import annotations

import shutil

from dancegrpo_npu.doctor.checks import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    DoctorOptions,
    Facts,
    check_accelerate,
    check_cann,
    check_devices,
    check_python,
    check_torch,
    check_torch_npu,
    check_visible_devices,
)
from dancegrpo_npu.doctor.compute import check_all_reduce, check_matmul
from dancegrpo_npu.doctor.numerics import check_numerics
from dancegrpo_npu.project import Project
from dancegrpo_npu.run.upstream_args import DEFAULT_FLUX_DIR, SCRIPTS

# What preprocessing (the whole pipeline) and training (transformer, vae) load from FLUX.1-dev.
FLUX_LAYOUT = (
    "model_index.json",
    "transformer",
    "vae",
    "text_encoder",
    "text_encoder_2",
    "tokenizer",
    "tokenizer_2",
    "scheduler",
)


def check_disk(project: Project, opts: DoctorOptions) -> Check:
    where = project.root
    free = shutil.disk_usage(where).free / 2**30
    detail = f"{free:.0f} GiB free under {where}"
    if free < opts.min_free_gb:
        return Check(
            "disk",
            FAIL,
            detail,
            f"free at least {opts.min_free_gb:.0f} GiB: a full FLUX transformer checkpoint is tens of GB (or --min-free-gb)",
        )
    return Check("disk", PASS, detail)


def check_tree(project: Project) -> Check:
    from dancegrpo_npu.engine import treecheck

    state = treecheck.tree_state(project, SCRIPTS["flux"].relpath)
    status = PASS if state["state"] == "verified" else FAIL
    fix = (
        None
        if status != FAIL
        else (
            treecheck.FIX if state["state"] == "missing" else treecheck.unverified_fix(state)
        )
    )
    return Check("tree", status, state["detail"], fix)


def check_weights(project: Project, opts: DoctorOptions) -> Check:
    tree = project.workdir
    defaults = dict(SCRIPTS["flux"].defaults)  # where launch points the reward files by default
    flux = opts.flux_dir or tree / DEFAULT_FLUX_DIR
    hps = opts.hps_ckpt or tree / defaults["--hps_ckpt"]
    clip = opts.hps_open_clip_ckpt or tree / defaults["--hps_open_clip_ckpt"]
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
        return Check(
            "weights",
            FAIL,
            "; ".join(problems),
            "put the weights where docs/ascend-910b.md (Weights) says, or pass --flux/--hps-ckpt/--hps-open-clip-ckpt",
        )
    return Check("weights", PASS, f"FLUX.1-dev at {flux}; HPS at {hps}; open_clip at {clip}")


# Each check as (name, fn(project, opts, facts)), in the order doctor runs them: facts found by
# an earlier check (torch, the device kind) feed the later ones.
STEPS = (
    ("python", lambda project, opts, facts: check_python()),
    ("torch", lambda project, opts, facts: check_torch(facts, opts)),
    ("torch_npu", lambda project, opts, facts: check_torch_npu(facts, opts)),
    ("cann", lambda project, opts, facts: check_cann(facts, opts)),
    ("accelerate", lambda project, opts, facts: check_accelerate(facts)),
    ("visible", lambda project, opts, facts: check_visible_devices(opts)),
    ("devices", lambda project, opts, facts: check_devices(facts, opts)),
    ("matmul", lambda project, opts, facts: check_matmul(facts)),
    ("numerics", lambda project, opts, facts: check_numerics(facts)),
    ("all_reduce", lambda project, opts, facts: check_all_reduce(facts, opts)),
    ("disk", lambda project, opts, facts: check_disk(project, opts)),
    ("tree", lambda project, opts, facts: check_tree(project)),
    ("weights", lambda project, opts, facts: check_weights(project, opts)),
)
CHECK_NAMES = tuple(name for name, _ in STEPS)


def run_checks(project: Project, opts: DoctorOptions) -> list[Check]:
    facts = Facts(wanted_npu=opts.device == "npu")
    return [
        Check(name, SKIP, "skipped by --skip") if name in opts.skip else fn(project, opts, facts) for name, fn in STEPS
    ]


def format_report(checks: list[Check]) -> str:
    lines = ["dancegrpo-npu doctor: can training start here?"]
    for c in checks:
        lines.append(f"  {c.status}  {c.name:<11} {c.detail}")
        if c.fix and c.status == FAIL:
            lines.append(f"        {'':<11} fix: {c.fix}")
        lines.extend(f"        {'':<11} {note}" for note in c.notes)
    counts = {s: sum(1 for c in checks if c.status == s) for s in (PASS, FAIL, SKIP, WARN)}
    verdict = "training can start" if not counts[FAIL] else "fix the FAILs before training"
    warned = f", {counts[WARN]} warned" if counts[WARN] else ""
    lines.append(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped{warned}: {verdict}")
    return "\n".join(lines)
