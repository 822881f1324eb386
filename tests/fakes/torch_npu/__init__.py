"""A FAKE ``torch_npu`` for tests.  It is not Huawei's torch_npu and runs nothing on an NPU.

It exists so that the port's NPU-only code paths (device selection, ``transfer_to_npu``
ordering, the HF32 switches, ``npu_fusion_attention``) can be exercised on machines without
an Ascend NPU.  Every result obtained with it is a CPU result: it never stands for an NPU
measurement.

What it imitates, from torch_npu's documentation:

* importing it registers the ``npu`` device type (``rename_privateuse1_backend``) and
  the ``torch.npu`` device module (``is_available``, ``device_count``, ``set_device``,
  ``current_device``, ``get_amp_supported_dtype`` - so ``torch.autocast("npu")`` can be
  constructed; autocast then changes nothing, no kernel here is an NPU kernel);
  ``FAKE_TORCH_NPU_DEVICES`` (default 8) is how many NPUs it pretends to see.  No tensor
  can be allocated on that "npu" device;
* ``torch.npu.matmul.allow_hf32`` (default False) and ``torch.npu.conv.allow_hf32`` (default
  True), the documented defaults: plain attributes that remember what was set and are read
  by nothing (no kernel here runs in HF32);
* ``npu_fusion_attention(query, key, value, head_num, input_layout, ..., atten_mask,
  scale, keep_prob)`` for the ``BSND`` and ``BNSD`` layouts, where ``atten_mask`` is
  boolean, True means "do not attend", and its shape is one the documentation lists
  ([B,N,S1,S2], [B,1,S1,S2], [1,1,S1,S2], [S1,S2]; no broadcasting); it returns a 7-tuple whose
  first item is the attention output, computed here in plain torch on the CPU tensors it is
  given.  The real kernel takes NPU tensors only; the fake cannot have NPU tensors, so it
  stands in for that rule by refusing to run in a process whose run device is not the NPU
  (``DANCEGRPO_DEVICE`` cpu or cuda, or auto with no fake NPU), where the real kernel would
  be handed CPU or CUDA tensors;
* ``FAKE_TORCH_NPU_BROKEN=1``: the import fails the way a torch_npu without CANN's
  libraries on the loader path does;
* ``torch.npu.synchronize``, ``reset_peak_memory_stats`` and ``max_memory_allocated`` (the
  allocator's statistics; the fake allocates nothing, so the peak is ``FAKE_TORCH_NPU_PEAK_BYTES``,
  default 0, whatever ran): recorded in ``calls``;
* ``torch_npu.profiler`` (``profiler.py``): the documented ``profile`` / ``ProfilerActivity`` /
  ``tensorboard_trace_handler`` surface; it records what it was asked and writes a marker
  file, never a trace;
* ``torch_npu.contrib.transfer_to_npu``: importing it records what was already imported
  and whether CUDA was initialised (``transfer_state``), so tests can check the order.

What it does NOT imitate: it registers no HCCL backend (``init_process_group("hccl")``
fails with it), redirects no ``torch.cuda`` call, and ships no distribution metadata - so
``importlib.metadata`` (and diffusers' ``is_torch_npu_available()``, which reads it) sees it
as installed only where a test writes a ``torch_npu`` dist-info beside it
(tests/patches/patched_tree_runner.py, ``fake_npu="installed"``).

Tests that use it are marked ``fake_npu``.
"""

from __future__ import annotations

import math
import os
import types

import torch

__fake__ = True
__version__ = "0.0.0+fake"

if os.environ.get("FAKE_TORCH_NPU_BROKEN"):  # a torch_npu whose CANN libraries are not found
    raise ImportError("libascendcl.so: cannot open shared object file: No such file or directory (FAKE)")

calls: list[tuple[str, dict]] = []  # what the code under test asked of the fake
transfer_state: dict | None = None  # set by importing torch_npu.contrib.transfer_to_npu


def _device_count() -> int:
    return int(os.environ.get("FAKE_TORCH_NPU_DEVICES", "8"))


class _FakeNpuModule(types.ModuleType):
    """Stands in for ``torch.npu`` (FAKE)."""

    def __init__(self):
        super().__init__("torch.npu")
        self._current = 0

    def is_available(self) -> bool:
        return _device_count() > 0

    def device_count(self) -> int:
        return _device_count()

    def set_device(self, device) -> None:
        index = device.index if isinstance(device, torch.device) else int(device)
        if not 0 <= index < _device_count():
            raise RuntimeError(f"fake torch_npu: invalid device {index} ({_device_count()} NPUs)")
        calls.append(("set_device", {"device": device}))
        self._current = index

    def current_device(self) -> int:
        return self._current

    def get_amp_supported_dtype(self) -> list:
        return [torch.float16, torch.bfloat16]  # what torch.autocast("npu") asks the device module

    def synchronize(self, device=None) -> None:
        calls.append(("synchronize", {}))

    def reset_peak_memory_stats(self, device=None) -> None:
        calls.append(("reset_peak_memory_stats", {}))

    def max_memory_allocated(self, device=None) -> int:
        # nothing is allocated on the fake NPU: a fixed number that says so, never a measurement
        calls.append(("max_memory_allocated", {}))
        return int(os.environ.get("FAKE_TORCH_NPU_PEAK_BYTES", "0"))


npu = _FakeNpuModule()
npu.matmul = types.SimpleNamespace(allow_hf32=False)  # torch_npu's documented defaults
npu.conv = types.SimpleNamespace(allow_hf32=True)
if torch._C._get_privateuse1_backend_name() == "privateuseone":
    torch.utils.rename_privateuse1_backend("npu")
torch._register_device_module("npu", npu)  # sets torch.npu, as torch_npu does


def _run_device_is_npu() -> bool:
    """Whether this process's run device is the (fake) NPU, by the overlay's rule."""
    requested = os.environ.get("DANCEGRPO_DEVICE", "auto").strip().lower() or "auto"
    return requested == "npu" or (requested == "auto" and _device_count() > 0)


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                         atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647,
                         next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                         actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False):
    if not _run_device_is_npu():
        raise RuntimeError(
            f"fake torch_npu: npu_fusion_attention called while DANCEGRPO_DEVICE="
            f"{os.environ.get('DANCEGRPO_DEVICE', 'auto')!r}: the real kernel would get {query.device.type} tensors")
    calls.append(("npu_fusion_attention", {
        "input_layout": input_layout, "head_num": head_num, "scale": scale, "keep_prob": keep_prob,
        "atten_mask_dtype": None if atten_mask is None else atten_mask.dtype,
        "atten_mask_shape": None if atten_mask is None else tuple(atten_mask.shape),
        "query_shape": tuple(query.shape)}))
    if input_layout == "BSND":
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    elif input_layout == "BNSD":
        q, k, v = query, key, value
    else:
        raise NotImplementedError(f"fake torch_npu: layout {input_layout} is not imitated")
    if q.shape[1] != head_num:
        raise RuntimeError(f"fake torch_npu: head_num {head_num} != {q.shape[1]} heads in the input")
    if keep_prob != 1.0:
        raise NotImplementedError("fake torch_npu: dropout (keep_prob < 1) is not imitated")
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if atten_mask is not None:
        if atten_mask.dtype not in (torch.bool, torch.uint8):
            raise TypeError("fake torch_npu: atten_mask must be bool or uint8")
        b, n, s1, s2 = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        documented = [(b, n, s1, s2), (b, 1, s1, s2), (1, 1, s1, s2), (s1, s2)]
        if tuple(atten_mask.shape) not in documented:
            raise RuntimeError(f"fake torch_npu: atten_mask shape {tuple(atten_mask.shape)} is not one of {documented}")
        scores = scores.masked_fill(atten_mask.bool(), -math.inf)
    out = (scores.softmax(dim=-1) @ v.float()).to(query.dtype)
    if input_layout == "BSND":
        out = out.transpose(1, 2)
    empty = torch.empty(0)
    return (out.contiguous(), empty, empty, empty, 0, 0, 0)
