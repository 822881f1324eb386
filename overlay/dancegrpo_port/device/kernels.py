"""diffusers' kernels from the run's device, not from whether torch_npu is installed
(attention-from-device.patch, qwenimage-kernels-from-device.patch).

diffusers picks torch_npu's kernels (Flux attention's ``npu_fusion_attention``, GEGLU's
``npu_geglu``, RMSNorm's ``npu_rms_norm``) whenever torch_npu is installed, whatever the
tensors' device: on a CPU or CUDA run on an Ascend host they would get CPU or CUDA tensors.
Off the NPU they are swapped for diffusers' plain paths; on the NPU diffusers' choice stands,
but for GEGLU's form (``DANCEGRPO_NPU_GELU``, :mod:`dancegrpo_port.device.choice`).  diffusers is
imported only when these are called.
"""

from __future__ import annotations

import importlib

import torch

from dancegrpo_port.device.choice import NPU_GEGLU_EXACT, accelerator


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
    stands, but for GEGLU's form (``choose_geglu`` of :mod:`dancegrpo_port.device.choice`).
    Returns the modules changed (none without torch_npu, or with a diffusers whose module does
    not read it).
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


def _npu_geglu_forward(self, hidden_states, *args, **kwargs):
    # diffusers' NPU path with the erf form; the extra arguments are the deprecated ``scale``,
    # which diffusers ignores too (it also warns)
    import torch_npu

    hidden_states = self.proj(hidden_states)
    return torch_npu.npu_geglu(hidden_states, dim=-1, approximate=0)[0]
