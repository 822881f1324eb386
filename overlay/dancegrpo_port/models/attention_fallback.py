"""``flash_attn_no_pad``'s contract without flash_attn: NPU fusion attention or SDPA.

Added to the upstream tree by dancegrpo-npu (overlay).  Upstream's
``fastvideo.models.flash_attn_no_pad`` unpads a packed ``qkv`` with a key padding
mask, runs flash_attn's varlen kernel and pads the result back.  flash_attn is a
CUDA-only package; the patched ``flash_attn_no_pad`` keeps that path where flash_attn
is installed and the tensors are on CUDA, and otherwise calls
:func:`padded_qkv_attention` here, which keeps the same contract:

* in:  ``qkv`` ``[batch, seqlen, 3, heads, head_dim]``, ``key_padding_mask``
  ``[batch, seqlen]`` (bool, True = a real token);
* out: ``[batch, seqlen, heads, head_dim]``; real tokens attend to the real tokens
  of their own sequence only (and, with ``causal``, to those not after them);
  padded positions are zero, as ``pad_input`` leaves them.

On an NPU it uses ``torch_npu.npu_fusion_attention`` (layout BSND, a boolean mask
where True means "masked out"); elsewhere
``torch.nn.functional.scaled_dot_product_attention`` (True means "attend").
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F


def _check(qkv: torch.Tensor, key_padding_mask: torch.Tensor) -> None:
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must be [batch, seqlen, 3, heads, head_dim], got {tuple(qkv.shape)}")
    if tuple(key_padding_mask.shape) != tuple(qkv.shape[:2]):
        raise ValueError(
            f"key_padding_mask must be [batch, seqlen] = {tuple(qkv.shape[:2])}, got {tuple(key_padding_mask.shape)}")


def _allowed(key_padding_mask: torch.Tensor, causal: bool) -> torch.Tensor:
    """[batch, 1, seqlen_q, seqlen_k] bool: True where query i may attend key j."""
    keep = key_padding_mask.bool()
    allowed = keep[:, None, None, :]
    if causal:
        seqlen = keep.shape[1]
        lower = torch.ones(seqlen, seqlen, dtype=torch.bool, device=keep.device).tril()
        allowed = allowed & lower
    return allowed


def _zero_padded(out: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
    # torch.where, not a product: a query with no key to attend to yields NaN in SDPA.
    keep = key_padding_mask.bool()[:, :, None, None]
    return torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))


def sdpa_attention(qkv, key_padding_mask, causal=False, dropout_p=0.0, softmax_scale=None):
    _check(qkv, key_padding_mask)
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # [b, h, s, d]
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=_allowed(key_padding_mask, causal), dropout_p=dropout_p, scale=softmax_scale)
    return _zero_padded(out.transpose(1, 2), key_padding_mask)


def npu_fusion_attention(qkv, key_padding_mask, causal=False, dropout_p=0.0, softmax_scale=None):
    _check(qkv, key_padding_mask)
    torch_npu = importlib.import_module("torch_npu")
    q, k, v = qkv.unbind(dim=2)  # [b, s, h, d] = BSND
    batch, seqlen, _, heads, head_dim = qkv.shape
    scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    # The kernel takes a full [B, 1, S, S] mask (no broadcasting), True = masked out.
    masked = ~_allowed(key_padding_mask, causal).expand(batch, 1, seqlen, seqlen)
    out = torch_npu.npu_fusion_attention(
        q, k, v, heads, "BSND",
        atten_mask=masked.contiguous(),
        scale=scale,
        keep_prob=1.0 - dropout_p,
    )[0]
    return _zero_padded(out, key_padding_mask)


def padded_qkv_attention(qkv, key_padding_mask, causal=False, dropout_p=0.0, softmax_scale=None):
    """``flash_attn_no_pad``'s contract on whatever device ``qkv`` lives on."""
    impl = npu_fusion_attention if qkv.device.type == "npu" else sdpa_attention
    return impl(qkv, key_padding_mask, causal=causal, dropout_p=dropout_p, softmax_scale=softmax_scale)
