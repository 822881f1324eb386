"""``bench``'s input checks: trainers, sizes and sample batch sizes, refused before anything is built.

The CLI tests run ``dancegrpo-npu bench`` in a child process and expect exit 2 with exactly one
line on stderr; they finish before torch is imported.  The sizes a preset does not set are
upstream's recipe, read from the patched tree: the checks of sizes run on the tiny presets (the
tool's own, every size set), the full-size presets on the upstream fixture or not at all.  Every
trainer has a bench (its row's): in process, or a short run of its smoke, said why.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dancegrpo_npu import registry
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.throughput import presets

ROOT = Path(__file__).resolve().parents[2]


def resolve(tree=None, **options):
    return presets.resolve(options, tree)


@pytest.mark.upstream
def test_full_is_upstreams_recipe(patched_tree):
    config = resolve(patched_tree.tree)
    s = config.sizes
    assert config.preset.name == f"{registry.default_trainer().name}-full" and config.sample_batch_sizes == (1,)
    assert config.recipe == patched_tree.tree / "scripts/finetune/finetune_flux_grpo.sh"
    assert (s.height, s.width, s.sampling_steps, s.generations) == (720, 720, 16, 12)
    assert (s.timestep_fraction, s.eta, s.shift, s.text_tokens) == (0.6, 0.3, 3.0, 512)
    assert (s.steps, s.warmup_steps) == (2, 1)
    # the trainer drops the last timestep, then trains int(15 * 0.6) of them
    assert s.train_timesteps == 9


FROM_THE_RECIPE = [name for name, p in presets.presets().items() if p.needs_recipe]


def test_only_the_tiny_presets_set_every_size():
    assert {p.size for p in presets.presets().values() if not p.needs_recipe} == {"tiny"}
    for spec in registry.benched():  # a full-size preset sets none of upstream's sizes
        full = spec.bench.preset("full")
        assert full is None or not set(full.sizes) & set(presets.RECIPE_FIELDS), spec.name


def test_every_trainer_has_a_bench_at_each_size_or_says_why():
    """bench --trainer NAME --size SIZE for every GRPO trainer of the registry: a preset, or the
    row's reason for the size; a trainer timed by a short run says why too."""
    assert [s.name for s in registry.benched()] == registry.trainers()
    for spec in registry.benched():
        for size in presets.SIZES:
            assert (spec.bench.preset(size) is None) == (size in dict(spec.bench.no_sizes)), (spec.name, size)
        assert spec.bench.preset("tiny") is not None, spec.name
        # in process: the row says how to build and call its train_one_step; else why not
        assert bool(spec.bench.short_run) != bool(spec.bench.train and spec.bench.prompt), spec.name


@pytest.mark.parametrize("name", [s.name for s in registry.benched() if s.bench.no_sizes])
def test_a_size_a_trainer_has_no_preset_at_is_refused_saying_why(name, capsys):
    from dancegrpo_npu.cli import main

    spec = registry.get(name)
    size, why = spec.bench.no_sizes[0]
    status = main(["bench", "--trainer", name, "--size", size])
    out, err = capsys.readouterr()
    [line] = err.strip().splitlines()
    assert status == 2 and out == "" and f"bench: {name} has no {size} size: {why}" in line
    assert "--size tiny" in line


def test_a_short_run_takes_only_its_own_sizes():
    name = next(s.name for s in registry.benched() if s.bench.short_run)
    config = resolve(trainer=name, size="tiny", generations=6, steps=1, sample_batch_sizes="1,3")
    assert config.sizes is None and (config.short.generations, config.short.steps, config.short.warmup_steps) == (6, 1, 1)
    with pytest.raises(DancegrpoError) as err:
        resolve(trainer=name, size="tiny", height=128)
    assert f"--height: {name} is timed by a short run of its smoke" in err.value.one_line()
    # a trainer that takes no --sample_batch_size: one N
    without = next(s.name for s in registry.benched() if s.bench.short_run and not s.bench.sample_batch_flag)
    with pytest.raises(DancegrpoError) as err:
        resolve(trainer=without, size="tiny", sample_batch_sizes="1,2")
    assert "takes no --sample_batch_size" in err.value.one_line()


@pytest.mark.parametrize("name", FROM_THE_RECIPE)
def test_a_preset_of_upstreams_recipe_without_a_tree_is_refused_in_one_line(tmp_path, name):
    for tree in (None, tmp_path / "absent"):
        preset = presets.PRESETS[name]
        with pytest.raises(DancegrpoError) as err:
            resolve(tree, trainer=preset.trainer, size=preset.size)
        line = err.value.one_line()
        assert err.value.exit_code == 1 and "\n" not in line
        assert f"bench: {preset.trainer} at size {preset.size} runs upstream's recipe " in line and "is missing" in line
        assert "`dancegrpo-npu fetch && dancegrpo-npu apply`" in line and "--workdir" in line


def test_the_tree_is_asked_for_only_by_a_preset_that_reads_the_recipe():
    def no_tree():
        raise AssertionError("a tiny preset asked for the patched tree")

    assert presets.resolve({"size": "tiny"}, no_tree).recipe is None
    with pytest.raises(DancegrpoError) as err:  # the values are checked before the tree is asked for
        presets.resolve({"size": "full", "sample_batch_sizes": "0"}, no_tree)
    assert "fewer than 1" in err.value.one_line()


def test_explicit_sizes_win_over_the_preset():
    config = resolve(size="tiny", height=256, generations=8, steps=3, sample_batch_sizes="8,1,8")
    assert (config.sizes.height, config.sizes.width, config.sizes.generations, config.sizes.steps) == (256, 64, 8, 3)
    assert config.sample_batch_sizes == (8, 1)
    assert config.decode_chunk(8) == 8 and resolve(size="tiny", vae_decode_chunk=3).decode_chunk(12) == 3


@pytest.mark.parametrize("options, message", [
    ({"size": "huge"}, "unknown size 'huge'; choose one of: tiny, cpu, full"),
    ({"trainer": "flx"}, "unknown trainer 'flx'; did you mean flux?"),
    ({"trainer": "preprocess"}, "unknown trainer 'preprocess'"),  # a preprocessing script has no bench
    ({"size": "tiny", "sample_batch_sizes": "1,3"}, "3 does not divide the 4 generations of a prompt; use divisors of 4: 1, 2, 4"),
    ({"sample_batch_sizes": "0"}, "0 samples per transformer call is fewer than 1"),
    ({"sample_batch_sizes": "4,-1"}, "-1 samples per transformer call is fewer than 1"),
    ({"sample_batch_sizes": "1,x"}, "'x' is not a whole number"),
    ({"size": "tiny", "generations": 6, "sample_batch_sizes": "4"}, "4 does not divide the 6 generations"),
    ({"size": "tiny", "height": 100}, "--height 100 is not a multiple of 16"),
    ({"size": "tiny", "sampling_steps": 1}, "needs 2 or more"),
    ({"size": "tiny", "timestep_fraction": 0.01}, "trains none"),
    ({"size": "tiny", "generations": 5}, "--generations 5 is not a multiple of --gradient-accumulation-steps 2"),
    ({"vae_decode_chunk": 0}, "--vae-decode-chunk 0 is below 1"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"dtype": "fp16"}, "unknown dtype 'fp16'"),
    # the tiny preset's 4 sampling steps: steps 0..2 are trained
    ({"size": "tiny", "sde_window_size": 4}, "--sde-window-size 4: a window holds 1 to 3 of the trainable steps of "
                                             "--sampling-steps 4"),
    ({"size": "tiny", "sde_window_size": -2}, "--sde-window-size -2: a window holds 1 to 3"),
    ({"size": "tiny", "sde_window_size": 2, "record": True}, "--record with --sde-window-size: a run's records hold "
                                                             "one SDE window setting"),
])  # fmt: skip
def test_bad_input_is_refused(options, message):
    with pytest.raises(DancegrpoError) as err:
        resolve(**options)
    assert err.value.exit_code == 2
    assert message in err.value.one_line()


def test_a_window_is_measured_beside_upstreams_step_and_a_short_run_takes_none():
    config = resolve(size="tiny", sampling_steps=16, timestep_fraction=0.6, sde_window_size=4)
    assert config.sde_window_size == 4 and config.sizes.train_timesteps == 9
    assert config.describe()["sde_window_size"] == 4 and resolve(size="tiny").sde_window_size == 0
    short = next(s.name for s in registry.benched() if s.bench.short_run)
    with pytest.raises(DancegrpoError) as err:
        resolve(trainer=short, size="tiny", sde_window_size=2)
    assert err.value.exit_code == 2 and "--sde-window-size 2: " in err.value.one_line()
    assert "is timed by a short run of its smoke" in err.value.one_line()


def bench(*args, project=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "dancegrpo_npu", "-C", str(project), "bench", *args],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("args, message", [
    (("--size", "huge"), "unknown size 'huge'"),
    (("--preset", "tiny"), "bench: --preset tiny: a bench is named by its trainer and size; give "
                           "`dancegrpo-npu bench --trainer NAME --size tiny|cpu|full`"),
    (("--size", "tiny", "--sample-batch-sizes", "1,3"), "3 does not divide the 4 generations"),
    (("--sample-batch-sizes", "0"), "fewer than 1"),
    (("--size", "tiny", "--sde-window-size", "4"), "--sde-window-size 4: a window holds 1 to 3"),
])  # fmt: skip
def test_cli_bad_input_is_one_line_exit_2(args, message):
    r = bench(*args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert message in r.stderr and r.stdout == ""


def test_cli_full_preset_without_a_tree_is_one_line_exit_1(tmp_path):
    (tmp_path / "upstream.lock").write_text((ROOT / "upstream.lock").read_text())
    r = bench("--size", "full", project=tmp_path)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{tmp_path / 'build' / 'DanceGRPO'} is missing" in r.stderr and "dancegrpo-npu fetch && dancegrpo-npu apply" in r.stderr


def test_the_window_line_is_upstreams_seconds_over_the_windows_at_each_n():
    """bench --sde-window-size: at each N, upstream's step then the window's, each ratio seconds
    without the window over seconds with it (the whole step: every phase)."""
    from dancegrpo_npu.throughput.bench import window_line, window_ratios
    from dancegrpo_npu.throughput.phases import Result

    def result(n, train, window=0):
        return Result(n, {"rollout": 2.0, "decode": 0.5, "reward": 0.5, "train": train}, {}, 4, True, window)

    results = [result(1, 9.0), result(1, 4.0, 4), result(2, 6.0), result(2, 3.0, 4)]
    assert window_ratios(results[0].phases_s, results[1].phases_s) == {"train": 2.25, "rollout": 1.0,
                                                                       "whole step": 12.0 / 7.0}
    assert window_line(results, 9) == ("SDE window of 4 steps against upstream's 9 trained timesteps (faster by): "
                                       "N=1 train 2.25x, whole step 1.71x; N=2 train 2.00x, whole step 1.50x")
