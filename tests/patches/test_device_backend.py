"""device-backend.patch with the FAKE torch_npu: each of the three patched scripts imports
torch_npu.contrib.transfer_to_npu before diffusers, transformers or any other fastvideo
module, and before CUDA is initialised.  (No NPU result: the fake only records order.)"""

from __future__ import annotations

import json

import pytest
from patched_tree_runner import run_in_tree  # noqa: F401  (a fixture)

SCRIPTS = ("fastvideo/train_grpo_flux.py", "fastvideo/train_grpo_flux_lora.py",
           "fastvideo/data_preprocess/preprocess_flux_embedding.py")
# the device package's concern modules, imported with it (overlay/dancegrpo_port/device/)
DEVICE_MODULES = ("choice", "distributed", "kernels", "matmul", "mixed_precision")


@pytest.mark.upstream
@pytest.mark.fake_npu
@pytest.mark.parametrize("script", SCRIPTS)
def test_transfer_to_npu_comes_first(run_in_tree, patched_tree, script):
    out = run_in_tree(
        f"""
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("patched_script", {str(patched_tree.tree / script)!r})
        spec.loader.exec_module(importlib.util.module_from_spec(spec))  # top level only: not __main__
        import torch_npu
        from dancegrpo_port import device
        assert torch_npu.__fake__
        print(json.dumps({{"state": torch_npu.transfer_state, "kind": device.accelerator().kind,
                          "backend": device.dist_backend(), "diffusers": "diffusers" in sys.modules}}))
        """,
        fake_npu=True, env={"DANCEGRPO_DEVICE": "auto"},
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["state"] == {"cuda_initialized": False,
                            "already_imported": ["dancegrpo_port", "dancegrpo_port.contract", "dancegrpo_port.device",
                                                 *(f"dancegrpo_port.device.{m}" for m in DEVICE_MODULES)]}
    assert (got["kind"], got["backend"], got["diffusers"]) == ("npu", "hccl", True)
