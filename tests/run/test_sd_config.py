"""An absl / ml_collections configuration (the SD trainer's --config FILE:NAME and --config.KEY=VALUE)
read before start as the trainer's absl reads it (run.absl_config), with the overlay's check of the
port's flags against it; and every trainer's --h / --w by its model's rule (the row's image_sizes)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from dancegrpo_npu import registry
from dancegrpo_npu.cli import main
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.run import absl_config
from dancegrpo_npu.run.inputs import image_sizes_problem

SCRIPT = textwrap.dedent('''\
    from absl import app, flags
    from ml_collections import config_flags

    FLAGS = flags.FLAGS
    config_flags.DEFINE_config_file("config", "config/base.py", "Training configuration.")

    def main(_):
        raise SystemExit("main must not run when the configuration is checked")

    if __name__ == "__main__":
        app.run(main)
''')

CONFIG = textwrap.dedent('''\
    import ml_collections

    def small():
        config = ml_collections.ConfigDict()
        config.seed = 42
        config.train = ml_collections.ConfigDict()
        config.train.learning_rate = 1e-5
        config.train.batch_size = 4
        config.updates_per_epoch = 2
        return config

    def get_config(name):
        return globals()[name]()
''')

# The overlay's side: the port's flags against the configuration (as dancegrpo_port.sd's).
CHECK = textwrap.dedent('''\
    def problem(args, config):
        if args.max_train_steps is not None and args.max_train_steps % config.updates_per_epoch:
            return f"--max_train_steps {args.max_train_steps} is not a multiple of {config.updates_per_epoch}"
        return None
''')


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "dgx.py").write_text(CONFIG)
    (tmp_path / "port_check.py").write_text(CHECK)
    return tmp_path


def check(tree, args, values=None):
    absl_config.check_config(tree / "train.py", tree, sys.executable, list(args), ("--config",),
                             values or {"max_train_steps": None}, "port_check:problem",
                             "--config configs/dgx.py:small")


def test_a_configuration_absl_takes_passes(tree):
    check(tree, ["--config", f"{tree}/configs/dgx.py:small", "--config.train.learning_rate=3e-5", "--seed", "1"])


@pytest.mark.parametrize("args, says", [
    (["--config.train.nonexistent=3"],
     "--config.train.nonexistent=3: the configuration dgx.py:small has no key train.nonexistent (its train keys: "
     "batch_size, learning_rate)"),
    (["--config.train.lerning_rate=3"], "did you mean --config.train.learning_rate?"),
    (["--config.train.learning_rate=abc"],
     "--config.train.learning_rate=abc: could not convert string to float: 'abc'; the configuration's "
     "config.train.learning_rate is a float (1e-05)"),
    (["--config.train.batch_size=2.5"], "config.train.batch_size is a int (4)"),
])
def test_a_key_or_value_absl_would_refuse_is_one_line_naming_it(tree, args, says):
    with pytest.raises(DancegrpoError) as err:
        check(tree, ["--config", f"{tree}/configs/dgx.py:small", *args])
    assert says in err.value.one_line() and "\n" not in err.value.one_line() and err.value.exit_code == 2


def test_a_configuration_name_the_file_lacks_is_refused_with_its_names(tree):
    with pytest.raises(DancegrpoError) as err:
        check(tree, ["--config", f"{tree}/configs/dgx.py:nosuch"])
    assert "dgx.py has no configuration 'nosuch'; choose one of: small" in err.value.one_line()
    assert err.value.exit_code == 2


@pytest.mark.parametrize("args, says", [
    (["--config", "/nowhere/dgx.py:small"], "/nowhere/dgx.py does not exist"),
    ([], "no --config: train.py's default configuration cannot be loaded"),
])
def test_a_configuration_that_cannot_load_is_refused(tree, args, says):
    with pytest.raises(DancegrpoError) as err:
        check(tree, args)
    assert says in err.value.one_line() and "--config configs/dgx.py:small" in err.value.one_line()
    assert err.value.exit_code == 2


def test_the_overlays_check_reads_the_configuration_and_the_port_flags(tree):
    args = ["--config", f"{tree}/configs/dgx.py:small", "--max_train_steps", "5"]
    with pytest.raises(DancegrpoError) as err:
        check(tree, args, {"max_train_steps": 5})
    assert err.value.one_line().startswith("train.py would refuse its arguments: --max_train_steps 5 is not a multiple of 2")
    check(tree, [*args, "--config.updates_per_epoch=5"], {"max_train_steps": 5})  # the override counts


@pytest.mark.upstream
@pytest.mark.parametrize("words, says", [
    (["--config.train.nonexistent=3"], "the configuration dgx.py:hpsv2 has no key train.nonexistent"),
    (["--max_train_steps", "5", "--checkpointing_steps", "3"],
     "train_grpo_sd.py would refuse its arguments: --max_train_steps 5 must be a positive multiple of the 2 "
     "optimizer updates an epoch makes"),
])
def test_launch_sd_dry_run_refuses_what_its_absl_and_overlay_would(dry_run_tree, tmp_path, capsys, words, says):
    assert main(["-C", str(dry_run_tree.project.root), "launch", "sd", "--dry-run", "--", *words]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ --h / --w by the row's model


def test_every_trainer_that_takes_sizes_has_its_models_rule():
    for name in registry.trainers():
        sizes = registry.get(name).image_sizes
        assert sizes is not None and sizes.multiple in (8, 16), name


@pytest.mark.parametrize("values, multiple, says", [
    ({"--h": "72"}, 16, "--h 72 is not a positive multiple of 16"),
    ({"--w": "8"}, 16, "--w 8 is not a positive multiple of 16"),
    ({"--h": "100"}, 8, "--h 100 is not a positive multiple of 8"),
    ({"--h": "72", "--w": "512"}, 8, None),
])
def test_sizes_by_the_rows_rule(values, multiple, says):
    rows = [registry.get(n) for n in registry.trainers() if registry.get(n).image_sizes.multiple == multiple]
    assert rows
    for row in rows:
        problem = image_sizes_problem(values, row.image_sizes)
        assert (problem is None) if says is None else (says in problem and row.image_sizes.why in problem), row.name


@pytest.mark.upstream
def test_launch_refuses_a_video_size_its_transformer_cannot_patch(dry_run_tree, capsys):
    assert main(["-C", str(dry_run_tree.project.root), "launch", "hunyuan", "--dry-run", "--", "--h", "72"]) == 2
    err = capsys.readouterr().err
    assert "--h 72 is not a positive multiple of 16 (HunyuanVideo's VAE downsamples 8x" in err
    assert len(err.strip().splitlines()) == 1


# The overlay's side: a flag not given takes its configuration key's value (as dancegrpo_port.sd's settle).
SETTLE = textwrap.dedent('''\
    def settle(args, config):
        if args.seed is None:
            args.seed = config.seed
        args.init_same_noise = True
''')


def test_the_values_a_replay_fits_are_the_configurations_where_no_flag_sets_them(tree):
    """A trainer configured by absl (the SD recipe's --config) keeps --seed... in its configuration:
    the values the trainer runs with are those its overlay's settle gives the port's flags."""
    (tree / "port_settle.py").write_text(SETTLE)
    args = ["--config", f"{tree}/configs/dgx.py:small"]

    def settled(values, *more):
        return absl_config.check_config(tree / "train.py", tree, sys.executable, [*args, *more], ("--config",),
                                        values, "port_check:problem", "--config configs/dgx.py:small",
                                        "port_settle:settle")

    assert settled({"seed": None, "max_train_steps": None}) == {"seed": 42, "max_train_steps": None,
                                                                "init_same_noise": True}
    assert settled({"seed": 7, "max_train_steps": None}, "--seed", "7")["seed"] == 7
    assert settled({"seed": None, "max_train_steps": None}, "--config.seed=3")["seed"] == 3  # the override counts
    assert check(tree, args) is None  # no settle named: nothing to read


@pytest.mark.upstream
def test_a_replay_of_the_sd_recipe_fits_a_launch_of_it(patched_tree, tmp_path, monkeypatch, capsys):
    """upstream's SD recipe sets the seed, the generations and the DDIM steps in its configuration
    (dgx.py:hpsv2), not as flags: a run recorded with them fits a launch of the recipe."""
    import json

    from recorded_runs import index

    runs = tmp_path / "runs"
    monkeypatch.setenv("DANCEGRPO_RUNS", str(runs))
    config = patched_tree.tree / "fastvideo" / "config_sd" / "dgx.py"
    sys.path.insert(0, str(patched_tree.tree))
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_dgx", config)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        hpsv2 = module.get_config("hpsv2")
    finally:
        sys.path.remove(str(patched_tree.tree))
    updates = 2  # the recipe's updates an epoch (test_launch_sd_dry_run_refuses_what_its_absl_and_overlay_would)
    source = runs / "20260101-100000-sd"
    (source / "records").mkdir(parents=True)
    (source / "summary.json").write_text("{}")
    recorded = index(script="train_grpo_sd.py", world_size=1, seed=hpsv2.seed, h=512, w=512,
                     num_generations=hpsv2.num_generations, sampling_steps=hpsv2.sample.num_steps,
                     init_same_noise=True, steps=list(range(1, updates + 1)))
    (source / "records" / "index.json").write_text(json.dumps(recorded))
    argv = ["-C", str(patched_tree.project.root), "launch", "sd", "--dry-run", "--replay", "sd", "--",
            "--max_train_steps", str(updates)]
    main(argv)
    out = capsys.readouterr()
    assert "--replay" in out.out and f"{source / 'records'}" in out.out, out.err
    assert "does not fit" not in out.err and "recorded with" not in out.err, out.err
    # a launch that changes one of them is refused, naming it
    steps = hpsv2.sample.num_steps
    assert main([*argv, "--sampling_steps", str(steps + 1)]) == 2
    err = capsys.readouterr().err
    assert f"recorded with sampling_steps {steps}, but this launch has sampling_steps {steps + 1}" in err, err
