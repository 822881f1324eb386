"""Autocast on the chosen device.

Upstream writes ``torch.autocast("cuda")``, which silently disables itself for CPU tensors: bf16
activations then meet fp32 weights.  The trainers' autocast blocks take the run's device here.
"""

from __future__ import annotations

import torch

from dancegrpo_port.device.choice import accelerator


def autocast(dtype: torch.dtype | None = None, enabled: bool = True):
    """``torch.autocast`` on this device (``torch.autocast("cuda")`` silently
    disables itself for CPU tensors, and bf16 activations then meet fp32 weights)."""
    if dtype is None:
        return torch.autocast(accelerator().autocast_device_type, enabled=enabled)
    return torch.autocast(accelerator().autocast_device_type, dtype=dtype, enabled=enabled)
