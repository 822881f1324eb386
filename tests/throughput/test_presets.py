"""``bench``'s input checks: presets, sizes and sample batch sizes, refused before anything is built.

The CLI tests run ``dancegrpo-npu bench`` in a child process and expect exit 2 with exactly one
line on stderr; they finish before torch is imported.  The sizes a preset does not set are
upstream's recipe, read from the patched tree: the checks of sizes run on the tiny presets (the
tool's own, every size set), the full-size presets on the upstream fixture or not at all.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dancegrpo_npu import trainers
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.throughput import presets

ROOT = Path(__file__).resolve().parents[2]


def resolve(tree=None, **options):
    return presets.resolve(options, tree)


@pytest.mark.upstream
def test_full_is_upstreams_recipe(patched_tree):
    config = resolve(patched_tree.tree)
    s = config.sizes
    assert config.preset.name == "full" and config.sample_batch_sizes == (1,)
    assert config.recipe == patched_tree.tree / "scripts/finetune/finetune_flux_grpo.sh"
    assert (s.height, s.width, s.sampling_steps, s.generations) == (720, 720, 16, 12)
    assert (s.timestep_fraction, s.eta, s.shift, s.text_tokens) == (0.6, 0.3, 3.0, 512)
    assert (s.steps, s.warmup_steps) == (2, 1)
    # the trainer drops the last timestep, then trains int(15 * 0.6) of them
    assert s.train_timesteps == 9


FROM_THE_RECIPE = [name for name, p in presets.presets().items() if p.needs_recipe]


def test_only_the_tiny_presets_set_every_size():
    assert {name for name, p in presets.presets().items() if not p.needs_recipe} == {"tiny", "tiny-wan", "tiny-qwenimage"}
    for spec in trainers.benched():  # a full-size preset sets none of upstream's sizes
        assert not set(spec.bench.presets[0].sizes) & set(presets.RECIPE_FIELDS), spec.name


@pytest.mark.parametrize("name", FROM_THE_RECIPE)
def test_a_preset_of_upstreams_recipe_without_a_tree_is_refused_in_one_line(tmp_path, name):
    for tree in (None, tmp_path / "absent"):
        with pytest.raises(DancegrpoError) as err:
            resolve(tree, preset=name)
        line = err.value.one_line()
        assert err.value.exit_code == 1 and "\n" not in line
        assert f"bench: preset {name} runs upstream's recipe " in line and "is missing" in line
        assert "`dancegrpo-npu fetch && dancegrpo-npu apply`" in line and "--workdir" in line


def test_the_tree_is_asked_for_only_by_a_preset_that_reads_the_recipe():
    def no_tree():
        raise AssertionError("a tiny preset asked for the patched tree")

    assert presets.resolve({"preset": "tiny"}, no_tree).recipe is None
    with pytest.raises(DancegrpoError) as err:  # the values are checked before the tree is asked for
        presets.resolve({"preset": "full", "sample_batch_sizes": "0"}, no_tree)
    assert "fewer than 1" in err.value.one_line()


def test_explicit_sizes_win_over_the_preset():
    config = resolve(preset="tiny", height=256, generations=8, steps=3, sample_batch_sizes="8,1,8")
    assert (config.sizes.height, config.sizes.width, config.sizes.generations, config.sizes.steps) == (256, 64, 8, 3)
    assert config.sample_batch_sizes == (8, 1)
    assert config.decode_chunk(8) == 8 and resolve(preset="tiny", vae_decode_chunk=3).decode_chunk(12) == 3


@pytest.mark.parametrize("options, message", [
    ({"preset": "huge"}, "unknown preset 'huge'; choose one of: full, cpu, tiny"),
    ({"preset": "tiny", "sample_batch_sizes": "1,3"}, "3 does not divide the 4 generations of a prompt; use divisors of 4: 1, 2, 4"),
    ({"sample_batch_sizes": "0"}, "0 samples per transformer call is fewer than 1"),
    ({"sample_batch_sizes": "4,-1"}, "-1 samples per transformer call is fewer than 1"),
    ({"sample_batch_sizes": "1,x"}, "'x' is not a whole number"),
    ({"preset": "tiny", "generations": 6, "sample_batch_sizes": "4"}, "4 does not divide the 6 generations"),
    ({"preset": "tiny", "height": 100}, "--height 100 is not a multiple of 16"),
    ({"preset": "tiny", "sampling_steps": 1}, "needs 2 or more"),
    ({"preset": "tiny", "timestep_fraction": 0.01}, "trains none"),
    ({"preset": "tiny", "generations": 5}, "--generations 5 is not a multiple of --gradient-accumulation-steps 2"),
    ({"vae_decode_chunk": 0}, "--vae-decode-chunk 0 is below 1"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"dtype": "fp16"}, "unknown dtype 'fp16'"),
])  # fmt: skip
def test_bad_input_is_refused(options, message):
    with pytest.raises(DancegrpoError) as err:
        resolve(**options)
    assert err.value.exit_code == 2
    assert message in err.value.one_line()


def bench(*args, project=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "dancegrpo_npu", "-C", str(project), "bench", *args],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("args, message", [
    (("--preset", "huge"), "unknown preset 'huge'"),
    (("--preset", "tiny", "--sample-batch-sizes", "1,3"), "3 does not divide the 4 generations"),
    (("--sample-batch-sizes", "0"), "fewer than 1"),
])  # fmt: skip
def test_cli_bad_input_is_one_line_exit_2(args, message):
    r = bench(*args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert message in r.stderr and r.stdout == ""


def test_cli_full_preset_without_a_tree_is_one_line_exit_1(tmp_path):
    (tmp_path / "upstream.lock").write_text((ROOT / "upstream.lock").read_text())
    r = bench("--preset", "full", project=tmp_path)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{tmp_path / 'build' / 'DanceGRPO'} is missing" in r.stderr and "dancegrpo-npu fetch && dancegrpo-npu apply" in r.stderr


@pytest.mark.parametrize("name", [spec.name for spec in trainers.REGISTRY.values() if spec.no_bench])
def test_a_trainer_bench_cannot_run_is_refused_saying_why(name, capsys):
    """``bench --preset NAME`` of a trainer without a train_one_step (Stable Diffusion): its
    row's reason in one line, exit 2, not "unknown preset"."""
    from dancegrpo_npu.cli import main

    assert trainers.get(name).bench is None and name not in presets.presets()
    status = main(["bench", "--preset", name])
    out, err = capsys.readouterr()
    [line] = err.strip().splitlines()
    assert status == 2 and out == "" and trainers.get(name).no_bench in line and f"plan {name}" in line
    assert "unknown preset" not in line


def test_some_trainer_says_why_it_has_no_preset():
    assert any(spec.no_bench for spec in trainers.REGISTRY.values())  # the parametrized test is not empty
