"""Strict mode: fail at the first op that makes a complex or float64 tensor on the run's device.

Added to the upstream tree by dancegrpo-npu (overlay).  The Ascend NPU runs neither
complex nor float64 kernels, and code that makes such tensors runs fine on CUDA and
CPU - so a port can look finished and still fail on the NPU.  With
``DANCEGRPO_NPU_STRICT=1``, ``dancegrpo_port.device.activate`` (the first thing each
patched script runs) switches this mode on for the rest of the process, and every aten
op the process runs is checked: the whole training step - module forwards, the GRPO
math between them (``flux_step``'s log-prob, the ratio, the loss), the backward pass,
``clip_grad_norm_`` and the optimizer - and also sampling, the reward and checkpointing.
The first op that produces a complex or float64 tensor *on the run's device* stops the
run, naming the op and where it ran::

    strict mode: aten.pow.Scalar made a torch.float64 tensor on cpu in
    FluxTransformer2DModel.pos_embed (FluxPosEmbed) ...
    strict mode: aten.mul.Tensor made a torch.float64 tensor on cpu outside modules:
    .../train_grpo_flux.py:612 (train_one_step) ...
    strict mode: aten.mul.Tensor made a torch.float64 tensor on cpu in backward of
    MulBackward0 ...

"Where" is the innermost module whose forward is running (a dotted path from the
outermost module; activation checkpointing re-runs forwards during backward and is
reported so), else the autograd node whose backward is running, else the first
Python frame outside torch that called the op.  The mode is a ``TorchDispatchMode``:
it sees the ops after autograd and autocast, as the device would run them, including
the backward ops (the autograd engine runs them with the thread-local state of the
thread that called ``backward()``, dispatch modes included).

"On the run's device": the rule the NPU imposes is that no float64 or complex tensor
lives on the NPU; float64 on the host (numpy, data loading) is fine there.  An NPU or
CUDA run therefore checks only NPU/CUDA tensors.  A CPU run cannot tell host from
device, so it checks every CPU tensor - stricter than the NPU.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

FORBIDDEN_DTYPES = (torch.float64, torch.complex32, torch.complex64, torch.complex128)
# FSDP / activation-checkpoint wrappers add these names; they say nothing to a reader.
_WRAPPER_NAMES = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")
# Frames in these files are not "the code that called the op": torch (and torch_npu,
# whose transfer_to_npu wraps torch's functions) and the `with` machinery.
_TORCH_DIR = os.path.dirname(torch.__file__)
_INTERNAL_PREFIXES = (
    _TORCH_DIR + os.sep,
    os.path.join(os.path.dirname(_TORCH_DIR), "torch_npu") + os.sep,
    contextlib.__file__,
)


class StrictModeError(RuntimeError):
    """An op produced a complex or float64 tensor on the run's device."""


@dataclass(frozen=True)
class Violation:
    op: str
    dtype: torch.dtype
    device: str
    where: str  # "Outer.inner (Inner)" | "backward of MulBackward0" | "outside modules: f.py:12 (fn)"

    def message(self) -> str:
        place = self.where if self.where.startswith("outside modules") else f"in {self.where}"
        return (
            f"strict mode: {self.op} made a {self.dtype} tensor on {self.device} {place}; the Ascend "
            "NPU runs no complex or float64 ops (DANCEGRPO_NPU_STRICT=1 stops at the first one; "
            "unset it, or launch without --strict, to run anyway on CPU/CUDA)"
        )


class ModuleTracker:
    """Which module's forward is running, as a dotted path (global module hooks)."""

    def __init__(self):
        self._stack: list[tuple[torch.nn.Module, str]] = []
        self._handles = []
        # each module's path when last entered from its parent: activation checkpointing
        # re-runs a block's forward in backward, when no parent forward is running
        self._known: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()

    def install(self) -> None:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._enter),
            hooks.register_module_forward_hook(self._leave, always_call=True),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stack.clear()
        self._known.clear()

    @property
    def active(self) -> bool:
        return bool(self._stack)

    def path(self) -> str:
        if not self._stack:
            return "(no module)"
        module, path = self._stack[-1]
        return f"{path} ({type(module).__name__})"

    def _enter(self, module, inputs):
        if not self._stack:
            self._stack.append((module, self._known.get(module, type(module).__name__)))
            return
        parent, parent_path = self._stack[-1]
        name = next((n for n, child in parent._modules.items() if child is module), None)
        if name is None:
            path = f"{parent_path}>{type(module).__name__}"
        elif name in _WRAPPER_NAMES:
            path = parent_path
        else:
            path = f"{parent_path}.{name}"
        self._known[module] = path
        self._stack.append((module, path))

    def _leave(self, module, inputs, output):
        if self._stack and self._stack[-1][0] is module:
            self._stack.pop()


def _location(frame) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


def _is_internal(frame) -> bool:
    filename = frame.f_code.co_filename
    return filename == __file__ or filename.startswith(_INTERNAL_PREFIXES)


def _caller_outside_torch() -> str:
    """``file:line (function)`` of the innermost frame that is not torch's or this module's."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _is_internal(frame):
            return _location(frame)
        frame = frame.f_back
    return "(no Python caller)"


def _python_code_in_backward() -> str | None:
    """The Python code the autograd engine is running (a custom Function's ``backward``,
    a tensor hook), or None for a backward formula written in C++.

    Below the engine's entry (``_engine_run_backward``) lies the code that called
    ``backward()``, which is not where the op ran; on a device's autograd thread the
    stack starts at the engine.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_engine_run_backward" and _is_internal(frame):
            return None
        if not _is_internal(frame):
            return _location(frame)
        frame = frame.f_back
    return None


def where_now(tracker: ModuleTracker) -> str:
    """Where the op being dispatched runs: module forward, backward node, or Python caller."""
    node = torch._C._current_autograd_node()
    if tracker.active:
        # a forward re-run by activation checkpointing inside backward is still that module's
        suffix = f", re-run in backward of {node.name()}" if node is not None else ""
        return tracker.path() + suffix
    if node is not None:
        code = _python_code_in_backward()
        return f"backward of {node.name()}" + (f" at {code}" if code else "")
    return f"outside modules: {_caller_outside_torch()}"


class StrictDtypeMode(TorchDispatchMode):
    """Checks every op's outputs: none may be complex or float64 on ``device_type``.

    ``device_type=None`` checks tensors on every device.  ``raise_on_violation=False``
    records the violations instead (``.violations``), which is how the tests count
    the ops a module makes.
    """

    def __init__(self, tracker: ModuleTracker, raise_on_violation: bool = True, device_type: str | None = None):
        super().__init__()
        self.tracker = tracker
        self.raise_on_violation = raise_on_violation
        self.device_type = device_type
        self.violations: list[Violation] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if (
                isinstance(leaf, torch.Tensor)
                and leaf.dtype in FORBIDDEN_DTYPES
                and (self.device_type is None or leaf.device.type == self.device_type)
                and not (_host_side_depth and leaf.device.type == "cpu")
            ):
                violation = Violation(str(func), leaf.dtype, str(leaf.device), where_now(self.tracker))
                if self.raise_on_violation:
                    raise StrictModeError(violation.message())
                self.violations.append(violation)
                break
        return out


@contextlib.contextmanager
def strict_mode(raise_on_violation: bool = True, device_type: str | None = None):
    """Strict mode for a block; yields the mode (its ``violations`` when recording)."""
    tracker = ModuleTracker()
    tracker.install()
    try:
        with StrictDtypeMode(tracker, raise_on_violation, device_type) as mode:
            yield mode
    finally:
        tracker.remove()


_process_wide: contextlib.ExitStack | None = None
_host_side_depth = 0


@contextlib.contextmanager
def host_side():
    """A block that runs on the host whatever the run's device - a model built on the CPU
    before it is moved (VideoAlign's load adds its reward tokens' embeddings there, with a
    complex eigendecomposition): its CPU tensors are host tensors, which the NPU's rule allows.
    On a CPU run strict mode cannot tell them from the device's otherwise; device tensors made
    inside are checked as ever."""
    global _host_side_depth
    _host_side_depth += 1
    try:
        yield
    finally:
        _host_side_depth -= 1


def enable_strict_mode(device_type: str | None = None) -> None:
    """Strict mode from now to the end of the process (what DANCEGRPO_NPU_STRICT=1 does).

    It is entered in the calling thread - the main thread, which runs the training
    step; the autograd engine carries it into its worker threads for ``backward()``.
    """
    global _process_wide
    if _process_wide is None:
        stack = contextlib.ExitStack()
        stack.enter_context(strict_mode(device_type=device_type))
        _process_wide = stack
