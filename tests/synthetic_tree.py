"""A synthetic dancegrpo-npu project for the launcher's tests: NOT upstream code.

The real patched tree and the tiny models come from other parts of the project (and the real
tiny launch is ``dancegrpo-npu smoke``).  Here a stand-in ``fastvideo/train_grpo_flux.py``
does what the launcher depends on and nothing else: it runs under torchrun, reads the
environment launch sets, and writes what upstream's trainer writes in its working directory
(``reward.txt``, ``images/*.png``) plus contract 4's ``metrics.jsonl`` and allow-tf32-hf32.patch's
``matmul_precision.json``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from projects import write_project

REPO = Path(__file__).resolve().parents[1]

FAKE_TRAINER = textwrap.dedent(
    '''\
    """FAKE train_grpo_flux.py from dancegrpo-npu's tests (synthetic_tree.py); not upstream's."""
    import argparse, json, os, struct, sys, zlib

    import fastvideo.synthetic_marker  # importable only through PYTHONPATH = the tree

    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--output_dir")
    p.add_argument("--max_train_steps", type=int, default=3)
    p.add_argument("--fail_rank", type=int, default=-1)
    args, _unknown = p.parse_known_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    total = None
    if os.environ.get("SYNTHETIC_ALLREDUCE") == "1":  # a real collective over torchrun's rendezvous
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        total = t.item()
        dist.destroy_process_group()

    if rank == 0:  # as the patched trainers' main() does first (allow-tf32-hf32.patch)
        with open("matmul_precision.json", "w") as f:
            json.dump({"device": os.environ.get("DANCEGRPO_DEVICE"), "allow_tf32": True}, f)

    seen = {k: os.environ.get(k) for k in (
        "DANCEGRPO_DEVICE", "DANCEGRPO_NPU_STRICT", "WANDB_MODE", "PYTHONPATH", "LOCAL_RANK", "MASTER_PORT",
        "SYNTHETIC_EXTRA")}
    with open(f"seen-rank{rank}.json", "w") as f:
        json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": seen, "world": world, "allreduce": total}, f)
    print(f"synthetic trainer rank {rank}/{world} started", flush=True)
    if rank == args.fail_rank:
        print("Traceback (most recent call last):", file=sys.stderr)
        print("RuntimeError: synthetic failure on purpose", file=sys.stderr, flush=True)
        sys.exit(3)

    def png(path, w=4, h=4):
        raw = b"".join(b"\\x00" + bytes([200, 30, 30] * w) for _ in range(h))
        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        with open(path, "wb") as f:
            f.write(b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))

    png(f"./images/flux_{rank}_0.png")  # upstream writes here and does not create ./images
    if rank == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "checkpoint.txt"), "w") as f:
            f.write("synthetic")
        for step in range(1, args.max_train_steps + 1):
            reward = 0.2 + 0.01 * step
            with open("./reward.txt", "a") as f:
                f.write(f"{reward}\\n")
            with open("./metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "loss": 1.0 / step, "grad_norm": 0.5, "reward_mean": reward,
                                    "step_time": 0.1, "lr": 1e-5}) + "\\n")
    '''
)


# Synthetic launch scripts in upstream's layout (scripts/finetune/finetune_flux_grpo*.sh), with
# made-up values: launch reads its recipes from such files.  Name -> (file, torchrun options,
# trainer, trainer arguments).
SYNTHETIC_RECIPES = {
    "8gpus": ("finetune_flux_grpo_8gpus.sh", "--nproc_per_node=8 --master_port 19002", "train_grpo_flux.py",
              "--seed 7 --pretrained_model_name_or_path data/flux --vae_model_path data/flux "
              "--data_json_path data/rl_embeddings/videos2caption.json --gradient_checkpointing "
              "--train_batch_size 2 --train_sp_batch_size 2 --gradient_accumulation_steps 12 --num_generations 12 "
              "--use_group --max_grad_norm 0.01 --output_dir data/outputs/grpo --h 720 --w 720 --sampling_steps 16 "
              "--max_train_steps 300 --use_ema --init_same_noise"),
    "2nodes": ("finetune_flux_grpo.sh", "--nnodes=2 --nproc_per_node=8 --node_rank=0 --master_addr=192.168.0.9 "
               "--master_port=29500", "train_grpo_flux.py",
               "--seed 7 --pretrained_model_name_or_path data/flux --vae_model_path data/flux "
               "--data_json_path data/rl_embeddings/videos2caption.json --train_batch_size 1 "
               "--train_sp_batch_size 1 --gradient_accumulation_steps 4 --num_generations 12 --use_group "
               "--max_grad_norm 1.0 --output_dir data/outputs/grpo"),
    "8gpus-lora": ("finetune_flux_grpo_8gpus_lora.sh", "--nproc_per_node=8 --master_port 19002",
                   "train_grpo_flux_lora.py",
                   "--seed 7 --pretrained_model_name_or_path data/flux --data_json_path "
                   "data/rl_embeddings/videos2caption.json --train_batch_size 2 --gradient_accumulation_steps 12 "
                   "--num_generations 12 --use_group --lora_rank 8"),
}


def write_recipes(tree: Path) -> None:
    (tree / "scripts" / "finetune").mkdir(parents=True, exist_ok=True)
    for file, torchrun, trainer, args in SYNTHETIC_RECIPES.values():
        words = " \\\n    ".join(args.replace(" --", "\n--").splitlines())
        (tree / "scripts" / "finetune" / file).write_text(
            f"# synthetic\nmkdir images\ntorchrun {torchrun} \\\n    fastvideo/{trainer} \\\n    {words}\n"
        )


def recipe_args(name: str) -> list[str]:
    return SYNTHETIC_RECIPES[name][3].split()


def write_weights(flux: Path) -> None:
    """A FLUX.1-dev directory in diffusers' layout, with stand-in files."""
    (flux / "model_index.json").parent.mkdir(parents=True, exist_ok=True)
    (flux / "model_index.json").write_text("{}")
    for model in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        (flux / model).mkdir(parents=True, exist_ok=True)
        (flux / model / "config.json").write_text("{}")
        (flux / model / "model.safetensors").write_bytes(b"synthetic")
    for tok in ("tokenizer", "tokenizer_2"):
        (flux / tok).mkdir(exist_ok=True)
        (flux / tok / "tokenizer_config.json").write_text("{}")


def make_project(root: Path, *, weights: bool = True) -> Path:
    """A project directory (``projects.write_project``: the real lock, no patch) with a
    synthetic patched tree at build/DanceGRPO."""
    write_project(root, REPO / "upstream.lock")
    tree = root / "build" / "DanceGRPO"
    (tree / "fastvideo" / "data_preprocess").mkdir(parents=True, exist_ok=True)
    (tree / "fastvideo" / "__init__.py").write_text("")
    (tree / "fastvideo" / "synthetic_marker.py").write_text("# synthetic test tree\n")
    for rel in ("train_grpo_flux.py", "train_grpo_flux_lora.py", "data_preprocess/preprocess_flux_embedding.py"):
        (tree / "fastvideo" / rel).write_text(FAKE_TRAINER)
    write_recipes(tree)
    if weights:
        write_weights(tree / "data" / "flux")
        # FLUX's dataset where launch's trainers read it (run.datasets), and upstream's shared one
        for data in (tree / "data" / "rl_embeddings" / "flux", tree / "data" / "rl_embeddings"):
            data.mkdir(parents=True, exist_ok=True)
            (data / "videos2caption.json").write_text('[{"caption": "a cat"}]')
        (tree / "hps_ckpt").mkdir(exist_ok=True)
        (tree / "hps_ckpt" / "open_clip_pytorch_model.bin").write_bytes(b"synthetic")
        (tree / "hps_ckpt" / "HPS_v2.1_compressed.pt").write_bytes(b"synthetic")
        (tree / "assets").mkdir(exist_ok=True)
        (tree / "assets" / "prompts.txt").write_text("a cat\n")
    return root


def trust_synthetic_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's verify compares a tree with the real lock; a synthetic tree never matches.

    Tests of the launcher therefore replace only the verdict, keeping the presence checks; the
    verify path itself is tested separately (test_launch.py, fake status module).
    """
    from dancegrpo_npu.engine import treecheck

    real = treecheck.tree_state

    def synthetic_state(project, script_relpath=None):
        state = real(project, script_relpath)
        if state["state"] == "missing":
            return state
        return {"state": "verified", "detail": "synthetic test tree (verdict replaced by the test)"}

    monkeypatch.setattr(treecheck, "tree_state", synthetic_state)
