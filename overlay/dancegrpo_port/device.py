"""Where the patched DanceGRPO scripts run: device, process-group backend, autocast.

Added to the upstream tree by dancegrpo-npu (overlay).  Upstream hard-codes CUDA:
``dist.init_process_group("nccl")``, ``torch.cuda.set_device``, ``torch.autocast("cuda")``,
``map_location=f"cuda:{device}"``.  The patch series routes each of those through
this one module, so the same tree runs on an Ascend NPU, on CUDA and on CPU.

Environment (``dancegrpo-npu launch`` sets both; a user may set them by hand):

``DANCEGRPO_DEVICE``      ``auto`` (default) | ``npu`` | ``cuda`` | ``cpu``.  ``auto`` picks the
                          NPU when torch_npu imports and sees one, CUDA or else the CPU when
                          torch_npu is not installed; torch_npu installed but seeing no NPU
                          (``ASCEND_RT_VISIBLE_DEVICES`` not ascending gives none) is refused,
                          never trained around on the CPU.
``DANCEGRPO_NPU_GELU``    ``exact`` (default) | ``upstream``: on an NPU run, ``torch.nn.GELU``
                          modules (the HPS reward's ViT) compute through ``torch_npu.npu_gelu``
                          with their own ``approximate``, and diffusers' ``GEGLU`` (the SD UNet's
                          feed-forwards) through ``torch_npu.npu_geglu`` in the erf form;
                          ``upstream`` leaves torch's op and diffusers' tanh kernel (see
                          :func:`choose_gelu` and :func:`choose_geglu`).
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
diffusers only in :func:`choose_attention_processors` and :func:`choose_diffusers_kernels`.
On an Ascend host torch (>= 2.5) has already imported torch_npu inside ``import torch`` (its
``torch.backends`` entry point), whatever ``DANCEGRPO_DEVICE`` says; without CANN's
``set_env.sh`` that import fails, and this module says so in one line.
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` keeps torch from loading it, but diffusers imports an
installed torch_npu itself (``diffusers.models.activations``), so a CPU run on an Ascend host
needs CANN's environment too, or a virtualenv without torch_npu.

Two device settings the upstream recipe assumes are made here too: :func:`allow_tf32`
(TF32 on CUDA, HF32 on the NPU; allow-tf32-hf32.patch) and :func:`choose_attention_processors`
(diffusers' NPU attention only on an NPU run; attention-from-device.patch).
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass

from dancegrpo_port.contract import DEVICE_CHOICES, DEVICE_ENV, STRICT_ENV

GELU_ENV = "DANCEGRPO_NPU_GELU"
SET_ENV_HINT = "source CANN's set_env.sh (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh)"
# diffusers imports an installed torch_npu whatever torch does: autoload off is not enough for the trainers
CPU_ONLY_HINT = ("for CPU-only work on an Ascend host use a virtualenv without torch_npu "
                 "(TORCH_DEVICE_BACKEND_AUTOLOAD=0 lets torch start, but diffusers imports torch_npu itself)")


class DeviceSelectionError(RuntimeError):
    """The device asked for in DANCEGRPO_DEVICE cannot be used here."""


try:
    import torch
except RuntimeError as _error:  # torch >= 2.5 imports torch_npu inside `import torch` (its entry point)
    if "backend extension: torch_npu" not in str(_error):
        raise
    _cause = _error.__cause__
    raise DeviceSelectionError(
        f"import torch failed loading torch_npu ({type(_cause).__name__}: {str(_cause).splitlines()[0] if _cause else ''}): "
        f"{SET_ENV_HINT}, or {CPU_ONLY_HINT}") from _error

DIST_BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Accelerator:
    """The resolved choice for this process."""

    kind: str  # "npu" | "cuda" | "cpu"
    strict: bool
    gelu: str = "torch"  # what torch.nn.GELU runs: "torch" | "torch_npu.npu_gelu"
    # what diffusers' GEGLU runs once choose_diffusers_kernels has run: "diffusers" (its own
    # forward: erf off the NPU, npu_geglu's tanh form on it) | NPU_GEGLU_EXACT
    geglu: str = "diffusers"

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


GELU_CHOICES = ("exact", "upstream")


def gelu_requested(environ=None) -> str:
    environ = os.environ if environ is None else environ
    value = environ.get(GELU_ENV, "exact").strip().lower() or "exact"
    if value not in GELU_CHOICES:
        raise DeviceSelectionError(f"{GELU_ENV}={value!r} is not one of {', '.join(GELU_CHOICES)}")
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
    except Exception as exc:  # noqa: BLE001 - libhccl.so not found (ImportError); CANN's package check raises a bare Exception
        error = exc
    first_line = str(error).splitlines()[0] if str(error) else ""
    raise DeviceSelectionError(
        f"torch_npu is installed but does not import ({type(error).__name__}: {first_line}); "
        f"{SET_ENV_HINT}, or {CPU_ONLY_HINT}") from error


def _npu_visible(torch_npu) -> bool:
    # device_count(), not is_available(): from torch_npu 2.10.0.post7 is_available() is the CANN
    # runtime's count, True for ASCEND_RT_VISIBLE_DEVICES=3,2 where device_count() (the ids
    # set_device accepts) is 0; device_count() > 0 is what is_available() was before
    npu = getattr(torch, "npu", None) or getattr(torch_npu, "npu", None)
    return bool(npu is not None and npu.device_count() > 0)


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
            raise DeviceSelectionError(
                f"{DEVICE_ENV}=npu but torch_npu sees no NPU: check ASCEND_RT_VISIBLE_DEVICES (ascending ids, "
                "each once) and `npu-smi info`")
        return "npu"
    if torch_npu is not None:
        if not _npu_visible(torch_npu):
            # never the CPU silently on an Ascend host: hours of gloo training nobody asked for
            visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
            shown = "unset" if visible is None else repr(visible)
            raise DeviceSelectionError(
                f"{DEVICE_ENV}=auto: torch_npu is installed but sees no NPU (ASCEND_RT_VISIBLE_DEVICES {shown}); "
                "check ASCEND_RT_VISIBLE_DEVICES (ascending ids, each once, e.g. 0,1,2,3) and `npu-smi info`, "
                f"or set {DEVICE_ENV}=cpu|cuda to run elsewhere on purpose")
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
    gelu = gelu_requested(environ)
    if kind == "npu":
        # Redirects torch.cuda.* / "cuda" device strings to the NPU; must come
        # before anything initialises CUDA (torch >= 2.5: the import suffices).
        importlib.import_module("torch_npu.contrib.transfer_to_npu")
    _active = Accelerator(kind=kind, strict=strict_requested(environ), gelu=choose_gelu(kind, gelu),
                          geglu=choose_geglu(kind, gelu))
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


def start_distributed(local_rank: int) -> torch.device:
    """The trainers' start, in upstream's order: the process group (upstream's
    ``dist.init_process_group("nccl")``) on this device's backend, then ``local_rank``'s device
    made current (upstream's ``torch.cuda.set_device``) and returned as a torch.device."""
    import torch.distributed as dist

    store = _restart_store(dist)
    if store is None:
        dist.init_process_group(dist_backend())
    else:
        dist.init_process_group(dist_backend(), store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    return set_local_device(local_rank)


def _restart_store(dist, environ=None):
    """A worker torchrun restarted (--max-restarts) on its static rendezvous: torchrun hands every
    attempt the same store, so an attempt's rank could read the address an earlier attempt's
    rank 0 left there (gloo: "connectFullMesh failed ... Connection refused") before this
    attempt's rank 0 writes its own.  The attempt's keys get a prefix of their own; None at the
    first attempt, or outside torchrun's agent store: init_process_group's own store then."""
    environ = os.environ if environ is None else environ
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt in ("", "0") or environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), int(environ["WORLD_SIZE"]),
                          is_master=False)
    return dist.PrefixStore(f"dancegrpo-restart-{attempt}", store)


def current_device() -> torch.device:
    kind = accelerator().kind
    if kind == "cpu":
        return torch.device("cpu")
    return torch.device(kind, getattr(torch, kind).current_device())


def empty_cache() -> None:
    """The device's ``empty_cache`` (upstream's ``torch.cuda.empty_cache()``); nothing on the CPU."""
    kind = accelerator().kind
    if kind != "cpu":
        getattr(torch, kind).empty_cache()


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



_AVG_REFUSED = "Cannot use ReduceOp.AVG with Gloo"


def all_reduce_mean(tensor: torch.Tensor) -> None:
    """``dist.all_reduce(tensor, op=ReduceOp.AVG)``, as upstream averages the logged loss, on
    every backend: torch 2.7.1's gloo refuses AVG (measured: "Cannot use ReduceOp.AVG with
    Gloo"; torch 2.10's takes it), so a CPU run of MindSpeed-MM's torch line stopped at its
    first step.  There the mean is the sum divided by the world size; where AVG is taken it is
    used unchanged.  gloo refuses before any rank sends, so every rank takes the same path."""
    import torch.distributed as dist

    try:
        dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
    except RuntimeError as e:
        if _AVG_REFUSED not in str(e):
            raise
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor.div_(dist.get_world_size())


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
        "torch.nn.GELU": accelerator().gelu,  # the op the reward's GELU ran (DANCEGRPO_NPU_GELU)
        "diffusers GEGLU": accelerator().geglu,  # and diffusers' GEGLU (the same variable)
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
    choose_diffusers_kernels()  # the same trap in GEGLU and RMSNorm; called from the same trainer lines
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


# --------------------------------------------------------------------------- kernels chosen by import

DIFFUSERS_KERNEL_MODULES = (
    "diffusers.models.activations",  # GEGLU: torch_npu.npu_geglu (diffusers 0.32 and later)
    "diffusers.models.normalization",  # RMSNorm: torch_npu.npu_rms_norm (diffusers >= 0.35)
)


def _no_npu() -> bool:
    return False


def choose_diffusers_kernels() -> list[str]:
    """diffusers' torch_npu kernels only on an NPU run, as for attention.

    diffusers' ``GEGLU.forward`` (0.32) and ``RMSNorm.forward`` (>= 0.35) call
    ``torch_npu.npu_geglu`` / ``npu_rms_norm`` whenever ``is_torch_npu_available()`` (torch_npu
    installed), whatever the tensors' device.  Off the NPU the ``is_torch_npu_available`` those
    forwards read from their module's globals answers False; on the NPU diffusers' choice
    stands, but for GEGLU's form (:func:`choose_geglu`).  Returns the modules changed (none
    without torch_npu, or with a diffusers whose module does not read it).
    """
    if accelerator().kind == "npu":
        if accelerator().geglu != NPU_GEGLU_EXACT:
            return []
        from diffusers.models import activations

        if activations.GEGLU.forward is _npu_geglu_forward:
            return []
        activations.GEGLU.forward = _npu_geglu_forward
        return ["diffusers.models.activations"]
    changed = []
    for name in DIFFUSERS_KERNEL_MODULES:
        module = importlib.import_module(name)
        check = getattr(module, "is_torch_npu_available", None)
        if check is not None and check is not _no_npu and check():
            module.is_torch_npu_available = _no_npu
            changed.append(name)
    return changed


def _npu_gelu_forward(self, input):
    import torch_npu

    return torch_npu.npu_gelu(input, approximate=self.approximate)


def choose_gelu(kind: str, requested: str) -> str:
    """The op every ``torch.nn.GELU`` runs (the HPS reward's ViT-H is built of them).

    Ascend documents the NPU's native GELU as the tanh form whatever ``approximate`` asks; the
    reward's ViT was trained with the exact (erf) form.  On an NPU run with ``exact``
    (the default) ``torch.nn.GELU.forward`` calls ``torch_npu.npu_gelu(x, approximate=...)``
    with the module's own ``approximate`` ('none': erf); ``upstream`` leaves torch's op, so
    ``compare`` between two NPU runs, one of each, measures what the choice moves.  Off the
    NPU nothing changes.
    """
    if kind != "npu" or requested == "upstream":
        return "torch"
    torch.nn.GELU.forward = _npu_gelu_forward
    return "torch_npu.npu_gelu"


NPU_GEGLU_EXACT = "torch_npu.npu_geglu(approximate=0)"


def _npu_geglu_forward(self, hidden_states, *args, **kwargs):
    # diffusers' NPU path with the erf form; the extra arguments are the deprecated ``scale``,
    # which diffusers ignores too (it also warns)
    import torch_npu

    hidden_states = self.proj(hidden_states)
    return torch_npu.npu_geglu(hidden_states, dim=-1, approximate=0)[0]


def choose_geglu(kind: str, requested: str) -> str:
    """What diffusers' ``GEGLU`` (the SD UNet's feed-forwards) runs; :func:`choose_diffusers_kernels`
    applies it, since diffusers is not imported yet when :func:`activate` runs.

    On the NPU diffusers calls ``torch_npu.npu_geglu(x, dim=-1, approximate=1)``, the tanh form
    (CANN: 0 is none, the erf form; 1 is tanh); elsewhere it gates with the exact (erf) GELU.
    On an NPU run with ``exact`` (the default, as for :func:`choose_gelu`) GEGLU calls
    ``npu_geglu`` with ``approximate=0``; ``upstream`` keeps diffusers' forward.  Off the NPU
    diffusers' forward stays (its plain path, see :func:`choose_diffusers_kernels`).
    """
    if kind != "npu" or requested == "upstream":
        return "diffusers"
    return NPU_GEGLU_EXACT
