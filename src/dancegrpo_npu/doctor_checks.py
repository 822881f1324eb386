"""Data and child-process code for ``doctor``: the version table (the README's 910B table
mirrors it), the FLUX.1-dev directory layout, and the all_reduce worker."""

from __future__ import annotations

import re

MIN_PYTHON = (3, 10)

# What this series is written for.  NPU: MindSpeed-MM's known-good set for FLUX DanceGRPO as
# issue 5 gives it (torch 2.7.1 + torch_npu 2.7.1, CANN 8.2.RC1, Python 3.10).  Not run here:
# no machine of this project has an NPU.
KNOWN_GOOD = {"python": "3.10", "torch": "2.7.1", "torch_npu": "2.7.1", "cann": "8.2.RC1"}

# torch_npu wheel -> (torch, CANN): rows of Ascend's published compatibility table
# (Ascend/pytorch README, "Ascend Auxiliary Software"; gitcode.com/Ascend/pytorch), the
# releases from CANN 8.2.RC1 on.  doctor checks torch == torch_npu's torch exactly and notes
# a CANN that is not the table's.
TORCH_NPU_TABLE: tuple[tuple[str, str, str], ...] = (
    ("2.1.0.post13", "2.1.0", "8.2.RC1"),
    ("2.5.1.post1", "2.5.1", "8.2.RC1"),
    ("2.6.0", "2.6.0", "8.2.RC1"),
    ("2.1.0.post17", "2.1.0", "8.3.RC1"),
    ("2.6.0.post3", "2.6.0", "8.3.RC1"),
    ("2.7.1", "2.7.1", "8.3.RC1"),
    ("2.8.0", "2.8.0", "8.3.RC1"),
    ("2.6.0.post5", "2.6.0", "8.5.0"),
    ("2.7.1.post2", "2.7.1", "8.5.0"),
    ("2.8.0.post2", "2.8.0", "8.5.0"),
    ("2.9.0", "2.9.0", "8.5.0"),
)

# What preprocessing (the whole pipeline) and training (transformer, vae) load from FLUX.1-dev.
FLUX_LAYOUT = (
    "model_index.json",
    "transformer",
    "vae",
    "text_encoder",
    "text_encoder_2",
    "tokenizer",
    "tokenizer_2",
    "scheduler",
)


def base_version(version: str) -> str:
    """'2.7.1+cpu' -> '2.7.1'; '2.7.1.post2' -> '2.7.1'; '2.7.1rc1' -> '2.7.1'."""
    m = re.match(r"(\d+\.\d+\.\d+)", version)
    return m.group(1) if m else version


def table_row(torch_npu_version: str) -> tuple[str, str, str] | None:
    """The table's row for this torch_npu wheel (local suffix ignored), if it has one."""
    wheel = torch_npu_version.split("+")[0]
    for row in TORCH_NPU_TABLE:
        if row[0] == wheel:
            return row
    return None


# One rank of the all_reduce check, run as `python -c ALLREDUCE_WORKER BACKEND KIND` with
# RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set.  Self-contained: the child imports only torch
# (and torch_npu on NPU), as the training scripts do.
ALLREDUCE_WORKER = r"""
import os, sys
backend, kind = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
import torch
import torch.distributed as dist
if kind == "npu":
    import torch_npu  # noqa: F401
    torch.npu.set_device(rank)
    device = torch.device("npu", rank)
elif kind == "cuda":
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
else:
    device = torch.device("cpu")
dist.init_process_group(backend, rank=rank, world_size=world)
t = torch.full((1024,), float(rank + 1), device=device)
dist.all_reduce(t)
want = world * (world + 1) / 2
ok = bool((t.cpu() == want).all().item())
dist.destroy_process_group()
print("ALLREDUCE_OK" if ok else f"ALLREDUCE_WRONG {t[0].item()} != {want}", flush=True)
sys.exit(0 if ok else 1)
"""
