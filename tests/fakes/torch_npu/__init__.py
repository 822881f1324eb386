"""A FAKE ``torch_npu`` for tests, NOT Huawei's torch_npu.  It runs nothing on an NPU.

It exists so that the port's NPU-only code paths (device selection, ``transfer_to_npu``
ordering, the HF32 switches, ``npu_fusion_attention``, the profiler, doctor's NPU branch) run
on machines without an Ascend NPU.  Every result obtained with it is a CPU result: it never
stands for an NPU measurement.  tests/npu/test_fake_torch_npu.py holds one test per
emulated behaviour below; tests/npu/test_torch_npu_wheel.py checks every torch_npu name,
keyword and environment variable the project uses, and the behaviours below, against the
sources of the real wheels this fake follows.

WHICH torch_npu: ``FAKE_TORCH_NPU_EMULATES`` (default 2.10.0.post6) names one of the wheels in
``VERSION_RULES`` below: 2.7.1.post10 and 2.10.0.post6 (the two lines bootstrap installs on
CANN 9.1.x) and 2.7.1.post11 and 2.10.0.post7 (the same lines on CANN 9.2.0, with another
``is_available()`` rule); ``__emulates__`` says which one this process emulates.
``VERSION_RULES`` is the one place that says what differs between them; everything else below
is the same in all four.  ``__version__`` is ``FAKE_TORCH_NPU_VERSION``, else torch's version
(doctor compares the two).

EMULATED, as those wheels' sources do it:

* autoload: ``tests/fakes/torch_npu-2.10.0.post6+fake.dist-info`` registers the ``torch.backends``
  entry point ``torch_npu = torch_npu:_autoload``, so with tests/fakes on the path ``import
  torch`` imports this package (torch >= 2.5, unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), and
  a failing import makes ``import torch`` itself fail ("Failed to load the backend extension:
  torch_npu").  Like the real one it sets ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` while it
  imports torch and ``_autoload()`` restores the value it found; 2.7.1.post11 and 2.10.0.post7 also call
  ``_autoload()`` at the end of its own import (``import torch_npu`` before ``import torch``
  leaves the variable as it was, not ``0``).  The dist-info also makes ``importlib.metadata``
  (and diffusers' ``is_torch_npu_available()``) see it as installed;
* import failures, in the real order: a torch that already has another accelerator (anything
  but ``cpu`` or ``npu``) is refused with "Two accelerators cannot be used at the same time";
  ``FAKE_TORCH_NPU_BROKEN=1`` stands for CANN's libraries not on the loader path
  (``set_env.sh`` not sourced): ``import torch_npu._C`` fails with the loader's bare
  ``ImportError`` ("libhccl.so: cannot open shared object file: No such file or directory",
  ``name="torch_npu._C"``) - these wheels import ``_C`` before ``_check_npu_import``, the code
  that would add "Please check that the cann package is installed..."; then the CANN package
  check (``utils/npu_intercept._cann_package_check``, called from
  ``_init/registry/registry_manager.py``) raises a bare ``Exception`` when
  ``ASCEND_HOME_PATH`` is set but it (or ``ASCEND_OPP_PATH``, ``<home>/runtime``,
  ``<home>/compiler``) is missing;
* devices: ``FAKE_TORCH_NPU_DEVICES`` (default 8) NPUs are "present"; ``ASCEND_RT_VISIBLE_DEVICES``
  is parsed as ``torch_npu.npu._parse_visible_devices`` does (digits and commas, read up to
  the first other character; empty: none) and counted as ``_device_count_ascend_hal`` does:
  a list that is not strictly ascending gives ``device_count()`` 0, and the list is cut at the
  first id that is not present.  ``is_available()`` follows ``VERSION_RULES``:
  ``device_count() > 0`` (2.7.1.post10, 2.10.0.post6; 2.7.1.post11 and 2.10.0.post7 with
  ``PYTORCH_HAL_BASED_NPU_CHECK=1``), or ``torch_npu._C._npu_getDeviceCount() > 0``
  (2.7.1.post11, 2.10.0.post7), the CANN runtime's own count.  What the runtime counts for a list that does
  not ascend is NOT in the wheel's Python sources: the fake ASSUMES it counts the listed ids
  that are present, in any order, so that for ``3,2`` ``is_available()`` is True while
  ``device_count()`` is 0.  ``get_device_name`` / ``get_device_properties`` raise
  ``AssertionError("Invalid device id...")`` outside ``0..device_count()-1``; the names are
  Ascend910B3 with 64 GiB;
* registration: the ``npu`` device type (``rename_privateuse1_backend``), ``torch.npu``
  (``_register_device_module``) and the generated ``Tensor.npu`` / ``Tensor.is_npu`` /
  ``Module.npu`` methods; ``torch.npu.matmul.allow_hf32`` (default False) and
  ``torch.npu.conv.allow_hf32`` (default True), remembered and read by nothing (no kernel
  here runs in HF32); ``get_amp_supported_dtype`` so ``torch.autocast("npu")`` constructs;
  ``manual_seed_all`` (nothing to seed), ``synchronize`` / ``reset_peak_memory_stats`` / ``max_memory_allocated`` (the peak is
  ``FAKE_TORCH_NPU_PEAK_BYTES``, default 0: nothing is allocated);
* kernels called with the documented signatures (``npu_fusion_attention``, ``npu_gelu``,
  ``npu_geglu``, ``npu_rms_norm``): computed in plain torch on the CPU tensors given.
  ``npu_fusion_attention`` takes the layouts BSND and BNSD (sparse_mode 0, a documented mask
  shape) and TND, the varlen form: ``actual_seq_qlen`` / ``actual_seq_kvlen`` lists of ints
  (cumulative lengths, ending at the tokens given), each segment attending within itself,
  causal with sparse_mode 2 or 3 and the compressed 2048x2048 mask; what the docs leave open
  (other modes, dropout, batches left out by trailing zeros, fully masked rows) it refuses.
  The real kernels take NPU tensors only; the fake cannot have NPU tensors, so it stands in for that
  rule by refusing to run in a process whose run device is not the NPU (``DANCEGRPO_DEVICE``
  cpu or cuda, or auto with no NPU visible);
* ``torch_npu.profiler`` (profiler.py) and ``torch_npu.contrib.transfer_to_npu``: see there.

NOT emulated: no HCCL backend (``init_process_group("hccl")`` fails), no tensor can be
allocated on the "npu" device, ``torch.cuda`` is not redirected to ``torch.npu``, no kernel
runs in HF32 or gives NPU numerics, ``device_count()`` is never cached.  Tests that use it are
marked ``fake_npu``.
"""

from __future__ import annotations

import math
import os
import time
import types

# torch_npu's own first lines: autoload off while it imports torch (no recursion), the
# caller's value kept for _autoload() to restore.
ORG_AUTOLOAD = os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402

__fake__ = True
__version__ = os.environ.get("FAKE_TORCH_NPU_VERSION") or torch.__version__.split("+")[0]

# What differs between the wheels this fake follows (tests/npu/test_torch_npu_wheel.py reads
# this literal and checks each entry against that wheel's sources):
# - "is_available": "device_count" (``device_count() > 0``) or "runtime_count" (the CANN
#   runtime's count, unless PYTORCH_HAL_BASED_NPU_CHECK=1; see the module docstring);
# - "autoload_restored_on_import": whether the package calls ``_autoload()`` at the end of
#   its own import;
# - "symlink_word": what the profiler's path warnings call a symbolic link.
VERSION_RULES = {
    "2.7.1.post10": {"is_available": "device_count", "autoload_restored_on_import": False,
                     "symlink_word": "soft chain"},
    "2.10.0.post6": {"is_available": "device_count", "autoload_restored_on_import": False,
                     "symlink_word": "soft chain"},
    "2.7.1.post11": {"is_available": "runtime_count", "autoload_restored_on_import": True,
                     "symlink_word": "symbolic link"},
    "2.10.0.post7": {"is_available": "runtime_count", "autoload_restored_on_import": True,
                     "symlink_word": "symbolic link"},
}
DEFAULT_EMULATES = "2.10.0.post6"
__emulates__ = os.environ.get("FAKE_TORCH_NPU_EMULATES") or DEFAULT_EMULATES
if __emulates__ not in VERSION_RULES:
    raise ImportError(f"fake torch_npu: FAKE_TORCH_NPU_EMULATES={__emulates__!r} is not one of "
                      f"{', '.join(VERSION_RULES)}")
RULES = VERSION_RULES[__emulates__]

calls: list[tuple[str, dict]] = []  # what the code under test asked of the fake
transfer_state: dict | None = None  # set by importing torch_npu.contrib.transfer_to_npu


def _pta_error(code: int, text: str) -> str:
    """torch_npu.utils._error_code.pta_error's suffix (Device/RankID unknown here)."""
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime())
    return f"\n[ERROR] {stamp} (PID:{os.getpid()}, Device:-1, RankID:-1) ERR00{code:03d} PTA {text}"


_NOT_FOUND = (8, "resource not found")

_accelerator = torch._C._get_accelerator()
if _accelerator.type not in ("cpu", "npu"):
    raise RuntimeError(
        f"Two accelerators cannot be used at the same time in PyTorch: npu and {_accelerator.type}. "
        f"You can install the cpu version of PyTorch to use your npu device, or use the "
        f"{_accelerator.type} device with 'export TORCH_DEVICE_BACKEND_AUTOLOAD=0'."
        + _pta_error(7, "feature not supported"))

if os.environ.get("FAKE_TORCH_NPU_BROKEN"):  # CANN's libraries are not on the loader path
    # the loader's own error for `import torch_npu._C`: torch_npu adds nothing to it
    raise ImportError("libhccl.so: cannot open shared object file: No such file or directory",
                      name="torch_npu._C")


def _cann_package_check() -> None:
    """torch_npu.utils.npu_intercept._cann_package_check: a bare Exception, as the real one raises."""
    home = os.environ.get("ASCEND_HOME_PATH")
    if home is None:
        return
    if not os.path.exists(home):
        raise Exception(f"ASCEND_HOME_PATH : {home} does not exist. Please run 'source set_env.sh' in the CANN "
                        "installation path." + _pta_error(*_NOT_FOUND))
    opp = os.environ.get("ASCEND_OPP_PATH")
    if opp is None:
        raise Exception("ASCEND_OPP_PATH environment variable is not set. Please check whether the opp package "
                        "has been installed. If exist, please run 'source set_env.sh' in the CANN installation "
                        "path." + _pta_error(*_NOT_FOUND))
    if not os.path.exists(opp):
        raise Exception(f"ASCEND_OPP_PATH : {opp} does not exist. Please check whether the opp package has been "
                        "installed. If exist, please run 'source set_env.sh' in the CANN installation path."
                        + _pta_error(*_NOT_FOUND))
    for part in ("runtime", "compiler"):
        path = os.path.join(home, part)
        if not os.path.exists(path):
            raise Exception(f"ASCEND_{part.upper()}_PATH : {path} does not exist. Please check whether the {part} "
                            "package has been installed. If exist, please run 'source set_env.sh' in the CANN "
                            "installation path." + _pta_error(*_NOT_FOUND))


_cann_package_check()


def _present() -> int:
    return int(os.environ.get("FAKE_TORCH_NPU_DEVICES", "8"))


def _parse_visible_devices() -> list[int]:
    """torch_npu.npu._parse_visible_devices: no variable means 64 candidate ids."""
    var = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if var is None:
        return list(range(64))
    end = len(var)
    for idx, c in enumerate(var):
        if not (c.isdigit() or c == ","):
            end = idx
            break
    ids: list[int] = []
    for elem in var[:end].split(","):
        if not elem:
            return ids
        ids.append(int(elem))
    return ids


def _runtime_count() -> int:
    """torch_npu._C._npu_getDeviceCount: ASSUMED to count the listed ids that are present, in
    any order (the CANN runtime's rule is not in the wheel's Python sources)."""
    present = _present()
    return len({i for i in _parse_visible_devices() if 0 <= i < present}) if present > 0 else 0


def _device_count() -> int:
    """torch_npu.npu._device_count_ascend_hal over the present NPUs."""
    visible = _parse_visible_devices()
    present = _present()
    if not visible or present <= 0:
        return 0
    for idx, val in enumerate(visible):
        if idx > 0 and val <= visible[idx - 1]:  # "`rts` need ascending order"
            return 0
        if val >= present:
            return idx
    return len(visible)


class _Properties:
    def __init__(self, name: str, total_memory: int):
        self.name = name
        self.total_memory = total_memory


class _FakeNpuModule(types.ModuleType):
    """Stands in for ``torch.npu`` / ``torch_npu.npu`` (FAKE)."""

    def __init__(self):
        super().__init__("torch.npu")
        self.__fake__ = True
        self._current = 0
        self.matmul = types.SimpleNamespace(allow_hf32=False)  # torch_npu's defaults
        self.conv = types.SimpleNamespace(allow_hf32=True)

    def is_available(self) -> bool:
        if RULES["is_available"] == "runtime_count" and os.getenv("PYTORCH_HAL_BASED_NPU_CHECK") != "1":
            return _runtime_count() > 0
        return self.device_count() > 0

    def device_count(self) -> int:
        return _device_count()

    def _check_index(self, device) -> int:
        index = self._current if device is None else (device.index if isinstance(device, torch.device) else int(device))
        if index < 0 or index >= self.device_count():
            raise AssertionError("Invalid device id" + _pta_error(3, "invalid value"))
        return index

    def get_device_name(self, device_name=None) -> str:
        self._check_index(device_name)
        return "Ascend910B3"

    def get_device_properties(self, device_name=None) -> _Properties:
        self._check_index(device_name)
        return _Properties("Ascend910B3", 64 * 2**30)

    def set_device(self, device) -> None:
        index = device.index if isinstance(device, torch.device) else int(device)
        if not 0 <= index < self.device_count():
            raise RuntimeError(f"fake torch_npu: set_device({index}) with {self.device_count()} NPU(s) visible")
        calls.append(("set_device", {"device": device}))
        self._current = index

    def current_device(self) -> int:
        return self._current

    def manual_seed_all(self, seed) -> None:  # torch.manual_seed calls it; no NPU generator to seed here
        pass

    def _is_in_bad_fork(self) -> bool:
        return False

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
if torch._C._get_privateuse1_backend_name() == "privateuseone":
    torch.utils.rename_privateuse1_backend("npu")
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
torch._register_device_module("npu", npu)  # sets torch.npu, as torch_npu does


def _run_device_is_npu() -> bool:
    """Whether this process's run device is the (fake) NPU, by the overlay's rule."""
    requested = os.environ.get("DANCEGRPO_DEVICE", "auto").strip().lower() or "auto"
    return requested == "npu" or (requested == "auto" and _device_count() > 0)


def _refuse_off_npu(kernel: str, tensor) -> None:
    if not _run_device_is_npu():
        raise RuntimeError(
            f"fake torch_npu: {kernel} called while DANCEGRPO_DEVICE="
            f"{os.environ.get('DANCEGRPO_DEVICE', 'auto')!r}: the real kernel would get {tensor.device.type} tensors")


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                         atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647,
                         next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                         actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
                         softmax_layout=""):
    """``atten_mask`` boolean, True means "do not attend", of a documented shape; BSND/BNSD with
    sparse_mode 0, and TND (varlen) with sparse_mode 0 (no mask) or 2/3 (causal, compressed mask)."""
    _refuse_off_npu("npu_fusion_attention", query)
    calls.append(("npu_fusion_attention", {
        "input_layout": input_layout, "head_num": head_num, "scale": scale, "keep_prob": keep_prob,
        "atten_mask_dtype": None if atten_mask is None else atten_mask.dtype,
        "atten_mask_shape": None if atten_mask is None else tuple(atten_mask.shape),
        "query_shape": tuple(query.shape), "sparse_mode": sparse_mode,
        "actual_seq_qlen": actual_seq_qlen, "actual_seq_kvlen": actual_seq_kvlen}))
    if keep_prob != 1.0:
        raise NotImplementedError("fake torch_npu: dropout (keep_prob < 1) is not imitated")
    if atten_mask is not None and atten_mask.dtype not in (torch.bool, torch.uint8):
        raise TypeError("fake torch_npu: atten_mask must be bool or uint8")
    if input_layout == "TND":
        return _fusion_attention_tnd(query, key, value, head_num, atten_mask, scale, actual_seq_qlen,
                                     actual_seq_kvlen, sparse_mode)
    if input_layout == "BSND":
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    elif input_layout == "BNSD":
        q, k, v = query, key, value
    else:
        raise NotImplementedError(f"fake torch_npu: layout {input_layout} is not imitated")
    if sparse_mode != 0:
        raise NotImplementedError(
            f"fake torch_npu: sparse_mode {sparse_mode} is not imitated with layout {input_layout}")
    if q.shape[1] != head_num:
        raise RuntimeError(f"fake torch_npu: head_num {head_num} != {q.shape[1]} heads in the input")
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if atten_mask is not None:
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


# The varlen (TND) limits and the compressed causal mask, as the wheels' docs give them.
MAX_TOKENS = 2**20  # "要求T(B*S)取值范围1~1M"
MAX_VARLEN_BATCH = 1024  # "varlen场景下长度最大支持1K"
COMPRESSED_MASK_SIDE = 2048  # sparse_mode 2/3: "优化后的压缩下三角矩阵(2048*2048)"


def _segments(cumulative, tokens: int, name: str) -> list[tuple[int, int]]:
    """``actual_seq_qlen``-style cumulative lengths (``int[]``) as [start, end) token ranges."""
    if not isinstance(cumulative, (list, tuple)) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in cumulative):
        raise TypeError(f"fake torch_npu: {name} must be a list of ints (int[]), got {cumulative!r}")
    if not 1 <= len(cumulative) <= MAX_VARLEN_BATCH:
        raise RuntimeError(f"fake torch_npu: {name} has {len(cumulative)} entries, not 1..{MAX_VARLEN_BATCH}")
    if len(cumulative) > 1 and cumulative[-1] == 0 and any(cumulative):
        # the docs let trailing zeros leave batches out; what the kernel writes there is not documented
        raise NotImplementedError(f"fake torch_npu: {name} {list(cumulative)} leaves batches out with trailing "
                                  "zeros (not imitated)")
    starts = [0, *cumulative[:-1]]
    if any(end < start for start, end in zip(starts, cumulative)):
        raise RuntimeError(f"fake torch_npu: {name} {list(cumulative)} is not cumulative (it decreases)")
    if cumulative[-1] != tokens:
        raise NotImplementedError(f"fake torch_npu: {name} ends at {cumulative[-1]}, not at the {tokens} tokens "
                                  "given (tokens left out are not imitated)")
    return list(zip(starts, cumulative))


def _fusion_attention_tnd(query, key, value, head_num, atten_mask, scale, actual_seq_qlen, actual_seq_kvlen,
                          sparse_mode):
    """Layout TND: each segment of ``actual_seq_qlen`` attends to its segment of ``actual_seq_kvlen``
    only.  sparse_mode 0 is the full segment; 2 (leftUpCausal) and 3 (rightDownCausal) the causal
    triangle from that corner, given the fixed compressed mask; no mask means full, whatever the mode."""
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        raise RuntimeError(f"fake torch_npu: layout TND takes [T, N, D] tensors, got query {tuple(query.shape)}")
    if actual_seq_qlen is None or actual_seq_kvlen is None:
        raise RuntimeError("fake torch_npu: layout TND needs actual_seq_qlen and actual_seq_kvlen")
    if not 1 <= query.shape[0] <= MAX_TOKENS or not 1 <= key.shape[0] <= MAX_TOKENS:
        raise RuntimeError(f"fake torch_npu: TND takes 1..{MAX_TOKENS} tokens, got {query.shape[0]} and {key.shape[0]}")
    if query.shape[1] != head_num or key.shape[1] != head_num:
        raise RuntimeError(f"fake torch_npu: head_num {head_num} != {query.shape[1]} heads in the input")
    q_segments = _segments(actual_seq_qlen, query.shape[0], "actual_seq_qlen")
    kv_segments = _segments(actual_seq_kvlen, key.shape[0], "actual_seq_kvlen")
    if len(q_segments) != len(kv_segments):
        raise RuntimeError("fake torch_npu: actual_seq_qlen and actual_seq_kvlen differ in length")
    causal = atten_mask is not None  # without a mask every sparse_mode is the full computation
    if causal:
        if sparse_mode not in (2, 3):
            raise NotImplementedError(f"fake torch_npu: TND with an atten_mask in sparse_mode {sparse_mode} "
                                      "is not imitated")
        side = COMPRESSED_MASK_SIDE
        if tuple(atten_mask.shape) != (side, side) or not torch.equal(
                atten_mask.bool(), torch.ones(side, side, dtype=torch.bool, device=atten_mask.device).triu(1)):
            # the docs: any other mask gives wrong results in these modes
            raise RuntimeError(f"fake torch_npu: sparse_mode {sparse_mode} takes the compressed {side}x{side} "
                               f"upper-triangle mask, got {tuple(atten_mask.shape)}")
    elif sparse_mode not in (0, 2, 3):
        raise NotImplementedError(f"fake torch_npu: sparse_mode {sparse_mode} is not imitated with layout TND")
    pieces = []
    for (qa, qb), (ka, kb) in zip(q_segments, kv_segments):
        if qb == qa:
            continue
        if kb == ka:
            raise NotImplementedError("fake torch_npu: queries with no key are not imitated")
        q, k, v = (t[a:b].float().transpose(0, 1) for t, a, b in ((query, qa, qb), (key, ka, kb), (value, ka, kb)))
        scores = (q @ k.transpose(-1, -2)) * scale  # [N, sq, skv]
        if causal:
            sq, skv = qb - qa, kb - ka
            shift = 0 if sparse_mode == 2 else skv - sq  # 2: from the top-left corner; 3: the bottom-right
            masked = torch.arange(skv)[None, :] > torch.arange(sq)[:, None] + shift
            if masked.all(dim=-1).any():
                raise NotImplementedError("fake torch_npu: fully masked rows are not imitated")
            scores = scores.masked_fill(masked, -math.inf)
        pieces.append((scores.softmax(dim=-1) @ v).transpose(0, 1))
    out = torch.cat(pieces).to(query.dtype)
    empty = torch.empty(0)
    return (out, empty, empty, empty, 0, 0, 0)


def npu_gelu(self, *, approximate="none"):
    """``npu_gelu(Tensor self, *, str approximate='none')``: 'none' is the erf form, 'tanh' the tanh form."""
    _refuse_off_npu("npu_gelu", self)
    calls.append(("npu_gelu", {"approximate": approximate}))
    return torch.nn.functional.gelu(self, approximate=approximate)


def npu_geglu(self, dim=-1, approximate=1):
    """``npu_geglu(Tensor self, int dim=-1, int approximate=1) -> (Tensor, Tensor)``: 1 is tanh, 0 erf."""
    _refuse_off_npu("npu_geglu", self)
    calls.append(("npu_geglu", {"dim": dim, "approximate": approximate}))
    hidden, gate = self.chunk(2, dim=dim)
    gelu = torch.nn.functional.gelu(gate, approximate="tanh" if approximate == 1 else "none")
    return hidden * gelu, gelu


def npu_rms_norm(self, gamma, epsilon=1e-06):
    """``npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)``."""
    _refuse_off_npu("npu_rms_norm", self)
    calls.append(("npu_rms_norm", {"epsilon": epsilon}))
    rstd = torch.rsqrt(self.float().pow(2).mean(-1, keepdim=True) + epsilon)
    return (self.float() * rstd).to(self.dtype) * gamma, rstd


from torch_npu import profiler  # noqa: E402,F401  (the real package imports it here too)


def _autoload():
    """The ``torch.backends`` entry point torch calls inside ``import torch``."""
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = ORG_AUTOLOAD


if RULES["autoload_restored_on_import"]:
    _autoload()
