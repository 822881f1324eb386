"""``dancegrpo-npu launch``: the stock upstream scripts under torchrun, from the patched tree.

A launch is planned first — script, arguments, environment, torchrun command — and every
check that can fail (script name, node rank, --env syntax, the patched tree, the weights, the
NPU list) fails here, before anything starts and before a run directory exists.  The plan then
runs (``runner.run_plan``) in its own run directory, which keeps the record.

API (used by ``dancegrpo-npu smoke``)::

    launch(project, LaunchSpec(script=NAME, args=(...), upstream_defaults=False)) -> RunRecord
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from dancegrpo_npu.host import ascend
from dancegrpo_npu.run import directory
from dancegrpo_npu.rundirs.rundir import find_run

from dancegrpo_npu import registry
from dancegrpo_npu.contract import DEVICE_CHOICES as DEVICES
from dancegrpo_npu.contract import DEVICE_ENV, arguments_problem, parse_step_spec, sde_window_fit
from dancegrpo_npu.engine import treecheck
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.host import network
from dancegrpo_npu.project import Project
from dancegrpo_npu.run import datasets, depsets, recipes
from dancegrpo_npu.run.align_flags import TRAINER_FLAGS, check_replay
from dancegrpo_npu.run.environment import no_npu_here, parse_env_assignment, plan_environment, shell_script
from dancegrpo_npu.run.inputs import image_sizes_problem
from dancegrpo_npu.run.plan import LaunchPlan, LaunchSpec, RunRecord
from dancegrpo_npu.run.resume import restart_spec, resume_point
from dancegrpo_npu.run.runner import run_plan
from dancegrpo_npu.run.upstream_args import (
    TrainerSpec,
    build_script_args,
    flag_values,
    input_problems,
    script_info,
    split_flags,
    trainer_values,
    without_flags,
)

DEFAULT_MULTINODE_PORT = 29500  # torchrun's own default: every node must name the same port


def run_name(spec: LaunchSpec) -> str:
    name = directory.check_name(spec.name or spec.script)
    return f"{name}-node{spec.node_rank}" if spec.nnodes > 1 else name


def check_spec(spec: LaunchSpec, dry_run: bool = False) -> TrainerSpec:
    info = script_info(spec.script)
    if spec.device not in DEVICES:
        raise DancegrpoError(f"unknown device {spec.device!r}", f"choose one of: {', '.join(DEVICES)}", exit_code=2)
    for what, value in (("--nproc-per-node", spec.nproc_per_node), ("--nnodes", spec.nnodes)):
        if value < 1:
            raise DancegrpoError(f"{what} must be at least 1, not {value}", "give a positive count", exit_code=2)
    if not 0 <= spec.node_rank < spec.nnodes:
        raise DancegrpoError(
            f"--node-rank {spec.node_rank} is not a node of --nnodes {spec.nnodes}",
            f"number the nodes 0..{spec.nnodes - 1}, the master node being 0",
            exit_code=2,
        )
    if spec.max_restarts < 0:
        raise DancegrpoError(f"--max-restarts must be 0 or more, not {spec.max_restarts}", "give a count", exit_code=2)
    network.check_port("--master-port", spec.master_port)
    network.check_network(spec.nnodes, spec.node_rank, spec.master_addr, spec.ifname, network.this_host(),
                          elsewhere=dry_run and spec.nnodes > 1)  # a login node plans for the compute nodes
    if spec.recipe is not None and (info.recipe_glob is None or not spec.upstream_defaults):
        raise DancegrpoError(
            f"--recipe {spec.recipe}: "
            + (f"{info.name} has no recipes" if info.recipe_glob is None else "--no-upstream-defaults uses none"),
            f"launch {info.name} without --recipe",
            exit_code=2,
        )
    for name, value in spec.env:
        parse_env_assignment(f"{name}={value}")
        if name == DEVICE_ENV:
            raise DancegrpoError(f"{DEVICE_ENV} is set by --device", "use --device instead of --env", exit_code=2)
    run_name(spec)
    given = spec.align.given()
    if given and not info.aligns:
        raise DancegrpoError(
            f"{', '.join(given)}: only the GRPO trainers ({', '.join(registry.aligning())}) draw noise and record stages",
            f"launch {info.name} without {' '.join(given)}",
            exit_code=2,
        )
    spec.align.check()
    if spec.profile_steps is not None:
        if not info.aligns:
            raise DancegrpoError(
                f"--profile: only the GRPO trainers ({', '.join(registry.aligning())}) time and profile GRPO steps",
                f"launch {info.name} without --profile",
                exit_code=2,
            )
        parse_step_spec(spec.profile_steps, "--profile")  # the syntax the trainer's parse_steps accepts
    return info


def _torch_npu_version(python: str) -> str | None:
    """The torch_npu the job's interpreter would import (None: not installed, or no interpreter)."""
    from dancegrpo_npu.host.devices import package_versions

    if not Path(python).exists():
        return None
    return package_versions(python).get("torch_npu")


def _profile_args(spec: LaunchSpec) -> list[str]:
    """``--profile_steps STEPS`` for the trainer (the seam's profile feature), which writes its traces to
    <run>/profile/step_<N>/ (the run directory is its working directory)."""
    if spec.profile_steps is None:
        return []
    if "--profile_steps" in {flag for flag, _, _ in split_flags(spec.args)}:
        raise DancegrpoError("--profile_steps given after -- as well as launch's --profile",
                             "use launch's --profile STEPS only", exit_code=2)
    return ["--profile_steps", spec.profile_steps]


def replay_values(info: TrainerSpec, values: dict[str, object], world_size: int) -> dict[str, object]:
    """What a replay's records must fit (contract.REPLAY_FIT): the values this launch's trainer runs
    with (``values``: run.upstream_args.trainer_values), the row's fixed ones, the world size, and
    the SDE window's schedule made of its flags (contract.sde_window_fit)."""
    values = {**values, **dict(info.fixed_values), "world_size": world_size}
    return {**values, "sde_window": sde_window_fit(values)}


def _alignment_args(project: Project, spec: LaunchSpec) -> tuple[list[str], Path | None]:
    """The contract's trainer arguments for spec.align, appended to the final script arguments, and
    the run a replay reads (checked by ``_check_alignment`` once the script's parser has read the
    arguments)."""
    align = spec.align
    if not align.given():
        return [], None
    typed = {flag for flag, _, _ in split_flags(spec.args)} & set(TRAINER_FLAGS)
    if typed:
        raise DancegrpoError(
            f"{', '.join(sorted(typed))} given after -- as well as launch's alignment options",
            "use launch's --rng / --record / --record-steps / --record-modules / --replay only",
            exit_code=2,
        )
    source = find_run(project.runs_dir, align.replay) if align.replay is not None else None
    return list(align.trainer_args(None if source is None else source / "records")), source


def _check_alignment(spec: LaunchSpec, info: TrainerSpec, script_args: list[str], parsed: dict | None,
                     world_size: int, source: Path | None) -> None:
    """--rng cpu's seed and a replay's fit, against what this launch's trainer runs with: the values
    its own parser reads from the final arguments (``parsed``; None: the arguments as given)."""
    if not spec.align.given():
        return
    planned = replay_values(info, trainer_values(info, script_args, parsed), world_size)
    if spec.align.rng == "cpu" and planned["seed"] is None:
        raise DancegrpoError("--rng cpu: the launch sets no --seed to seed the CPU generator from",
                             "pass --seed N after --", exit_code=2)
    if source is not None:
        check_replay(source, planned)


@dataclass(frozen=True)
class ArgumentsCheck:
    """What the script's own parser made of the final arguments."""

    said: str  # what the plan says about the check
    values: dict | None = None  # the namespace the parser makes of them (None: not read)
    devices: dict | None = None  # the job's devices, probed in the same child (None: not probed)
    python: str | None = None  # the interpreter the child ran


def _check_script_args(info: TrainerSpec, tree: Path, script_args: list[str], spec: LaunchSpec,
                       environ: dict[str, str], problems: list[str], dry_run: bool,
                       job_env: dict[str, str]) -> ArgumentsCheck:
    """The final arguments parsed by the script's own parser (run.script_parser), in the run's
    dependency set (the tool's interpreter when that set is not installed: a dry run lists it
    among the problems) and the job's environment ``job_env``; a bad one is refused in one line,
    exit 2.  A real launch's child probes the job's devices too, for the run's record."""
    from dancegrpo_npu.run import script_parser

    try:
        python = depsets.python_for(info.depset, environ)
    except DancegrpoError:
        python = sys.executable
    # launch's user typed spec.args after --; the smoke's hold its own as well
    user_flags = {flag for flag, _, _ in split_flags(spec.args)} if spec.verb == "launch" else set()
    try:
        # the flags another reader takes (absl's --config...) are that reader's to check
        parsed = script_parser.check_script_args(tree / info.relpath, tree, python,
                                                 without_flags(script_args, info.foreign_flags), user_flags,
                                                 None if dry_run else job_env)
    except DancegrpoError as e:
        if e.exit_code == 2 or not dry_run:
            raise
        problems.append(e.one_line())
        return ArgumentsCheck("not checked (see below)")
    if parsed is None:
        return ArgumentsCheck(f"not checked: {info.relpath} builds no parser in `if __name__ == \"__main__\":`")
    checked = f"checked by {Path(info.relpath).name}'s own parser"
    if info.foreign_flags:  # absl's --config, read as the script's absl reads it, and the overlay's check
        from dancegrpo_npu.run import absl_config

        try:
            settled = absl_config.check_config(tree / info.relpath, tree, python, script_args, info.foreign_flags,
                                               parsed.values, info.config_check, info.config_example,
                                               info.config_settle)
        except DancegrpoError as e:
            if e.exit_code == 2 or not dry_run:
                raise
            problems.append(e.one_line())
            return ArgumentsCheck("not checked (see below)", parsed.values)
        return ArgumentsCheck(checked, settled or parsed.values, parsed.devices, python)
    return ArgumentsCheck(checked, parsed.values, parsed.devices, python)


def _check_port_flags(info: TrainerSpec, parsed: dict | None) -> None:
    """The contract's checks of the port's flags (contract.arguments_problem: the SDE window's),
    which the trainer makes at start, made on the namespace its own parser gives (None: not read,
    nothing to check) before anything starts: one line, exit 2."""
    problem = None if parsed is None else arguments_problem(parsed)
    if problem:
        raise DancegrpoError(f"{Path(info.relpath).name} would refuse its arguments: {problem}",
                             "fix the script's arguments; nothing was started", exit_code=2)


def build_plan(
    project: Project,
    spec: LaunchSpec,
    run_dir: Path,
    *,
    environ: dict[str, str] | None = None,
    cwd: Path | None = None,
    dev_dir: Path = Path("/dev"),
    python: str | None = None,
    dry_run: bool = False,
    verified: dict | None = None,
) -> LaunchPlan:
    """Everything about a launch, checked; nothing is written or started.  ``verified``: the
    command's verification of the patched tree (``engine.treecheck.tree_state``); None: verified here.

    Missing or incomplete inputs are refused, unless ``dry_run``: then they are listed in
    ``plan.problems``.  Whether this host can run it (an NPU plan on a host without NPUs) is
    left to ``launch``: a dry run on a login node prints the plan for the NPU node."""
    info = check_spec(spec, dry_run)
    environ = dict(os.environ if environ is None else environ)
    state = treecheck.require_tree(project, info.relpath, verified)
    tree = project.workdir
    recipe, recipe_args, scaling = recipes.plan_recipe(spec, info, tree)
    script_args = build_script_args(
        info,
        tuple(spec.args),
        tree=tree,
        cwd=Path(cwd or os.getcwd()),
        run_dir=run_dir,
        upstream_defaults=spec.upstream_defaults,
        recipe_args=recipe_args,
    )
    problems = input_problems(info, script_args)
    if dry_run:
        problems += network.not_checked_here(spec.nnodes, spec.node_rank, spec.master_addr, spec.ifname,
                                             network.this_host())
    align_args, replay_source = _alignment_args(project, spec)
    script_args += align_args
    script_args += _profile_args(spec)
    if spec.align.env():  # --msprobe: before the user's --env, which wins
        spec = replace(spec, env=spec.align.env() + tuple(spec.env))
    env, env_set, profile, npus_here = plan_environment(spec, tree, environ, dev_dir)
    # the script's parser first: a flag it lacks is the mistake to name, before what is missing
    checked = _check_script_args(info, tree, script_args, spec, environ, problems, dry_run, env)
    parsed = checked.values
    _check_port_flags(info, parsed)
    _check_alignment(spec, info, script_args, parsed, spec.nproc_per_node * spec.nnodes, replay_source)
    sizes = image_sizes_problem(flag_values(script_args), info.image_sizes)
    if sizes:
        raise DancegrpoError(sizes, "fix the script's arguments; nothing was started", exit_code=2)
    if problems and not dry_run:
        raise DancegrpoError(
            "; ".join(problems),
            "put them there (docs/weights.md: every model's weights and where they go) or pass their flags after --; "
            "`dancegrpo-npu launch ... --dry-run` lists everything missing",
        )
    port = spec.master_port
    if port is None:
        port = network.free_port() if spec.nnodes == 1 else DEFAULT_MULTINODE_PORT
    if python is None:
        try:
            python = depsets.python_for(info.depset, environ, needed_by=info.name)
        except DancegrpoError as e:
            if not dry_run:
                raise
            problems.append(f"{e.message}: {e.hint}")
            python = str(depsets.venv_dir(info.depset, environ) / "bin" / "python")
    if spec.profile_steps is not None and profile == "npu":  # torch_npu 2.7.1 drops a refused path silently
        ascend.check_profiler_dir(run_dir / "profile", _torch_npu_version(python))
    command = (
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes", str(spec.nnodes),
        "--nproc_per_node", str(spec.nproc_per_node),
        "--node_rank", str(spec.node_rank),
        "--master_addr", spec.master_addr or "127.0.0.1",
        "--master_port", str(port),
        *(("--max-restarts", str(spec.max_restarts)) if spec.max_restarts else ()),
        "--log_dir", str(run_dir / "logs" / "torchrun"),
        "--redirects", "3",
        "--tee", "3",
        str(tree / info.relpath),
        *script_args,
    )  # fmt: skip
    return LaunchPlan(
        spec=spec,
        script=info,
        run_dir=run_dir,
        script_path=tree / info.relpath,
        script_args=tuple(script_args),
        command=command,
        env_set=tuple(env_set),
        env=env,
        profile=profile,
        tree_state=state,
        npus_here=npus_here,
        dev_dir=dev_dir,
        recipe=recipe,
        recipe_scaling=recipes.batch_line(info, recipe, scaling, spec.nproc_per_node * spec.nnodes),
        recipe_notes=recipes.recipe_notes(spec, info, recipe, scaling, script_args),
        problems=tuple(problems),
        arguments_checked=checked.said,
        devices=checked.devices if checked.python == python else None,  # another interpreter's are not the job's
    )


def _check_runs_dir(runs: Path) -> None:
    """A runs directory (--runs-dir, $DANCEGRPO_RUNS) that is a file, or lies under one, is refused
    in one line, at the dry run too, as the real launch's making of its run directory words it."""
    import errno

    from dancegrpo_npu.files import cannot_write

    for path in (runs, *runs.parents):
        if path.exists():
            if not path.is_dir():
                code = errno.EEXIST if path == runs else errno.ENOTDIR
                raise cannot_write(runs, OSError(code, os.strerror(code), str(runs)))
            return


def launch(project: Project, spec: LaunchSpec, dry_run: bool = False, *, dev_dir: Path = Path("/dev"),
           verified: dict | None = None) -> RunRecord:
    """Plan, check, then (unless dry_run) run the job and keep its record.  See module doc.  The tree
    is verified once (``verified``: as the command verified it already), its verdict kept in the plan.

    A dry run checks every input in one pass and prints the plan, with what would stop the
    job here (missing inputs, no NPU on this host); its return code is 0 when the job could
    start here, 1 when not.  A real launch refuses instead, before anything is written."""
    now = time.time()
    check_spec(spec, dry_run)
    spec = restart_spec(spec)
    if spec.resume_of is not None:  # the run continues in its own directory
        plan = build_plan(project, spec, spec.resume_of, dev_dir=dev_dir, dry_run=dry_run, verified=verified)
        problems = list(plan.problems)
        try:
            step, path = resume_point(plan.script_args, plan.run_dir)
            where = f"step {step} " if step is not None else ""
            plan = replace(plan, resume_from=f"from its checkpoint {where}({path})")
        except DancegrpoError as e:
            if not dry_run:
                raise
            problems.append(e.one_line())
        not_here = no_npu_here(plan)
        if dry_run:
            problems += [f"{not_here.message}: {not_here.hint}"] if not_here else []
            print(shell_script(plan, dry_run=True, problems=problems), end="", flush=True)
            if problems:
                print(f"dancegrpo-npu: dry run: the resume could not start here; {len(problems)} problem(s), "
                      "listed in the plan under '# could not start here'", file=sys.stderr, flush=True)
            return RunRecord(spec.resume_of, 1 if problems else 0, plan.command,
                             {"status": "dry-run", "problems": problems})
        if not_here is not None:
            raise not_here
        print(f"dancegrpo-npu: resuming run {plan.run_dir.name} {plan.resume_from}", file=sys.stderr, flush=True)
        return run_plan(project, plan)
    _check_runs_dir(project.runs_dir)
    tentative = project.runs_dir / directory.run_dir_name(run_name(spec), now)
    plan = build_plan(project, spec, tentative, dev_dir=dev_dir, dry_run=dry_run, verified=verified)
    not_here = no_npu_here(plan)
    if dry_run:
        problems = list(plan.problems) + ([f"{not_here.message}: {not_here.hint}"] if not_here else [])
        print(shell_script(plan, dry_run=True, problems=problems), end="", flush=True)
        if problems:
            print(f"dancegrpo-npu: dry run: the job could not start here; {len(problems)} problem(s), "
                  "listed in the plan under '# could not start here'", file=sys.stderr, flush=True)
        return RunRecord(tentative, 1 if problems else 0, plan.command, {"status": "dry-run", "problems": problems})
    if not_here is not None:
        raise not_here
    run_dir = directory.create_run_dir(project.runs_dir, run_name(spec), now)
    if run_dir != tentative:
        plan = build_plan(project, spec, run_dir, dev_dir=dev_dir, verified=plan.tree_state)
    if plan.recipe is not None:
        print(f"dancegrpo-npu: {recipes.recipe_line(plan)}", file=sys.stderr, flush=True)
    made = datasets.output_of(plan.script, flag_values(plan.script_args))
    if made is not None:  # preprocessing: the dataset's record says what made it, once it is whole
        datasets.forget(made)
    record = run_plan(project, plan)
    if made is not None and record.returncode == 0:
        datasets.record(made, plan.script, flag_values(plan.script_args), run_dir)
        print(f"dancegrpo-npu: the {datasets.model(plan.script.dataset).title} dataset is in {made}", flush=True)
    return record
