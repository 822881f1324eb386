"""``dancegrpo-npu bench`` for Qwen-Image: the presets' shapes, what the full size needs, and one
run at size tiny through the patched Qwen-Image trainer's own ``train_one_step``, in the
diffusers-0.35 set's interpreter (as for Wan2.1: tests/throughput/test_bench_wan.py)."""

from __future__ import annotations

import json

import pytest
from bench_runs import PHASES, bench

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.throughput import models, presets


@pytest.mark.upstream
def test_the_qwenimage_preset_is_qwen_image(patched_tree):
    """Qwen-Image's transformer/config.json (the memory plan's, the family's plan.json), and its VAE's
    (AutoencoderKLQwenImage: Wan2.1's configuration, shipped in the family's folder); its recipe,
    read from upstream's script in the patched tree; the cpu size: its width, one block."""
    transformer, vae, _hps = models.model_configs(presets.PRESETS["qwenimage-full"])
    assert (transformer["num_layers"], transformer["attention_head_dim"], transformer["num_attention_heads"],
            transformer["joint_attention_dim"], transformer["in_channels"], transformer["out_channels"],
            transformer["patch_size"], transformer["axes_dims_rope"]) == (60, 128, 24, 3584, 64, 16, 2, [16, 56, 56])
    assert (vae["base_dim"], vae["z_dim"], vae["dim_mult"], vae["num_res_blocks"]) == (96, 16, [1, 2, 4, 4], 2)
    s = presets.resolve({"trainer": "qwenimage", "size": "full"}, patched_tree.tree).sizes
    assert (s.height, s.width, s.sampling_steps, s.generations, s.gradient_accumulation_steps) == (720, 720, 20, 12, 12)
    assert (s.timestep_fraction, s.eta, s.shift, s.text_tokens) == (0.6, 0.3, 3.0, 256)
    assert presets.depset_of(presets.PRESETS["qwenimage-tiny"]) == "diffusers-0.35"
    cpu, cpu_vae, _ = models.model_configs(presets.PRESETS["qwenimage-cpu"])
    assert cpu == {**transformer, "num_layers": 1} and cpu_vae == vae


@pytest.mark.upstream
def test_the_full_preset_is_refused_where_it_does_not_fit(patched_tree):
    """20.4e9 parameters four times over in bf16 (weights, gradients, AdamW's moments) do not fit
    one 64 GB card: refused before anything is built, naming the tiny preset."""
    config = presets.resolve({"trainer": "qwenimage", "size": "full"}, patched_tree.tree)
    configs = models.model_configs(config.preset)
    counts = models.ParamCounts(transformer=20_430_401_088, vae=126_892_531, hps=986_109_441)
    estimate = models.estimate_memory(counts, configs, config.sizes, (1,), config.decode_chunk, 2, "qwenimage")
    assert 150 * 2**30 < estimate.weights < 160 * 2**30 and estimate.activations > 0  # 156 GiB
    with pytest.raises(DancegrpoError) as info:
        models.check_fits(estimate, 64 * 10**9, "free npu memory", "qwenimage-full", "npu")
    assert "bench: qwenimage-full needs about" in info.value.message
    assert info.value.hint.startswith("use --size cpu") and info.value.exit_code == 2


@pytest.mark.slow
@pytest.mark.upstream
def test_tiny_qwenimage_runs_the_qwenimage_trainer_in_the_sets_interpreter(patched_tree, tmp_path):
    from depset_035 import diffusers_035_python

    diffusers_035_python()
    out = tmp_path / "bench.json"
    r = bench(patched_tree.project.root, "--runs-dir", str(tmp_path / "runs"), "--trainer", "qwenimage", "--size",
              "tiny", "--device", "cpu", "--sample-batch-sizes", "1,2", "--steps", "1", "--warmup-steps", "0",
              "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "bench: qwenimage runs with the diffusers-0.35 dependency set" in r.stderr
    document = json.loads(out.read_text())
    results, facts = document["results"], document["fingerprint"]["bench"]
    assert [x["sample_batch_size"] for x in results] == [1, 2]
    assert all(set(x["phases_s"]) == PHASES and all(v > 0 for v in x["phases_s"].values()) for x in results)
    assert facts["trainer"].startswith("fastvideo/train_grpo_qwenimage.py: train_one_step")
    assert (facts["dependency_set"], facts["torch_threads_from"]) == ("diffusers-0.35", "OMP_NUM_THREADS=1, yours")
    assert "rollout samples/s against N=1: N=2 " in r.stdout
    lines = [json.loads(x) for x in (tmp_path / "runs").glob("*-bench-qwenimage-tiny/metrics.jsonl").__next__()
             .read_text().splitlines()]
    assert [(x["step"], x["sample_batch_size"]) for x in lines] == [(1, 1), (2, 2)]
    assert all(x["clip_frac_first"] == 0.0 and x["grad_norm"] > 0 for x in lines)
