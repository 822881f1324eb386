"""``dancegrpo-npu smoke``: the embedded default - two GRPO steps of the stock trainer on tiny models.

It builds (once; reused) the fixtures - a tiny FLUX.1-dev-shaped pipeline, an HPSv2-shaped
reward and an RL-embeddings dataset (``dancegrpo_npu.smoke.fixtures``) - then launches the *patched
stock* ``fastvideo/train_grpo_flux.py`` (``--lora``: ``train_grpo_flux_lora.py``) through
``dancegrpo-npu launch``, so the smoke run gets a run directory like any launch: 2 GRPO steps
at 64x64, 4 sampling steps, 2 generations per prompt, HPSv2 reward, strict mode on.

It passes only if, read back from what the script itself wrote:

* ``metrics.jsonl`` has both steps, with finite rewards and losses;
* the checkpoint upstream writes at step 2 (``outputs/checkpoint-2-0``, or
  ``outputs/lora-checkpoint-2-0``) loads back the way upstream and diffusers intend -
  ``FluxTransformer2DModel.from_pretrained``, or ``FluxPipeline.lora_state_dict`` +
  ``load_lora_into_transformer`` (what ``FluxPipeline.load_lora_weights`` does) - and
  its trainable parameters differ from where training started (the fixture weights; for
  LoRA, peft's zero-initialised ``lora_B``).

Upstream saves a checkpoint at the *start* of a step whose number is a multiple of
``--checkpointing_steps``: checkpoint 2 holds the weights after step 1's update.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.align.options import AlignOptions, add_align_options, options_from_args, records_index
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import Project, project_from_args

STEPS = 2
DEVICES = ("auto", "cpu", "cuda", "npu")
EXAMPLES = """\
examples:
  dancegrpo-npu smoke                    # 1 process, full fine-tuning, device auto
  dancegrpo-npu smoke --nproc 2 --lora   # the LoRA trainer on 2 ranks
  dancegrpo-npu smoke --device npu -v    # on a 910B node, showing the run as it goes

The run directory (runs/<time>-smoke/) keeps the command, every rank's log, metrics.jsonl,
reward.txt, images/ and the checkpoint; `dancegrpo-npu runs` lists it.
"""


@dataclass(frozen=True)
class SmokeOptions:
    nproc: int = 1
    lora: bool = False
    device: str = "auto"
    verbose: bool = False  # stream the run's own output
    env: tuple[tuple[str, str], ...] = ()  # more environment for the job (wins over the smoke's)
    align: AlignOptions = AlignOptions()  # --rng/--record.../--replay: launch maps and checks them


@dataclass(frozen=True)
class StepFigures:
    step: int
    reward_mean: float
    loss: float
    grad_norm: float
    step_time: float


@dataclass(frozen=True)
class CheckpointCheck:
    path: Path
    loaded_with: str
    changed: int  # trainable tensors that differ from their starting values
    total: int
    max_change: float


@dataclass(frozen=True)
class SmokeResult:
    run_dir: Path
    steps: tuple[StepFigures, ...]
    checkpoint: CheckpointCheck
    wall_time_s: float


def trainer_args(fixtures, lora: bool) -> tuple[str, ...]:
    """Exactly the arguments the smoke passes (no upstream defaults): upstream's recipe
    (finetune_flux_grpo*.sh), shrunk to 2 steps at 64x64 on the fixtures."""
    args = [
        "--seed", "42",
        "--pretrained_model_name_or_path", str(fixtures.model_dir),
        "--vae_model_path", str(fixtures.model_dir),
        "--data_json_path", str(fixtures.data_json),
        "--use_hpsv2",
        "--hps_model", str(fixtures.hps_model_config),
        "--hps_open_clip_ckpt", str(fixtures.hps_open_clip_ckpt),
        "--hps_ckpt", str(fixtures.hps_ckpt),
        "--gradient_checkpointing",
        "--train_batch_size", "1",
        "--num_latent_t", "1",
        "--sp_size", "1",
        "--train_sp_batch_size", "1",
        "--dataloader_num_workers", "0",
        "--gradient_accumulation_steps", "2",
        "--max_train_steps", str(STEPS),
        "--learning_rate", "1e-3",
        "--mixed_precision", "bf16",
        "--checkpointing_steps", str(STEPS),
        "--cfg", "0.0",
        "--h", "64", "--w", "64", "--t", "1",
        "--sampling_steps", "4",
        "--eta", "0.3",
        "--lr_warmup_steps", "0",
        "--sampler_seed", "1223627",
        "--max_grad_norm", "1.0",
        "--weight_decay", "0.0001",
        "--num_generations", "2",
        "--shift", "3",
        "--use_group",
        "--ignore_last",
        "--timestep_fraction", "0.6",
        "--init_same_noise",
        "--clip_range", "1e-4",
        "--adv_clip_max", "5.0",
    ]  # fmt: skip
    if lora:
        args += ["--lora_rank", "4", "--lora_alpha", "8"]
    return tuple(args)


def job_env(device: str, nproc: int) -> tuple[tuple[str, str], ...]:
    env = [("WANDB_MODE", "disabled"), ("TOKENIZERS_PARALLELISM", "false")]
    if device == "cpu" or (device == "auto" and not _accelerator_visible()):
        # The ranks share the CPU: one thread each when there are fewer cores than ranks.
        env.append(("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc))))
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
    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


def read_metrics(run_dir: Path) -> tuple[StepFigures, ...]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise DancegrpoError(f"smoke: the trainer wrote no {path}", f"see the rank logs in {run_dir / 'logs'}")
    steps = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            steps.append(StepFigures(int(row["step"]), float(row["reward_mean"]), float(row["loss"]),
                                     float(row["grad_norm"]), float(row["step_time"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise DancegrpoError(f"smoke: {path} line {n} is not a metrics record ({exc})") from None
    if [s.step for s in steps] != list(range(1, STEPS + 1)):
        raise DancegrpoError(f"smoke: {path} has steps {[s.step for s in steps]}, expected 1..{STEPS}")
    for s in steps:
        bad = [name for name in ("reward_mean", "loss", "grad_norm") if not math.isfinite(getattr(s, name))]
        if bad:
            raise DancegrpoError(f"smoke: step {s.step} has non-finite {', '.join(bad)} ({s})",
                                 f"see the rank logs in {run_dir / 'logs'}")
    return tuple(steps)


def _compare(start: dict, end: dict, what: str) -> tuple[int, int, float]:
    import torch

    if set(start) != set(end):
        raise DancegrpoError(f"smoke: the checkpoint's {what} names differ from the model's",
                             f"missing {sorted(set(start) - set(end))[:3]}, extra {sorted(set(end) - set(start))[:3]}")
    diffs = [(end[k].float() - start[k].float()).abs().max().item() for k in start]
    if not all(math.isfinite(d) for d in diffs):
        raise DancegrpoError(f"smoke: the checkpoint's {what} are not finite")
    return sum(d > 0 for d in diffs), len(diffs), max(diffs, default=0.0)


def check_full_checkpoint(outputs: Path, model_dir: Path) -> CheckpointCheck:
    from diffusers import FluxTransformer2DModel

    path = outputs / f"checkpoint-{STEPS}-0"
    if not path.is_dir():
        raise DancegrpoError(f"smoke: the trainer wrote no checkpoint {path}")
    trained = FluxTransformer2DModel.from_pretrained(str(path)).state_dict()
    start = FluxTransformer2DModel.from_pretrained(str(model_dir), subfolder="transformer").state_dict()
    changed, total, biggest = _compare(start, trained, "parameter")
    return CheckpointCheck(path, "FluxTransformer2DModel.from_pretrained", changed, total, biggest)


def check_lora_checkpoint(outputs: Path, model_dir: Path) -> CheckpointCheck:
    import torch
    from diffusers import FluxPipeline, FluxTransformer2DModel

    path = outputs / f"lora-checkpoint-{STEPS}-0"
    if not path.is_dir():
        raise DancegrpoError(f"smoke: the trainer wrote no LoRA checkpoint {path}")
    state_dict, alphas = FluxPipeline.lora_state_dict(str(path), return_alphas=True)
    transformer = FluxTransformer2DModel.from_pretrained(str(model_dir), subfolder="transformer")
    FluxPipeline.load_lora_into_transformer(state_dict, network_alphas=alphas, transformer=transformer)
    loaded = {k: v for k, v in transformer.state_dict().items() if ".lora_B." in k}
    if not loaded:
        raise DancegrpoError(f"smoke: {path} loaded, but the transformer has no LoRA layers afterwards")
    # peft initialises lora_B to zeros: training is what moves it.
    changed, total, biggest = _compare({k: torch.zeros_like(v) for k, v in loaded.items()}, loaded, "lora_B")
    return CheckpointCheck(path, "FluxPipeline.lora_state_dict + load_lora_into_transformer", changed, total, biggest)


@contextmanager
def _quiet(enabled: bool):
    """Send the run's streamed output to /dev/null (launch keeps it in logs/console.log)."""
    if not enabled:
        yield
        return
    saved = sys.stdout
    with open(os.devnull, "w") as sink:
        sys.stdout = sink
        try:
            yield
        finally:
            sys.stdout = saved


def check_options(options: SmokeOptions) -> None:
    if options.nproc < 1:
        raise DancegrpoError(f"--nproc must be at least 1, not {options.nproc}", "give a positive count", exit_code=2)
    if options.device not in DEVICES:
        raise DancegrpoError(f"unknown device {options.device!r}", f"choose one of: {', '.join(DEVICES)}", exit_code=2)


def run_smoke(project: Project, options: SmokeOptions) -> SmokeResult:
    from dancegrpo_npu.smoke.fixtures import build_fixtures

    check_options(options)
    start = time.monotonic()
    # with the tree: the dataset is also read back through the patched LatentDataset
    fixtures = build_fixtures(project.build_dir / "fixtures", tree=project.workdir)
    record = _launch(project, options, fixtures)
    if record.returncode != 0:
        failure = record.summary.get("failure") or {}
        last = next((line.strip() for line in reversed(failure.get("tail") or []) if line.strip()), "")
        raise DancegrpoError(
            f"smoke: the training run failed (exit {record.returncode})" + (f": {last}" if last else ""),
            f"see {record.run_dir / failure.get('log', 'logs')}")
    steps = read_metrics(record.run_dir)
    check = (check_lora_checkpoint if options.lora else check_full_checkpoint)(
        record.run_dir / "outputs", fixtures.model_dir)
    if check.changed == 0:
        raise DancegrpoError(f"smoke: training changed none of the {check.total} trainable tensors in {check.path}")
    return SmokeResult(record.run_dir, steps, check, time.monotonic() - start)


def _launch(project: Project, options: SmokeOptions, fixtures):
    from dancegrpo_npu.run.launch import LaunchSpec, launch

    spec = LaunchSpec(
        script="flux-lora" if options.lora else "flux",
        args=trainer_args(fixtures, options.lora),
        nproc_per_node=options.nproc,
        device=options.device,
        name="smoke-lora" if options.lora else "smoke",
        env=job_env(options.device, options.nproc) + tuple(options.env),
        upstream_defaults=False,
        strict=True,
        align=options.align,
    )
    with _quiet(not options.verbose):
        return launch(project, spec)


def format_result(result: SmokeResult) -> str:
    lines = [f"{'step':>4}  {'reward':>9}  {'loss':>11}  {'grad_norm':>10}  {'time':>7}"]
    for s in result.steps:
        lines.append(f"{s.step:>4}  {s.reward_mean:>9.4f}  {s.loss:>11.4g}  {s.grad_norm:>10.4g}  {s.step_time:>6.2f}s")
    c = result.checkpoint
    lines.append(f"checkpoint {c.path} loads with {c.loaded_with}; {c.changed} of {c.total} trainable tensors "
                 f"changed (max |change| {c.max_change:.3g})")
    lines.append(f"smoke: passed in {result.wall_time_s:.1f} s; record: {result.run_dir}")
    return "\n".join(lines)


PASSED_NAME = "smoke-passed.json"


def inputs_sha256(project: Project, options: SmokeOptions) -> str | None:
    """What a smoke result depends on: the verified tree (lock, series, overlay - digested
    the way apply records them), the fixtures' parameters, the smoke's own code and
    options.  None when the tree is not exactly lock + series + overlay (then nothing can
    be reused)."""
    import hashlib

    from dancegrpo_npu.engine.apply import overlay_sha256
    from dancegrpo_npu.smoke.fixtures import params_sha256
    from dancegrpo_npu.engine.series import load_series, series_sha256
    from dancegrpo_npu.engine.stage import read_overlay
    from dancegrpo_npu.engine.status import verify_tree

    try:
        report = verify_tree(project)
        parts = (report.lock.commit, series_sha256(load_series(project.patches_dir)),
                 overlay_sha256(read_overlay(project.overlay_dir)))
    except DancegrpoError:
        return None
    h = hashlib.sha256()
    for part in (*parts, params_sha256(), Path(__file__).read_text(), repr((options.nproc, options.lora, options.device))):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def _passes(project: Project) -> dict[str, str]:
    """inputs_sha256 -> run directory of each remembered pass (a damaged record is empty)."""
    try:
        record = json.loads((project.build_dir / PASSED_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in record.items() if isinstance(v, str)} if isinstance(record, dict) else {}


def previous_pass(project: Project, key: str | None) -> Path | None:
    """The run directory of an earlier pass with the same inputs, if it is still there."""
    run_dir = _passes(project).get(key) if key else None
    return Path(run_dir) if run_dir and Path(run_dir, "summary.json").is_file() else None


def record_pass(project: Project, key: str | None, result: SmokeResult) -> None:
    """Remember a pass (one entry per set of inputs: full, LoRA, 1 or 2 ranks...)."""
    from dancegrpo_npu.files import write_atomic

    if key:
        passes = {k: v for k, v in _passes(project).items() if Path(v, "summary.json").is_file()}
        passes[key] = str(result.run_dir)
        write_atomic(project.build_dir / PASSED_NAME, json.dumps(passes, indent=1))


def align_options(args, project: Project) -> AlignOptions:
    """The smoke's alignment options (launch turns them into trainer arguments and checks a
    replay against the planned run).  A replay source is looked up here already, so that one
    without records is refused before the fixtures are built."""
    from dancegrpo_npu.run.records import find_run

    align = options_from_args(args)
    if align.given() and args.if_needed:
        raise DancegrpoError(f"--if-needed skips the run, so it does not combine with {', '.join(align.given())}",
                             "drop --if-needed", exit_code=2)
    if align.replay is not None:
        records_index(find_run(project.runs_dir, align.replay))
    return align


def _cmd_smoke(args) -> int:
    project = project_from_args(args)
    options = SmokeOptions(nproc=args.nproc, lora=args.lora, device=args.device, verbose=args.verbose,
                           align=align_options(args, project))
    check_options(options)
    key = inputs_sha256(project, options)
    if args.if_needed:
        earlier = previous_pass(project, key)
        if earlier:
            print(f"smoke: already passed for this tree, series, overlay and fixtures (record: {earlier}); "
                  "`dancegrpo-npu smoke` runs it again")
            return 0
    what = "LoRA" if options.lora else "full"
    print(f"smoke: {what} FLUX GRPO, {STEPS} steps at 64x64, 4 sampling steps, 2 generations, HPSv2 reward, "
          f"strict mode; {options.nproc} process(es), device {options.device}", flush=True)
    result = run_smoke(project, options)
    print(format_result(result))
    record_pass(project, key, result)
    return 0


def register(sub, common) -> None:
    p = sub.add_parser(
        "smoke",
        parents=[common],
        help="2 GRPO steps of the patched stock trainer on tiny models: proves the port end to end",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nproc", type=int, default=1, metavar="N", help="processes (ranks) on this machine (default 1)")
    p.add_argument("--lora", action="store_true", help="run train_grpo_flux_lora.py instead of the full trainer")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="DANCEGRPO_DEVICE for the run (default auto: npu, else cuda, else cpu)")
    p.add_argument("--verbose", "-v", action="store_true", help="show the run's own output as it goes")
    p.add_argument("--if-needed", action="store_true",
                   help="do nothing if a smoke run with the same options already passed on this exact tree, "
                   "series, overlay and fixtures (what ./scripts/bootstrap.sh uses to stay idempotent)")
    add_align_options(p)
    p.set_defaults(func=_cmd_smoke)
