"""lora-same-init-on-all-ranks.patch and no-cpu-offload-on-cpu.patch on two gloo ranks: LoRA ranks that initialise different weights
(seed + rank, as the trainer seeds) all start from rank 0's; CPU offload is not asked for
on a CPU run; checkpoints and EMA state dicts gather under sharding; the trainer's own
functions are used (get_dit_fsdp_kwargs, save_checkpoint, FSDP_EMA)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

WORKER = '''
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from diffusers import FluxTransformer2DModel
from peft import LoraConfig
from dancegrpo_port.device import activate, dist_backend, set_local_device
activate()
from fastvideo.utils.fsdp_util import get_dit_fsdp_kwargs
from fastvideo.utils.checkpoint import save_checkpoint

dist.init_process_group(dist_backend())
rank = dist.get_rank()
set_local_device(int(os.environ["LOCAL_RANK"]))
out = sys.argv[1]
result = {}

def tiny():
    torch.manual_seed(0)  # the same base weights on every rank, like from_pretrained
    return FluxTransformer2DModel(num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
                                  joint_attention_dim=8, pooled_projection_dim=8, in_channels=8, axes_dims_rope=[2, 2, 4])

# LoRA, as train_grpo_flux_lora.py sets it up
model = tiny()
model.requires_grad_(False)
torch.manual_seed(42 + rank)  # set_seed(args.seed + rank)
model.add_adapter(LoraConfig(r=4, lora_alpha=8, init_lora_weights=True, target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
own_init = {k: v.clone() for k, v in model.state_dict().items() if "lora_A" in k}
kwargs, no_split = get_dit_fsdp_kwargs(model, "full", True, True, "fp32")
result["cpu_offload"] = repr(kwargs["cpu_offload"])
result["sync_module_states"] = kwargs["sync_module_states"]
model._no_split_modules = [m.__name__ for m in no_split]
kwargs["auto_wrap_policy"] = kwargs["auto_wrap_policy"](model)
fsdp = FSDP(model, **kwargs)
with FSDP.summon_full_params(fsdp):
    lora = torch.cat([v.flatten() for k, v in sorted(fsdp.state_dict().items()) if "lora_A" in k])
gathered = [torch.zeros_like(lora) for _ in range(2)]
dist.all_gather(gathered, lora)
rank0_init = torch.cat([v.flatten() for k, v in sorted(own_init.items())])
starts = torch.zeros(2)
starts[rank] = float(torch.equal(lora, rank0_init))
dist.all_reduce(starts)
result["ranks_equal"] = torch.equal(gathered[0], gathered[1])
result["started_from_own_init"] = starts.tolist()

# full model: a checkpoint and an EMA copy, gathered under FULL_SHARD with 2 ranks
sys.path.insert(0, os.environ["TREE"] + "/fastvideo")
import importlib.util
spec = importlib.util.spec_from_file_location("trainer", os.environ["TREE"] + "/fastvideo/train_grpo_flux.py")
trainer = importlib.util.module_from_spec(spec); spec.loader.exec_module(trainer)
model = tiny()
kwargs, _ = get_dit_fsdp_kwargs(model, "full", False, True, "fp32")
fsdp = FSDP(model, **kwargs)
ema = trainer.FSDP_EMA(fsdp, 0.9, rank)
with torch.no_grad():
    for p in fsdp.parameters():
        p.add_(1.0)
ema.update(fsdp)
save_checkpoint(fsdp, rank, out, 1, 0)
if rank == 0:
    loaded = FluxTransformer2DModel.from_pretrained(out + "/checkpoint-1-0").state_dict()
    base = tiny().state_dict()
    result["checkpoint_shifted_by_1"] = all(torch.allclose(loaded[k], base[k] + 1) for k in base)
    result["ema_shifted_by_0.1"] = all(torch.allclose(ema.ema_state_dict_rank0[k], base[k] + 0.1, atol=1e-6) for k in base)
    print("RESULT " + json.dumps(result))
dist.barrier()  # rank 1 must not tear the group down while rank 0 still reads the checkpoint
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.upstream
def test_two_gloo_ranks(patched_tree, tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANCEGRPO_")}
    env.update({"PYTHONPATH": str(patched_tree.tree), "TREE": str(patched_tree.tree), "DANCEGRPO_DEVICE": "cpu",
                "OMP_NUM_THREADS": "1"})
    with socket.socket() as s:  # a free port (torchrun's --master_port 0 does not rendezvous)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(port), str(worker), str(tmp_path / "out")], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=180)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(lines[0][len("RESULT "):])
    assert got == {"cpu_offload": "None", "sync_module_states": False, "ranks_equal": True,
                   "started_from_own_init": [1.0, 0.0], "checkpoint_shifted_by_1": True, "ema_shifted_by_0.1": True}
