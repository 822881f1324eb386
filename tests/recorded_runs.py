"""Synthetic recorded runs for compare's and replay's tests: NOT written by a trainer.

They follow the alignment contract's records format (records/index.json, one safetensors file per
rank and step, modules/rank_R.{safetensors,json}) with made-up, seeded tensors of the contract's
shapes and dtypes, so that compare can be tested on exactly known differences.  The real
trainers' records are compared in tests/align/test_compare_trainers.py (slow).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

# Module outputs in execution order (a module's output exists after its children's), as the
# contract names them: model prefix / module path, the root module alone.
MODULES = (
    "transformer/pos_embed",
    "transformer/x_embedder",
    "transformer/transformer_blocks.0.norm1",
    "transformer/transformer_blocks.0.attn.0",
    "transformer/transformer_blocks.0.attn.1",
    "transformer/transformer_blocks.0",
    "transformer/proj_out",
    "transformer",
    "vae/decoder.conv_in",
    "vae/decoder.mid_block",
    "vae/decoder",
    "reward/visual.transformer",
    "reward/visual",
    "reward.image_features",  # an item of the root module's (dict) output
)


def index(**over) -> dict:
    base = {
        "format": 1, "script": "train_grpo_flux.py", "world_size": 1, "rng": "cpu", "seed": 42,
        "h": 16, "w": 16, "t": 1, "num_generations": 2, "sampling_steps": 3, "init_same_noise": True,
        "eta": 0.3, "clip_range": 0.0001, "timestep_fraction": 0.6, "replayed_from": None,
        "steps": [1, 2], "modules": False,
    }  # fmt: skip
    base.update(over)
    return base


def step_tensors(idx: dict, step: int, rank: int) -> dict[str, np.ndarray]:
    """One rank's tensors of one step, seeded by (step, rank): two runs made alike are bit-equal."""
    rng = np.random.default_rng(1000 * step + rank)
    b, s, g = idx["num_generations"], idx["sampling_steps"], idx["num_generations"]
    lh, lw = idx["h"] // 8, idx["w"] // 8
    tokens = (lh // 2) * (lw // 2)
    t = max(1, int(s * idx["timestep_fraction"]))
    f32 = np.float32
    out = {
        "noise.init": rng.standard_normal((1 if idx["init_same_noise"] else b, 16, lh, lw)).astype(f32),
        "noise.sde": rng.standard_normal((b, s, tokens, 64)).astype(f32),
        "noise.perms": np.stack([rng.permutation(s - 1) for _ in range(b)]).astype(np.int64),
        "latents": rng.standard_normal((b, s + 1, tokens, 64)).astype(f32),
        "log_probs": (rng.standard_normal((b, s)) - 1.5).astype(f32),
        "images": rng.integers(0, 256, (b, idx["h"], idx["w"], 3), dtype=np.uint8),
        "rewards": rng.uniform(0.2, 0.4, b).astype(f32),
        "advantages": rng.standard_normal(b).astype(f32),
        "train.log_prob": (rng.standard_normal((b, t)) - 1.5).astype(f32),
        "train.old_log_prob": (rng.standard_normal((b, t)) - 1.5).astype(f32),
        "train.ratio": (1 + 1e-6 * rng.standard_normal((b, t))).astype(f32),
        "train.loss": (0.1 * rng.standard_normal((b, t))).astype(f32),
        "grad_norm": rng.uniform(0.5, 2.0, 2).astype(f32),
    }
    assert g == b
    return out


def module_tensors(rank: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(77 + rank)
    return {name: rng.standard_normal((2, 8)).astype(np.float32) for name in MODULES}


Perturb = Callable[[int, int, dict], None]  # (step, rank, tensors) -> edits tensors in place


def make_run(
    runs_dir: Path,
    name: str,
    *,
    perturb: Perturb | None = None,
    perturb_modules: Callable[[int, dict], None] | None = None,
    metrics: bool = True,
    **index_over,
) -> Path:
    """runs/<name>/ with launch.json, summary.json, metrics.jsonl and records/ per the contract."""
    from safetensors.numpy import save_file

    run = runs_dir / name
    (run / "records").mkdir(parents=True)
    idx = index(**index_over)
    (run / "launch.json").write_text(json.dumps({"script": "flux", "world_size": idx["world_size"]}))
    (run / "summary.json").write_text(json.dumps({"status": "succeeded", "world_size": idx["world_size"]}))
    for step in idx["steps"]:
        for rank in range(idx["world_size"]):
            tensors = step_tensors(idx, step, rank)
            if perturb:
                perturb(step, rank, tensors)
            path = run / "records" / f"step_{step:06d}" / f"rank_{rank}.safetensors"
            path.parent.mkdir(exist_ok=True)
            save_file(tensors, str(path))
    if idx["modules"]:
        (run / "records" / "modules").mkdir()
        for rank in range(idx["world_size"]):
            tensors = module_tensors(rank)
            if perturb_modules:
                perturb_modules(rank, tensors)
            save_file(tensors, str(run / "records" / "modules" / f"rank_{rank}.safetensors"))
            (run / "records" / "modules" / f"rank_{rank}.json").write_text(json.dumps({"order": list(MODULES)}))
    if metrics:
        with open(run / "metrics.jsonl", "w") as f:
            for step in idx["steps"]:
                f.write(json.dumps({"step": step, "loss": 0.1 / step, "grad_norm": 1.0 + step, "reward_mean": 0.3,
                                    "step_time": 1.0, "lr": 1e-5, "clip_frac": 0.0, "logprob_diff_max": 0.0}) + "\n")
    (run / "records" / "index.json").write_text(json.dumps(idx))
    return run
