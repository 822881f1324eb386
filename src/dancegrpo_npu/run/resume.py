"""``launch --resume RUN`` and ``launch --max-restarts N``: a run continued in its own directory.

A resume launches the run's recorded script arguments again (launch.json), plus the trainer
arguments given after ``--`` (the later wins: ``--max_train_steps 600`` trains longer) and
``--resume_from_checkpoint latest``: the trainer continues from the newest complete checkpoint
under ``<output_dir>/resume`` (the overlay's ``dancegrpo_port/checkpoints.py``), and
metrics.jsonl, records/ and summary.json continue in the same directory.

What must not change is checked before anything starts, in one line naming what differs: the
world size, the trainer values a checkpoint is made of (``CHECKPOINT_FIT``: generations, sizes,
sampling steps, batch size), the script, and the tree (upstream commit, series, overlay) the run
was launched from.  ``--max-restarts N`` passes torchrun's elastic ``--max-restarts N``; every
worker start resumes from ``latest`` on its own, and the run record counts the restarts.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dancegrpo_npu.contract import CHECKPOINT_DIR, CHECKPOINT_FIT, CHECKPOINT_MANIFEST
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import Project
from dancegrpo_npu.run.plan import LaunchSpec
from dancegrpo_npu.run.upstream_args import flag_values
from dancegrpo_npu.rundirs.rundir import find_run, read_json

RESUME_FLAG = "--resume_from_checkpoint"
# Launch options a resume takes from the record; giving one another value would change the run.
RECORDED = ("script", "nproc_per_node", "nnodes", "device")
# Trainer arguments a resume keeps: what a checkpoint is made of, and the run's draws.
FIT_ARGS = tuple(k for k in CHECKPOINT_FIT if k not in ("world_size", "code")) + ("seed", "rng", "use_ema", "lora_rank")


def tree_identity(project: Project) -> dict:
    """The upstream commit, series and overlay a run is launched from (launch.json's "identity")."""
    from dancegrpo_npu.engine.apply import overlay_sha256
    from dancegrpo_npu.engine.lock import load_lock
    from dancegrpo_npu.engine.series import load_series, series_sha256
    from dancegrpo_npu.engine.stage import read_overlay

    try:
        return {"upstream_commit": load_lock(project.lock_path).commit,
                "series": series_sha256(load_series(project.patches_dir)),
                "overlay": overlay_sha256(read_overlay(project.overlay_dir))}
    except (DancegrpoError, OSError):
        return {}


def launch_identity(project: Project, tree_state: dict) -> dict:
    """launch.json's "identity": the digests the command's verified tree carries (the tree is
    verified once a command, and its verdict passed down), else read from the project."""
    carried = {"upstream_commit": tree_state.get("upstream_commit"), "series": tree_state.get("series_sha256"),
               "overlay": tree_state.get("overlay_sha256")}
    if tree_state.get("state") == "verified" and all(carried.values()):
        return carried
    return tree_identity(project)


def with_resume_flag(args) -> tuple[str, ...]:
    """``args`` with ``--resume_from_checkpoint latest`` unless they name a checkpoint."""
    if RESUME_FLAG in flag_values(args):
        return tuple(args)
    return (*args, RESUME_FLAG, "latest")


def resume_spec(project: Project, ref: str, extra_args: tuple[str, ...] = (), given: dict | None = None,
                max_restarts: int = 0) -> LaunchSpec:
    """The LaunchSpec that continues run ``ref``; refused in one line when it would change the run."""
    run_dir = find_run(project.runs_dir, ref)
    launch = read_json(run_dir / "launch.json") or {}
    if not launch.get("script_args"):
        raise DancegrpoError(f"--resume {ref}: {run_dir} has no launch.json with the run's arguments",
                             "resume a run that `dancegrpo-npu launch` or `smoke` started", exit_code=2)
    for key, value in (given or {}).items():
        if value is not None and key in RECORDED and value != launch.get(key):
            raise DancegrpoError(f"--resume {ref}: {key.replace('_', '-')} {value} would change the run "
                                 f"(it has {launch.get(key)})", "resume without it", exit_code=2)
    args = tuple(launch["script_args"]) + tuple(extra_args)
    refuse_change(project, run_dir, launch, args)
    return LaunchSpec(script=launch["script"], args=with_resume_flag(args), nproc_per_node=launch["nproc_per_node"],
                      nnodes=launch["nnodes"], node_rank=launch.get("node_rank", 0),
                      master_addr=launch.get("master_addr"), device=launch["device"], strict=bool(launch.get("strict")),
                      upstream_defaults=False, env=tuple((e["name"], e["value"]) for e in launch.get("env_set", [])
                                                         if e.get("source") == "--env" and e.get("value") is not None),
                      max_restarts=max_restarts, resume_of=run_dir)


def refuse_change(project: Project, run_dir: Path, launch: dict, args: tuple[str, ...]) -> None:
    """One line naming what a resume with ``args`` would change, before anything starts."""
    differ = []
    now = tree_identity(project)
    for key, value in (launch.get("identity") or {}).items():
        if now.get(key) != value:
            differ.append(f"{key.replace('_', ' ')} {str(value)[:12]} (now {str(now.get(key))[:12]})")
    old, new = _values(launch["script_args"]), _values(args)
    for key in FIT_ARGS:
        if old.get(key) != new.get(key):
            differ.append(f"--{key} {old.get(key)} (now {new.get(key)})")
    checkpoint = latest_manifest(output_dir(launch["script_args"], run_dir))
    world = launch.get("world_size")
    if checkpoint and checkpoint.get("world_size") not in (None, world):
        differ.append(f"world size {checkpoint.get('world_size')} in the checkpoint (the run: {world})")
    if differ:
        raise DancegrpoError(f"--resume {run_dir.name}: it would change the run: {', '.join(differ)}",
                             "start a new run for that (docs/resume.md: what a resume may change)", exit_code=2)


def _values(args) -> dict:
    """Each flag's last value, as the trainer's argparse keeps it (a bare flag: True)."""
    return {flag[2:]: True if value is None else value for flag, value in flag_values(args).items()}


def output_dir(script_args, run_dir: Path) -> Path:
    return Path(_values(script_args).get("output_dir") or run_dir / "outputs")


def complete_checkpoint(output: Path) -> tuple[int, Path] | None:
    """(step, directory) of the newest complete checkpoint under ``<output>/resume``: one whose
    manifest (written last) reads and names files of the sizes it lists, as the trainer's
    ``latest`` takes it (the overlay's checkpoints.read_manifest); None when there is none."""
    root = output / CHECKPOINT_DIR
    found = []
    for path in root.glob("step-*") if root.is_dir() else []:
        digits = path.name[len("step-"):]
        if digits.isdigit():
            found.append((int(digits), path))
    for step, path in sorted(found, reverse=True):
        files = (read_json(path / CHECKPOINT_MANIFEST) or {}).get("files")
        if not isinstance(files, dict) or not files:
            continue
        try:
            if all((path / name).stat().st_size == size for name, size in files.items()):
                return step, path
        except OSError:
            continue
    return None


def resume_point(script_args, run_dir: Path) -> tuple[int | None, Path]:
    """The checkpoint a resume with ``script_args`` loads: (step, directory) of the newest
    complete one for ``latest``, or the one named; one line when there is none (the trainer
    would start again at step 1, which is not a resume)."""
    named = _values(script_args).get(RESUME_FLAG[2:])
    output = output_dir(script_args, run_dir)
    if named not in (None, True, "latest"):
        path = Path(str(named))
        if not (path / CHECKPOINT_MANIFEST).is_file():
            raise DancegrpoError(f"--resume {run_dir.name}: {RESUME_FLAG} {path} is not a complete checkpoint "
                                 f"(no {CHECKPOINT_MANIFEST})", f"name one under {output / CHECKPOINT_DIR}, or "
                                 "give none: the newest complete one is taken")
        digits = path.name[len("step-"):]
        return (int(digits) if digits.isdigit() else None), path
    found = complete_checkpoint(output)
    if found is None:
        raise DancegrpoError(f"--resume {run_dir.name}: the run has no complete checkpoint under "
                             f"{output / CHECKPOINT_DIR}, so its trainer would start again at step 1",
                             "start a new run instead, with --checkpointing_steps N after -- "
                             "(smoke: --checkpointing-steps N) to have one every N steps")
    return found


def continue_command(project: Project, verb: str, run_dir: Path, cwd: Path | None = None) -> str:
    """The command that continues ``run_dir`` from where it is typed: ``dancegrpo-npu smoke
    --resume RUN``, with -C / --workdir / the run's path when this launch needed them."""
    import os
    import shlex

    from dancegrpo_npu.project import RUNS_ENV, find_project

    cwd = Path(cwd or os.getcwd()).resolve()
    words = ["dancegrpo-npu"]
    if cwd != project.root.resolve():
        words += ["-C", str(project.root)]
    plain = find_project(project.root, None, os.environ.get(RUNS_ENV) or None)
    if project.workdir.resolve() != plain.workdir.resolve():
        words += ["--workdir", str(project.workdir)]
    ref = run_dir.name if run_dir.parent.resolve() == plain.runs_dir.resolve() else str(run_dir)
    words += [verb, "--resume", ref]
    return " ".join(shlex.quote(w) for w in words)


def continuation(project: Project, verb: str, run_dir: Path, script_args, status: str) -> dict:
    """How a run that stopped (interrupted, terminated, failed) goes on: its newest complete
    checkpoint and the command that continues from it, or that it has none yet and how to get
    them; ``line`` says it in one line, naming the run."""
    values = _values(script_args)
    found = complete_checkpoint(output_dir(script_args, run_dir))
    command = continue_command(project, verb, run_dir)
    if found is not None:
        step, path = found
        line = (f"run {run_dir.name} {status}; its last complete checkpoint is step {step} ({path}); "
                f"continue it from there with: {command}")
        return {"checkpoint": str(path), "step": step, "command": command, "line": line}
    every = values.get("checkpointing_steps")
    how = ("start it again with --checkpointing-steps N (a divisor of --steps) to have one every N steps"
           if verb == "smoke" else
           "start it again with `-- --checkpointing_steps N` to have one every N steps")
    line = (f"run {run_dir.name} {status} before its first complete checkpoint"
            + (f" (the trainer saves one after every {every} steps)" if every else "")
            + f", so nothing can be continued: {how}")
    return {"checkpoint": None, "step": None, "command": None, "line": line}


def latest_manifest(output: Path) -> dict | None:
    """The manifest of the newest checkpoint with one (the trainer checks it in full)."""
    root = output / CHECKPOINT_DIR
    for path in sorted(root.glob("step-*"), reverse=True) if root.is_dir() else []:
        manifest = read_json(path / CHECKPOINT_MANIFEST) or {}
        if manifest:
            return manifest
    return None


def restarts(run_dir: Path) -> int:
    """Elastic restarts of the run's workers: torchrun's attempt_<n> directories beyond the first
    of each torchrun (logs/torchrun/<run id>/)."""
    root = run_dir / "logs" / "torchrun"
    if not root.is_dir():
        return 0
    return sum(max(0, len(list(run.glob("attempt_*"))) - 1) for run in root.iterdir() if run.is_dir())


def resumed_launch_json(earlier: dict, now: dict) -> dict:
    """launch.json of a resumed run: the first launch as it was, each resume appended."""
    keep = {k: now[k] for k in ("user_args", "script_args", "command", "env_set", "launched_from", "tree") if k in now}
    return {**earlier, "resumes": [*earlier.get("resumes", []), keep]}


def restart_spec(spec: LaunchSpec) -> LaunchSpec:
    """``--max-restarts N`` on a new run: each worker start resumes from latest (none at first)."""
    return replace(spec, args=with_resume_flag(spec.args)) if spec.max_restarts else spec
