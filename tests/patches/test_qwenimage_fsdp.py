"""device-backend in the Qwen-Image trainers' FSDP wrapper: FSDP on the run's device.

Upstream's ``fsdp_wrapper`` divides by ``torch.cuda.device_count()`` (0 without CUDA: the first
wrap fails with ZeroDivisionError) and builds its hybrid-shard mesh on "cuda".  In the patched
tree, with the diffusers-0.35 set, it wraps a tiny ``QwenImageTransformer2DModel`` on the CPU
(gloo), FULL_SHARD and HYBRID_SHARD with the device mesh, and a forward and backward pass runs.
"""

from __future__ import annotations

import os
import subprocess

import pytest

SNIPPET = r"""
import os, torch, torch.distributed as dist
from dancegrpo_port.device import activate
activate()
dist.init_process_group("gloo", rank=0, world_size=1)
from diffusers import QwenImageTransformer2DModel
from fastvideo.utils.fsdp_util_qwenimage import fsdp_wrapper, FSDPConfig
for strategy, mesh in (("FULL_SHARD", False), ("HYBRID_SHARD", True)):
    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                        axes_dims_rope=(4, 6, 6))
    wrapped = fsdp_wrapper(model, FSDPConfig(sharding_strategy=strategy, num_shard=1,
                                             mixed_precision_dtype=torch.float32, use_device_mesh=mesh))
    out = wrapped(hidden_states=torch.randn(1, 24, 16), encoder_hidden_states=torch.randn(1, 5, 24),
                  encoder_hidden_states_mask=torch.ones(1, 5, dtype=torch.long), timestep=torch.tensor([0.5]),
                  img_shapes=[[(1, 4, 6)]], txt_seq_lens=[5], return_dict=False)[0]
    out.mean().backward()
    print("wrapped", strategy, wrapped.compute_device)
dist.destroy_process_group()
"""


def _run(python: str, tree, port: int):
    env = dict(os.environ, PYTHONPATH=str(tree), DANCEGRPO_DEVICE="cpu", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    return subprocess.run([python, "-c", SNIPPET], cwd=tree, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.upstream
def test_the_qwen_image_fsdp_wrapper_runs_on_the_cpu(patched_tree):
    from dancegrpo_npu.host.network import free_port
    from depset_035 import diffusers_035_python

    python = diffusers_035_python()
    r = _run(python, patched_tree.tree, free_port())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["wrapped FULL_SHARD cpu", "wrapped HYBRID_SHARD cpu"]
