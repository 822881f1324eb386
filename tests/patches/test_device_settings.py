"""allow-tf32-hf32.patch and attention-from-device.patch, run through the patched trainers' own main() with the FAKE torch_npu.

allow-tf32-hf32: main() starts with TF32 on CUDA and, on an NPU run, HF32 (torch_npu's documented
switches; the fake only stores them), and rank 0 writes what it set to ./matmul_precision.json.
attention-from-device: with torch_npu installed (the fake and its dist-info, so diffusers sees it) and
DANCEGRPO_DEVICE=cpu, the trainers' transformer gets diffusers' FluxAttnProcessor2_0, not its
NPU processor, and a forward with bf16 weights never calls npu_fusion_attention (the fake
refuses to run off the NPU).  No NPU result: every number here is computed on the CPU.
"""

from __future__ import annotations

import json
import socket

import pytest
from patched_tree_runner import run_in_tree  # noqa: F401  (a fixture)

TRAINERS = ("fastvideo/train_grpo_flux.py",
            pytest.param("fastvideo/train_grpo_flux_lora.py", marks=pytest.mark.extended))  # CI: the full trainer's

# Runs a patched trainer as __main__ and stops it at a chosen call, printing what it saw then.
RUN_TRAINER_UNTIL = '''
import json, os, runpy, sys
import torch
import torch.distributed as dist

script, stop_at, out_path = sys.argv[1:4]
sys.argv = [script, *sys.argv[4:]]


class Stop(Exception):
    pass


def npu_switches():
    if not hasattr(torch, "npu"):
        return None
    return {"matmul": torch.npu.matmul.allow_hf32, "conv": torch.npu.conv.allow_hf32}


result = {}
if stop_at == "init_process_group":  # main()'s first lines, before any collective
    def stop(*args, **kwargs):
        result.update(cuda_tf32=torch.backends.cuda.matmul.allow_tf32, npu_hf32=npu_switches())
        raise Stop()
    dist.init_process_group = stop
else:  # right after the trainer set the transformer's attention up (before FSDP or LoRA wrap it)
    import dancegrpo_port.device as device_module
    choose = device_module.choose_attention_processors

    def stop(transformer, *args, **kwargs):
        choose(transformer, *args, **kwargs)
        from diffusers.utils.import_utils import is_torch_npu_available
        result["diffusers_sees_torch_npu"] = is_torch_npu_available()
        result["processors"] = sorted({type(m.processor).__name__ for m in transformer.modules()
                                       if hasattr(m, "processor")})
        # bf16 weights, as FSDP casts them with --master_weight_type bf16: the NPU processor then gets
        # bf16 queries (with float32 weights diffusers' RMSNorm hands it float32, and it uses SDPA)
        transformer.to(torch.bfloat16)
        torch.manual_seed(0)
        bf16 = dict(dtype=torch.bfloat16)
        try:
            out = transformer(hidden_states=torch.randn(1, 4, 8, **bf16), encoder_hidden_states=torch.randn(1, 3, 8, **bf16),
                              pooled_projections=torch.randn(1, 8, **bf16), timestep=torch.tensor([0.5], **bf16),
                              img_ids=torch.zeros(4, 3), txt_ids=torch.zeros(3, 3), return_dict=False)[0]
            result["forward"] = "finite" if bool(torch.isfinite(out.float()).all()) else "not finite"
        except RuntimeError as e:
            result["forward"] = str(e)
        raise Stop()
    device_module.choose_attention_processors = stop
try:
    runpy.run_path(script, run_name="__main__")
except Stop:
    pass
npu = sys.modules.get("torch_npu")
result["npu_fusion_attention_calls"] = None if npu is None else sum(
    1 for name, _ in npu.calls if name == "npu_fusion_attention")
result["record"] = json.load(open("matmul_precision.json")) if os.path.exists("matmul_precision.json") else None
with open(out_path, "w") as f:
    json.dump(result, f)
'''

TINY_FLUX = '''
import sys, torch
from diffusers import FluxTransformer2DModel
torch.manual_seed(0)
FluxTransformer2DModel(num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
                       joint_attention_dim=8, pooled_projection_dim=8, in_channels=8,
                       axes_dims_rope=[2, 2, 4]).save_pretrained(sys.argv[1] + "/transformer")
'''


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_trainer_until(run_in_tree, tree, tmp_path, script, stop_at, device, model="unused"):
    out = tmp_path / "result.json"
    env = {"DANCEGRPO_DEVICE": device, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": _free_port()}
    run_in_tree(RUN_TRAINER_UNTIL, fake_npu=True, env=env, args=(
        str(tree / script), stop_at, str(out), "--data_json_path", "unused.json",
        "--pretrained_model_name_or_path", str(model), "--output_dir", str(tmp_path / "outputs")))
    return json.loads(out.read_text())


@pytest.mark.upstream
@pytest.mark.fake_npu
@pytest.mark.parametrize("script", TRAINERS)
def test_npu_run_sets_hf32_and_records_it(run_in_tree, patched_tree, tmp_path, script):
    got = run_trainer_until(run_in_tree, patched_tree.tree, tmp_path, script, "init_process_group", "npu")
    assert got["cuda_tf32"] is True
    assert got["npu_hf32"] == {"matmul": True, "conv": True}  # matmul's documented default is False
    assert got["record"] == {
        "device": "npu", "allow_tf32": True,
        "torch.backends.cuda.matmul.allow_tf32": True, "torch.backends.cudnn.allow_tf32": True,
        "torch.npu.matmul.allow_hf32": True, "torch.npu.conv.allow_hf32": True,
        "torch.nn.GELU": "torch_npu.npu_gelu", "diffusers GEGLU": "torch_npu.npu_geglu(approximate=0)",
    }


@pytest.mark.upstream
@pytest.mark.fake_npu
@pytest.mark.parametrize("script", TRAINERS)
def test_cpu_run_with_torch_npu_installed_keeps_tf32_and_leaves_npu_switches(run_in_tree, patched_tree, tmp_path,
                                                                           script):
    got = run_trainer_until(run_in_tree, patched_tree.tree, tmp_path, script, "init_process_group", "cpu")
    assert got["cuda_tf32"] is True  # upstream's line, kept
    assert got["npu_hf32"] in (None, {"matmul": False, "conv": True})  # not touched (defaults, if imported)
    assert got["record"]["device"] == "cpu" and got["record"]["torch.backends.cuda.matmul.allow_tf32"] is True
    assert got["record"]["torch.npu.matmul.allow_hf32"] is None and got["record"]["torch.npu.conv.allow_hf32"] is None


@pytest.mark.upstream
@pytest.mark.fake_npu
@pytest.mark.parametrize("script", TRAINERS)
def test_cpu_run_with_torch_npu_installed_uses_sdpa_attention(run_in_tree, patched_tree, tmp_path, script):
    model = tmp_path / "tiny-flux"
    run_in_tree(TINY_FLUX, args=(str(model),))
    got = run_trainer_until(run_in_tree, patched_tree.tree, tmp_path, script, "choose_attention_processors", "cpu", model)
    assert got["diffusers_sees_torch_npu"] is True  # the precondition of the defect
    assert got["processors"] == ["FluxAttnProcessor2_0"]
    assert got["forward"] == "finite" and got["npu_fusion_attention_calls"] == 0


@pytest.mark.upstream
@pytest.mark.fake_npu
def test_npu_run_keeps_diffusers_npu_processor(run_in_tree):
    out = run_in_tree(
        """
        import json, torch
        from dancegrpo_port import device
        assert device.activate().kind == "npu"
        from diffusers import FluxTransformer2DModel
        t = FluxTransformer2DModel(num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
                                   joint_attention_dim=8, pooled_projection_dim=8, in_channels=8, axes_dims_rope=[2, 2, 4])
        replaced = device.choose_attention_processors(t)
        print(json.dumps([replaced, [type(b.attn.processor).__name__ for b in t.single_transformer_blocks]]))
        """,
        fake_npu=True, env={"DANCEGRPO_DEVICE": "npu"},
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [0, ["FluxAttnProcessor2_0_NPU"]]

