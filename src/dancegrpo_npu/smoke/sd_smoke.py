"""The Stable Diffusion smoke: upstream's SD trainer on a tiny pipeline, with the FLUX smoke's checks.

The trainer is configured by upstream's own configuration (``fastvideo/config_sd/dgx.py:hpsv2``
in the patched tree) shrunk with absl's overrides: one prompt a rank an epoch, its generations
sampled and trained one at a time (upstream's sample.batch_size >= train.batch_size) and
accumulated into one optimizer update an epoch (so a smoke step is an
epoch, as the seam counts steps), 6 DDIM steps at 64x64.  The port's flags give the files, the
seed, the generations and the steps.  Upstream saves the UNet at the end of every epoch but the
first (``config.save_freq`` 1): ``outputs/checkpoint_epoch_<S-1>`` holds the weights after all S
updates and must load with ``UNet2DConditionModel.from_pretrained`` and have moved; at 2 ranks
every rank's weights must be equal (DDP).
"""

from __future__ import annotations

import time
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError

SIZE = 64
LEARNING_RATE, WEIGHT_DECAY = 1e-5, 1e-4  # upstream's config_sd/base.py (train.learning_rate, adam_weight_decay)


def trainer_args(tree: Path, model_dir: Path, hps, steps: int, generations: int,
                 checkpointing_steps: int | None, sampling_steps: int) -> tuple[str, ...]:
    args = [
        "--config", f"{tree / 'fastvideo/config_sd/dgx.py'}:hpsv2",
        "--config.sample.batch_size=1",
        "--config.train.batch_size=1",
        f"--config.train.gradient_accumulation_steps={generations}",
        "--config.save_freq=1",
        "--pretrained_model_name_or_path", str(model_dir),
        "--prompt_dir", str(hps.prompts),
        "--hps_model", str(hps.hps_model_config),
        "--hps_open_clip_ckpt", str(hps.hps_open_clip_ckpt),
        "--hps_ckpt", str(hps.hps_ckpt),
        "--seed", "42",
        "--num_generations", str(generations),
        "--sampling_steps", str(sampling_steps),
        "--h", str(SIZE), "--w", str(SIZE),
        "--max_train_steps", str(steps),
        "--weights_digest",
    ]
    if checkpointing_steps:
        args += ["--checkpointing_steps", str(checkpointing_steps)]
    return tuple(args)


def steps_problem(steps: int, nproc: int, prompts: int) -> str | None:
    if steps < 2:
        return (f"--steps {steps}: upstream's SD trainer saves the UNet at the end of every epoch but the first, "
                "so the smoke's checkpoint check needs at least 2 steps")
    if steps * nproc > prompts:
        return (f"--steps {steps}: the SD trainer takes one prompt a rank a step and passes over its prompts once; "
                f"{steps} steps on {nproc} rank{'s' if nproc != 1 else ''} need {steps * nproc} prompts, the fixtures have {prompts}")
    return None


def check_unet(path: Path, model_dir: Path, budget):
    """``path`` loads with UNet2DConditionModel.from_pretrained and moved from the fixture's UNet."""
    from diffusers import UNet2DConditionModel

    from dancegrpo_npu.smoke.checks import CheckpointCheck, _compare, unmoved

    if not path.is_dir():
        raise DancegrpoError(f"smoke: the trainer wrote no checkpoint {path}")
    try:
        trained = UNet2DConditionModel.from_pretrained(path).state_dict()
    except (OSError, ValueError, RuntimeError) as exc:
        raise DancegrpoError(f"smoke: {path} does not load with UNet2DConditionModel.from_pretrained: {exc}") from None
    start = UNet2DConditionModel.from_pretrained(model_dir, subfolder="unet").state_dict()
    changed, total, biggest, decay = _compare(start, trained, "parameter", budget)
    return CheckpointCheck(path, "UNet2DConditionModel.from_pretrained", changed, total, biggest, decay,
                           budget.updates, unmoved(start, trained, budget))


def run(project, options, spec, start: float):
    from dancegrpo_npu.smoke import trained
    from dancegrpo_npu.smoke.checks import DecayBudget, check_training_moved, read_metrics
    from dancegrpo_npu.smoke.fixtures import PROMPTS, build_fixtures
    from dancegrpo_npu.smoke.runner import SmokeResult, _launch
    from dancegrpo_npu.smoke.sd_fixtures import build_sd_fixtures

    if options.resume is None:
        problem = steps_problem(options.steps, options.nproc, len(PROMPTS))
        if problem:
            raise DancegrpoError(problem, "give another --steps or --nproc", exit_code=2)
    hps = build_fixtures(project.build_dir / "fixtures")  # the HPS reward files and the prompts
    built = build_sd_fixtures(project.build_dir / f"fixtures-{spec.name}")
    args = trainer_args(project.workdir, built.model_dir, hps, options.steps, options.generations,
                        options.checkpointing_steps, spec.smoke.sampling_steps) + tuple(options.extra_args)
    record = _launch(project, options, args)
    steps = read_metrics(record.run_dir, options.steps)
    equal = trained.check_equal_weights(record.run_dir, options.nproc) if options.nproc > 1 else None
    check = check_unet(record.run_dir / "outputs" / f"checkpoint_epoch_{options.steps - 1}", built.model_dir,
                       DecayBudget(LEARNING_RATE, WEIGHT_DECAY, options.steps))
    check_training_moved(check)
    return SmokeResult(record.run_dir, steps, check, time.monotonic() - start, equal)
