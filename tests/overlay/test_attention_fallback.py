"""overlay/dancegrpo_port/models/attention_fallback.py against a plain reference attention and
against the dense-mask form it replaced (kept here only as a reference), on the SDPA path and, with
the FAKE torch_npu, on the varlen NPU path."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from overlay_runner import run_python  # noqa: F401  (puts overlay/ on sys.path; run_python is a fixture)

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

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
    """npu_fusion_attention is called as documented (TND with cumulative actual_seq_qlen/kvlen, scale,
    keep_prob; causal: sparse_mode 3 with the compressed mask, True = masked out); the FAKE computes
    that documented contract in plain torch on the CPU."""
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
        res["calls"] = [[c["input_layout"], c["head_num"], c["scale"], c["keep_prob"], c["actual_seq_qlen"],
                         c["actual_seq_kvlen"], c["sparse_mode"], str(c["atten_mask_dtype"]),
                         c["atten_mask_shape"] and list(c["atten_mask_shape"])] for _, c in torch_npu.calls]
        print(json.dumps(res))
        """,
        fake_npu=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for causal in ("False", "True"):
        assert got[causal][0] < 1e-5 and got[causal][1]
    segments = [4, 6, 7, 12]  # 0..4 real, 4..6 padding, 6..7 padding, 7..12 real
    assert got["calls"] == [["TND", 2, 8 ** -0.5, 1.0, segments, segments, 0, "None", None],
                            ["TND", 2, 8 ** -0.5, 1.0, segments, segments, 3, "torch.bool", [2048, 2048]]]


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


# The dense-mask form the fallback had before, a reference only: a [B, 1, S, S] boolean mask
# (True = attend for SDPA; its negation, contiguous, for the NPU kernel in layout BSND).  Source
# text, so that the fake-NPU snippets run the same code.
DENSE_MASK_FORMS = '''
import torch, torch.nn.functional as F

def _allowed(key_padding_mask, causal):
    keep = key_padding_mask.bool()
    allowed = keep[:, None, None, :]
    if causal:
        seqlen = keep.shape[1]
        allowed = allowed & torch.ones(seqlen, seqlen, dtype=torch.bool, device=keep.device).tril()
    return allowed

def _zero_padded(out, key_padding_mask):
    keep = key_padding_mask.bool()[:, :, None, None]
    return torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))

def dense_mask_sdpa(qkv, key_padding_mask, causal=False, dropout_p=0.0, softmax_scale=None):
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=_allowed(key_padding_mask, causal), dropout_p=dropout_p, scale=softmax_scale)
    return _zero_padded(out.transpose(1, 2), key_padding_mask)

def dense_mask_npu(qkv, key_padding_mask, causal=False, dropout_p=0.0, softmax_scale=None):
    import torch_npu
    q, k, v = qkv.unbind(dim=2)
    batch, seqlen, _, heads, head_dim = qkv.shape
    scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    masked = ~_allowed(key_padding_mask, causal).expand(batch, 1, seqlen, seqlen)
    out = torch_npu.npu_fusion_attention(q, k, v, heads, "BSND", atten_mask=masked.contiguous(), scale=scale,
                                         keep_prob=1.0 - dropout_p)[0]
    return _zero_padded(out, key_padding_mask)

SMOKE_SEQLEN = 320  # the smoke's shapes: two heads of 16, a few hundred tokens, three sequences

def smoke_masks():
    """"runs": each sequence's real tokens one run (Hunyuan's: image, prompt, padding), one with
    padding before, one all padding; "scattered": real tokens with a gap (the gather path)."""
    s = SMOKE_SEQLEN
    runs = torch.zeros(4, s, dtype=torch.bool)
    runs[0] = True
    runs[1, :251] = True
    runs[2, 37:300] = True
    scattered = torch.zeros(3, s, dtype=torch.bool)
    scattered[0, :283] = True
    scattered[1, 8:140] = True
    scattered[1, 200:300] = True
    scattered[2, ::3] = True
    return {"runs": runs, "scattered": scattered}

def smoke_qkv(mask, dtype, seed=0, head_dim=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(mask.shape[0], mask.shape[1], 3, 2, head_dim, generator=g).to(dtype)
'''
exec(DENSE_MASK_FORMS)  # noqa: S102  (defines dense_mask_sdpa, smoke_masks, smoke_qkv here)

# the largest |new - dense-mask| over the cases below, measured on CPU (torch 2.x SDPA) and stated
# in docs/port.md; a bound of one bfloat16 step at these magnitudes (2**-8) for bfloat16
LARGEST_DIFFERENCE = {torch.float32: 1e-6, torch.bfloat16: 2**-8}


def largest_difference(new, mask_name, dtype, causal, seed=0):
    mask = smoke_masks()[mask_name]
    qkv = smoke_qkv(mask, dtype, seed)
    a, b = new(qkv, mask, causal=causal), dense_mask_sdpa(qkv, mask, causal=causal)  # noqa: F821
    assert a.dtype == b.dtype == dtype and a.shape == b.shape
    assert torch.equal(a[~mask], torch.zeros_like(a[~mask]))
    return float((a.float() - b.float()).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_sdpa_path_equals_the_dense_mask_form(dtype):
    diffs = {(m, causal, seed): largest_difference(sdpa_attention, m, dtype, causal, seed)
             for m in ("runs", "scattered") for causal in (False, True) for seed in range(3)}
    largest = max(diffs.values())
    print(f"largest |sdpa per sequence - dense mask| {dtype}: {largest:.3g}")
    assert largest <= LARGEST_DIFFERENCE[dtype], diffs


class LargestTensors(TorchDispatchMode):
    """Every tensor an op hands back while active: (elements, shape, op)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.seen += [(t.numel(), tuple(t.shape), str(func)) for t in tensors]
        return out

    def at_least(self, numel):
        return [s for s in self.seen if s[0] >= numel]


def seqlen_squared_tensors(attention, causal, backward=True):
    """What of seqlen*seqlen elements or more ``attention`` makes, forward and backward, on the
    smoke's batch with heads small enough that no other tensor is that large."""
    mask = smoke_masks()["runs"][:3]
    qkv = smoke_qkv(mask, torch.float32, head_dim=8).requires_grad_()  # 3*320*3*2*8 < 320**2
    with LargestTensors() as seen:
        out = attention(qkv, mask, causal=causal)
        if backward:
            out.sum().backward()
    return seen.at_least(SMOKE_SEQLEN ** 2)  # noqa: F821


@pytest.mark.parametrize("causal", [False, True])
def test_the_sdpa_path_makes_no_seqlen_by_seqlen_tensor(causal):
    assert seqlen_squared_tensors(sdpa_attention, causal) == []


def test_the_probe_sees_the_dense_mask():
    """The check above can fail: the dense-mask form's causal mask is [B, 1, S, S]."""
    found = seqlen_squared_tensors(dense_mask_sdpa, causal=True)  # noqa: F821
    assert (3 * SMOKE_SEQLEN ** 2, (3, 1, SMOKE_SEQLEN, SMOKE_SEQLEN), "aten.bitwise_and.Tensor") in found  # noqa: F821


def test_a_batch_without_padding_is_one_unmasked_call(monkeypatch):
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: seen.append(k) or real(*a, **k))
    qkv, mask = make()
    out = sdpa_attention(qkv, torch.ones_like(mask), causal=True)
    assert out.is_contiguous() and [k.get("attn_mask") for k in seen] == [None] and seen[0]["is_causal"] is True
    seen.clear()
    sdpa_attention(qkv, mask)  # three sequences with padding: three calls, none with a mask
    assert len(seen) == 3 and all(k.get("attn_mask") is None for k in seen)


NPU_SNIPPET_HEAD = '''
import itertools, json, torch, torch_npu
assert torch_npu.__fake__
from dancegrpo_port.models.attention_fallback import npu_fusion_attention
'''


@pytest.mark.fake_npu
def test_varlen_npu_path_equals_the_dense_mask_form_with_the_fake_torch_npu(run_python):
    """TND with actual_seq_qlen/kvlen (the FAKE computes the documented varlen contract on the CPU)
    against the dense-mask BSND call it replaced, through the same fake."""
    out = run_python(
        NPU_SNIPPET_HEAD + DENSE_MASK_FORMS + '''
res = {"diff": {}, "calls": {}}
for dtype, name, causal, seed in itertools.product((torch.float32, torch.bfloat16), ("runs", "scattered"),
                                                   (False, True), range(2)):
    mask = smoke_masks()[name]
    qkv = smoke_qkv(mask, dtype, seed)
    torch_npu.calls.clear()
    a = npu_fusion_attention(qkv, mask, causal=causal)
    call = torch_npu.calls[0][1]
    b = dense_mask_npu(qkv, mask, causal=causal)
    assert a.dtype == dtype and a.shape == b.shape and torch.equal(a[~mask], torch.zeros_like(a[~mask]))
    key = str(dtype)
    res["diff"][key] = max(res["diff"].get(key, 0.0), float((a.float() - b.float()).abs().max()))
    res["calls"][f"{name} {causal}"] = [call["input_layout"], list(call["query_shape"]), call["actual_seq_qlen"],
        call["actual_seq_kvlen"], call["sparse_mode"], call["atten_mask_shape"] and list(call["atten_mask_shape"]),
        str(call["atten_mask_dtype"])]
print(json.dumps(res))
''',
        fake_npu=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"largest |TND varlen - dense-mask BSND| (fake torch_npu): {got['diff']}")
    assert got["diff"]["torch.float32"] <= LARGEST_DIFFERENCE[torch.float32]
    assert got["diff"]["torch.bfloat16"] <= LARGEST_DIFFERENCE[torch.bfloat16]
    s = SMOKE_SEQLEN  # noqa: F821
    # runs: the whole padded buffer, each padding run a sequence of its own (nothing gathered)
    runs_lengths = [s, 251, s - 251, 37, 300 - 37, s - 300, s]
    runs_cum = list(itertools.accumulate(runs_lengths))
    # scattered: the real tokens only, gathered (lengths 283, 232, 107)
    scattered_cum = [283, 283 + 232, 283 + 232 + 107]
    for causal in (False, True):
        mask = [[2048, 2048], "torch.bool"] if causal else [None, "None"]
        assert got["calls"][f"runs {causal}"] == ["TND", [4 * s, 2, 16], runs_cum, runs_cum, 3 if causal else 0, *mask]
        assert got["calls"][f"scattered {causal}"] == ["TND", [scattered_cum[-1], 2, 16], scattered_cum, scattered_cum,
                                                       3 if causal else 0, *mask]


@pytest.mark.fake_npu
def test_varlen_npu_path_builds_no_seqlen_by_seqlen_tensor(run_python):
    """Outside the kernel (fused on the NPU; the FAKE's own scores are not counted), the varlen path
    makes nothing of seqlen*seqlen elements; the compressed causal mask (2048x2048, whatever the
    lengths) is made once per device.  The dense-mask form made [B, 1, S, S] each call."""
    out = run_python(
        NPU_SNIPPET_HEAD + DENSE_MASK_FORMS + '''
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

class Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__(); self.big = []
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.big += [list(t.shape) for t in tree_flatten(out)[0]
                     if isinstance(t, torch.Tensor) and t.numel() >= SMOKE_SEQLEN ** 2]
        return out

kernel = torch_npu.npu_fusion_attention
def fused(*args, **kwargs):
    with _disable_current_modes():
        return kernel(*args, **kwargs)
torch_npu.npu_fusion_attention = fused
res = {}
for name, attention in (("varlen", npu_fusion_attention), ("dense", dense_mask_npu)):
    for causal in (False, True):
        for call in ("first", "second"):
            for mask_name in ("runs", "scattered"):
                mask = smoke_masks()[mask_name][:3]
                qkv = smoke_qkv(mask, torch.float32, head_dim=8)
                with Seen() as seen:
                    attention(qkv, mask, causal=causal)
                res[f"{name} {causal} {call} {mask_name}"] = seen.big
print(json.dumps(res))
''',
        fake_npu=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    s = SMOKE_SEQLEN  # noqa: F821
    for masks in ("runs", "scattered"):
        assert got[f"varlen False first {masks}"] == got[f"varlen False second {masks}"] == []
        assert got[f"varlen True second {masks}"] == []
        assert [3, 1, s, s] in got[f"dense False second {masks}"]  # the probe sees the dense mask
    assert got["varlen True first runs"] == [[2048, 2048]] * 2  # ones, then its upper triangle: once a device
