"""A replay of a run launched with upstream's own recipe is not refused where the recipe names a
value the contract knows under another name: HunyuanVideo's recipe passes ``--use_same_noise``,
which its trainer records as ``init_same_noise`` (the overlay's settle), and the launch reads it
the same way (the row's ``renamed_values``, from the namespace the trainer's own parser makes).

Slow: two runs of the real patched HunyuanVideo trainer on the smoke's tiny models, one step each,
launched with upstream's recipe (finetune_hunyuan_grpo.sh) under the smoke's sizes and files: the
first with ``--rng cpu --record``, the second a ``--replay`` of it; compare finds them aligned."""

from __future__ import annotations

import json

import pytest

from dancegrpo_npu import registry
from dancegrpo_npu.cli import main
from dancegrpo_npu.run.align_flags import AlignOptions

pytestmark = [pytest.mark.slow, pytest.mark.upstream]
pytest.importorskip("torch")
pytest.importorskip("diffusers")

TRAINER = "hunyuan"


def launched(project, args, align: AlignOptions, name: str):
    from dancegrpo_npu.run.launch import LaunchSpec, launch
    from dancegrpo_npu.smoke import runner

    spec = LaunchSpec(script=TRAINER, args=tuple(args), device="cpu", name=name, env=runner.job_env("cpu", 1),
                      upstream_defaults=True, align=align)  # upstream's recipe, overridden by the tiny run's flags
    record = launch(project, spec)
    assert record.returncode == 0, (record.run_dir / "logs").iterdir()
    return record.run_dir


def test_a_run_of_upstreams_recipe_with_use_same_noise_replays(patched_tree, capsys):
    from dancegrpo_npu.smoke import runner

    project, spec = patched_tree.project, registry.get(TRAINER)
    assert ("use_same_noise", "init_same_noise") in spec.renamed_values
    options = runner.SmokeOptions(trainer=TRAINER, device="cpu", steps=1, generations=2)
    built = registry.load(spec.smoke.fixtures)(project, options, spec)
    tiny = runner.trainer_arguments(project, built, options, spec)  # the smoke's models, dataset and sizes
    source = launched(project, tiny, AlignOptions(rng="cpu", record=True), "recipe")
    script_args = json.loads((source / "launch.json").read_text())["script_args"]
    assert "--use_same_noise" in script_args  # upstream's recipe's flag, not the smoke's
    index = json.loads((source / "records" / "index.json").read_text())
    assert index["init_same_noise"] is True and index["steps"] == [1]
    replay = launched(project, tiny, AlignOptions(replay=str(source), record=True), "recipe-replay")
    index = json.loads((replay / "records" / "index.json").read_text())
    assert index["replayed_from"] == str(source / "records") and index["init_same_noise"] is True
    capsys.readouterr()
    assert main(["-C", str(project.root), "compare", str(source), str(replay)]) == 0, capsys.readouterr().out[-3000:]
