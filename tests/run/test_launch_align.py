"""launch/smoke alignment flags: --rng, --record, --record-steps, --record-modules, --replay become
the contract's trainer arguments; bad values and replays that do not fit are refused in one
line before anything starts (checked with launch --dry-run on the synthetic tree)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recorded_runs import index
from synthetic_tree import make_project, trust_synthetic_tree

from dancegrpo_npu import registry
from dancegrpo_npu.cli import main
from dancegrpo_npu.project import find_project

SMALL = ("--h", "16", "--w", "16", "--num_generations", "2", "--sampling_steps", "3", "--max_train_steps", "2")


@pytest.fixture
def project(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    return find_project(make_project(tmp_path / "proj"))


def recorded(project, name: str, **over) -> Path:
    """A run with only records/index.json: all a replay check reads."""
    run = project.runs_dir / name
    (run / "records").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    (run / "records" / "index.json").write_text(json.dumps(index(**over)))
    return run


def dry_run(project, capsys, *argv) -> tuple[int, str, str]:
    before = sorted(p.name for p in project.runs_dir.iterdir()) if project.runs_dir.exists() else []
    rc = main(["-C", str(project.root), "launch", *argv])
    out = capsys.readouterr()
    after = sorted(p.name for p in project.runs_dir.iterdir()) if project.runs_dir.exists() else []
    assert after == before  # a dry run, or a refusal, creates no run directory
    return rc, out.out, out.err


def command_tail(out: str) -> str:
    """The torchrun command of a dry run's script, on one line."""
    text = out[out.index("torch.distributed.run"):]
    return " ".join(part.strip() for part in text.replace("\\\n", " ").split())


def test_flags_become_the_contracts_trainer_arguments(project, capsys):
    rc, out, err = dry_run(project, capsys, "flux", "--dry-run", "--rng", "cpu", "--record-steps", "1-3,5",
                           "--record-modules", "--", "--max_train_steps", "2")  # fmt: skip
    assert rc == 0, err
    assert command_tail(out).endswith(" --rng cpu --record --record_steps 1-3,5 --record_modules")
    rc, out, _ = dry_run(project, capsys, "--record", "flux-lora", "--dry-run")  # before the script too
    assert rc == 0 and command_tail(out).endswith(" --record")
    rc, _, err = dry_run(project, capsys, "--rng", "gpu", "flux", "--dry-run")
    assert rc == 2 and err == "dancegrpo-npu: error: --rng 'gpu' is not a choice; choose one of: device, cpu\n"
    rc, out, _ = dry_run(project, capsys, "flux", "--dry-run")
    assert rc == 0 and "--rng" not in out and "--record" not in out  # nothing given: upstream's run, unchanged


@pytest.mark.parametrize(
    "argv, message",
    [
        (["flux", "--rng", "gpu"], "--rng 'gpu' is not a choice; choose one of: device, cpu"),
        (["flux-lora", "--rng=gpu"], "--rng 'gpu' is not a choice"),
        (["flux", "--record-steps", "1-x"], "--record-steps '1-x': '1-x' is not understood"),
        (["flux", "--record-steps", "0,2"], "'0' is not a step"),
        (["flux", "--record-steps", "5-2"], "'5-2' is not a step"),
        (["flux", "--record-steps", ""], "--record-steps '': '' is not understood"),
        (["preprocess", "--record"], f"--record: only the GRPO trainers ({', '.join(registry.aligning())}) draw noise and record"),
        (["flux", "--record", "--", "--record"], "--record given after -- as well as launch's alignment options"),
        (["flux", "--rng", "cpu", "--no-upstream-defaults"], "--rng cpu: the launch sets no --seed"),
        (["flux", "--replay", "nosuch"], "no run 'nosuch'"),
    ],
)
def test_bad_alignment_input_is_one_line(project, capsys, argv, message):
    rc, out, err = dry_run(project, capsys, *argv[:1], "--dry-run", *argv[1:])
    assert rc == 2 and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_replay_that_fits_passes_the_records_directory(project, capsys):
    src = recorded(project, "20260101-100000-gpu", steps=[1, 2, 3])
    rc, out, err = dry_run(project, capsys, "flux", "--dry-run", "--replay", "gpu", "--", *SMALL)
    assert rc == 0, err
    assert command_tail(out).endswith(f" --replay {src / 'records'}")
    rc, out, err = dry_run(project, capsys, "flux", "--dry-run", "--replay", str(src), "--record", "--", *SMALL)
    assert rc == 0 and command_tail(out).endswith(f" --record --replay {src / 'records'}")


def test_replay_without_records(project, capsys):
    run = project.runs_dir / "20260101-100000-plain"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    rc, _, err = dry_run(project, capsys, "flux", "--dry-run", "--replay", "plain", "--", *SMALL)
    assert rc == 2 and "--replay: run 20260101-100000-plain has no records" in err
    assert "launch, smoke or bench with --record" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "over, argv, message",
    [
        ({}, ["--nproc-per-node", "2"], "recorded with world_size 1, but this launch has world_size 2"),
        ({}, ["--", *SMALL[4:]], "recorded with h 16, w 16, but this launch has h 720, w 720"),  # upstream's default
        ({"num_generations": 12}, ["--", *SMALL], "recorded with num_generations 12, but this launch has num_generations 2"),
        ({"sampling_steps": 16}, ["--", *SMALL], "sampling_steps 16, but this launch has sampling_steps 3"),
        ({"init_same_noise": False}, ["--", *SMALL], "init_same_noise false, but this launch has init_same_noise true"),
        ({"sde_window": [2, 0, None, 0, None]}, ["--", *SMALL], "recorded with sde_window [2, 0, null, 0, null], but "
                                                                "this launch has sde_window not set"),
        ({"steps": [1]}, ["--", *SMALL], "steps 2 of this launch (max_train_steps 2) were not recorded (recorded: 1)"),
        ({"steps": [1, 2]}, ["--", *SMALL[:-1], "10"], "steps 3-10 of this launch (max_train_steps 10) were not"),
    ],
)  # fmt: skip
def test_replay_that_does_not_fit_is_refused_naming_what_differs(project, capsys, over, argv, message):
    recorded(project, "20260101-100000-src", **over)
    rc, out, err = dry_run(project, capsys, "flux", "--dry-run", "--replay", "src", *argv)
    if "--" not in argv:
        rc, out, err = dry_run(project, capsys, "flux", "--dry-run", "--replay", "src", *argv, "--", *SMALL)
    assert rc == 2 and out == "" and message in err, err
    assert err.startswith("dancegrpo-npu: error: --replay") and err.count("\n") == 1


# A stand-in trainer whose parser launch can read (run.script_parser): the defaults are its own.
PARSED_TRAINER = """\
import argparse

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for flag in ("--output_dir", "--replay"):
        parser.add_argument(flag)
    for flag in ("--h", "--w", "--sampling_steps", "--max_train_steps", "--seed"):
        parser.add_argument(flag, type=int, default=None)
    parser.add_argument("--num_generations", type=int, default={generations})
    parser.add_argument("--{same_noise}", action="store_true", default=False)
    args = parser.parse_args()
"""


@pytest.mark.parametrize("script, generations, same_noise", [
    ("flux", 16, "init_same_noise"),
    ("hunyuan", 12, "use_same_noise"),  # the row's renamed_values: its init_same_noise
])
def test_replay_checks_the_trainers_own_defaults_without_upstream_defaults(project, capsys, script, generations,
                                                                            same_noise):
    """--no-upstream-defaults (as smoke runs): a flag not given is the trainer's own parser's default
    (each row's: read from its script), not the shell script's, nor another trainer's."""
    (project.workdir / registry.get(script).relpath).write_text(
        PARSED_TRAINER.format(generations=generations, same_noise=same_noise))
    recorded(project, "20260101-100000-src")
    small = ("--h", "16", "--w", "16", "--sampling_steps", "3", "--max_train_steps", "2")
    rc, _, err = dry_run(project, capsys, script, "--dry-run", "--no-upstream-defaults", "--replay", "src", "--",
                         *small)
    assert rc == 2
    assert f"recorded with num_generations 2, init_same_noise true, but this launch has num_generations " \
           f"{generations}, init_same_noise false" in err  # fmt: skip
    rc, _, err = dry_run(project, capsys, script, "--dry-run", "--no-upstream-defaults", "--replay", "src", "--",
                         *small, "--num_generations", "2", f"--{same_noise}")
    assert rc == 0, err


def test_replay_of_a_bad_index(project, capsys):
    run = recorded(project, "20260101-100000-src")
    (run / "records" / "index.json").write_text(json.dumps({"format": 2}))
    rc, _, err = dry_run(project, capsys, "flux", "--dry-run", "--replay", "src", "--", *SMALL)
    assert rc == 2 and "is not a format-1 records index" in err


# ------------------------------------------------------------------ smoke: refused before fixtures


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rng", "gpu"], "--rng 'gpu' is not a choice"),
        (["--record-steps", "x"], "--record-steps 'x'"),
        (["--replay", "nosuch"], "no run 'nosuch'"),
        (["--replay", "plain"], "run 20260101-100000-plain has no records"),
        (["--record", "--if-needed"], "--if-needed skips the run, so it does not combine with --record"),
    ],
)
def test_smoke_refuses_bad_alignment_input_before_building_anything(tmp_path, capsys, argv, message):
    root = tmp_path / "p"
    (root / "runs" / "20260101-100000-plain").mkdir(parents=True)
    (root / "runs" / "20260101-100000-plain" / "summary.json").write_text("{}")
    (root / "upstream.lock").write_text((Path(__file__).parents[2] / "upstream.lock").read_text())
    rc = main(["-C", str(root), "smoke", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1
    assert sorted(p.name for p in root.iterdir()) == ["runs", "upstream.lock"]  # no build/, no fixtures
    assert [p.name for p in (root / "runs").iterdir()] == ["20260101-100000-plain"]


def test_smoke_passes_the_alignment_options_to_launch(tmp_path, monkeypatch):
    """smoke hands its options to launch (which maps and checks them, as above)."""
    from dancegrpo_npu.run.align_flags import AlignOptions
    from dancegrpo_npu.run import launch as launch_mod
    from dancegrpo_npu.smoke import runner
    from dancegrpo_npu.trainers.flux.smoke import trainer_args

    seen = {}
    ended = type("Record", (), {"returncode": 0, "run_dir": tmp_path})()  # a run that ended well
    monkeypatch.setattr(launch_mod, "launch", lambda project, spec, **kw: seen.setdefault("spec", spec) and ended)
    fixtures = type("F", (), {k: tmp_path for k in ("model_dir", "data_json", "hps_model_config",
                                                     "hps_open_clip_ckpt", "hps_ckpt")})  # fmt: skip
    align = AlignOptions(rng="cpu", record_modules=True)
    options = runner.SmokeOptions(align=align)
    runner._launch(find_project(make_project(tmp_path / "p")), options, trainer_args(fixtures, lora=False))
    assert seen["spec"].align == align and seen["spec"].align.trainer_args(None) == ("--rng", "cpu", "--record",
                                                                                     "--record_modules")  # fmt: skip


def test_msprobe_records_modules_and_sets_the_jobs_environment(project, capsys, monkeypatch):
    from dancegrpo_npu.run import align_flags as options

    monkeypatch.setattr(options.importlib.util, "find_spec", lambda name: object())  # as if installed
    rc, out, err = dry_run(project, capsys, "flux", "--dry-run", "--msprobe", "statistics")
    assert rc == 0, err
    assert command_tail(out).endswith(" --record --record_modules")
    assert "DANCEGRPO_MSPROBE=statistics" in out
    # the user's --env wins, as for every variable launch sets
    rc, out, err = dry_run(project, capsys, "flux", "--dry-run", "--msprobe", "statistics",
                           "--env", "DANCEGRPO_MSPROBE=tensor")
    assert rc == 0 and "DANCEGRPO_MSPROBE=tensor" in out and "DANCEGRPO_MSPROBE=statistics" not in out, out


def test_msprobe_bad_task_or_not_installed_is_refused_in_one_line(project, capsys, monkeypatch):
    from dancegrpo_npu.run import align_flags as options

    rc, _, err = dry_run(project, capsys, "flux", "--dry-run", "--msprobe", "L1")
    assert rc == 2 and err == "dancegrpo-npu: error: --msprobe 'L1' is not a task; choose one of: statistics, tensor\n"
    monkeypatch.setattr(options.importlib.util, "find_spec", lambda name: object())  # as if installed
    rc, _, err = dry_run(project, capsys, "preprocess", "--dry-run", "--msprobe", "tensor")
    assert rc == 2 and "--msprobe: only the GRPO trainers" in err
    monkeypatch.setattr(options.importlib.util, "find_spec", lambda name: None)
    rc, _, err = dry_run(project, capsys, "flux", "--dry-run", "--msprobe", "tensor")
    assert rc == 2 and err.count("\n") == 1 and "msprobe) is not installed" in err and "dancegrpo-npu[msprobe]" in err


def test_a_replay_fits_hunyuans_use_same_noise_as_the_shared_initial_noise():
    """HunyuanVideo's recipe passes --use_same_noise, which its trainer records as init_same_noise
    (the overlay's hunyuan.settle): a replay of such a run must fit a launch of the same recipe.
    The values are read from the namespace the script's own parser makes (its defaults too)."""
    from dancegrpo_npu.run.launch import replay_values
    from dancegrpo_npu.run.upstream_args import trainer_values

    hunyuan, flux = registry.get("hunyuan"), registry.get("flux")
    namespace = {"h": 480, "w": 848, "use_same_noise": True, "max_train_steps": 2, "num_generations": 16}
    assert replay_values(hunyuan, trainer_values(hunyuan, [], namespace), 8)["init_same_noise"] is True
    assert trainer_values(hunyuan, [], {**namespace, "use_same_noise": False})["init_same_noise"] is False
    # a trainer without the alias: the flag means nothing there
    assert trainer_values(flux, [], {**namespace, "init_same_noise": False})["init_same_noise"] is False
    # without the parser's namespace, the arguments as given
    args = ["--h", "480", "--w", "848", "--use_same_noise", "--max_train_steps", "2"]
    assert trainer_values(hunyuan, args, None)["init_same_noise"] is True
    assert trainer_values(hunyuan, args[:4], None)["init_same_noise"] is None
    assert trainer_values(flux, args, None)["init_same_noise"] is None
    # the SD trainer always shares its initial latents, whatever its flags say
    assert replay_values(registry.get("sd"), trainer_values(registry.get("sd"), [], {}), 1)["init_same_noise"] is True
