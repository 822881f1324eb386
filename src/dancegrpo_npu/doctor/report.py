"""``dancegrpo-npu doctor``: can training start here?  Each check PASS, FAIL or SKIP, with the fix.

The NPU checks (torch_npu, CANN, NPUs, matmul on each NPU, the numerics self-check of NPU 0
against the CPU, HCCL all_reduce) run when this machine has the NPU stack; elsewhere doctor says so and runs the CUDA or CPU equivalents
(matmul on each GPU or the CPU; an NCCL or gloo all_reduce).  Exit code 0 only if nothing
FAILed.  torch is imported inside the checks, never when the CLI starts.
"""

from __future__ import annotations

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
from dancegrpo_npu.doctor import trainers as trainers_mod
from dancegrpo_npu.doctor.numerics import check_numerics
from dancegrpo_npu.project import Project

def check_disk(project: Project, opts: DoctorOptions, trainers: list[str]) -> Check:
    """Free space where the runs go (their checkpoints): at least one resume checkpoint of the
    largest trainer checked, and --min-free-gb."""
    free, where = trainers_mod.free_gib(project.runs_dir)
    need, why = trainers_mod.disk_need(trainers, opts.min_free_gb)
    detail = f"{free:.0f} GiB free under {where} (the runs directory{'' if where == project.runs_dir else ', to be made'})"
    if free < need:
        return Check("disk", FAIL, f"{detail}; {need:.0f} GiB wanted ({why})",
                     f"free at least {need:.0f} GiB there, or put the runs elsewhere: --runs-dir DIR (or DANCEGRPO_RUNS)")
    return Check("disk", PASS, f"{detail}; {need:.0f} GiB wanted ({why})")


def check_tree(project: Project) -> Check:
    from dancegrpo_npu.engine import treecheck

    state = treecheck.tree_state(project)
    status = PASS if state["state"] == "verified" else FAIL
    fix = (
        None
        if status != FAIL
        else (
            treecheck.FIX if state["state"] == "missing" else treecheck.unverified_fix(state)
        )
    )
    return Check("tree", status, state["detail"], fix)


def chosen_trainers(project: Project, opts: DoctorOptions) -> list[str]:
    return list(opts.trainers) if opts.trainers else trainers_mod.installed(project, opts.environ)


def _other_depsets() -> str:
    """`` (--with SET for NAME, ...)`` for each dependency set of the registry's trainers other than
    the tool's own."""
    from dancegrpo_npu import registry
    from dancegrpo_npu.run import depsets

    users: dict[str, list[str]] = {}
    for name in registry.trainers():
        if registry.get(name).depset != depsets.DEFAULT:
            users.setdefault(registry.get(name).depset, []).append(name)
    return "".join(f" (--with {depset} for {', '.join(names)})" for depset, names in users.items())


def check_weights(project: Project, opts: DoctorOptions) -> Check:
    """Each trainer's inputs and dependency set, as ``launch NAME --dry-run`` finds them."""
    if not opts.trainers and not project.workdir.is_dir():  # the tree check names it, with its fix
        return Check("weights", SKIP, f"no patched tree at {project.workdir} to read the trainers from (see tree)")
    names = chosen_trainers(project, opts)
    if not names:
        return Check("weights", FAIL, "no GRPO trainer of the tree has its dependency set installed here",
                     "./scripts/bootstrap.sh --deps-only" + _other_depsets())
    problems, ready, failing = [], [], []
    refused: dict[str, list] = {}  # a dry run's refusal (the tree, the arguments): its trainers, its hint
    for name in names:
        found, refusal = trainers_mod.trainer_check(project, name, opts.environ, weights_dir=opts.weights_dir,
                                                    hps_ckpt=opts.hps_ckpt, hps_open_clip_ckpt=opts.hps_open_clip_ckpt)
        if refusal is not None:
            refused.setdefault(refusal.message.rstrip("."), [[], refusal.hint])[0].append(name)
        elif found:
            problems.append(f"{name}: {'; '.join(found)}")
            failing.append(name)
        else:
            ready.append(name)
    if problems or refused:
        # the same refusal once, with every trainer it stopped, and its hint once, in the fix
        problems += [f"{', '.join(stopped)}: {message}" for message, (stopped, _) in refused.items()]
        hints = list(dict.fromkeys(hint for _, hint in refused.values() if hint))
        fix = "; ".join(([trainers_mod.input_fix(failing)] if failing else []) + hints) or None
        shown = f" ({', '.join(ready)} ready)" if ready else ""
        return Check("weights", FAIL, " | ".join(problems) + shown, fix)
    return Check("weights", PASS, f"every input and the dependency set of {', '.join(ready)} "
                 "(as `launch NAME --dry-run` checks them)")


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
    ("disk", lambda project, opts, facts: check_disk(project, opts, chosen_trainers(project, opts))),
    ("tree", lambda project, opts, facts: check_tree(project)),
    ("weights", lambda project, opts, facts: check_weights(project, opts)),
)
CHECK_NAMES = tuple(name for name, _ in STEPS)


def run_checks(project: Project, opts: DoctorOptions) -> list[Check]:
    facts = Facts(wanted_npu=opts.device == "npu")
    return _each_fix_once([
        Check(name, SKIP, "skipped by --skip") if name in opts.skip else fn(project, opts, facts) for name, fn in STEPS
    ])


def _each_fix_once(checks: list[Check]) -> list[Check]:
    """A failed check whose fix is an earlier failed check's (the weights refused for the tree's
    state) points at it instead of printing it again."""
    from dataclasses import replace

    seen: dict[str, str] = {}
    out = []
    for c in checks:
        if c.status == FAIL and c.fix:
            if c.fix in seen:
                c = replace(c, fix=f"the {seen[c.fix]} check's fix, above")
            else:
                seen[c.fix] = c.name
        out.append(c)
    return out


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
