"""``flash_attn_no_pad``'s contract without flash_attn: varlen NPU fusion attention, or SDPA per sequence.

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

Neither path builds a ``[batch, 1, seqlen, seqlen]`` mask: at HunyuanVideo's 480x480x53
(seqlen 12,856) that mask is 165 MB a call, in each of the 60 blocks.

* On an NPU: ``torch_npu.npu_fusion_attention`` in layout TND, the kernel's varlen form
  (what flash_attn's varlen call is on CUDA): tokens packed ``[tokens, heads, head_dim]``,
  ``actual_seq_qlen`` / ``actual_seq_kvlen`` the cumulative sequence lengths, so each
  sequence attends within itself with no mask.  ``causal`` is sparse_mode 3 (the causal
  triangle from the bottom-right corner, flash_attn's alignment; with equal query and
  key lengths the same as from the top-left) with the kernel's fixed compressed mask,
  2048x2048 whatever the lengths, made once per device.  When every sequence's real tokens
  are one run (Hunyuan's: image tokens, then the prompt's, then padding), the padded
  buffer goes in as it is and each padding run is a sequence of its own, computed and
  then zeroed: nothing is gathered.  Otherwise the real tokens are gathered first and
  scattered back, as flash_attn's ``unpad_input`` / ``pad_input`` do.
* Elsewhere (CPU; CUDA without flash_attn):
  ``torch.nn.functional.scaled_dot_product_attention`` once per sequence over its real
  tokens (a slice when they are one run), with no mask (``is_causal`` for causal); a
  batch without padding is one call.
"""

from __future__ import annotations

import importlib
import itertools

import torch
import torch.nn.functional as F

# sparse_mode 2/3 (causal) take this compressed mask, whatever the sequence lengths
# (torch_npu's npu_fusion_attention docs: "atten_mask为优化后的压缩下三角矩阵(2048*2048)").
COMPRESSED_MASK_SIDE = 2048
RIGHT_DOWN_CAUSAL = 3
_compressed_masks: dict[str, torch.Tensor] = {}


def _check(qkv: torch.Tensor, key_padding_mask: torch.Tensor) -> None:
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must be [batch, seqlen, 3, heads, head_dim], got {tuple(qkv.shape)}")
    if tuple(key_padding_mask.shape) != tuple(qkv.shape[:2]):
        raise ValueError(
            f"key_padding_mask must be [batch, seqlen] = {tuple(qkv.shape[:2])}, got {tuple(key_padding_mask.shape)}")


def _runs(keep: torch.Tensor) -> list[tuple[int, int]] | None:
    """(start, end) of each sequence's real tokens when they are one run each ((0, 0) for none);
    None when some sequence's real tokens are not contiguous.  ``keep`` is on the host."""
    runs = []
    for row in keep:
        real = row.nonzero().flatten()
        if len(real) == 0:
            runs.append((0, 0))
            continue
        start, end = int(real[0]), int(real[-1]) + 1
        if end - start != len(real):
            return None
        runs.append((start, end))
    return runs


def _zero_padded(out: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
    # torch.where, not a product: what was computed at padded positions may be anything
    keep = key_padding_mask.bool()[:, :, None, None]
    return torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))


def sdpa_attention(qkv, key_padding_mask, causal=False, dropout_p=0.0, softmax_scale=None):
    _check(qkv, key_padding_mask)
    batch, seqlen, _, heads, head_dim = qkv.shape
    keep = key_padding_mask.bool().cpu()  # the lengths decide the slices: one host read, as unpad_input's
    if bool(keep.all()):
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # [b, h, s, d]
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=softmax_scale)
        return out.transpose(1, 2).contiguous()
    out = qkv.new_zeros(batch, seqlen, heads, head_dim)
    for i, row in enumerate(keep):
        real = row.nonzero().flatten()
        if len(real) == 0:
            continue
        start, end = int(real[0]), int(real[-1]) + 1
        if end - start == len(real):
            where = slice(start, end)
            seq = qkv[i, where]
        else:
            where = real.to(qkv.device)
            seq = qkv[i].index_select(0, where)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in seq.unbind(dim=1))  # [1, h, n, d]
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=softmax_scale)
        out[i, where] = o[0].transpose(0, 1)
    return out


def _compressed_causal_mask(device: torch.device) -> torch.Tensor:
    key = str(device)
    if key not in _compressed_masks:  # True = masked out: above the diagonal
        side = COMPRESSED_MASK_SIDE
        _compressed_masks[key] = torch.ones(side, side, dtype=torch.bool, device=device).triu(1)
    return _compressed_masks[key]


def npu_fusion_attention(qkv, key_padding_mask, causal=False, dropout_p=0.0, softmax_scale=None):
    _check(qkv, key_padding_mask)
    torch_npu = importlib.import_module("torch_npu")
    batch, seqlen, _, heads, head_dim = qkv.shape
    scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    keep = key_padding_mask.bool()
    # actual_seq_qlen is int[] in the kernel's schema: the lengths are read on the host
    host = keep.cpu()
    runs = _runs(host)
    if runs is not None:
        lengths = [n for start, end in runs for n in (start, end - start, seqlen - end) if n > 0]
        packed = qkv.reshape(batch * seqlen, 3, heads, head_dim)
    else:
        lengths = [n for n in host.sum(dim=1).tolist() if n > 0]
        packed = qkv[keep]  # [tokens, 3, heads, head_dim]
    if packed.shape[0] == 0:  # the kernel takes 1..1M tokens
        return qkv.new_zeros(batch, seqlen, heads, head_dim)
    cumulative = list(itertools.accumulate(lengths))
    q, k, v = packed.unbind(dim=1)  # [tokens, heads, head_dim] = TND
    out = torch_npu.npu_fusion_attention(
        q, k, v, heads, "TND",
        atten_mask=_compressed_causal_mask(qkv.device) if causal else None,
        scale=scale,
        keep_prob=1.0 - dropout_p,
        actual_seq_qlen=cumulative,
        actual_seq_kvlen=cumulative,
        sparse_mode=RIGHT_DOWN_CAUSAL if causal else 0,
    )[0]
    if runs is not None:
        return _zero_padded(out.reshape(batch, seqlen, heads, head_dim), keep)
    return out.new_zeros(batch, seqlen, heads, head_dim).index_put((keep,), out)


def padded_qkv_attention(qkv, key_padding_mask, causal=False, dropout_p=0.0, softmax_scale=None):
    """``flash_attn_no_pad``'s contract on whatever device ``qkv`` lives on."""
    impl = npu_fusion_attention if qkv.device.type == "npu" else sdpa_attention
    return impl(qkv, key_padding_mask, causal=causal, dropout_p=dropout_p, softmax_scale=softmax_scale)
