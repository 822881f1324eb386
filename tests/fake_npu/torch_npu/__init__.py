"""FAKE torch_npu, for dancegrpo-npu's tests only.  This is NOT Huawei's torch_npu.

It has no NPU kernels and runs nothing on an NPU.  It imitates the small surface that
``dancegrpo-npu doctor`` reads to find NPUs: ``torch_npu.__version__`` and
``torch.npu.is_available / device_count / get_device_name / get_device_properties``,
with ASCEND_RT_VISIBLE_DEVICES honoured the way the real runtime does (logical ids over the
NPUs present).  The NPUs "present" are FAKE_NPU_COUNT (default 8) Ascend910B3 with 64 GiB.
Compute on an "npu" device fails, as it must: no result obtained with this fake is an NPU
result.

It registers no HCCL backend and no "npu" device type, has no ``npu_fusion_attention`` and no
HF32 switches, and ships no distribution metadata (``importlib.metadata`` does not see it).

Why a second fake beside tests/fakes/torch_npu: that one registers the "npu" device with torch
(privateuse1 renamed, device module; no HCCL backend either), which cannot be undone, so it is
only imported in the subprocesses the overlay and patch tests start.  This one registers nothing with torch, so
doctor's tests can import it inside the pytest process without changing torch for the tests
that run after them (merging the two broke the fixtures and smoke tests that way).
"""

import os
import re
import types

import torch

__fake__ = True
__version__ = os.environ.get("FAKE_TORCH_NPU_VERSION") or re.match(r"\d+\.\d+\.\d+", torch.__version__).group(0)


def _present() -> int:
    return int(os.environ.get("FAKE_NPU_COUNT", "8"))


def _visible() -> list[int]:
    value = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if value is None:
        return list(range(_present()))
    ids = [int(x) for x in value.split(",")]
    if any(i >= _present() for i in ids):
        raise RuntimeError("fake torch_npu: ASCEND_RT_VISIBLE_DEVICES names a device that is not present")
    return ids


class _Properties:
    def __init__(self, name: str, total_memory: int):
        self.name = name
        self.total_memory = total_memory


def _set_device(index):
    raise RuntimeError("fake torch_npu: there is no NPU to set (this is a test fake)")


npu = types.ModuleType("torch.npu")
npu.__fake__ = True
npu.is_available = lambda: _present() > 0
npu.device_count = lambda: len(_visible())
npu.get_device_name = lambda index=0: "Ascend910B3"
npu.get_device_properties = lambda index=0: _Properties("Ascend910B3", 64 * 2**30)
npu.set_device = _set_device
torch.npu = npu
