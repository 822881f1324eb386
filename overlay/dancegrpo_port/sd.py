"""Stable Diffusion v1.4 (``train_grpo_sd.py``): the port's flags in an absl / ml_collections program.

Upstream's SD trainer is configured by ``--config fastvideo/config_sd/dgx.py:hpsv2`` (absl parses
it, and ``--config.KEY=VALUE`` overrides a key), not by argparse.  The seam gives it the port's
flags as the other trainers have them, read by an argparse parser before absl parses the rest:

    parser = argparse.ArgumentParser(); hooks.add_arguments(parser); sd.add_arguments(parser)
    args, absl_argv = parser.parse_known_args()      every --config... is left to absl
    app.run(functools.partial(main, args=args), argv=[sys.argv[0], *absl_argv])

and in ``main``, once absl has made the configuration, ``settle(args, config)`` makes the two
agree: a port flag given (``--seed``, ``--num_generations``, ``--sampling_steps``) sets its key;
one not given takes the key's value, so the features read one namespace whatever set it.

A step is one optimizer update of upstream's inner loop (``updates_per_epoch``): an epoch samples
``sample.batch_size`` prompts x ``num_generations`` on each rank, then trains them in batches of
``train.batch_size``, an update every ``train.gradient_accumulation_steps`` batches.  The rollout
belongs to an epoch's first step.  Checkpoints are written at the end of an epoch, so
--checkpointing_steps and --max_train_steps must be multiples of the updates an epoch makes.

Self-contained: the standard library and torch; PIL, numpy and ml_collections come with the
trainer's own imports.
"""

from __future__ import annotations

import os
import time

import torch

from dancegrpo_port import reward
from dancegrpo_port.contract import SDE_WINDOW_FLAGS

# What upstream hard-codes, relative to the directory the script starts in.
MODEL_DIR = "./data/stable-diffusion-v1-4"
PROMPTS = "./assets/prompts.txt"
CHECKPOINTS = "./my_checkpoints"
LATENT_SCALE = 8  # the SD VAE's downsampling: upstream's 64x64 latents are its 512x512 images


def add_arguments(parser) -> None:
    """The SD trainer's port flags: its files, the shared GRPO vocabulary over its configuration,
    the steps and checkpoints, the reward's choices (the seam's features add theirs)."""
    parser.add_argument("--pretrained_model_name_or_path", type=str, default=MODEL_DIR,
                        help=f"the StableDiffusionPipeline directory (upstream's: {MODEL_DIR})")
    parser.add_argument("--prompt_dir", type=str, default=PROMPTS,
                        help=f"the prompt file, one prompt a line (upstream's: {PROMPTS})")
    parser.add_argument("--output_dir", type=str, default=CHECKPOINTS,
                        help=f"where the UNet checkpoints and the resume checkpoints go (upstream's: {CHECKPOINTS})")
    reward.add_arguments(parser)
    parser.add_argument("--seed", type=int, default=None, help="sets config.seed (default: the configuration's)")
    parser.add_argument("--num_generations", type=int, default=None,
                        help="sets config.num_generations (default: the configuration's)")
    parser.add_argument("--sampling_steps", type=int, default=None,
                        help="sets config.sample.num_steps, the DDIM steps (default: the configuration's)")
    parser.add_argument("--h", type=int, default=512, help="image height (upstream's 512: 64x64 latents)")
    parser.add_argument("--w", type=int, default=512, help="image width (upstream's 512)")
    parser.add_argument("--max_train_steps", type=int, default=None,
                        help="stop after this many optimizer updates, a multiple of an epoch's (default: upstream's "
                        "config.num_epochs)")
    parser.add_argument("--checkpointing_steps", type=int, default=None,
                        help="a resume checkpoint every this many updates, a multiple of an epoch's (default: none)")
    parser.add_argument("--resume_from_checkpoint", type=str, default=None,
                        help="a resume checkpoint directory, or 'latest' (in <output_dir>/resume)")
    parser.add_argument("--reward_from_jpeg", action="store_true", default=False,
                        help="score each image read back from the JPEG written to ./images_same, one at a time "
                        "(upstream's way: the reward then depends on the JPEG encoder); default: from memory")
    parser.add_argument("--reward_batch_size", type=int, default=0,
                        help="images HPSv2 scores at once (default 0: the whole rollout batch; 1: one at a time)")


def updates_per_epoch(config) -> int:
    samples = config.sample.batch_size * config.num_generations
    return samples // (config.train.batch_size * config.train.gradient_accumulation_steps) * config.train.num_inner_epochs


def settle(args, config) -> None:
    """Make the port's flags and upstream's configuration agree (see the module doc), and give
    the features the names they read (the flow trainers' flags)."""
    pairs = ((args, "seed", config, "seed"), (args, "num_generations", config, "num_generations"),
             (args, "sampling_steps", config.sample, "num_steps"))
    for a, flag, c, key in pairs:
        if getattr(a, flag) is None:
            setattr(a, flag, getattr(c, key))
        else:
            setattr(c, key, getattr(a, flag))
    args.use_group = True  # advantages are normalised within a prompt's generations
    args.init_same_noise = True  # upstream: one initial latent for every sample of a rank's epoch
    args.t = 1
    args.eta = config.sample.eta
    args.clip_range = config.train.clip_range
    args.timestep_fraction = config.train.timestep_fraction
    args.train_batch_size = config.sample.batch_size  # prompts a rank samples a step
    # samples an update takes on a rank: the shared accumulation check then says whether an
    # epoch's samples make whole updates
    args.gradient_accumulation_steps = config.train.batch_size * config.train.gradient_accumulation_steps
    args.use_hpsv2 = config.reward_fn == "hpsv2"
    args.sample_batch_size = config.train.batch_size  # upstream samples train.batch_size images at once
    args.updates_per_epoch = updates_per_epoch(config)


def argument_problem(args, config) -> str | None:
    """What the configuration and the port's flags cannot run (one line), or None."""
    window = [f"--{name} {getattr(args, name)}" for name in SDE_WINDOW_FLAGS if getattr(args, name, None) not in (None, 0)]
    if window:
        return (f"{window[0]}: the SD trainer takes no SDE window: its DDIM pipeline passes one eta to every step, "
                "its log-prob is NaN at eta = 0 (no ODE step), and its number of trained timesteps sets accelerate's "
                "gradient accumulation at start")
    if config.use_lora:
        return ("config.use_lora=True: upstream's LoRA path builds LoRAAttnProcessor(hidden_size=...), which "
                "diffusers 0.32 no longer takes; train the full UNet (the configuration's default)")
    if config.reward_fn not in ("hpsv2", "hpsv3"):
        return f"config.reward_fn={config.reward_fn!r}: upstream's SD trainer scores hpsv2 or hpsv3 only"
    if config.reward_fn == "hpsv3":
        try:
            import hpsv3  # noqa: F401
        except ImportError:
            return ("config.reward_fn='hpsv3' needs the hpsv3 package and its Qwen2-VL-7B weights, which this "
                    "environment lacks; install HPSv3 (github.com/MizzenAI/HPSv3) or use dgx.py:hpsv2")
    if args.h % LATENT_SCALE or args.w % LATENT_SCALE:
        return f"--h {args.h} --w {args.w}: the SD VAE needs multiples of {LATENT_SCALE}"
    if config.sample.batch_size < config.train.batch_size or config.sample.batch_size % config.train.batch_size:
        return (f"config.sample.batch_size {config.sample.batch_size} must be a multiple of config.train.batch_size "
                f"{config.train.batch_size} (upstream's trainer asserts it after loading every model)")
    train_samples = config.train.batch_size * config.train.gradient_accumulation_steps
    samples = config.sample.batch_size * config.num_generations
    if config.sample.batch_size * config.num_generations % config.train.batch_size or samples % train_samples:
        return (f"an epoch's {samples} samples a rank (sample.batch_size x num_generations) are not whole updates of "
                f"train.batch_size {config.train.batch_size} x train.gradient_accumulation_steps "
                f"{config.train.gradient_accumulation_steps}")
    if int((config.sample.num_steps - 1) * config.train.timestep_fraction) < 1:
        return (f"config.train.timestep_fraction {config.train.timestep_fraction} of {config.sample.num_steps} DDIM "
                "steps trains no timestep")
    per_epoch = updates_per_epoch(config)
    for flag in ("max_train_steps", "checkpointing_steps"):
        value = getattr(args, flag)
        if value is not None and (value < 1 or value % per_epoch):
            return (f"--{flag} {value} must be a positive multiple of the {per_epoch} optimizer updates an epoch "
                    "makes: the SD trainer's checkpoints are written at the end of an epoch")
    if args.reward_batch_size < 0:
        return f"--reward_batch_size {args.reward_batch_size} must be 0 (the rollout batch) or more"
    return None


def configuration_problem(args, config) -> str | None:
    """Settle the flags and the configuration, then what they cannot run (one line), or None:
    what check_arguments refuses, and what launch asks before start (with the configuration absl
    makes of its --config arguments, and the port's flags as the parser reads them)."""
    settle(args, config)
    return argument_problem(args, config)


def check_arguments(args, config) -> None:
    """Settle the flags and the configuration, then the SD trainer's own refusals, before anything
    loads (one line, exit 2)."""
    from dancegrpo_port import hooks

    hooks.refuse(configuration_problem(args, config))


def latents_dtype(mixed_precision: str):
    """The initial latents' dtype: upstream's bfloat16 under mixed precision (autocast casts them
    for the UNet), float32 without it, where upstream's bfloat16 latents meet the float32 UNet
    and the first call stops ("mat1 and mat2 must have the same dtype")."""
    return torch.float32 if mixed_precision == "no" else torch.bfloat16


def accelerator_options() -> dict:
    """Accelerator keyword arguments from the run's device: the CPU run is accelerate's cpu=True
    (else it takes the NPU or GPU it finds); the process group is the port's, already up."""
    from dancegrpo_port import device

    return {"cpu": device.accelerator().kind == "cpu"}


def epochs(loader, init_steps: int, per_epoch: int, max_train_steps: int | None, num_epochs: int):
    """Upstream's ``enumerate(loader)``, less the epochs a resume has trained (``init_steps``
    updates), and ending after --max_train_steps updates (default: upstream's rule, which runs
    epochs 0..num_epochs)."""
    first = init_steps // per_epoch
    last = max_train_steps // per_epoch - 1 if max_train_steps else num_epochs
    for epoch, prompts in enumerate(loader):
        if epoch > last:
            return
        if epoch >= first:
            yield epoch, prompts


class Steps:
    """The seam's steps of the SD loop: one optimizer update each, an epoch's first one begun at
    the epoch's start (its rollout belongs to it), the next begun where one ends, unless the
    epoch is over.  Times each step for metrics.jsonl."""

    def __init__(self, per_epoch: int, lr: float):
        self.per_epoch, self.lr, self.start = per_epoch, lr, None

    def begin(self, step: int) -> None:
        from dancegrpo_port import hooks

        self.start = time.time()
        hooks.step_begin(step)

    def end(self, step: int, loss, grad_norm) -> None:
        from dancegrpo_port import hooks

        hooks.step_end(step, loss=float(loss), grad_norm=float(grad_norm), step_time=time.time() - self.start,
                       lr=self.lr)
        if step % self.per_epoch:
            self.begin(step + 1)


def as_images(images) -> list:
    """The pipeline's float images (B, 3, H, W) in [0, 1] as upstream's PIL images: uint8 by
    truncation, resized to 512x512 (upstream's save size)."""
    import numpy as np
    from PIL import Image

    out = []
    for image in images:
        pil = Image.fromarray((image.to(torch.float32).cpu().numpy().transpose(1, 2, 0) * 255).astype(np.uint8))
        out.append(pil.resize((512, 512)))
    return out


def jpeg_round_trip(image, path: str):
    """Upstream's reward input: the image saved as JPEG and read back."""
    from PIL import Image

    image.save(path)
    with Image.open(path) as f:
        return f.convert("RGB")


def hps_rewards(args, images, captions, preprocess_val, processor, reward_model, device, names) -> torch.Tensor:
    """HPSv2 of a rollout batch, each image with its own caption: from memory, --reward_batch_size
    at a time (default the whole batch); with --reward_from_jpeg, upstream's way: each image saved
    to ./images_same/<name> as JPEG, read back and scored alone."""
    from dancegrpo_port.device import autocast

    if args.reward_from_jpeg:
        os.makedirs("./images_same", exist_ok=True)
        images = [jpeg_round_trip(im, os.path.join("./images_same", n)) for im, n in zip(images, names)]
    size = 1 if args.reward_from_jpeg else (args.reward_batch_size or len(images))
    scores = []
    for start in range(0, len(images), size):
        batch = [preprocess_val(im) for im in images[start:start + size]]
        image = torch.stack(batch).to(device=device, non_blocking=True)
        text = processor(list(captions[start:start + size])).to(device=device, non_blocking=True)
        with torch.no_grad(), autocast():
            outputs = reward_model(image, text)
            logits = outputs["image_features"] @ outputs["text_features"].T
            scores.append(torch.diagonal(logits))
    return torch.cat(scores)


def hpsv3_rewards(reward_model, images, captions, names) -> torch.Tensor:
    """HPSv3 reads image files: each image as upstream writes it (./images_same/<name>, JPEG)."""
    os.makedirs("./images_same", exist_ok=True)
    scores = []
    for image, caption, name in zip(images, captions, names):
        path = os.path.join("./images_same", name)
        image.save(path)
        score = reward_model.reward([path], [caption])
        scores.append(score[:, 0] if score.ndim == 2 else score)
    return torch.cat(scores)


def save_unet(unet, directory: str) -> None:
    """Upstream's UNet checkpoint with the config.json it names but never writes, so that
    ``UNet2DConditionModel.from_pretrained(directory)`` loads it; written to a temporary
    directory and renamed, so a crash never leaves half a checkpoint."""
    import shutil

    from safetensors.torch import save_file

    tmp = directory.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(unet.state_dict(), os.path.join(tmp, "diffusion_pytorch_model.safetensors"))
    unet.save_config(tmp)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)

