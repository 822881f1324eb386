"""FLUX's rotary position embedding in float32, real-valued: no float64, no complex.

Added to the upstream tree by dancegrpo-npu (overlay).  diffusers 0.32's
``FluxPosEmbed`` builds the RoPE tables in float64 on every device but mps
(``freqs_dtype = torch.float64``, 54 float64 ops a call for FLUX's three axes); the
Ascend NPU has no float64 kernels.  :class:`Float32FluxPosEmbed` computes the same
``(cos, sin)`` tables in float32: the inverse frequencies are computed in Python
(double precision) and rounded once, and the angles ``pos * inv_freq`` are formed in
float32.  For FLUX-sized ids (64x64 latent grid + 512 text ids, axes (16, 56, 56),
theta 10000) it stays within 1e-5 of diffusers' float64 result (tested).

:func:`install_float32_rope` swaps it into a loaded ``FluxTransformer2DModel``;
the patched trainers call it right after ``from_pretrained``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def inverse_frequencies(dim: int, theta: float) -> list[float]:
    """``1 / theta ** (2i / dim)`` for i < dim/2, in double precision (Python floats)."""
    if dim % 2:
        raise ValueError(f"RoPE axis dimension must be even, got {dim}")
    return [1.0 / (theta ** (i / dim)) for i in range(0, dim, 2)]


class Float32FluxPosEmbed(nn.Module):
    """Drop-in for ``diffusers.models.embeddings.FluxPosEmbed`` (same attributes,
    same ``forward(ids) -> (cos, sin)``, each ``[S, sum(axes_dim)]`` float32)."""

    def __init__(self, theta: int, axes_dim: Sequence[int]):
        super().__init__()
        self.theta = theta
        self.axes_dim = list(axes_dim)
        freqs = [f for dim in self.axes_dim for f in inverse_frequencies(dim, theta)]
        axes = [axis for axis, dim in enumerate(self.axes_dim) for _ in range(dim // 2)]
        # Plain tensors, not buffers: a buffer would be cast with the model
        # (FSDP's buffer_dtype, .to(bfloat16)) and lose the float32 precision.
        self._tables = {"cpu": (torch.tensor(freqs, dtype=torch.float32), torch.tensor(axes))}

    def _tables_on(self, device: torch.device):
        key = str(device)
        if key not in self._tables:
            inv_freq, axes = self._tables["cpu"]
            self._tables[key] = (inv_freq.to(device), axes.to(device))
        return self._tables[key]

    def forward(self, ids: torch.Tensor):
        if ids.shape[-1] != len(self.axes_dim):
            raise ValueError(f"ids have {ids.shape[-1]} axes, RoPE has {len(self.axes_dim)}")
        pos = ids.float()
        inv_freq, axes = self._tables_on(ids.device)
        # Each axis' positions against its own frequencies, concatenated as diffusers does.
        angles = pos[:, axes] * inv_freq  # [S, sum(axes_dim) / 2], float32
        cos = angles.cos().repeat_interleave(2, dim=1)
        sin = angles.sin().repeat_interleave(2, dim=1)
        return cos, sin


def install_float32_rope(transformer: nn.Module) -> nn.Module:
    """Replace ``transformer.pos_embed`` (a FluxPosEmbed) by :class:`Float32FluxPosEmbed`.

    Returns the transformer.  A transformer without a FLUX-style ``pos_embed``
    is an error: the caller meant a FLUX model.
    """
    old = getattr(transformer, "pos_embed", None)
    if old is None or not hasattr(old, "axes_dim") or not hasattr(old, "theta"):
        raise TypeError(f"{type(transformer).__name__} has no FLUX pos_embed (theta, axes_dim) to replace")
    if not isinstance(old, Float32FluxPosEmbed):
        transformer.pos_embed = Float32FluxPosEmbed(theta=old.theta, axes_dim=old.axes_dim)
    return transformer
