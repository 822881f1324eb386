"""doctor's numerics self-check: the ops the port depends on, on the NPU and on the CPU.

Each op runs on the same inputs (drawn on the CPU, fixed seed) at the dtype a run uses it in
(bfloat16: the transformers; float32: RoPE, the reward's GELU, HF32 matmuls), once on NPU 0
and once on the CPU, and the NPU's result is compared with the CPU's.  Beside the ops, a block
of each model whose registry row names one (``numerics_block``: the trainers of the tool's own
dependency set, which doctor runs in) and the reward's ViT block:

- ``elementwise`` ops (GELU, softmax, the norms, RoPE): the largest relative error of an element
  (elements smaller than msprobe's small value are left out of it), against twice msprobe's
  ``rtol`` for the dtype - one rounding on each side;
- ``accumulating`` ops (matmul, conv, attention, the blocks): the largest absolute error over the
  reference's largest magnitude, against msprobe's accumulated-error bound for the dtype.

The figures are msprobe's (mindstudio-probe, ``msprobe/pytorch/api_accuracy_checker/
precision_standard/standard_config.py``: ``_small_value``, ``_rtol``, ``_accumulative_error_bound``).
An op within its tolerance PASSes; beyond it it WARNs, with what that means for aligning an
NPU run with a CUDA or CPU run - a WARN is a difference to expect in ``compare``, not a broken
NPU.  Against a FAKE torch_npu both sides run on the CPU: the check runs, and says it proves
nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

MSPROBE = "msprobe api_accuracy_checker StandardConfig"

# msprobe's StandardConfig figures, by dtype name
SMALL_VALUE = {"float32": 2**-20, "bfloat16": 2**-10, "float16": 2**-10}
RTOL = {"float32": 2**-20, "bfloat16": 2**-8, "float16": 2**-10}
ACCUMULATIVE_ERROR_BOUND = {"float32": 2**-11, "bfloat16": 2**-7, "float16": 2**-8}


@dataclass(frozen=True)
class OpResult:
    name: str
    dtype: str
    kind: str  # "elementwise" | "accumulating"
    max_abs: float
    max_rel: float  # the metric of the kind (see the module docstring)
    tolerance: float
    source: str
    status: str  # PASS | WARN | ERROR
    meaning: str  # what a WARN means for alignment (or the error)

    def line(self) -> str:
        if self.status == "ERROR":
            return f"ERROR {self.name} ({self.dtype}): {self.meaning}"
        text = (f"{self.status:<5} {self.name} ({self.dtype}, {self.kind}): max abs {self.max_abs:.2e}, "
                f"rel {self.max_rel:.2e} <= {self.tolerance:.2e}? ({self.source})")
        return text + (f" - {self.meaning}" if self.status == "WARN" else "")


def tolerance(kind: str, dtype: str) -> tuple[float, str]:
    if kind == "elementwise":
        return 2 * RTOL[dtype], f"2 x {MSPROBE}._rtol[{dtype}]"
    return ACCUMULATIVE_ERROR_BOUND[dtype], f"{MSPROBE}._accumulative_error_bound[{dtype}]"


def errors(torch, got, want, kind: str, dtype: str) -> tuple[float, float]:
    """(max abs error, the kind's relative error) of ``got`` against the reference ``want``."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    diff = (got - want).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    if kind == "elementwise":
        big = want.abs() >= SMALL_VALUE[dtype]
        rel = float((diff[big] / want.abs()[big]).max()) if bool(big.any()) else 0.0
    else:
        scale = float(want.abs().max())
        rel = max_abs / scale if scale else max_abs
    return max_abs, rel


# What a WARN of each op means for aligning an NPU run with a CUDA or CPU run.
MEANINGS = {
    "matmul, HF32 off": "float32 matmuls differ beyond rounding: report it (this is not a documented NPU difference)",
    "matmul, HF32 on": "HF32 rounds float32 matmul inputs to 10 bits, as TF32 does on CUDA (upstream's recipe turns "
                       "TF32 on, the port HF32): compare with a CUDA run with TF32, not with a float32 CPU run",
    "matmul": "bfloat16 matmuls accumulate differently: expect latents and log-probs to drift within their tolerances",
    "conv2d (HF32 on by default)": "HF32 is torch_npu's default for convolutions: the VAE's float32 convolutions "
                                   "round like TF32 convolutions on CUDA",
    "conv2d": "bfloat16 convolutions accumulate differently: decoded images move by about a bfloat16 step",
    "softmax": "attention weights differ: sampling drifts, compare's latents tolerance bounds it",
    "layer_norm": "LayerNorm differs: every transformer block carries it",
    "npu_rms_norm": "torch_npu's RMSNorm (diffusers >= 0.35 on the NPU) differs from the CPU formula",
    "gelu, erf (F.gelu)": "the NPU's native GELU is not the exact (erf) form: the HPS reward's ViT uses it; keep "
                          "DANCEGRPO_NPU_GELU=exact (torch_npu.npu_gelu) so rewards match the GPU's",
    "gelu, erf (npu_gelu 'none')": "torch_npu.npu_gelu(approximate='none') is not the erf form either: compare the "
                                   "rewards of DANCEGRPO_NPU_GELU=exact and =upstream runs",
    "gelu, tanh": "the tanh GELU (the transformers' feed-forwards) differs",
    "scaled_dot_product_attention": "SDPA differs: the transformers' attention off the NPU processor",
    "npu_fusion_attention": "the NPU's fused attention (diffusers' NPU processor, the port's fallback) differs "
                            "from SDPA: sampling drifts, compare's latents tolerance bounds it",
    "RoPE, float32": "the float32 RoPE tables differ: positions move every attention",
    "HPS ViT block": "the reward's ViT block (with torch's nn.GELU, as DANCEGRPO_NPU_GELU=upstream runs it) "
                     "differs: rewards move (compare's rewards tolerance is 0.02%); the npu_gelu line is the default's",
}


def _ops(torch, npu_ops):
    """(name, dtype, kind, make_inputs(g) -> tuple, fn(inputs, on_npu) -> tensor, setup(on_npu)) per op."""
    F = torch.nn.functional
    bf16, f32 = torch.bfloat16, torch.float32

    def randn(g, *shape, dtype=f32, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    def hf32(flag):
        def setup(on_npu):
            if on_npu:
                torch.npu.matmul.allow_hf32 = flag
        return setup

    def rms_norm(inputs, on_npu):
        x, w = inputs
        if on_npu:
            return npu_ops.npu_rms_norm(x, w, epsilon=1e-6)[0]
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def fusion_attention(inputs, on_npu):
        q, k, v = inputs
        if on_npu:
            return npu_ops.npu_fusion_attention(q, k, v, q.shape[1], "BNSD", scale=q.shape[-1] ** -0.5)[0]
        return F.scaled_dot_product_attention(q, k, v)

    def rope(inputs, on_npu):
        pos, inv_freq = inputs
        angles = pos[:, None] * inv_freq[None, :]
        return torch.cat([angles.cos(), angles.sin()], dim=-1)

    def gelu_npu(inputs, on_npu):
        (x,) = inputs
        return npu_ops.npu_gelu(x, approximate="none") if on_npu else F.gelu(x)

    ops = [
        ("matmul, HF32 off", f32, "accumulating", lambda g: (randn(g, 64, 256), randn(g, 256, 64)),
         lambda t, _: t[0] @ t[1], hf32(False)),
        ("matmul, HF32 on", f32, "accumulating", lambda g: (randn(g, 64, 256), randn(g, 256, 64)),
         lambda t, _: t[0] @ t[1], hf32(True)),
        ("matmul", bf16, "accumulating", lambda g: (randn(g, 64, 256, dtype=bf16), randn(g, 256, 64, dtype=bf16)),
         lambda t, _: t[0] @ t[1], hf32(False)),
        ("conv2d (HF32 on by default)", f32, "accumulating",
         lambda g: (randn(g, 1, 8, 16, 16), randn(g, 8, 8, 3, 3, scale=0.2)), lambda t, _: F.conv2d(t[0], t[1]), None),
        ("conv2d", bf16, "accumulating",
         lambda g: (randn(g, 1, 8, 16, 16, dtype=bf16), randn(g, 8, 8, 3, 3, dtype=bf16, scale=0.2)),
         lambda t, _: F.conv2d(t[0], t[1]), None),
        ("softmax", bf16, "elementwise", lambda g: (randn(g, 8, 128, dtype=bf16, scale=3.0),),
         lambda t, _: t[0].softmax(-1), None),
        ("softmax", f32, "elementwise", lambda g: (randn(g, 8, 128, scale=3.0),), lambda t, _: t[0].softmax(-1), None),
        ("layer_norm", bf16, "elementwise", lambda g: (randn(g, 8, 128, dtype=bf16),),
         lambda t, _: F.layer_norm(t[0], (128,), eps=1e-6), None),
        ("npu_rms_norm", bf16, "elementwise", lambda g: (randn(g, 8, 128, dtype=bf16), randn(g, 128, dtype=bf16)),
         rms_norm, None),
        ("gelu, erf (F.gelu)", f32, "elementwise", lambda g: (randn(g, 4096, scale=3.0),),
         lambda t, _: F.gelu(t[0]), None),
        ("gelu, erf (npu_gelu 'none')", f32, "elementwise", lambda g: (randn(g, 4096, scale=3.0),), gelu_npu, None),
        ("gelu, tanh", bf16, "elementwise", lambda g: (randn(g, 4096, dtype=bf16, scale=3.0),),
         lambda t, _: F.gelu(t[0], approximate="tanh"), None),
        ("scaled_dot_product_attention", bf16, "accumulating",
         lambda g: tuple(randn(g, 1, 2, 64, 32, dtype=bf16) for _ in range(3)),
         lambda t, _: F.scaled_dot_product_attention(*t), None),
        ("npu_fusion_attention", bf16, "accumulating",
         lambda g: tuple(randn(g, 1, 2, 64, 32, dtype=bf16) for _ in range(3)), fusion_attention, None),
        ("RoPE, float32", f32, "elementwise",
         lambda g: (torch.arange(64, dtype=f32), torch.tensor([10000.0 ** (-i / 56) for i in range(0, 56, 2)])),
         rope, None),
    ]
    return ops


def _vit_block(torch, g):
    """("HPS ViT block", run(device)): the reward's ViT-H-14 block, narrow, with torch's nn.GELU."""
    try:
        from open_clip.transformer import ResidualAttentionBlock
    except ImportError:
        from hpsv2.src.open_clip.transformer import ResidualAttentionBlock
    torch.manual_seed(0)
    block = ResidualAttentionBlock(64, 4, act_layer=torch.nn.GELU)  # ViT-H-14's block, narrow
    x = torch.randn(1, 16, 64, generator=g)

    def run(device):
        b = copy.deepcopy(block).to(device)
        with torch.no_grad():
            return b(x.to(device))

    return "HPS ViT block", run


# What a WARN of a model's block means (its row names the block: ``numerics_block``).
BLOCK_MEANING = "one {name} differs beyond bfloat16 accumulation: expect the rollout to drift"


def model_blocks() -> list:
    """The blocks the registry's rows name (``numerics_block``, "module:function" (torch, generator)
    -> (name, run(device))), each once: the rows of the tool's own dependency set, which doctor
    runs in."""
    from dancegrpo_npu import registry
    from dancegrpo_npu.run import depsets

    refs = [spec.numerics_block for spec in registry.REGISTRY.values()
            if spec.numerics_block and spec.depset == depsets.DEFAULT]
    return [registry.load(ref) for ref in dict.fromkeys(refs)]


def run_numerics(torch, npu_ops, device: str, blocks=None) -> list[OpResult]:
    """Every op on ``device`` and on the CPU, then each of ``blocks`` (None: the registry's,
    ``model_blocks``) and the reward's ViT block.  ``npu_ops``: the module with torch_npu's kernels."""
    results = []
    g = torch.Generator().manual_seed(0)
    cases = [(name, str(dtype).split(".")[1], kind, make(g), fn, setup)
             for name, dtype, kind, make, fn, setup in _ops(torch, npu_ops)]
    for name, dtype, kind, inputs, fn, setup in cases:
        results.append(_compare(torch, name, dtype, kind, lambda on_npu, d: fn(tuple(t.to(d) for t in inputs), on_npu),
                                setup, device))
    built = [(builder, "bfloat16") for builder in (model_blocks() if blocks is None else blocks)]
    for builder, dtype in (*built, (_vit_block, "float32")):
        try:
            name, run = builder(torch, g)
        except Exception as e:  # noqa: BLE001 - a missing library is reported as that block's error
            name = getattr(builder, "__name__", "block").replace("_", " ")
            results.append(OpResult(name, dtype, "accumulating", 0, 0, 0, "", "ERROR", f"not built: {e}"))
            continue
        result = _compare(torch, name, dtype, "accumulating", lambda on_npu, d: run(d), None, device)
        if builder is not _vit_block:
            result = replace(result, meaning=BLOCK_MEANING.format(name=name))
        results.append(result)
    if device != "cpu":
        torch.npu.matmul.allow_hf32 = False  # torch_npu's default, as found
    return results


def _compare(torch, name, dtype, kind, call, setup, device) -> OpResult:
    tol, source = tolerance(kind, dtype)
    try:
        if setup:
            setup(False)
        want = call(False, "cpu")
        if setup:
            setup(True)
        got = call(True, device)
    except Exception as e:  # noqa: BLE001 - one op failing must not hide the others
        return OpResult(name, dtype, kind, 0, 0, tol, source, "ERROR", f"{type(e).__name__}: {str(e).splitlines()[0]}")
    max_abs, rel = errors(torch, got, want, kind, dtype)
    status = "PASS" if rel <= tol else "WARN"
    return OpResult(name, dtype, kind, max_abs, rel, tol, source, status, MEANINGS.get(name, ""))


def check_numerics(facts) -> "Check":
    from dancegrpo_npu.doctor.checks import FAIL, PASS, SKIP, WARN, Check

    torch = facts.torch
    if torch is None or facts.kind != "npu" or facts.count == 0:
        if facts.wanted_npu:  # --device npu: the devices check has said why there is none
            return Check("numerics", FAIL, "no NPU to check: --device npu asks for one and none is usable here "
                         "(see the devices check)", "fix the devices check first")
        return Check("numerics", SKIP, "not an NPU run: the self-check compares NPU 0 with the CPU")
    import torch_npu

    fake = bool(getattr(torch_npu, "__fake__", False))
    results = run_numerics(torch, torch_npu, "cpu" if fake else "npu:0")
    notes = tuple(r.line() for r in results)
    failed = [r.name for r in results if r.status == "ERROR"]
    warned = [f"{r.name} ({r.dtype})" for r in results if r.status == "WARN"]
    if fake:
        return Check("numerics", SKIP, f"{len(results)} ops ran against a FAKE torch_npu, both sides on the CPU: "
                     "this proves nothing about an NPU", notes=notes)
    if failed:
        return Check("numerics", FAIL, f"{len(failed)} of {len(results)} ops failed on npu:0: {', '.join(failed)}",
                     "match torch/torch_npu/CANN (docs/ascend-910b.md, Versions); send this report to support",
                     notes=notes)
    if warned:
        return Check("numerics", WARN, f"{len(warned)} of {len(results)} ops beyond msprobe's tolerances on npu:0: "
                     f"{', '.join(warned)} (what each means below; differences to expect in compare, not a broken NPU)",
                     notes=notes)
    return Check("numerics", PASS, f"{len(results)} ops on npu:0 within msprobe's tolerances of the CPU", notes=notes)
