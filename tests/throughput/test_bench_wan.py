"""``dancegrpo-npu bench`` for Wan2.1: the presets' shapes, the child process in the
diffusers-0.35 set's interpreter, and its refusal when that set is not installed.

The slow test runs wan at size tiny once (the patched Wan trainer's own ``train_one_step``,
N = 1 and 2 side by side, --record) from the tool's interpreter (diffusers 0.32): the bench runs
itself in the set's interpreter and writes the same table, run directory and records as for FLUX.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_runs import PHASES, bench

from dancegrpo_npu.throughput import presets

ROOT = Path(__file__).resolve().parents[2]
SET_ENV = "DANCEGRPO_VENV_DIFFUSERS_0_35"


@pytest.mark.upstream
def test_the_wan_preset_is_wan2_1_t2v_1_3b(patched_tree):
    """diffusers' WanTransformer3DModel / AutoencoderKLWan configs of Wan2.1-T2V-1.3B (its
    transformer/config.json and vae/config.json), shipped as package data; upstream's Wan recipe, read from
    its script in the patched tree."""
    from dancegrpo_npu.throughput.models import model_configs

    transformer, vae, hps = model_configs(presets.PRESETS["wan-full"])
    assert transformer == {
        "added_kv_proj_dim": None, "attention_head_dim": 128, "cross_attn_norm": True, "eps": 1e-6, "ffn_dim": 8960,
        "freq_dim": 256, "image_dim": None, "in_channels": 16, "num_attention_heads": 12, "num_layers": 30,
        "out_channels": 16, "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024,
        "text_dim": 4096,
    }  # fmt: skip
    assert (vae["base_dim"], vae["z_dim"], vae["dim_mult"], vae["num_res_blocks"], vae["temperal_downsample"]) == (
        96, 16, [1, 2, 4, 4], 2, [False, True, True])
    assert len(vae["latents_mean"]) == len(vae["latents_std"]) == 16
    assert hps["vision_cfg"]["width"] == 1280  # ViT-H-14, as for FLUX
    s = presets.resolve({"trainer": "wan", "size": "full"}, patched_tree.tree).sizes
    assert (s.height, s.width, s.sampling_steps, s.generations, s.text_tokens) == (512, 512, 20, 12, 226)
    assert (s.timestep_fraction, s.eta, s.shift, s.train_timesteps) == (0.6, 0.3, 3.0, 11)
    assert dict(presets.trainer_of(presets.PRESETS["wan-full"]).bench.extra_args)["cfg_infer"] == 5.0
    cpu, _, _ = model_configs(presets.PRESETS["wan-cpu"])
    assert cpu == {**transformer, "num_layers": 1}
    from dancegrpo_npu import registry
    assert {name: presets.depset_of(p) for name, p in presets.PRESETS.items()} == {
        name: registry.get(p.trainer).depset for name, p in presets.PRESETS.items()}  # each its trainer's set
    assert {presets.depset_of(presets.PRESETS[f"wan-{size}"]) for size in presets.SIZES} == {"diffusers-0.35"}


def test_the_child_gets_the_same_arguments():
    """What the child bench is given parses back to the options it was made from."""
    from dancegrpo_npu.cli import build_parser
    from dancegrpo_npu.commands.bench import options_from_args
    from dancegrpo_npu.throughput.bench import bench_argv

    typed = ["bench", "--trainer", "wan", "--size", "tiny", "--device", "cpu", "--sample-batch-sizes", "1,2", "--steps", "1",
             "--warmup-steps", "0", "--height", "32", "--eta", "0.5", "--vae-decode-chunk", "1", "--record"]
    options = options_from_args(build_parser().parse_args(typed))
    again = options_from_args(build_parser().parse_args(["bench", *bench_argv(options, None)]))
    assert again == options and options["height"] == 32 and options["record"] is True
    assert bench_argv(options, "out.json")[-2:] == ["--json", "out.json"]


def test_without_the_diffusers_035_set_it_is_refused_in_one_line(tmp_path):
    r = bench(ROOT, "--runs-dir", str(tmp_path / "runs"), "--trainer", "wan", "--size", "tiny", "--device", "cpu",
              env={SET_ENV: str(tmp_path / "absent")}, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and r.stdout == "", r.stderr
    assert lines[0].startswith("dancegrpo-npu: error: bench --trainer wan runs with the diffusers-0.35 dependency set")
    assert str(tmp_path / "absent") in lines[0]
    assert "./scripts/bootstrap.sh --deps-only --with diffusers-0.35" in lines[0]
    assert not (tmp_path / "runs").exists()  # refused before a run directory is made


@pytest.mark.slow
@pytest.mark.upstream
def test_tiny_wan_runs_the_wan_trainer_in_the_sets_interpreter(patched_tree, tmp_path):
    from depset_035 import diffusers_035_python

    from dancegrpo_npu.rundirs.rundir import list_runs

    python = diffusers_035_python()
    out = tmp_path / "bench.json"
    r = bench(patched_tree.project.root, "--runs-dir", str(tmp_path / "runs"), "--trainer", "wan", "--size", "tiny",
              "--device", "cpu", "--sample-batch-sizes", "1,2", "--steps", "1", "--json", str(out), "--record")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"bench: wan runs with the diffusers-0.35 dependency set: {python}" in r.stderr
    assert "OpenCV" not in r.stderr  # the libraries' warnings during a step are in console.log, as the trainer's prints
    document = json.loads(out.read_text())
    results, facts = document["results"], document["fingerprint"]["bench"]
    assert [x["sample_batch_size"] for x in results] == [1, 2]
    assert all(set(x["phases_s"]) == PHASES and all(v > 0 for v in x["phases_s"].values()) for x in results)
    assert facts["trainer"].startswith("fastvideo/train_grpo_wan_2_1.py: train_one_step")
    assert (facts["preset"], facts["dependency_set"], facts["device_kind"]) == ("wan-tiny", "diffusers-0.35", "cpu")
    assert document["fingerprint"]["packages"]["diffusers"].startswith("0.35.")  # measured in the set's interpreter
    assert facts["torch_threads"] == 1 and facts["torch_threads_from"] == "OMP_NUM_THREADS=1, yours"
    assert r.stdout.splitlines()[0].endswith("warm-up; 1 CPU thread(s) (OMP_NUM_THREADS=1, yours)")
    assert "rollout samples/s against N=1: N=2 " in r.stdout
    [run] = list_runs(tmp_path / "runs")
    assert str(run.path) == facts["run_dir"] and run.name.endswith("-bench-wan-tiny")
    lines = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["sample_batch_size"]) for x in lines] == [(1, 1), (2, 2)]
    for line, result in zip(lines, results):
        assert {p: line[f"time_{p}"] for p in PHASES} == result["phases_s"]
        assert line["clip_frac_first"] == 0.0 and line["grad_norm"] > 0
    assert sorted(p.name for p in (run.path / "videos").iterdir()) == [f"wan_2_1_0_{i}.mp4" for i in range(4)]
    assert json.loads((run.path / "records" / "index.json").read_text())["steps"] == [1, 2]
    assert "final loss" in (run.path / "logs" / "console.log").read_text()
