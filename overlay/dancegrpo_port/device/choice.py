"""Which device this process runs on, chosen once: ``DANCEGRPO_DEVICE``, ``DANCEGRPO_NPU_STRICT``,
``DANCEGRPO_NPU_GELU`` read by :func:`activate`, and the chosen device's own calls
(``set_device``, ``current_device``, ``empty_cache``).

``auto`` picks the NPU when torch_npu imports and sees one, CUDA or else the CPU when torch_npu
is not installed; torch_npu installed but seeing no NPU (``ASCEND_RT_VISIBLE_DEVICES`` not
ascending gives none) is refused, never trained around on the CPU.  On the NPU
``torch_npu.contrib.transfer_to_npu`` is imported here, before anything touches CUDA, so that it
can redirect ``torch.cuda`` calls to ``torch.npu``.

``DANCEGRPO_NPU_GELU`` (``exact``, the default, or ``upstream``) is chosen with the device: on an
NPU run every ``torch.nn.GELU`` (the HPS reward's ViT) runs ``torch_npu.npu_gelu`` with its own
``approximate`` from :func:`activate` on, and diffusers' GEGLU the erf form once
:func:`dancegrpo_port.device.kernels.choose_diffusers_kernels` has run.
"""

from __future__ import annotations

import importlib
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


def empty_cache() -> None:
    """The device's ``empty_cache`` (upstream's ``torch.cuda.empty_cache()``); nothing on the CPU."""
    kind = accelerator().kind
    if kind != "cpu":
        getattr(torch, kind).empty_cache()


# --------------------------------------------------------------------------- the GELU chosen with the device


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


def choose_geglu(kind: str, requested: str) -> str:
    """What diffusers' ``GEGLU`` (the SD UNet's feed-forwards) runs;
    :func:`dancegrpo_port.device.kernels.choose_diffusers_kernels` applies it, since diffusers is
    not imported yet when :func:`activate` runs.

    On the NPU diffusers calls ``torch_npu.npu_geglu(x, dim=-1, approximate=1)``, the tanh form
    (CANN: 0 is none, the erf form; 1 is tanh); elsewhere it gates with the exact (erf) GELU.
    On an NPU run with ``exact`` (the default, as for :func:`choose_gelu`) GEGLU calls
    ``npu_geglu`` with ``approximate=0``; ``upstream`` keeps diffusers' forward.  Off the NPU
    diffusers' forward stays (its plain path, see ``choose_diffusers_kernels``).
    """
    if kind != "npu" or requested == "upstream":
        return "diffusers"
    return NPU_GEGLU_EXACT
