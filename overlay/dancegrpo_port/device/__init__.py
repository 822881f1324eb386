"""Where the patched DanceGRPO scripts run: device, process-group backend, autocast.

Added to the upstream tree by dancegrpo-npu (overlay).  Upstream hard-codes CUDA:
``dist.init_process_group("nccl")``, ``torch.cuda.set_device``, ``torch.autocast("cuda")``,
``map_location=f"cuda:{device}"``.  The patch series routes each of those through
this package, so the same tree runs on an Ascend NPU, on CUDA and on CPU.  The patches and the
overlay call it as ``dancegrpo_port.device.<function>``: this module is that one public face,
and re-exports exactly what they call.  Each concern lives in a module of its own:

==============================  ==================================================================
``device/choice.py``            which device, chosen once per process (:func:`activate`,
                                :func:`accelerator`; ``DeviceSelectionError``) and its own calls
                                (:func:`set_local_device`, :func:`current_device`,
                                :func:`empty_cache`); the GELU op chosen with it
``device/distributed.py``       the process group on the device's backend (:func:`dist_backend`,
                                :func:`start_distributed`), the collectives
                                (:func:`all_reduce_mean`, :func:`broadcast_module_states`) and what
                                FSDP may ask of the device (:func:`fsdp_cpu_offload_supported`,
                                :func:`fsdp_sync_module_states_supported`,
                                :func:`full_state_dict_cpu_offload`)
``device/mixed_precision.py``   :func:`autocast` on the device
``device/matmul.py``            TF32 on CUDA, HF32 on the NPU (:func:`allow_tf32`;
                                allow-tf32-hf32.patch)
``device/kernels.py``           diffusers' kernels from the run's device, not from an installed
                                torch_npu (:func:`choose_attention_processors`,
                                :func:`choose_diffusers_kernels`; attention-from-device.patch)
==============================  ==================================================================

Environment (``dancegrpo-npu launch`` sets the first two; a user may set them by hand; the
names are the contract's, ``dancegrpo_port/contract.py``):

``DANCEGRPO_DEVICE``      ``auto`` (default) | ``npu`` | ``cuda`` | ``cpu``.  ``auto`` picks the
                          NPU when torch_npu imports and sees one, CUDA or else the CPU when
                          torch_npu is not installed; torch_npu installed but seeing no NPU
                          (``ASCEND_RT_VISIBLE_DEVICES`` not ascending gives none) is refused,
                          never trained around on the CPU.
``DANCEGRPO_NPU_STRICT``  ``1``: strict mode (``dancegrpo_port.strict_mode``) - from
                          :func:`activate` to the end of the process, fail at the first op
                          that makes a complex or float64 tensor on the chosen device (the
                          NPU runs neither), naming the op and where it ran.
``DANCEGRPO_NPU_GELU``    ``exact`` (default) | ``upstream``: on an NPU run, ``torch.nn.GELU``
                          modules (the HPS reward's ViT) compute through ``torch_npu.npu_gelu``
                          with their own ``approximate``, and diffusers' ``GEGLU`` (the SD UNet's
                          feed-forwards) through ``torch_npu.npu_geglu`` in the erf form;
                          ``upstream`` leaves torch's op and diffusers' tanh kernel
                          (``choose_gelu`` and ``choose_geglu`` in ``device/choice.py``).

============  ========  =============  ===============================================
device        backend   autocast type  notes
============  ========  =============  ===============================================
npu           hccl      npu            torch_npu + transfer_to_npu imported first
cuda          nccl      cuda           upstream's behaviour, unchanged
cpu           gloo      cpu            FSDP without CPU offload / sync_module_states
============  ========  =============  ===============================================

The scripts call :func:`activate` before anything touches CUDA: on Ascend,
``torch_npu.contrib.transfer_to_npu`` must be imported before any ``torch.cuda`` call
so that it can redirect them to ``torch.npu``.  This package needs only torch; it
imports torch_npu only when the NPU is asked for (or ``auto`` probes for it), and
diffusers only in the functions of ``device/kernels.py``.
On an Ascend host torch (>= 2.5) has already imported torch_npu inside ``import torch`` (its
``torch.backends`` entry point), whatever ``DANCEGRPO_DEVICE`` says; without CANN's
``set_env.sh`` that import fails, and ``device/choice.py`` says so in one line.
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` keeps torch from loading it, but diffusers imports an
installed torch_npu itself (``diffusers.models.activations``), so a CPU run on an Ascend host
needs CANN's environment too, or a virtualenv without torch_npu.
"""

from __future__ import annotations

# choice first: it imports torch, and says in one line when torch cannot load torch_npu
from dancegrpo_port.device.choice import (
    DeviceSelectionError, accelerator, activate, current_device, empty_cache, set_local_device,
)
from dancegrpo_port.device.distributed import (
    all_reduce_mean, broadcast_module_states, dist_backend, fsdp_cpu_offload_supported,
    fsdp_sync_module_states_supported, full_state_dict_cpu_offload, start_distributed,
)
from dancegrpo_port.device.kernels import choose_attention_processors, choose_diffusers_kernels
from dancegrpo_port.device.matmul import allow_tf32
from dancegrpo_port.device.mixed_precision import autocast

__all__ = [
    "DeviceSelectionError", "accelerator", "activate", "all_reduce_mean", "allow_tf32", "autocast",
    "broadcast_module_states", "choose_attention_processors", "choose_diffusers_kernels", "current_device",
    "dist_backend", "empty_cache", "fsdp_cpu_offload_supported", "fsdp_sync_module_states_supported",
    "full_state_dict_cpu_offload", "set_local_device", "start_distributed",
]
