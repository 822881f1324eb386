"""``dancegrpo-npu smoke --trainer wan``: the patched stock Wan2.1 trainer on a tiny Wan built from
diffusers' classes, with the diffusers-0.35 dependency set (docs/dependencies.md).

The slow tests share their runs (each distinct run once a test run, ``WanRuns``: tests/shared_runs.py):

- one 2-rank strict run at G = 4 with --rng cpu --record: the smoke passes (metrics, the
  checkpoint loads with WanTransformer3DModel.from_pretrained and moved, every rank holds the
  same weights after training);
- the same with --sample_batch_size 4: ``compare`` against the first exits 0 and
  clip_frac_first is 0 on every step of both (two --rng cpu --record runs aligned);
- one 1-rank strict run of 3 steps with --rng cpu --record; killed once its checkpoint 2 is complete
  and continued with ``launch --resume``, it ends as the uninterrupted run, every record bit-equal;
- the tree without the FSDP patch (``apply --without wan-fsdp.patch``) at 2 ranks: the
  smoke refuses it, because the ranks end with different weights (upstream's bug);
- a bad --sample_batch_size is refused by the trainer at start, in one line.

The others check the smoke's own refusals, the equal-weights check on hand-made digests and the
float32 RoPE against diffusers' float64 one (in the set's interpreter).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess

import pytest
from conftest import copy_project
from depset_035 import diffusers_035_python
from smoke_runs import assert_a_cut_run_resumes_exactly, metrics, passed

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.smoke import runner as smoke
from dancegrpo_npu.smoke.trained import check_equal_weights

torch = pytest.importorskip("torch")

G = 4
ALIGNED = ("--rng", "cpu", "--record")
FSDP_PATCH = "wan-fsdp.patch"


def options(nproc=2, steps=2, generations=G, extra=(), align=()) -> smoke.SmokeOptions:
    from dancegrpo_npu.run.align_flags import AlignOptions

    return smoke.SmokeOptions(nproc=nproc, trainer="wan", device="cpu", steps=steps, generations=generations,
                              extra_args=tuple(extra), align=AlignOptions(rng="cpu", record=True) if align else AlignOptions())


class WanRuns:
    """Each distinct smoke run once a test run (tests/shared_runs.py): its SmokeResult, or the
    DancegrpoError it ended with."""

    def __init__(self, shared, projects):
        self.shared, self.projects = shared, projects

    def __call__(self, tree="patched", **kw):
        return self.shared.smoke(self.projects[tree](), options(**kw))


@pytest.fixture(scope="module")
def runs(patched_tree, shared_runs, upstream_source, tmp_path_factory):
    from shared_runs import smoke_fixtures

    diffusers_035_python()
    smoke_fixtures(shared_runs, patched_tree.project, "wan")  # built once a test run

    @functools.cache
    def without_fsdp():
        from dancegrpo_npu.engine.apply import apply_worktree
        from dancegrpo_npu.engine.fetch import fetch
        from dancegrpo_npu.project import find_project

        project = find_project(copy_project(tmp_path_factory.mktemp("without-fsdp") / "project"))
        fetch(project, source=upstream_source)
        apply_worktree(project, without=(FSDP_PATCH,))
        return project

    return WanRuns(shared_runs, {"patched": lambda: patched_tree.project, "without-fsdp": without_fsdp})


@pytest.mark.slow
@pytest.mark.upstream
def test_two_ranks_strict_every_rank_holds_the_same_weights(runs):
    result = passed(runs(align=True))
    assert [s.step for s in result.steps] == [1, 2] and all(s.grad_norm > 0 for s in result.steps)
    assert result.checkpoint.loaded_with == "WanTransformer3DModel.from_pretrained"
    assert result.checkpoint.updates == 2 and result.checkpoint.changed == result.checkpoint.total > 0
    assert result.equal_weights == result.checkpoint.total
    assert sorted(p.name for p in (result.run_dir / "weights").iterdir()) == ["rank0.json", "rank1.json"]
    assert len(list((result.run_dir / "videos").glob("wan_2_1_*.mp4"))) == 2 * G  # upstream's files, each rank


@pytest.mark.slow
@pytest.mark.upstream
def test_sample_batch_size_4_is_aligned_with_1(runs):
    from dancegrpo_npu.cli import main

    one = passed(runs(align=True))
    batched = passed(runs(align=True, extra=("--sample_batch_size", str(G))))
    assert main(["compare", str(one.run_dir), str(batched.run_dir)]) == 0
    for m in metrics(one.run_dir) + metrics(batched.run_dir):
        assert m["clip_frac_first"] == 0.0


# One rank, 3 steps, --rng cpu --record: the 1-rank smoke, the resume's uninterrupted reference, and the
# SDE window's Wan2.1 run without the flag (tests/patches/test_sde_window.py: OFF_STEPS).
ONE_RANK = dict(nproc=1, steps=3, generations=2, align=True)


@pytest.mark.slow
@pytest.mark.upstream
def test_one_rank_strict(runs):
    from dancegrpo_npu.smoke.trained import last_checkpoint

    result = passed(runs(**ONE_RANK))
    name, updates = last_checkpoint(ONE_RANK["steps"])
    assert result.checkpoint.path.name == name and result.checkpoint.updates == updates > 0
    assert result.checkpoint.changed == result.checkpoint.total > 0 and all(s.grad_norm > 0 for s in result.steps)
    assert result.equal_weights is None  # one process: no other rank to compare with, and none is claimed


@pytest.mark.slow
@pytest.mark.upstream
def test_a_killed_run_resumes_exactly(runs, capsys):
    """Resume comes to Wan through the seam: the 1-rank run above killed once checkpoint 2 is
    complete; `launch --resume` continues it in its own directory, and it ends as the uninterrupted
    run: every record bit-equal, steps 1..3 once each."""
    from dataclasses import replace

    project = runs.projects["patched"]()
    ref = passed(runs(**ONE_RANK))
    cut = replace(options(**ONE_RANK), env=(("DANCEGRPO_CHECKPOINT_FAULT", "2:saved"),))
    assert_a_cut_run_resumes_exactly(project, ref, cut, capsys)


@pytest.mark.slow
@pytest.mark.extended  # CI keeps Wan2.1's 2-rank equal-weights smoke, which the patch is for
@pytest.mark.upstream
def test_without_the_fsdp_patch_the_ranks_train_separate_copies(runs):
    failed = runs(tree="without-fsdp", steps=1, generations=2)  # one update already parts the copies
    assert isinstance(failed, DancegrpoError), "the tree without wan-fsdp.patch passed the equal-weights check"
    assert "after training, rank 1 holds other weights than rank 0" in failed.message
    assert "not synchronised" in failed.hint


@pytest.mark.slow
@pytest.mark.upstream
def test_a_bad_sample_batch_size_is_refused_at_start(runs):
    failed = runs(nproc=1, steps=1, extra=("--sample_batch_size", "3"))
    assert isinstance(failed, DancegrpoError)
    assert ("train_grpo_wan_2_1.py: error: --sample_batch_size 3 does not divide --num_generations 4: "
            "pick one of 1, 2, 4") in failed.message
    assert "\n" not in failed.message


@pytest.mark.parametrize("kw, message", [
    ({"trainer": "wan", "steps": 4, "nproc": 2}, "--steps 4: the Wan trainer needs 5 prompts on each of the 2 ranks"),
    ({"trainer": "wan", "steps": 8, "nproc": 1}, "--steps 8: the Wan trainer needs 9 prompts on its one rank ("),
    ({"trainer": "wan", "lora": True}, "--lora names the trainer flux-lora, not wan"),
    ({"trainer": "sdxl"}, "unknown trainer 'sdxl'"),
])
def test_the_smoke_refuses_at_start(kw, message):
    with pytest.raises(DancegrpoError) as info:
        smoke.check_options(smoke.SmokeOptions(**kw))
    assert message in info.value.message and info.value.exit_code == 2


def test_equal_weights_check(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "rank0.json").write_text(json.dumps({"a": "1", "b": "2"}))
    (weights / "rank1.json").write_text(json.dumps({"a": "1", "b": "2"}))
    assert check_equal_weights(tmp_path, 2) == 2
    (weights / "rank1.json").write_text(json.dumps({"a": "1", "b": "3"}))
    with pytest.raises(DancegrpoError) as info:
        check_equal_weights(tmp_path, 2)
    assert "rank 1 holds other weights than rank 0: 1 of 2 tensors differ (first: b)" in info.value.message
    with pytest.raises(DancegrpoError, match="rank 2 wrote no weights digest"):
        check_equal_weights(tmp_path, 3)


ROPE_CHECK = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from diffusers.models.transformers import transformer_wan
from diffusers import WanTransformer3DModel
from dancegrpo_port.models.wan_rope import Float32WanRotaryPosEmbed, use_float32_rope
from dancegrpo_npu.trainers.wan.fixtures import TRANSFORMER_CONFIG

from torch.utils._python_dispatch import TorchDispatchMode

class Float64Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.count += any(getattr(t, "dtype", None) == torch.float64 for t in (out if isinstance(out, (tuple, list)) else [out]))
        return out

with Float64Ops() as ref_ops:
    ref = transformer_wan.WanRotaryPosEmbed(128, (1, 2, 2), 1024)  # Wan2.1-1.3B's head dim
with Float64Ops() as our_ops:
    ours = Float32WanRotaryPosEmbed(128, (1, 2, 2), 1024)
table = max((ours.freqs_cos.double() - ref.freqs_cos).abs().max().item(),
            (ours.freqs_sin.double() - ref.freqs_sin).abs().max().item())
x = torch.randn(1, 16, 21, 60, 104)  # 81 frames at 480x832, latent grid
rc, rs = ref(x)
oc, os_ = ours(x)
used = max((oc.double() - rc).abs().max().item(), (os_.double() - rs).abs().max().item())
torch.manual_seed(0)
model64 = WanTransformer3DModel(**TRANSFORMER_CONFIG)
use_float32_rope()
torch.manual_seed(0)
model32 = WanTransformer3DModel(**TRANSFORMER_CONFIG)
assert isinstance(model32.rope, Float32WanRotaryPosEmbed)
h = torch.randn(1, 16, 1, 8, 8); t = torch.tensor([500]); e = torch.randn(1, 512, TRANSFORMER_CONFIG["text_dim"])
with torch.no_grad():
    a = model64(h, t, e, return_dict=False)[0]
    b = model32(h, t, e, return_dict=False)[0]
print(json.dumps({"table": table, "used": used, "dtype": str(ours.freqs_cos.dtype), "ref_float64_ops": ref_ops.count,
                  "our_float64_ops": our_ops.count, "out": ((a - b).norm() / a.norm()).item()}))
"""


@pytest.mark.slow
def test_float32_rope_is_diffusers_float64_rope_within_1e_5():
    """The overlay's tables against diffusers' (built in float64; Wan2.1-1.3B's head dim), the part
    an 81-frame 480x832 video uses, and a tiny transformer's output with each."""
    from pathlib import Path

    python = diffusers_035_python()
    overlay = Path(__file__).resolve().parents[2] / "overlay"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([python, "-c", ROPE_CHECK, str(overlay)], capture_output=True, text=True, env=env,
                         timeout=600, check=True).stdout.strip().splitlines()[-1]
    found = json.loads(out)
    # diffusers 0.35 builds its tables with float64 ops (then keeps float32 buffers); ours makes none
    assert found["ref_float64_ops"] > 0 and found["our_float64_ops"] == 0 and found["dtype"] == "torch.float32"
    assert found["table"] <= 1e-7 and found["used"] <= 1e-7
    assert found["out"] <= 1e-5


@pytest.mark.upstream
def test_launch_wan_runs_upstreams_recipe_with_the_sets_interpreter(patched_tree, capsys):
    from dancegrpo_npu.run.launch import LaunchSpec, launch
    from dancegrpo_npu.run.upstream_args import split_flags

    python = diffusers_035_python()
    record = launch(patched_tree.project, LaunchSpec(script="wan", nproc_per_node=8, device="cuda"), dry_run=True)
    assert record.command[0] == python
    values = {flag: value for flag, value, _ in split_flags(record.command[record.command.index("--seed"):])}
    # finetune_wan_2_1_grpo.sh: 512x512, one frame, 12 generations, 20 sampling steps, CFG 5.0, accumulation 24
    assert (values["--h"], values["--w"], values["--t"], values["--num_generations"], values["--sampling_steps"],
            values["--cfg_infer"], values["--gradient_accumulation_steps"]) == ("512", "512", "1", "12", "20", "5.0", "24")
    assert "recipe 8gpus" in capsys.readouterr().out
