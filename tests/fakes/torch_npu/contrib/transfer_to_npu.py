"""FAKE ``torch_npu.contrib.transfer_to_npu`` (see torch_npu/__init__.py).

It records what had been imported before it (diffusers, transformers, the patched fastvideo
modules) and whether CUDA was initialised (``torch_npu.transfer_state``), so tests can check
that the patched scripts import it first.

EMULATED, the side effects of the module on the rest of the process, as in the wheels the fake
follows (torch_npu/__init__.py says which):

* ``warnings.filterwarnings(action='once')`` for the whole process;
* the libraries of its ``apis_config.json`` (transformers >= 4.32.0, trl >= 0.7.1, peft >= 0.5.0,
  accelerate >= 0.22.0), where installed, are IMPORTED - ``transformers.trainer`` and
  ``accelerate.state`` among them - and each listed function or method is wrapped
  (``functools.wraps``, so ``__wrapped__`` is the original; the real wrapper calls it with
  the original ``torch.cuda.is_available``), e.g. accelerate's backend choice
  ``PartialState._prepare_backend``;
* ``torch.jit.script`` / ``torch.jit.script_method`` become no-ops (a RuntimeWarning says so);
* ``torch.Tensor.is_cuda`` means "is on the NPU" and ``Tensor.cuda`` / ``Module.cuda`` are ``.npu``;
* ``torch.distributed.init_process_group`` is ``_compose_wrappers(_wrapper_cuda,
  _wrapper_hccl)(init_process_group)``: ``_wrapper_hccl`` (outside) rewrites ``nccl`` to
  ``hccl`` and ``cuda`` to ``npu`` in its string arguments and in ``backend=``;
  ``_wrapper_cuda`` (inside) rewrites CUDA devices (strings, ``torch.device``; an int in
  ``device=`` / ``device_id=`` ...) to the NPU in its arguments and device keywords, so
  ``device_id=torch.device("cuda", 1)`` arrives as ``npu:1``; ``is_nccl_available`` is
  ``is_hccl_available``; the ``cuda`` entry of ``Backend.default_device_backend_map`` is removed.

NOT emulated: the redirection of ``torch.cuda.*``, of "cuda" device strings elsewhere than in
``init_process_group`` and of the profiler; nor, with ``FAKE_TORCH_NPU_LIBRARIES=skip``, the
libraries' import and wrapping.
"""

import functools
import importlib
import importlib.metadata
import os
import sys
import warnings

import torch
from packaging.version import Version

import torch_npu

__fake__ = True

torch_npu.transfer_state = {
    "cuda_initialized": torch.cuda.is_initialized(),
    "already_imported": sorted(
        name for name in sys.modules
        if name.split(".")[0] in ("diffusers", "transformers", "peft", "accelerate", "trl", "fastvideo",
                                  "dancegrpo_port")
    ),
}

warnings.filterwarnings(action="once")

# The entries of torch_npu 2.7.1's contrib/apis_config.json: package -> (minimum version, wrapped APIs).
APIS_CONFIG = {
    "transformers": ("4.32.0", {
        "transformers.training_args.TrainingArguments.__post_init__": "method",
        "transformers.trainer.Trainer._load_rng_state": "method",
        "transformers.trainer.Trainer._save_rng_state": "method",
        "transformers.trainer_utils.TrainerMemoryTracker.start": "method",
        "transformers.utils.import_utils.is_torch_cuda_available": "function",
        "transformers.utils.import_utils.is_mamba_ssm_available": "function",
        "transformers.utils.import_utils.is_causal_conv1d_available": "function",
        "transformers.utils.import_utils.is_torch_bf16_gpu_available": "function",
        "transformers.utils.import_utils.is_torch_tf32_available": "function",
        "transformers.utils.import_utils.is_bitsandbytes_available": "function",
        "transformers.utils.import_utils.is_flash_attn_2_available": "function",
    }),
    "trl": ("0.7.1", {
        "trl.import_utils.is_bitsandbytes_available": "function",
        "trl.trainer.utils.get_kbit_device_map": "function",
    }),
    "peft": ("0.5.0", {"peft.utils.other.infer_device": "function"}),
    "accelerate": ("0.22.0", {
        "accelerate.commands.env.env_command": "function",
        "accelerate.launchers.notebook_launcher": "function",
        "accelerate.commands.config.default.write_basic_config": "function",
        "accelerate.utils.environment.override_numa_affinity": "function",
        "accelerate.utils.modeling.get_max_memory": "function",
        "accelerate.utils.megatron_lm.initialize": "function",
        "accelerate.utils.bnb.load_and_quantize_model": "function",
        "accelerate.utils.bnb.get_quantized_model_device_map": "function",
        "accelerate.utils.imports.is_cuda_available": "function",
        "accelerate.test_utils.scripts.test_script.training_check": "function",
        "accelerate.test_utils.scripts.test_cli.main": "function",
        "accelerate.test_utils.scripts.external_deps.test_peak_memory_usage.TorchTracemalloc.__enter__": "method",
        "accelerate.test_utils.scripts.external_deps.test_peak_memory_usage.TorchTracemalloc.__exit__": "method",
        "accelerate.state.PartialState._prepare_backend": "method",
    }),
}
_original_is_available = torch.cuda.is_available


def _owner(full_name: str, kind: str):
    """(object, attribute) for a listed API; None where it does not import (as the real one skips it)."""
    parts = full_name.split(".")
    try:
        if kind == "method":
            return getattr(importlib.import_module(".".join(parts[:-2])), parts[-2]), parts[-1]
        return importlib.import_module(".".join(parts[:-1])), parts[-1]
    except Exception:  # noqa: BLE001 - the real module ignores what does not import
        return None


def _wrap_library_function(fn):
    @functools.wraps(fn)
    def decorated(*args, **kwargs):
        patched, torch.cuda.is_available = torch.cuda.is_available, _original_is_available
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.is_available = patched
    return decorated


# FAKE_TORCH_NPU_LIBRARIES=skip (set by the overlay's snippet runner, whose snippets never look at
# them) leaves the libraries alone: importing transformers.trainer costs seconds a process.
for _package, (_minimum, _apis) in APIS_CONFIG.items() if os.environ.get("FAKE_TORCH_NPU_LIBRARIES") != "skip" else ():
    try:
        _version = importlib.metadata.version(_package)
    except importlib.metadata.PackageNotFoundError:
        continue
    if Version(_version) < Version(_minimum):
        continue
    for _name, _kind in _apis.items():
        _found = _owner(_name, _kind)
        if _found and getattr(_found[0], _found[1], None):
            setattr(_found[0], _found[1], _wrap_library_function(getattr(*_found)))


def _jit_script(obj, optimize=None, _frames_up=0, _rcb=None, example_inputs=None):
    return obj


def _jit_script_method(fn):
    return fn


warnings.warn("torch.jit.script and torch.jit.script_method will be disabled by transfer_to_npu, which currently "
              "does not support them, if you need to enable them, please do not use transfer_to_npu.", RuntimeWarning)
torch.jit.script = _jit_script
torch.jit.script_method = _jit_script_method

torch.Tensor.cuda = torch.Tensor.npu
torch.Tensor.is_cuda = torch.Tensor.is_npu
torch.nn.Module.cuda = torch.nn.Module.npu


DEVICE_KWARGS = ("device", "device_type", "map_location", "device_id")  # the real device_kwargs_list


def _to_npu(value, replace_int: bool):
    """_replace_cuda_to_npu_in_list / _in_kwargs for one value (dicts are left alone here)."""
    if isinstance(value, str) and "cuda" in value:
        return value.replace("cuda", "npu")
    if isinstance(value, torch.device) and "cuda" in value.type:
        return torch.device("npu" if value.index is None else f"npu:{value.index}")
    if replace_int and isinstance(value, int) and not isinstance(value, bool):
        return f"npu:{value}"
    return value


def _wrapper_cuda(fn):
    @functools.wraps(fn)
    def decorated(*args, **kwargs):
        replace_int = fn.__name__ in ("to", "to_empty")
        args = [_to_npu(a, replace_int) for a in args]
        for name in DEVICE_KWARGS:
            if kwargs.get(name) is not None:
                kwargs[name] = _to_npu(kwargs[name], True)  # an int device keyword becomes npu:<int>
        return fn(*args, **kwargs)
    return decorated


def _wrapper_hccl(fn):
    @functools.wraps(fn)
    def decorated(*args, **kwargs):
        args = [a.replace("nccl", "hccl").replace("cuda", "npu") if type(a) is str else a for a in args]
        backend = kwargs.get("backend")
        if type(backend) is str:
            kwargs["backend"] = backend.replace("nccl", "hccl").replace("cuda", "npu")
        return fn(*args, **kwargs)
    return decorated


def _compose_wrappers(*wrappers):
    def compose(f):
        for wrapper in wrappers:
            f = wrapper(f)
        return f
    return compose


torch.distributed.init_process_group = _compose_wrappers(_wrapper_cuda, _wrapper_hccl)(torch.distributed.init_process_group)
torch.distributed.is_nccl_available = lambda: "hccl" in torch.distributed.Backend.backend_list
if "cuda" in getattr(torch.distributed.Backend, "default_device_backend_map", {}):
    del torch.distributed.Backend.default_device_backend_map["cuda"]
