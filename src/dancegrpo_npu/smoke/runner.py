"""``dancegrpo-npu smoke``: the embedded default - a few GRPO steps of the stock trainer on tiny models.

It builds (once; reused) the fixtures - a tiny FLUX.1-dev-shaped pipeline, an HPSv2-shaped
reward and an RL-embeddings dataset (``dancegrpo_npu.smoke.fixtures``) - then launches the *patched
stock* trainer of the registry's default row (``--lora``: its LoRA variant; ``--trainer NAME``: that row) from the tree
(build/DanceGRPO, or --workdir) through ``dancegrpo-npu launch``, so the smoke run gets a run
directory like any launch: 2 GRPO steps (--steps) at 64x64, 4 sampling steps, 2 generations
per prompt (--generations), HPSv2 reward, strict mode on.

It passes only if, read back from what the script itself wrote:

* ``metrics.jsonl`` has every step, with finite rewards and losses and a finite, non-zero
  grad norm (the loss of GRPO's first inner iteration is 0 by design: not a check), and no step
  whose rewards are all equal (every advantage 0: it learns nothing; the step is named);
* the checkpoint upstream writes at the last step N (``outputs/checkpoint-N-0``, or
  ``outputs/lora-checkpoint-N-0``) loads back the way upstream and diffusers intend -
  ``FluxTransformer2DModel.from_pretrained``, or ``FluxPipeline.lora_state_dict`` +
  ``load_lora_into_transformer`` (what ``FluxPipeline.load_lora_weights`` does) - and
  its trainable parameters moved from where training started (the fixture weights; for
  LoRA, peft's zero-initialised ``lora_B``) further than AdamW's weight decay alone moves
  them: weight decay changes every weight whether or not a gradient arrives.

Upstream saves a checkpoint only at the *start* of a step whose number is a multiple of
``--checkpointing_steps`` (the smoke passes N): checkpoint N holds the weights after step
N-1's update, and upstream never saves the last step's update (the port's resume checkpoint,
``outputs/resume/step-N``, holds it: docs/resume.md).  With --steps 1 the checkpoint holds the
starting weights, so only the grad norm shows that training reached the model.

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

from dancegrpo_npu import trainers
from dancegrpo_npu.run.align_flags import AlignOptions
from dancegrpo_npu.contract import DEVICE_CHOICES as DEVICES
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import Project
from dancegrpo_npu.run.upstream_args import flag_values  # noqa: F401  (smoke.flag_values, as tests use it)
from dancegrpo_npu.smoke.recipe import shrunk_recipe
from dancegrpo_npu.smoke.checks import (
    CheckpointCheck,
    DecayBudget,
    StepFigures,
    check_full_checkpoint,
    check_lora_checkpoint,
    check_training_moved,
    read_metrics,
)

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
    return trainers.default_trainer().lora or ""


def trainer_of(options: SmokeOptions) -> str:
    return options.trainer or (lora_trainer() if options.lora else trainers.default_trainer().name)


def trainer_args(fixtures, lora: bool, steps: int = STEPS, generations: int = GENERATIONS,
                 checkpointing_steps: int | None = None) -> tuple[str, ...]:
    """Exactly the arguments the smoke passes (no upstream defaults): upstream's recipe
    (finetune_flux_grpo*.sh), shrunk to ``steps`` steps at 64x64 on the fixtures."""
    args = shrunk_recipe(fixtures.model_dir, fixtures.data_json, fixtures, generations, steps,
                         checkpointing_steps or steps)
    if lora:
        args += ["--lora_rank", "4", "--lora_alpha", "8"]
    return tuple(args)


def decay_budget(args, steps: int) -> DecayBudget:
    """What weight decay alone can do before checkpoint ``steps``, from the arguments the
    trainer got: updates a step = samples a step / accumulation steps (the trainers' loop)."""
    v = flag_values(args)
    try:
        samples = int(v["--train_batch_size"]) * (int(v["--num_generations"]) if "--use_group" in v else 1)
        per_step = samples // int(v["--gradient_accumulation_steps"])
        return DecayBudget(float(v["--learning_rate"]), float(v["--weight_decay"]), (steps - 1) * per_step)
    except (KeyError, TypeError, ValueError) as exc:
        raise DancegrpoError(f"smoke: cannot read the optimizer settings from the trainer's arguments ({exc})",
                             "give --learning_rate, --weight_decay, --train_batch_size and "
                             "--gradient_accumulation_steps numbers", exit_code=2) from None


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
        trainers.smoke_spec(options.trainer)  # refuses one smoke does not run
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
    trainer = trainers.smoke_spec(trainer_of(options)).smoke
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


# The run directories the smoke in progress launched (``_launch`` adds them): its verdict goes there.
_LAUNCHED: ContextVar[list | None] = ContextVar("smoke_launched", default=None)


def run_smoke(project: Project, options: SmokeOptions) -> SmokeResult:
    from dancegrpo_npu.engine import treecheck

    options = resumed_options(project, options)
    check_options(options)
    start = time.monotonic()
    spec = trainers.smoke_spec(trainer_of(options))
    # the tree first: building the fixtures takes a while, and launch would refuse a missing tree anyway
    treecheck.require_tree(project, spec.relpath)
    launched: list[Path] = []
    token = _LAUNCHED.set(launched)
    try:
        result = trainers.load(spec.smoke.run)(project, options, spec, start)
    except DancegrpoError as error:
        if launched:
            record_verdict(launched[-1], error)
        raise
    finally:
        _LAUNCHED.reset(token)
    record_verdict(result.run_dir, None)
    return result


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


def run_with_tool_fixtures(project: Project, options: SmokeOptions, spec, start: float) -> SmokeResult:
    """The smoke of a trainer of the tool's own dependency set: the tiny FLUX.1-dev-shaped
    fixtures built here, the checkpoint loaded back here (full, or LoRA with ``spec.smoke.lora``)."""
    from dancegrpo_npu.smoke.fixtures import build_fixtures

    # with the tree: the dataset is also read back through the patched LatentDataset
    fixtures = build_fixtures(project.build_dir / "fixtures", tree=project.workdir)
    record = _launch(project, options, all_trainer_args(options, fixtures))
    steps = read_metrics(record.run_dir, options.steps)
    budget = decay_budget(all_trainer_args(options, fixtures), options.steps)
    check = (check_lora_checkpoint if spec.smoke.lora else check_full_checkpoint)(
        record.run_dir / "outputs", fixtures.model_dir, options.steps, budget)
    check_training_moved(check)
    return SmokeResult(record.run_dir, steps, check, time.monotonic() - start)


def run_with_depset_fixtures(project: Project, options: SmokeOptions, spec, start: float) -> SmokeResult:
    """The smoke of a trainer of another dependency set (Wan2.1, Qwen-Image: diffusers-0.35): its
    fixtures (``spec.smoke.fixtures``) built by that set's interpreter, then the FLUX smoke's
    checks plus every rank's equal weights (smoke.trained)."""
    from dancegrpo_npu.run.depsets import python_for
    from dancegrpo_npu.smoke import trained
    from dancegrpo_npu.smoke.fixtures import build_fixtures

    smoke = spec.smoke
    python = python_for(spec.depset, needed_by=spec.name)
    hps = build_fixtures(project.build_dir / "fixtures")  # the HPS reward files and the prompts
    built = trainers.load(smoke.fixtures)(project, hps.prompts, spec, python)
    args = trainers.load(smoke.arguments)(built, hps, max_train_steps(spec, options.steps), options.generations, spec)
    args += tuple(options.extra_args)
    record = _launch(project, options, args)
    steps = read_metrics(record.run_dir, options.steps)
    equal = trained.check_equal_weights(record.run_dir, options.nproc) if options.nproc > 1 else None
    checkpoint, updates = trained.last_checkpoint(options.steps, smoke.passes)
    check = trained.check_checkpoint(record.run_dir / "outputs" / checkpoint, built.model_dir, smoke.model_class,
                                     decay_budget(args, updates + 1), python)
    check_training_moved(check)
    return SmokeResult(record.run_dir, steps, check, time.monotonic() - start, equal)


def all_trainer_args(options: SmokeOptions, fixtures) -> tuple[str, ...]:
    """The smoke's arguments, then the user's (after --): the trainer's argparse keeps the last."""
    lora = trainers.smoke_spec(trainer_of(options)).smoke.lora
    return trainer_args(fixtures, lora, options.steps, options.generations,
                        options.checkpointing_steps) + tuple(options.extra_args)


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
                           steps=smoke_steps(trainers.smoke_spec(launch["script"]), int(v["--max_train_steps"])),
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


def _launch(project: Project, options: SmokeOptions, args):
    """The smoke's training run, launched; its record, or the one error of a run that did not end
    well (``_ran``)."""
    from dancegrpo_npu.run.launch import LaunchSpec, launch
    from dancegrpo_npu.run.resume import resume_spec

    if options.resume is not None:
        spec = replace(resume_spec(project, options.resume, max_restarts=options.max_restarts), verb="smoke",
                       stall_timeout=options.stall_timeout)
        with _quiet(not options.verbose, StepProgress(sys.stdout, project.runs_dir, options.steps, spec.resume_of)):
            return _ran(_launched(launch(project, spec)), advised=options.verbose)

    trainer = trainers.smoke_spec(trainer_of(options))
    spec = LaunchSpec(
        script=trainer.name,
        args=tuple(args),
        nproc_per_node=options.nproc,
        device=options.device,
        name=trainers.run_name(trainer),
        env=job_env(options.device, options.nproc) + tuple(options.env),
        upstream_defaults=False,
        strict=options.strict,
        align=options.align,
        verb="smoke",
        max_restarts=options.max_restarts,
        stall_timeout=options.stall_timeout,
    )
    with _quiet(not options.verbose, StepProgress(sys.stdout, project.runs_dir, options.steps)):
        return _ran(_launched(launch(project, spec)), advised=options.verbose)


def _launched(record):
    """``record``, its run directory noted for the smoke's verdict (``run_smoke``)."""
    launched = _LAUNCHED.get()
    if launched is not None and record is not None:
        launched.append(record.run_dir)
    return record


# Loss values this small are upstream's 0 with float rounding (a group's advantages sum to 0 in float32).
ZERO_LOSS = 1e-6
# The parts of a Qwen-Image block that only make its text stream's output: the model keeps the image
# stream alone after its last block, so in that block no loss depends on them.
_TEXT_STREAM_OUTPUT = re.compile(r"^transformer_blocks\.(\d+)\.(attn\.(add_q_proj|norm_added_q|to_add_out)|txt_mlp)\.")


def loss_note(steps) -> str | None:
    """Why the loss column is 0, where it is (upstream's GRPO loss, in every trainer's script)."""
    if not steps or any(abs(s.loss) > ZERO_LOSS for s in steps):
        return None
    return ("loss 0 is upstream's GRPO loss by construction: it is -advantage x ratio over the group's samples, and "
            "before the step's update every ratio is 1 (the policy that sampled is the one trained; the smoke "
            "updates once, after the whole group), so it is minus the mean of the group's advantages, which is 0; "
            "its gradient is not: see grad_norm")


def unchanged_note(check) -> str | None:
    """Why some trainable tensors did not move, where the reason is known; else their names."""
    if not check.updates or check.changed >= check.total or not check.unchanged:
        return None
    blocks = {m.group(1) for m in map(_TEXT_STREAM_OUTPUT.match, check.unchanged) if m}
    if len(blocks) == 1 and all(_TEXT_STREAM_OUTPUT.match(n) for n in check.unchanged):
        return (f"the other {len(check.unchanged)} are block {blocks.pop()}'s text-stream parts (add_q_proj, "
                "norm_added_q, to_add_out, txt_mlp): the model keeps only the image stream after its last block, "
                "so no output depends on them and no gradient reaches them")
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
        note = unchanged_note(c)
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
