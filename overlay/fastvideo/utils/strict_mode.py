"""Strict mode: fail at the first op on the model path that makes a complex or float64 tensor.

Added to the upstream tree by dancegrpo-npu (overlay).  The Ascend NPU runs neither
complex nor float64 kernels, and code that makes such tensors runs fine on CUDA and
CPU - so a port can look finished and still fail on the NPU.  With
``DANCEGRPO_NPU_STRICT=1`` (read by ``fastvideo.utils.device.activate``) every aten op
is checked on any machine, and the first one that produces such a tensor while a
module's forward is running stops the run with the op and the module's path::

    strict mode: aten.pow.Scalar made a torch.float64 tensor in
    FluxTransformer2DModel.pos_embed (FluxPosEmbed) ...

"The model path" is: inside the forward of any ``torch.nn.Module`` (the transformer,
the VAE, the reward model, the text encoders).  Data loading and host-side
bookkeeping outside modules are not checked.  The mode is a ``TorchDispatchMode``,
so it sees the ops after autocast, as the device would run them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

FORBIDDEN_DTYPES = (torch.float64, torch.complex32, torch.complex64, torch.complex128)
# FSDP / activation-checkpoint wrappers add these names; they say nothing to a reader.
_WRAPPER_NAMES = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


class StrictModeError(RuntimeError):
    """An op on the model path produced a complex or float64 tensor."""


@dataclass(frozen=True)
class Violation:
    op: str
    dtype: torch.dtype
    module: str

    def message(self) -> str:
        return (
            f"strict mode: {self.op} made a {self.dtype} tensor in {self.module}; the Ascend NPU "
            "runs no complex or float64 ops (DANCEGRPO_NPU_STRICT=1 stops at the first one; "
            "unset it to run anyway on CPU/CUDA)"
        )


class ModuleTracker:
    """Which module's forward is running, as a dotted path (global module hooks)."""

    def __init__(self):
        self._stack: list[tuple[torch.nn.Module, str]] = []
        self._handles = []

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
            self._stack.append((module, type(module).__name__))
            return
        parent, parent_path = self._stack[-1]
        name = next((n for n, child in parent._modules.items() if child is module), None)
        if name is None:
            path = f"{parent_path}>{type(module).__name__}"
        elif name in _WRAPPER_NAMES:
            path = parent_path
        else:
            path = f"{parent_path}.{name}"
        self._stack.append((module, path))

    def _leave(self, module, inputs, output):
        if self._stack and self._stack[-1][0] is module:
            self._stack.pop()


class StrictDtypeMode(TorchDispatchMode):
    """Checks every op's outputs while a module's forward runs.

    ``raise_on_violation=False`` records the violations instead (``.violations``),
    which is how the tests count the ops a module makes.
    """

    def __init__(self, tracker: ModuleTracker, raise_on_violation: bool = True):
        super().__init__()
        self.tracker = tracker
        self.raise_on_violation = raise_on_violation
        self.violations: list[Violation] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.tracker.active:
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor) and leaf.dtype in FORBIDDEN_DTYPES:
                    violation = Violation(str(func), leaf.dtype, self.tracker.path())
                    if self.raise_on_violation:
                        raise StrictModeError(violation.message())
                    self.violations.append(violation)
                    break
        return out


@contextlib.contextmanager
def strict_mode(raise_on_violation: bool = True):
    """Strict mode for a block; yields the mode (its ``violations`` when recording)."""
    tracker = ModuleTracker()
    tracker.install()
    try:
        with StrictDtypeMode(tracker, raise_on_violation) as mode:
            yield mode
    finally:
        tracker.remove()


_process_wide: contextlib.ExitStack | None = None


def enable_strict_mode() -> None:
    """Strict mode from now to the end of the process (what DANCEGRPO_NPU_STRICT=1 does)."""
    global _process_wide
    if _process_wide is None:
        stack = contextlib.ExitStack()
        stack.enter_context(strict_mode())
        _process_wide = stack

