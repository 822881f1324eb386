"""``dancegrpo-npu smoke``: the embedded default - a few GRPO steps of the stock trainer on tiny models.

One pipeline runs every trainer the registry smokes, through the row's hooks (``registry.Smoke``):
it builds the row's fixtures (once; reused) - a tiny pipeline shaped like the trainer's model, the
shared HPSv2-shaped reward (``smoke.fixtures``) and a dataset - builds the trainer's arguments
(upstream's recipe shrunk), launches the *patched stock* trainer of the row (the registry's default,
``--lora``: its LoRA variant; ``--trainer NAME``: that row) from the tree (build/DanceGRPO, or
--workdir) through ``dancegrpo-npu launch``, so the smoke run gets a run directory like any launch
(2 GRPO steps by default, --steps, at 64x64, 2 generations per prompt, --generations, strict mode
on), then reads back what the script itself wrote.

It passes only if:

* ``metrics.jsonl`` has every step, with finite rewards and losses and a finite, non-zero
  grad norm (the loss of GRPO's first inner iteration is 0 by design: not a check), and no step
  whose rewards are all equal (every advantage 0: it learns nothing; the step is named);
* the checkpoint upstream writes at the last step loads back the way upstream and diffusers
  intend (the row's checkpoint hook: the class the released weights load with, or the LoRA
  loader), and its trainable parameters moved from where training started further than AdamW's
  weight decay alone moves them: weight decay changes every weight whether or not a gradient
  arrives;
* at more than one rank, for the rows that check it, every rank holds the same weights.

Upstream saves a checkpoint only at the *start* of a step whose number is a multiple of
``--checkpointing_steps``: a checkpoint N holds the weights after step N-1's update, and upstream
never saves the last step's update (the port's resume checkpoint, ``outputs/resume/step-N``, holds
it: docs/resume.md).  With --steps 1 the checkpoint holds the starting weights, so only the grad
norm shows that training reached the model.

``--checkpointing-steps K`` (a divisor of --steps) checkpoints every K steps; ``--resume RUN``
continues a smoke run that stopped from its newest complete checkpoint, as ``launch --resume``.
"""
from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path

from dancegrpo_npu import registry
from dancegrpo_npu.contract import DEVICE_CHOICES as DEVICES
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import Project
from dancegrpo_npu.run.align_flags import AlignOptions
from dancegrpo_npu.run.upstream_args import flag_values
from dancegrpo_npu.smoke.checks import CheckpointCheck, StepFigures, check_training_moved, read_metrics

STEPS = 2  # the default --steps
GENERATIONS = 2  # the default --generations
# Trainer flags the smoke's own checks depend on: set through the smoke's options only.
OWN_FLAGS = {
    "--max_train_steps": "use --steps",
    "--checkpointing_steps": "use --checkpointing-steps",
    "--num_generations": "use --generations",
    "--output_dir": "the smoke reads the checkpoint from the run's outputs/",
}


@dataclass(frozen=True)
class SmokeOptions:
    nproc: int = 1
    lora: bool = False  # the default trainer's LoRA variant (its row's ``lora``)
    trainer: str = ""  # a registry row smoke runs; "": the default row, or its LoRA variant with lora
    device: str = "auto"
    verbose: bool = False  # stream the run's own output
    env: tuple[tuple[str, str], ...] = ()  # more environment for the job (wins over the smoke's)
    steps: int = STEPS
    generations: int = GENERATIONS
    extra_args: tuple[str, ...] = ()  # trainer arguments after the smoke's own (argparse: the later wins)
    align: AlignOptions = AlignOptions()  # --rng/--record.../--replay: launch maps and checks them
    strict: bool = True  # off only for trees that run float64 on purpose (an ablation without float32-rope)
    checkpointing_steps: int | None = None  # --checkpointing-steps N; None: the last step only
    resume: str | None = None  # --resume RUN: continue that smoke run (its own options)
    max_restarts: int = 0  # torchrun's elastic restarts, each from the newest complete checkpoint
    stall_timeout: object = None  # the stall watchdog's limit: seconds, "off", None (derived: run.watchdog)


@dataclass(frozen=True)
class SmokeResult:
    run_dir: Path
    steps: tuple[StepFigures, ...]
    checkpoint: CheckpointCheck
    wall_time_s: float
    equal_weights: int | None = None  # tensors every rank holds equal after training (trainers that check it)
    unchanged_why: str | None = None  # the row's reason why the tensors that did not move cannot (its model's)


def max_train_steps(spec, steps: int) -> int:
    """The trainer's --max_train_steps for the smoke's ``steps``: the trainers whose loop counts
    from 0 and saves as it reaches a pass's step S (smoke.trained) get a pass's steps less the
    row's ``loop_below``; a trainer of several ``passes`` runs steps / passes a pass."""
    return steps // spec.smoke.passes - spec.smoke.loop_below


def smoke_steps(spec, max_train_steps: int) -> int:
    """The smoke's --steps that passes the trainer ``max_train_steps``."""
    return (max_train_steps + spec.smoke.loop_below) * spec.smoke.passes


def default_steps(spec) -> int:
    """--steps when not given: STEPS, or one step a pass for a trainer of several passes."""
    return spec.smoke.passes if spec.smoke.passes > 1 else STEPS


def lora_trainer() -> str:
    """The trainer ``--lora`` names: the default trainer's LoRA variant."""
    return registry.default_trainer().lora or ""


def trainer_of(options: SmokeOptions) -> str:
    return options.trainer or (lora_trainer() if options.lora else registry.default_trainer().name)


def job_env(device: str, nproc: int) -> tuple[tuple[str, str], ...]:
    env = [("WANDB_MODE", "disabled"), ("TOKENIZERS_PARALLELISM", "false")]
    if device == "cpu" or (device == "auto" and not _accelerator_visible()):
        # The ranks share the CPU: one thread each when there are fewer cores than ranks.
        from dancegrpo_npu.host.cpus import cpu_threads

        env.append(("OMP_NUM_THREADS", str(cpu_threads(nproc, dict(os.environ))[0])))
    return tuple(env)


def _accelerator_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    if torch.cuda.is_available():
        return True
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        return False
    # device_count(), as the port's device choice: torch_npu 2.10.0.post7's is_available() can be
    # True where device_count() is 0 (ASCEND_RT_VISIBLE_DEVICES not ascending)
    return bool(getattr(torch, "npu", None) and torch.npu.device_count() > 0)


class StepProgress(io.TextIOBase):
    """Stands in for stdout while the run's own output is hidden (launch keeps it in
    logs/console.log): a line for each step the run finishes, read from its metrics.jsonl as
    the output goes by.  The run is the one directory under ``runs_dir`` that was not there
    before (or ``run_dir``, the run a --resume continues)."""

    POLL_S = 0.5

    def __init__(self, out, runs_dir: Path, steps: int, run_dir: Path | None = None):
        self.out, self.runs_dir, self.steps, self.run_dir = out, runs_dir, steps, run_dir
        self.known = {p.name for p in runs_dir.iterdir()} if runs_dir.is_dir() else set()
        self.offset = self._size() if run_dir is not None else 0  # a resumed run's steps are shown already
        self.polled = 0.0
        self.buffer = self  # launch writes the job's lines as bytes to sys.stdout.buffer

    def _size(self) -> int:
        try:
            return (self.run_dir / "metrics.jsonl").stat().st_size
        except OSError:
            return 0

    def write(self, data) -> int:
        if time.monotonic() - self.polled >= self.POLL_S:
            self.poll()
        return len(data)

    def flush(self) -> None:
        pass

    def poll(self) -> None:
        self.polled = time.monotonic()
        if self.run_dir is None:
            new = sorted(p for p in self.runs_dir.iterdir() if p.name not in self.known and p.is_dir()) \
                if self.runs_dir.is_dir() else []
            if not new:
                return
            self.run_dir = new[-1]
        size = self._size()
        if size <= self.offset:
            self.offset = min(self.offset, size)  # a resume cut the file back to its checkpoint
            return
        with open(self.run_dir / "metrics.jsonl", "rb") as f:
            f.seek(self.offset)
            chunk = f.read(size - self.offset)
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                rec = json.loads(line)
                figures = (f"reward {float(rec['reward_mean']):.4f}, loss {float(rec['loss']):.4g}, "
                           f"grad norm {float(rec['grad_norm']):.4g}, {float(rec['step_time']):.1f} s")
                step = int(rec["step"])
            except (ValueError, KeyError, TypeError):
                continue
            print(f"smoke: step {step} of {self.steps} done: {figures}", file=self.out, flush=True)


@contextmanager
def _quiet(enabled: bool, progress: StepProgress | None = None):
    """Hide the run's streamed output (launch keeps it in logs/console.log); with ``progress``,
    show a line a step instead."""
    if not enabled:
        yield
        return
    saved = sys.stdout
    with open(os.devnull, "w") as devnull:
        sys.stdout = progress or devnull
        try:
            yield
        finally:
            sys.stdout = saved
            if progress is not None:
                progress.poll()  # the last step, written after the last output line


def check_options(options: SmokeOptions) -> None:
    if options.nproc < 1:
        raise DancegrpoError(f"--nproc must be at least 1, not {options.nproc}", "give a positive count", exit_code=2)
    if options.trainer:
        registry.smoke_spec(options.trainer)  # refuses one smoke does not run
    if options.lora and options.trainer not in ("", lora_trainer()):
        raise DancegrpoError(f"--lora names the trainer {lora_trainer()}, not {options.trainer}",
                             "give --trainer alone", exit_code=2)
    if options.device not in DEVICES:
        raise DancegrpoError(f"unknown device {options.device!r}", f"choose one of: {', '.join(DEVICES)}", exit_code=2)
    if options.max_restarts < 0:
        raise DancegrpoError(f"--max-restarts must be 0 or more, not {options.max_restarts}", "give a count",
                             exit_code=2)
    if options.steps < 1:
        raise DancegrpoError(f"--steps must be at least 1, not {options.steps}", "give a positive count", exit_code=2)
    if options.generations < 2:
        raise DancegrpoError(
            f"--generations must be at least 2, not {options.generations}",
            "GRPO's advantage is (reward - the group's mean) / the group's std, and a group of one "
            "has no std (NaN advantages)", exit_code=2)
    every = options.checkpointing_steps
    if every is not None and (every < 1 or options.steps % every):
        raise DancegrpoError(f"--checkpointing-steps {every} does not divide --steps {options.steps}",
                             "the smoke checks the checkpoint of its last step: give a divisor of --steps",
                             exit_code=2)
    for flag in flag_values(options.extra_args):  # also refuses what is not --flag [value]
        if flag in OWN_FLAGS:
            raise DancegrpoError(f"smoke: {flag} cannot be given after --", OWN_FLAGS[flag], exit_code=2)
    trainer = registry.smoke_spec(trainer_of(options)).smoke
    if trainer.loop_below:  # the trainers whose loop saves as it reaches a pass's step S
        from dancegrpo_npu.smoke.fixtures import PROMPTS
        from dancegrpo_npu.smoke.trained import steps_problem

        if options.steps % trainer.passes:
            raise DancegrpoError(f"--steps {options.steps}: the {trainer.label} trainer makes {trainer.passes} passes "
                                 f"over its prompts, each of --steps / {trainer.passes} steps",
                                 f"give a multiple of {trainer.passes}", exit_code=2)
        problem = steps_problem(options.steps, options.nproc, len(PROMPTS), trainer.label, trainer.passes)
        if problem:
            raise DancegrpoError(problem, "give fewer --steps or fewer --nproc", exit_code=2)
    if trainer.check_options:  # what else the row's trainer needs of the options
        problem = registry.load(trainer.check_options)(options, registry.smoke_spec(trainer_of(options)))
        if problem:
            raise DancegrpoError(problem, "give another --steps or --nproc", exit_code=2)


# The run directories the smoke in progress launched (``_launch`` adds them): its verdict goes there.
_LAUNCHED: ContextVar[list | None] = ContextVar("smoke_launched", default=None)


def run_smoke(project: Project, options: SmokeOptions, verified: dict | None = None) -> SmokeResult:
    """The smoke of ``options``: the row's fixtures, arguments, the launch, its metrics and its
    checkpoint, checked.  ``verified``: the command's verification of the tree (``engine.treecheck``),
    passed down to the launch; None: verified here, once."""
    from dancegrpo_npu.engine import treecheck

    options = resumed_options(project, options)
    check_options(options)
    start = time.monotonic()
    spec = registry.smoke_spec(trainer_of(options))
    # the tree first: building the fixtures takes a while, and launch would refuse a missing tree anyway
    verified = treecheck.require_tree(project, spec.relpath, verified)
    launched: list[Path] = []
    token = _LAUNCHED.set(launched)
    try:
        result = _pipeline(project, options, spec, verified, start)
    except DancegrpoError as error:
        if launched:
            record_verdict(launched[-1], error)
        raise
    finally:
        _LAUNCHED.reset(token)
    record_verdict(result.run_dir, None)
    return result


def _pipeline(project: Project, options: SmokeOptions, spec, verified: dict, start: float) -> SmokeResult:
    """Every trainer's smoke, through its row's hooks (``registry.Smoke``): the fixtures (built once,
    reused), the trainer's arguments then the user's (after --: the trainer's argparse keeps the
    last), the launch, the metrics, every rank's equal weights (rows that check them), the checkpoint."""
    from dancegrpo_npu.smoke import trained

    smoke = spec.smoke
    built = registry.load(smoke.fixtures)(project, options, spec)
    args = trainer_arguments(project, built, options, spec)
    record = _launch(project, options, args, verified)
    steps = read_metrics(record.run_dir, options.steps)
    equal = None
    if smoke.equal_weights and options.nproc > 1:  # the rows whose arguments ask every rank for --weights_digest
        equal = trained.check_equal_weights(record.run_dir, options.nproc)
    check = registry.load(smoke.checkpoint)(record.run_dir, built, options, spec, args)
    check_training_moved(check)
    why = registry.load(smoke.unchanged_note)(check) if smoke.unchanged_note else None
    return SmokeResult(record.run_dir, steps, check, time.monotonic() - start, equal, why)


def record_verdict(run_dir: Path, error: DancegrpoError | None) -> None:
    """The smoke's verdict in its run directory (``rundirs.rundir.SMOKE_VERDICT``), which ``runs``
    reads: the launch's summary says only how the training run ended.  Best effort: a verdict that
    cannot be written must not hide the smoke's own result."""
    from dancegrpo_npu.files import write_atomic
    from dancegrpo_npu.rundirs.rundir import SMOKE_VERDICT

    verdict = {"passed": error is None, "error": None if error is None else error.message}
    try:
        write_atomic(run_dir / SMOKE_VERDICT, json.dumps(verdict, indent=1) + "\n")
    except OSError:
        pass


_IMPORT_ERROR = re.compile(r"^(?:ModuleNotFoundError|ImportError)\b")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in ')


def import_failure(tail) -> str | None:
    """Where an import stopped the run, from the last traceback of a failed rank's log (its
    ``tail``) when its exception is an ImportError: "FILE line N: the import", the frame that
    imported (the trainer's own line, or the module it imports); None otherwise."""
    lines = list(tail or ())
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last):" in line]
    if not starts:
        return None
    frames, code, error = [], {}, None
    for line in lines[starts[-1] + 1:]:
        match = _FRAME.match(line)
        if match:
            frames.append(match.groups())
        elif line.strip() and line[0].isspace():
            if frames and frames[-1] not in code and not set(line.strip()) <= set("^~ "):
                code[frames[-1]] = line.strip()
        elif line.strip():
            error = line.strip()
            break
    if not frames or not error or not _IMPORT_ERROR.match(error):
        return None
    where = f"{frames[-1][0]} line {frames[-1][1]}"
    return f"{where}: {code[frames[-1]]}" if frames[-1] in code else where


def _ran(record, advised: bool = False):
    """The run's record, or one error naming why the training run failed: an import that failed is
    named with its file and line (no step ran, so nothing about checkpoints helps); a failed run's
    advice is kept where it has a checkpoint to continue from, and said once: ``advised`` when the
    launch printed it already (-v shows the launch's own lines)."""
    if record.returncode != 0:
        failure = record.summary.get("failure") or {}
        # the exception line (run.failure.error_line), not the log's last line: a progress bar
        why = failure.get("error") or ""
        continuation = record.summary.get("continue_with") or {}
        status = record.summary.get("status", "failed")
        see = f"see {record.run_dir / failure.get('log', 'logs')}"
        where = import_failure(failure.get("tail")) if status == "failed" else None
        if where:
            raise DancegrpoError(f"smoke: the training run failed at an import (exit {record.returncode}): {why}, "
                                 f"at {where}", f"{see}; install what it imports, or fix the import")
        advice = continuation.get("line") if status != "failed" or continuation.get("checkpoint") else None
        if advised:
            advice = None
        raise DancegrpoError(
            f"smoke: the training run {status if status in ('failed', 'stalled') else 'was ' + status} "
            f"(exit {record.returncode})"
            + (f": {why}" if why else ""),
            see + (f"; {advice}" if advice else ""))
    return record


def trainer_arguments(project: Project, built, options: SmokeOptions, spec) -> tuple[str, ...]:
    """The row's arguments for its fixtures ``built``, then the user's (after --): the trainer's
    argparse keeps the last."""
    return tuple(registry.load(spec.smoke.arguments)(project, built, options, spec)) + tuple(options.extra_args)


def resumed_options(project: Project, options: SmokeOptions, given: dict | None = None) -> SmokeOptions:
    """--resume RUN: the smoke's options as that run had them (its steps, generations, trainer).
    ``given``: the options typed with --resume (name -> value, None when not typed); one that
    differs from the run's is refused in one line, as ``launch --resume`` refuses a change."""
    from dancegrpo_npu.rundirs.rundir import find_run

    if options.resume is None:
        return options
    run_dir = find_run(project.runs_dir, options.resume)
    try:
        launch = json.loads((run_dir / "launch.json").read_text())
        v = flag_values(launch["script_args"])
        recorded = replace(options, trainer=launch["script"], lora=False, nproc=launch["nproc_per_node"],
                           steps=smoke_steps(registry.smoke_spec(launch["script"]), int(v["--max_train_steps"])),
                           generations=int(v["--num_generations"]),
                           checkpointing_steps=int(v["--checkpointing_steps"]), extra_args=())
        device = launch["device"]
        recorded = replace(recorded, device=device)
    except (OSError, ValueError, KeyError, TypeError):
        raise DancegrpoError(f"smoke --resume {options.resume}: {run_dir} is not a smoke run's record",
                             "resume a run `dancegrpo-npu smoke` started", exit_code=2) from None
    has = {"trainer": recorded.trainer, "steps": recorded.steps, "generations": recorded.generations,
           "nproc": recorded.nproc, "checkpointing-steps": recorded.checkpointing_steps, "device": device}
    for name, value in (given or {}).items():
        if value is not None and value != has[name]:
            raise DancegrpoError(f"smoke --resume {options.resume}: --{name} {value} would change the run "
                                 f"(it has {has[name]})", "resume without it: the run continues as it was started",
                                 exit_code=2)
    refuse_complete(run_dir, recorded.steps)
    return recorded


def refuse_complete(run_dir: Path, steps: int) -> None:
    """A run whose training run ended (summary.json: succeeded) has nothing left to train: a
    resume would load its last checkpoint, train no step and count a resume."""
    from dancegrpo_npu.rundirs.rundir import SMOKE_VERDICT, read_json

    summary = read_json(run_dir / "summary.json") or {}
    if summary.get("status") != "succeeded":
        return
    verdict = read_json(run_dir / SMOKE_VERDICT) or {}
    checked = {True: "and passed its checks", False: "and failed its checks"}.get(verdict.get("passed"), "")
    raise DancegrpoError(f"smoke --resume {run_dir.name}: the run is already complete: it trained its {steps} "
                         f"step{'s' if steps != 1 else ''} {checked}".rstrip(),
                         "start a new smoke run to train again (`dancegrpo-npu runs` shows this one)")


def _launch(project: Project, options: SmokeOptions, args, verified: dict | None = None):
    """The smoke's training run, launched on the tree as ``verified`` (None: launch verifies it);
    its record, or the one error of a run that did not end well (``_ran``)."""
    from dancegrpo_npu.run.launch import LaunchSpec, launch
    from dancegrpo_npu.run.resume import resume_spec

    if options.resume is not None:
        spec = replace(resume_spec(project, options.resume, max_restarts=options.max_restarts), verb="smoke",
                       stall_timeout=options.stall_timeout)
        with _quiet(not options.verbose, StepProgress(sys.stdout, project.runs_dir, options.steps, spec.resume_of)):
            return _ran(_launched(launch(project, spec, verified=verified)), advised=options.verbose)

    trainer = registry.smoke_spec(trainer_of(options))
    spec = LaunchSpec(
        script=trainer.name,
        args=tuple(args),
        nproc_per_node=options.nproc,
        device=options.device,
        name=registry.run_name(trainer),
        env=job_env(options.device, options.nproc) + tuple(options.env),
        upstream_defaults=False,
        strict=options.strict,
        align=options.align,
        verb="smoke",
        max_restarts=options.max_restarts,
        stall_timeout=options.stall_timeout,
    )
    with _quiet(not options.verbose, StepProgress(sys.stdout, project.runs_dir, options.steps)):
        return _ran(_launched(launch(project, spec, verified=verified)), advised=options.verbose)


def _launched(record):
    """``record``, its run directory noted for the smoke's verdict (``run_smoke``)."""
    launched = _LAUNCHED.get()
    if launched is not None and record is not None:
        launched.append(record.run_dir)
    return record


# Loss values this small are upstream's 0 with float rounding (a group's advantages sum to 0 in float32).
ZERO_LOSS = 1e-6
def loss_note(steps) -> str | None:
    """Why the loss column is 0, where it is (upstream's GRPO loss, in every trainer's script)."""
    if not steps or any(abs(s.loss) > ZERO_LOSS for s in steps):
        return None
    return ("loss 0 is upstream's GRPO loss by construction: it is -advantage x ratio over the group's samples, and "
            "before the step's update every ratio is 1 (the policy that sampled is the one trained; the smoke "
            "updates once, after the whole group), so it is minus the mean of the group's advantages, which is 0; "
            "its gradient is not: see grad_norm")


def unchanged_note(check, known: str | None = None) -> str | None:
    """Why some trainable tensors did not move: ``known``, the row's reason where its model has one
    (``registry.Smoke.unchanged_note``); else their names."""
    if not check.updates or check.changed >= check.total or not check.unchanged:
        return None
    if known:
        return known
    shown = ", ".join(check.unchanged[:4]) + (", ..." if len(check.unchanged) > 4 else "")
    return f"the other {len(check.unchanged)} moved no further than weight decay alone: {shown}"


def format_result(result: SmokeResult) -> str:
    lines = [f"{'step':>4}  {'reward':>9}  {'loss':>11}  {'grad_norm':>10}  {'time':>7}"]
    for s in result.steps:
        lines.append(f"{s.step:>4}  {s.reward_mean:>9.4f}  {s.loss:>11.4g}  {s.grad_norm:>10.4g}  {s.step_time:>6.2f}s")
    note = loss_note(result.steps)
    if note:
        lines.append(note)
    c = result.checkpoint
    if c.updates:
        lines.append(f"checkpoint {c.path} loads with {c.loaded_with}; {c.changed} of {c.total} trainable tensors "
                     f"changed (max |change| {c.max_change:.3g}; weight decay alone: up to {c.decay_max:.2g})")
        note = unchanged_note(c, result.unchanged_why)
        if note:
            lines.append(f"  {note}")
    else:
        lines.append(f"checkpoint {c.path} loads with {c.loaded_with}; it holds the starting weights (upstream "
                     "saves at the start of a step), so with 1 step only the grad norm shows that training "
                     "reached the model")
    if result.equal_weights is not None:
        lines.append(f"every rank holds the same weights after training ({result.equal_weights} tensors)")
    lines.append(f"smoke: passed in {result.wall_time_s:.1f} s; record: {result.run_dir}")
    return "\n".join(lines)
