"""The Stable Diffusion smoke's hooks (the row's ``Smoke``): upstream's SD trainer on a tiny pipeline.

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

from pathlib import Path

from dancegrpo_npu.smoke.checks import DecayBudget, check_saved_model
from dancegrpo_npu.smoke.fixtures import PROMPTS, WithReward

SIZE = 64
LEARNING_RATE, WEIGHT_DECAY = 1e-5, 1e-4  # upstream's config_sd/base.py (train.learning_rate, adam_weight_decay)


def fixtures(project, options, spec) -> WithReward:
    """The tiny pipeline (built once, reused) and the reward fixtures."""
    from dancegrpo_npu.smoke.fixtures import build_reward_fixtures
    from dancegrpo_npu.trainers.sd.fixtures import build_sd_fixtures

    reward = build_reward_fixtures(project.build_dir / "fixtures-reward")  # the HPS reward files and the prompts
    return WithReward(build_sd_fixtures(project.build_dir / f"fixtures-{spec.name}"), reward)


def arguments(project, built: WithReward, options, spec) -> tuple[str, ...]:
    return trainer_args(project.workdir, built.models.model_dir, built.reward, options.steps, options.generations,
                        options.checkpointing_steps, spec.smoke.sampling_steps)


def check_options(options, spec) -> str | None:
    """Too few steps for a checkpoint to check, or too few prompts for the steps and ranks."""
    return steps_problem(options.steps, options.nproc, len(PROMPTS))


def checkpoint(run_dir: Path, built: WithReward, options, spec, args):
    """``checkpoint_epoch_<S-1>``: the UNet after all S updates, loaded with the row's class."""
    return check_saved_model(run_dir / "outputs" / f"checkpoint_epoch_{options.steps - 1}", built.models.model_dir,
                             spec.smoke.model_class, DecayBudget(LEARNING_RATE, WEIGHT_DECAY, options.steps),
                             subfolder="unet")


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
