"""The arguments the smokes of the trainers of upstream's shared argparse pass: upstream's GRPO
recipe shrunk to 64x64, one latent frame, 4 sampling steps, on tiny models and the HPS fixture.

The trainers whose argparse is a near-copy of one another take the same flags; what differs (the
step count, the checkpoint interval, a CFG) is each trainer's own, in its family's smoke hooks
(``trainers/<family>/smoke.py``).
"""
from __future__ import annotations

from pathlib import Path


def shrunk_recipe(model_dir: Path, data_json: Path, hps, generations: int, max_train_steps: int,
                  checkpointing_steps: int) -> list[str]:
    """``hps``: the HPS fixture (``hps_model_config``, ``hps_open_clip_ckpt``, ``hps_ckpt``)."""
    return [
        "--seed", "42",
        "--pretrained_model_name_or_path", str(model_dir),
        "--vae_model_path", str(model_dir),
        "--data_json_path", str(data_json),
        "--use_hpsv2",
        "--hps_model", str(hps.hps_model_config),
        "--hps_open_clip_ckpt", str(hps.hps_open_clip_ckpt),
        "--hps_ckpt", str(hps.hps_ckpt),
        "--gradient_checkpointing",
        "--train_batch_size", "1",
        "--num_latent_t", "1",
        "--sp_size", "1",
        "--train_sp_batch_size", "1",
        "--dataloader_num_workers", "0",
        # Each rank trains train_batch_size (1) x generations samples a step and steps the
        # optimizer every gradient_accumulation_steps of them (the seam refuses at start a count
        # that does not divide a step's samples): one update a step, on the whole group.
        "--gradient_accumulation_steps", str(generations),
        "--max_train_steps", str(max_train_steps),
        "--learning_rate", "1e-3",
        "--mixed_precision", "bf16",
        "--checkpointing_steps", str(checkpointing_steps),
        "--cfg", "0.0",
        "--h", "64", "--w", "64", "--t", "1",
        "--sampling_steps", "4",
        "--eta", "0.3",
        "--lr_warmup_steps", "0",
        "--sampler_seed", "1223627",
        "--max_grad_norm", "1.0",
        "--weight_decay", "0.0001",
        "--num_generations", str(generations),
        "--shift", "3",
        "--use_group",
        "--ignore_last",
        "--timestep_fraction", "0.6",
        "--init_same_noise",
        "--clip_range", "1e-4",
        "--adv_clip_max", "5.0",
    ]  # fmt: skip
