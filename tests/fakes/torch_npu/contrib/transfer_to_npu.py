"""FAKE ``torch_npu.contrib.transfer_to_npu``: records the import order, redirects nothing.

The real module patches ``torch.cuda`` and "cuda" device strings to the NPU, which
only works if it is imported before anything initialises CUDA.  This fake notes
what had been imported (diffusers, transformers, the patched fastvideo modules)
and whether CUDA was initialised, so tests can check the patched scripts import it
first.
"""

import sys

import torch

import torch_npu

__fake__ = True

torch_npu.transfer_state = {
    "cuda_initialized": torch.cuda.is_initialized(),
    "already_imported": sorted(
        name for name in sys.modules
        if name.split(".")[0] in ("diffusers", "transformers", "peft", "accelerate", "fastvideo", "dancegrpo_port")
    ),
}
