"""Qwen-Image's rotary position embedding, real-valued: cos/sin tables, no complex tensor.

Added to the upstream tree by dancegrpo-npu (overlay).  diffusers' (>= 0.35)
``QwenEmbedRope`` builds its frequency tables with ``torch.polar`` (complex64, in
``__init__``), and ``apply_rotary_emb_qwen(use_real=False)`` rotates queries and keys with
``view_as_complex`` and a complex product: four calls a block, 60 blocks.  The Ascend NPU
runs complex64 slowly if at all, and strict mode stops on it.  The rotation of a pair
``(x0, x1)`` by the angle ``a`` is ``(x0 cos a - x1 sin a, x0 sin a + x1 cos a)``: the same
products in float32 on real tensors.  On the CPU in float32 the real form equals the
complex one within 1e-6 (tests/overlay/test_qwen_rope.py).

:func:`install_real_rope` must run before the transformer is built (the complex tables are
made in ``QwenEmbedRope.__init__``): it replaces, in diffusers' module, ``QwenEmbedRope`` by
:class:`RealQwenEmbedRope` and ``apply_rotary_emb_qwen`` by :func:`apply_rotary_emb_qwen`,
which the attention processor looks up there at each call.  The new function takes the
real path for the tables this module makes and hands anything else to diffusers' own, so
a model built before the install keeps working unchanged.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
from torch import nn

MAX_POSITIONS = 4096  # diffusers' table length (positive and negative indices)


class RotaryTables(NamedTuple):
    """Per token: the cosines and sines of its angles, each ``[S, D // 2]`` float32."""

    cos: torch.Tensor
    sin: torch.Tensor

    def to(self, device) -> "RotaryTables":
        return RotaryTables(self.cos.to(device), self.sin.to(device))


def _angles(index: torch.Tensor, dim: int, theta: float) -> torch.Tensor:
    """diffusers' ``rope_params`` before ``torch.polar``: the same float32 arithmetic."""
    if dim % 2:
        raise ValueError(f"RoPE axis dimension must be even, got {dim}")
    return torch.outer(index, 1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float32).div(dim)))


class RealQwenEmbedRope(nn.Module):
    """Drop-in for ``diffusers...transformer_qwenimage.QwenEmbedRope``: the same constructor
    and ``forward(video_fhw, txt_seq_lens, device) -> (image tables, text tables)``, the
    tables as :class:`RotaryTables` instead of complex tensors."""

    def __init__(self, theta: int, axes_dim: Sequence[int], scale_rope: bool = False):
        super().__init__()
        self.theta = theta
        self.axes_dim = list(axes_dim)
        self.scale_rope = scale_rope
        pos_index = torch.arange(MAX_POSITIONS)
        neg_index = torch.arange(MAX_POSITIONS).flip(0) * -1 - 1
        # Plain tensors, not buffers: a buffer would be cast with the model (bf16) and lose precision.
        self.pos_angles = torch.cat([_angles(pos_index, d, theta) for d in self.axes_dim], dim=1)
        self.neg_angles = torch.cat([_angles(neg_index, d, theta) for d in self.axes_dim], dim=1)
        self._cache: dict[tuple, RotaryTables] = {}

    def _video_angles(self, frame: int, height: int, width: int, idx: int) -> torch.Tensor:
        """diffusers' ``_compute_video_freqs`` on the angles."""
        split = [d // 2 for d in self.axes_dim]
        pos = self.pos_angles.split(split, dim=1)
        neg = self.neg_angles.split(split, dim=1)
        frames = pos[0][idx : idx + frame].view(frame, 1, 1, -1).expand(frame, height, width, -1)
        if self.scale_rope:
            rows = torch.cat([neg[1][-(height - height // 2) :], pos[1][: height // 2]], dim=0)
            cols = torch.cat([neg[2][-(width - width // 2) :], pos[2][: width // 2]], dim=0)
        else:
            rows, cols = pos[1][:height], pos[2][:width]
        rows = rows.view(1, height, 1, -1).expand(frame, height, width, -1)
        cols = cols.view(1, 1, width, -1).expand(frame, height, width, -1)
        return torch.cat([frames, rows, cols], dim=-1).reshape(frame * height * width, -1)

    def _tables(self, key: tuple, make) -> RotaryTables:
        if key not in self._cache:
            angles = make()
            self._cache[key] = RotaryTables(angles.cos().contiguous(), angles.sin().contiguous())
        return self._cache[key]

    def forward(self, video_fhw, txt_seq_lens, device):
        if isinstance(video_fhw, list):
            video_fhw = video_fhw[0]
        if not isinstance(video_fhw, list):
            video_fhw = [video_fhw]
        device = torch.device(device)
        video, max_vid_index = [], 0
        for idx, (frame, height, width) in enumerate(video_fhw):
            video.append(self._tables(("video", idx, frame, height, width, device),
                                      lambda: self._video_angles(frame, height, width, idx).to(device)))
            if self.scale_rope:
                max_vid_index = max(height // 2, width // 2, max_vid_index)
            else:
                max_vid_index = max(height, width, max_vid_index)
        max_len = max(txt_seq_lens)
        text = self._tables(("text", max_vid_index, max_len, device),
                            lambda: self.pos_angles[max_vid_index : max_vid_index + max_len].to(device))
        image = RotaryTables(torch.cat([t.cos for t in video]), torch.cat([t.sin for t in video]))
        return image, text


_diffusers_apply = None  # diffusers' apply_rotary_emb_qwen, kept for tables it made itself


def apply_rotary_emb_qwen(x: torch.Tensor, freqs_cis, use_real: bool = True, use_real_unbind_dim: int = -1):
    """Rotate ``x`` ``[B, S, H, D]`` by :class:`RotaryTables`; anything else goes to diffusers."""
    if not isinstance(freqs_cis, RotaryTables):
        return _diffusers_apply(x, freqs_cis, use_real=use_real, use_real_unbind_dim=use_real_unbind_dim)
    cos = freqs_cis.cos.to(x.device)[:, None, :]  # [S, 1, D/2]: broadcast over the heads
    sin = freqs_cis.sin.to(x.device)[:, None, :]
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(3)
    return out.type_as(x)


def install_real_rope() -> None:
    """Make diffusers' Qwen-Image transformer build and apply the real-valued RoPE (idempotent).

    Call before ``QwenImageTransformer2DModel.from_pretrained``."""
    global _diffusers_apply
    from diffusers.models.transformers import transformer_qwenimage as module

    if module.apply_rotary_emb_qwen is not apply_rotary_emb_qwen:
        _diffusers_apply = module.apply_rotary_emb_qwen
        module.apply_rotary_emb_qwen = apply_rotary_emb_qwen
    module.QwenEmbedRope = RealQwenEmbedRope
