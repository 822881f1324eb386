"""Float32 matmul precision as upstream's recipe assumes it: TF32 on CUDA, its NPU counterpart
HF32 on the NPU (allow-tf32-hf32.patch), written down by rank 0 for the run's record."""

from __future__ import annotations

import json
import os

import torch

from dancegrpo_port.device.choice import accelerator

MATMUL_RECORD = "matmul_precision.json"  # rank 0 writes it in the working directory (the run directory)


def allow_tf32(flag: bool = True, record: str | None = MATMUL_RECORD) -> dict:
    """TF32 for float32 matmuls and convolutions on CUDA, and its NPU counterpart, HF32.

    Upstream's recipe sets ``torch.backends.cuda.matmul.allow_tf32 = True``; transfer_to_npu
    does not carry that switch over, so on the NPU float32 matmuls would run at full float32
    while the CUDA recipe runs them in TF32.  torch_npu's documented switches
    ``torch.npu.matmul.allow_hf32`` (default False, "like torch.backends.cuda.matmul.allow_tf32")
    and ``torch.npu.conv.allow_hf32`` (default True, "like torch.backends.cudnn.allow_tf32")
    are set to ``flag`` on the NPU.  Returns the switches as read back after setting them;
    rank 0 (``RANK``, default 0) also writes them to ``record`` (JSON), for the run's record.
    """
    torch.backends.cuda.matmul.allow_tf32 = flag
    torch.backends.cudnn.allow_tf32 = flag
    kind = accelerator().kind
    settings = {
        "device": kind,
        "allow_tf32": flag,
        "torch.backends.cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "torch.backends.cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "torch.npu.matmul.allow_hf32": None,  # None: not an NPU run, left alone
        "torch.npu.conv.allow_hf32": None,
        "torch.nn.GELU": accelerator().gelu,  # the op the reward's GELU ran (DANCEGRPO_NPU_GELU)
        "diffusers GEGLU": accelerator().geglu,  # and diffusers' GEGLU (the same variable)
    }
    if kind == "npu":
        torch.npu.matmul.allow_hf32 = flag
        torch.npu.conv.allow_hf32 = flag
        settings["torch.npu.matmul.allow_hf32"] = bool(torch.npu.matmul.allow_hf32)
        settings["torch.npu.conv.allow_hf32"] = bool(torch.npu.conv.allow_hf32)
    if record and int(os.environ.get("RANK", "0")) == 0:
        with open(record, "w") as f:
            json.dump(settings, f, indent=1)
            f.write("\n")
    return settings
