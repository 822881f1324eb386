"""Wan2.1's rotary position embedding with float32 tables: no float64 anywhere.

Added to the upstream tree by dancegrpo-npu (overlay).  diffusers' ``WanRotaryPosEmbed``
(0.33 on) builds its cos/sin tables with float64 ops on every device but mps; 0.35.0 then
casts them to float32 buffers (measured: they stay float32 after ``from_pretrained`` with
bf16 or float32), a version that keeps the float64 result runs float64 slices and products in
every forward, which the Ascend NPU has no kernels for, and strict mode stops at the float64
ops either way.  :class:`Float32WanRotaryPosEmbed` keeps the same tables as float32,
each value computed in double precision by Python's ``math`` and rounded once (within 6e-8 of
diffusers' float64 table, tested), so no float64 op runs at all, not even at construction.  Its
forward is diffusers' (0.35.0).  The tables are plain tensors, not buffers: a buffer would be
cast with the model (``.to(bfloat16)``, FSDP's ``buffer_dtype``) and lose the float32 precision.

:func:`use_float32_rope` puts it in ``diffusers.models.transformers.transformer_wan`` so that
``WanTransformer3DModel`` builds it; the patched trainer calls it before ``from_pretrained``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dancegrpo_port.models.flux_rope import inverse_frequencies


def rope_table(dim: int, max_seq_len: int, theta: float) -> tuple[list[list[float]], list[list[float]]]:
    """diffusers' ``get_1d_rotary_pos_embed(dim, arange(max_seq_len), theta, use_real=True,
    repeat_interleave_real=True)`` in double precision: (cos, sin), each [max_seq_len][dim]."""
    inv = inverse_frequencies(dim, theta)
    cos = [[math.cos(p * f) for f in inv for _ in (0, 1)] for p in range(max_seq_len)]
    sin = [[math.sin(p * f) for f in inv for _ in (0, 1)] for p in range(max_seq_len)]
    return cos, sin


class Float32WanRotaryPosEmbed(nn.Module):
    """Drop-in for ``diffusers.models.transformers.transformer_wan.WanRotaryPosEmbed``: the same
    constructor and ``forward(hidden_states) -> (cos, sin)``, each [1, seq, 1, head_dim] float32."""

    def __init__(self, attention_head_dim: int, patch_size, max_seq_len: int, theta: float = 10000.0):
        super().__init__()
        self.attention_head_dim = attention_head_dim
        self.patch_size = patch_size
        self.max_seq_len = max_seq_len
        h_dim = w_dim = 2 * (attention_head_dim // 6)
        t_dim = attention_head_dim - h_dim - w_dim
        cos, sin = [], []
        for dim in (t_dim, h_dim, w_dim):
            c, s = rope_table(dim, max_seq_len, theta)
            cos.append(torch.tensor(c, dtype=torch.float32))
            sin.append(torch.tensor(s, dtype=torch.float32))
        self._tables = {"cpu": (torch.cat(cos, dim=1), torch.cat(sin, dim=1))}

    def _tables_on(self, device: torch.device):
        key = str(device)
        if key not in self._tables:
            cos, sin = self._tables["cpu"]
            self._tables[key] = (cos.to(device), sin.to(device))
        return self._tables[key]

    @property
    def freqs_cos(self) -> torch.Tensor:
        return self._tables["cpu"][0]

    @property
    def freqs_sin(self) -> torch.Tensor:
        return self._tables["cpu"][1]

    def forward(self, hidden_states: torch.Tensor):
        batch_size, num_channels, num_frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.patch_size
        ppf, pph, ppw = num_frames // p_t, height // p_h, width // p_w
        split_sizes = [
            self.attention_head_dim - 2 * (self.attention_head_dim // 3),
            self.attention_head_dim // 3,
            self.attention_head_dim // 3,
        ]
        table_cos, table_sin = self._tables_on(hidden_states.device)
        out = []
        for table in (table_cos, table_sin):
            f, h, w = table.split(split_sizes, dim=1)
            parts = [
                f[:ppf].view(ppf, 1, 1, -1).expand(ppf, pph, ppw, -1),
                h[:pph].view(1, pph, 1, -1).expand(ppf, pph, ppw, -1),
                w[:ppw].view(1, 1, ppw, -1).expand(ppf, pph, ppw, -1),
            ]
            out.append(torch.cat(parts, dim=-1).reshape(1, ppf * pph * ppw, 1, -1))
        return out[0], out[1]


def use_float32_rope() -> None:
    """From now on, ``WanTransformer3DModel`` builds its RoPE with float32 tables."""
    from diffusers.models.transformers import transformer_wan

    transformer_wan.WanRotaryPosEmbed = Float32WanRotaryPosEmbed
