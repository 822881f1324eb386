"""Where the patched DanceGRPO scripts run: device, process-group backend, autocast.

Added to the upstream tree by dancegrpo-npu (overlay).  Upstream hard-codes CUDA:
``dist.init_process_group("nccl")``, ``torch.cuda.set_device``, ``torch.autocast("cuda")``,
``map_location=f"cuda:{device}"``.  The patch series routes each of those through
this one module, so the same tree runs on an Ascend NPU, on CUDA and on CPU.

Environment (``dancegrpo-npu launch`` sets both; a user may set them by hand):

``DANCEGRPO_DEVICE``      ``auto`` (default) | ``npu`` | ``cuda`` | ``cpu``.  ``auto`` picks the
                          NPU when torch_npu imports and sees one, else CUDA when available,
                          else the CPU.
``DANCEGRPO_NPU_STRICT``  ``1``: strict mode (``dancegrpo_port.strict_mode``) - from
                          :func:`activate` to the end of the process, fail at the first op
                          that makes a complex or float64 tensor on the chosen device (the
                          NPU runs neither), naming the op and where it ran.

============  ========  =============  ===============================================
device        backend   autocast type  notes
============  ========  =============  ===============================================
npu           hccl      npu            torch_npu + transfer_to_npu imported first
cuda          nccl      cuda           upstream's behaviour, unchanged
cpu           gloo      cpu            FSDP without CPU offload / sync_module_states
============  ========  =============  ===============================================

The scripts call :func:`activate` before anything touches CUDA: on Ascend,
``torch_npu.contrib.transfer_to_npu`` must be imported before any ``torch.cuda`` call
so that it can redirect them to ``torch.npu``.  This module needs only torch; it
imports torch_npu only when the NPU is asked for (or ``auto`` probes for it), and
diffusers only in :func:`choose_attention_processors`.

Two device settings the upstream recipe assumes are made here too: :func:`allow_tf32`
(TF32 on CUDA, HF32 on the NPU; patch 0016) and :func:`choose_attention_processors`
(diffusers' NPU attention only on an NPU run; patch 0017).
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass

import torch

from dancegrpo_port.contract import DEVICE_CHOICES, DEVICE_ENV, STRICT_ENV
DIST_BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
_TRUE = ("1", "true", "yes", "on")


class DeviceSelectionError(RuntimeError):
    """The device asked for in DANCEGRPO_DEVICE cannot be used here."""


@dataclass(frozen=True)
class Accelerator:
    """The resolved choice for this process."""

    kind: str  # "npu" | "cuda" | "cpu"
    strict: bool

    @property
    def dist_backend(self) -> str:
        return DIST_BACKENDS[self.kind]

    @property
    def autocast_device_type(self) -> str:
        return self.kind


def requested_kind(environ=None) -> str:
    environ = os.environ if environ is None else environ
    value = environ.get(DEVICE_ENV, "auto").strip().lower() or "auto"
    if value not in DEVICE_CHOICES:
        raise DeviceSelectionError(
            f"{DEVICE_ENV}={value!r} is not one of {', '.join(DEVICE_CHOICES)}")
    return value


def strict_requested(environ=None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get(STRICT_ENV, "").strip().lower() in _TRUE


def _import_torch_npu():
    """torch_npu, or None when it is not installed; installed but broken is an error."""
    try:
        return importlib.import_module("torch_npu")
    except ModuleNotFoundError as exc:
        if exc.name == "torch_npu":
            return None
        error = exc
    except (ImportError, OSError) as exc:  # e.g. CANN's libraries not on the loader path
        error = exc
    raise DeviceSelectionError(
        f"torch_npu is installed but does not import ({type(error).__name__}: {error}); source CANN's "
        f"set_env.sh first, or set {DEVICE_ENV}=cpu|cuda to run without it") from error


def _npu_visible(torch_npu) -> bool:
    npu = getattr(torch, "npu", None) or getattr(torch_npu, "npu", None)
    return bool(npu is not None and npu.is_available())


def resolve_kind(requested: str) -> str:
    """The device kind for ``requested`` (see the module docstring for ``auto``)."""
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise DeviceSelectionError(
                f"{DEVICE_ENV}=cuda but torch.cuda.is_available() is False",
            )
        return "cuda"
    torch_npu = _import_torch_npu()
    if requested == "npu":
        if torch_npu is None:
            raise DeviceSelectionError(
                f"{DEVICE_ENV}=npu but torch_npu is not installed (install the torch_npu "
                "build that matches this torch)")
        if not _npu_visible(torch_npu):
            raise DeviceSelectionError(f"{DEVICE_ENV}=npu but torch_npu sees no NPU")
        return "npu"
    if torch_npu is not None and _npu_visible(torch_npu):
        return "npu"
    return "cuda" if torch.cuda.is_available() else "cpu"


_active: Accelerator | None = None  # one process, one device choice


def activate(environ=None) -> Accelerator:
    """Resolve the device once per process; on the NPU import transfer_to_npu.

    Call it first thing in a script.  With strict mode asked for, strict mode is
    switched on here for the rest of the process, checking tensors on ``kind``'s
    device (on the CPU: every tensor, since host and device are one there).
    """
    global _active
    if _active is not None:
        return _active
    kind = resolve_kind(requested_kind(environ))
    if kind == "npu":
        # Redirects torch.cuda.* / "cuda" device strings to the NPU; must come
        # before anything initialises CUDA (torch >= 2.5: the import suffices).
        importlib.import_module("torch_npu.contrib.transfer_to_npu")
    _active = Accelerator(kind=kind, strict=strict_requested(environ))
    if _active.strict:
        from dancegrpo_port.strict_mode import enable_strict_mode

        enable_strict_mode(device_type=kind)
    return _active


def accelerator() -> Accelerator:
    return activate()


def dist_backend() -> str:
    """hccl on the NPU, nccl on CUDA (upstream's), gloo on the CPU."""
    return accelerator().dist_backend


def set_local_device(local_rank: int) -> torch.device:
    """Make ``local_rank``'s device current and return it as a torch.device.

    Upstream passes the bare int from ``torch.cuda.current_device()`` around;
    transfer_to_npu rewrites ints as CUDA ordinals, so FSDP and friends get a
    torch.device here.
    """
    kind = accelerator().kind
    if kind == "cpu":
        return torch.device("cpu")
    getattr(torch, kind).set_device(local_rank)
    return torch.device(kind, local_rank)


def current_device() -> torch.device:
    kind = accelerator().kind
    if kind == "cpu":
        return torch.device("cpu")
    return torch.device(kind, getattr(torch, kind).current_device())


def autocast(dtype: torch.dtype | None = None, enabled: bool = True):
    """``torch.autocast`` on this device (``torch.autocast("cuda")`` silently
    disables itself for CPU tensors, and bf16 activations then meet fp32 weights)."""
    if dtype is None:
        return torch.autocast(accelerator().autocast_device_type, enabled=enabled)
    return torch.autocast(accelerator().autocast_device_type, dtype=dtype, enabled=enabled)


def fsdp_cpu_offload_supported() -> bool:
    """FSDP's CPUOffload needs an accelerator to offload from."""
    return accelerator().kind != "cpu"


def fsdp_sync_module_states_supported() -> bool:
    """FSDP's sync_module_states broadcasts over the device's collective backend;
    with gloo on the CPU it is refused, so ranks are synchronised by hand."""
    return accelerator().kind != "cpu"


def full_state_dict_cpu_offload() -> bool:
    """Whether full (gathered) state dicts may be offloaded to the CPU.

    On the CPU they already are: FSDP's offload path then frees the sharded
    storage it just gathered and, with two or more ranks, fails with
    ``storage of size 0``.
    """
    return accelerator().kind != "cpu"


def broadcast_module_states(module: torch.nn.Module, src: int = 0) -> None:
    """What FSDP's ``sync_module_states=True`` does: every rank takes rank
    ``src``'s parameters and buffers (e.g. freshly initialised LoRA weights)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=src)



# --------------------------------------------------------------------------- matmul precision

MATMUL_RECORD = "matmul_precision.json"  # rank 0 writes it in the working directory (the run directory)


def allow_tf32(flag: bool = True, record: str | None = MATMUL_RECORD) -> dict:
    """TF32 for float32 matmuls and convolutions on CUDA, and its NPU counterpart, HF32.

    Upstream's recipe sets ``torch.backends.cuda.matmul.allow_tf32 = True``; transfer_to_npu
    does not carry that switch over, so on the NPU float32 matmuls would run at full float32
    while the CUDA recipe runs them in TF32.  torch_npu's documented switches
    ``torch.npu.matmul.allow_hf32`` (default False, "like torch.backends.cuda.matmul.allow_tf32")
    and ``torch.npu.conv.allow_hf32`` (default True, "like torch.backends.cudnn.allow_tf32")
    are set to ``flag`` on the NPU.  Returns the switches as read back after setting them;
    rank 0 (``RANK``, default 0) also writes them to ``record`` (JSON), for the run's record.
    """
    torch.backends.cuda.matmul.allow_tf32 = flag
    torch.backends.cudnn.allow_tf32 = flag
    kind = accelerator().kind
    settings = {
        "device": kind,
        "allow_tf32": flag,
        "torch.backends.cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "torch.backends.cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "torch.npu.matmul.allow_hf32": None,  # None: not an NPU run, left alone
        "torch.npu.conv.allow_hf32": None,
    }
    if kind == "npu":
        torch.npu.matmul.allow_hf32 = flag
        torch.npu.conv.allow_hf32 = flag
        settings["torch.npu.matmul.allow_hf32"] = bool(torch.npu.matmul.allow_hf32)
        settings["torch.npu.conv.allow_hf32"] = bool(torch.npu.conv.allow_hf32)
    if record and int(os.environ.get("RANK", "0")) == 0:
        with open(record, "w") as f:
            json.dump(settings, f, indent=1)
            f.write("\n")
    return settings


# --------------------------------------------------------------------------- attention processor


def choose_attention_processors(transformer: torch.nn.Module) -> int:
    """Attention processors from the run's device, not from whether torch_npu is installed.

    diffusers 0.32 gives FluxSingleTransformerBlock its ``FluxAttnProcessor2_0_NPU`` whenever
    ``is_torch_npu_available()`` (torch_npu installed), and that processor calls
    ``torch_npu.npu_fusion_attention`` for fp16/bf16 queries - on CPU (or CUDA) tensors when the
    run's device is not the NPU.  Off the NPU each such processor is replaced by
    ``FluxAttnProcessor2_0`` (scaled_dot_product_attention); on the NPU diffusers' choice stands.
    Returns how many processors were replaced.  A diffusers without the NPU class has nothing
    to replace.
    """
    if accelerator().kind == "npu":
        return 0
    from diffusers.models import attention_processor

    npu_processor = getattr(attention_processor, "FluxAttnProcessor2_0_NPU", None)
    if npu_processor is None:
        return 0
    replaced = 0
    for module in transformer.modules():
        if isinstance(getattr(module, "processor", None), npu_processor):
            module.set_processor(attention_processor.FluxAttnProcessor2_0())
            replaced += 1
    return replaced
