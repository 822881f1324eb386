"""overlay/dancegrpo_port/models/attention_fallback.py against a plain reference attention."""

from __future__ import annotations

import json
import math

import pytest
from overlay_runner import run_python  # noqa: F401  (puts overlay/ on sys.path; run_python is a fixture)

torch = pytest.importorskip("torch")

from dancegrpo_port.models.attention_fallback import padded_qkv_attention, sdpa_attention  # noqa: E402


def reference(qkv, mask, causal=False, softmax_scale=None):
    """Per sequence: keep the real tokens, attend among them, put the result back; zeros elsewhere."""
    b, s, _, h, d = qkv.shape
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(d)
    out = torch.zeros(b, s, h, d, dtype=torch.float64)
    for i in range(b):
        idx = mask[i].nonzero().flatten()
        q, k, v = (qkv[i, idx, j].double().transpose(0, 1) for j in range(3))  # [h, n, d]
        scores = q @ k.transpose(-1, -2) * scale
        if causal:
            n = len(idx)
            scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
        out[i, idx] = (scores.softmax(-1) @ v).transpose(0, 1)
    return out


def make(b=3, s=7, h=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, s, 3, h, d, generator=g)
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[0, 5:] = False  # padding at the end
    mask[1, :2] = False  # padding at the start
    mask[1, 4] = False  # and in the middle
    return qkv, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softmax_scale", [None, 0.3])
def test_matches_reference_with_padding(causal, softmax_scale):
    qkv, mask = make()
    out = padded_qkv_attention(qkv, mask, causal=causal, softmax_scale=softmax_scale)
    assert out.shape == (3, 7, 2, 8) and out.dtype == qkv.dtype
    ref = reference(qkv, mask, causal, softmax_scale)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))  # padded positions are zero


def test_padding_changes_the_result():
    qkv, mask = make()
    unmasked = padded_qkv_attention(qkv, torch.ones_like(mask))
    assert not torch.allclose(unmasked[0, :5], padded_qkv_attention(qkv, mask)[0, :5])


def test_an_all_padded_sequence_gives_zeros_not_nan():
    qkv, mask = make()
    mask[2] = False
    out = padded_qkv_attention(qkv, mask)
    assert torch.isfinite(out).all() and torch.equal(out[2], torch.zeros_like(out[2]))


def test_bf16_and_gradients():
    qkv, mask = make()
    out = padded_qkv_attention(qkv.to(torch.bfloat16), mask)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.double(), reference(qkv, mask), atol=3e-2)
    x = qkv.clone().requires_grad_()
    padded_qkv_attention(x, mask).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_bad_shapes_are_refused():
    qkv, mask = make()
    with pytest.raises(ValueError, match=r"qkv must be \[batch, seqlen, 3, heads, head_dim\]"):
        sdpa_attention(qkv[:, :, :2], mask)
    with pytest.raises(ValueError, match=r"key_padding_mask must be \[batch, seqlen\] = \(3, 7\)"):
        sdpa_attention(qkv, mask[:, :5])


@pytest.mark.fake_npu
def test_npu_path_with_the_fake_torch_npu(run_python):
    """npu_fusion_attention is called as documented (BSND, True = masked out, scale, keep_prob);
    the FAKE computes that documented contract in plain torch on the CPU."""
    out = run_python(
        """
        import json, math, torch, torch_npu
        assert torch_npu.__fake__
        from dancegrpo_port.models.attention_fallback import npu_fusion_attention, sdpa_attention
        g = torch.Generator().manual_seed(0)
        qkv = torch.randn(2, 6, 3, 2, 8, generator=g)
        mask = torch.ones(2, 6, dtype=torch.bool); mask[0, 4:] = False; mask[1, 0] = False
        res = {}
        for causal in (False, True):
            a = npu_fusion_attention(qkv, mask, causal=causal)
            b = sdpa_attention(qkv, mask, causal=causal)
            res[str(causal)] = [float((a - b).abs().max()), bool(torch.equal(a[~mask], torch.zeros_like(a[~mask])))]
        call = torch_npu.calls[0][1]
        res["call"] = [call["input_layout"], call["head_num"], call["scale"], call["keep_prob"],
                       str(call["atten_mask_dtype"]), list(call["atten_mask_shape"])]
        print(json.dumps(res))
        """,
        fake_npu=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for causal in ("False", "True"):
        assert got[causal][0] < 1e-5 and got[causal][1]
    assert got["call"] == ["BSND", 2, 8 ** -0.5, 1.0, "torch.bool", [2, 1, 6, 6]]


@pytest.mark.fake_npu
def test_fake_fusion_attention_refuses_off_the_npu(run_python):
    """The real kernel takes NPU tensors only; the FAKE refuses to run when the run's device is
    not the NPU, so code that hands it CPU tensors on a CPU run fails in the tests too."""
    out = run_python(
        """
        import torch, torch_npu
        q = torch.randn(1, 2, 4, 8, dtype=torch.bfloat16)
        try:
            torch_npu.npu_fusion_attention(q, q, q, 2, input_layout="BNSD", scale=8 ** -0.5)
        except RuntimeError as e:
            print(e)
        print(len(torch_npu.calls))
        """,
        fake_npu=True, env={"DANCEGRPO_DEVICE": "cpu"},
    )
    assert out.stdout.splitlines() == [
        "fake torch_npu: npu_fusion_attention called while DANCEGRPO_DEVICE='cpu': the real kernel would get cpu tensors",
        "0"]
