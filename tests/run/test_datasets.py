"""Each model's RL-embeddings dataset in its own directory (dancegrpo_npu.run.datasets):
preprocessing two models leaves both datasets whole, each trainer's plan reads its own, and a
dataset recorded for another model is refused in one line, at the dry run and at start.

On the synthetic tree, through `launch`: stand-in preprocessing scripts (FLUX's and Wan2.1's)
that write a dataset in upstream's layout, naming the model they were run for, and a Wan2.1
trainer and recipe beside the synthetic FLUX ones."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from synthetic_tree import FAKE_TRAINER, make_project, trust_synthetic_tree, write_weights

from dancegrpo_npu.cli import main
from dancegrpo_npu.project import find_project

FAKE_PREPROCESS = textwrap.dedent('''\
    """FAKE preprocessing from dancegrpo-npu's tests (test_datasets.py); not upstream's."""
    import argparse, json, os

    p = argparse.ArgumentParser()
    p.add_argument("--model_path")
    p.add_argument("--output_dir")
    p.add_argument("--prompt_dir")
    args, _ = p.parse_known_args()
    if int(os.environ["RANK"]) == 0:
        os.makedirs(os.path.join(args.output_dir, "prompt_embed"), exist_ok=True)
        with open(os.path.join(args.output_dir, "prompt_embed", "0.pt"), "w") as f:
            f.write(os.path.basename(args.model_path))
        with open(os.path.join(args.output_dir, "videos2caption.json"), "w") as f:
            json.dump([{"prompt_embed_path": "0.pt", "caption": os.path.basename(args.model_path)}], f)
''')

WAN_RECIPE = textwrap.dedent('''\
    # synthetic
    torchrun --nproc_per_node=8 --master_port 19002 \\
        fastvideo/train_grpo_wan_2_1.py \\
        --seed 7 --pretrained_model_name_or_path data/Wan2.1-T2V-1.3B --vae_model_path data/Wan2.1-T2V-1.3B \\
        --data_json_path data/rl_embeddings/videos2caption.json --h 480 --w 832 --max_train_steps 300
''')


@pytest.fixture
def project(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    monkeypatch.setenv("DANCEGRPO_VENV_DIFFUSERS_0_35", sys.prefix)  # the stand-ins need no diffusers
    project = find_project(make_project(tmp_path / "proj"))
    tree = project.workdir
    write_weights(tree / "data" / "Wan2.1-T2V-1.3B")  # stand-in files in the layout the checks ask for
    for rel in ("preprocess_flux_embedding.py", "preprocess_wan_2_1_embeddings.py"):
        (tree / "fastvideo" / "data_preprocess" / rel).write_text(FAKE_PREPROCESS)
    (tree / "fastvideo" / "train_grpo_wan_2_1.py").write_text(FAKE_TRAINER)
    (tree / "scripts" / "finetune" / "finetune_wan_2_1_grpo_8gpus.sh").write_text(WAN_RECIPE)
    return project


def cli(project, *words):
    return main(["-C", str(project.root), *words])


def dataset(project, model):
    return project.workdir / "data" / "rl_embeddings" / model


def test_preprocessing_two_models_leaves_both_datasets_and_each_trainer_reads_its_own(project, capsys):
    assert cli(project, "launch", "preprocess", "--device", "cpu") == 0
    assert cli(project, "launch", "preprocess-wan", "--device", "cpu") == 0
    out = capsys.readouterr().out
    assert f"the Wan2.1-T2V-1.3B dataset is in {dataset(project, 'wan')}" in out
    for model, weights in (("flux", "flux"), ("wan", "Wan2.1-T2V-1.3B")):
        data = json.loads((dataset(project, model) / "videos2caption.json").read_text())
        assert data == [{"prompt_embed_path": "0.pt", "caption": weights}], model
        assert (dataset(project, model) / "prompt_embed" / "0.pt").read_text() == weights
        record = json.loads((dataset(project, model) / "dataset.json").read_text())
        assert record["model"] == model and record["preprocessing"] == {"flux": "preprocess"}.get(model, "preprocess-wan")
        assert record["arguments"]["--model_path"] == str(project.workdir / "data" / weights)
    # upstream's shared directory is left as it was
    assert (project.workdir / "data/rl_embeddings/videos2caption.json").read_text() == '[{"caption": "a cat"}]'

    for trainer, model in (("flux", "flux"), ("wan", "wan")):
        assert cli(project, "launch", trainer, "--nproc-per-node", "8", "--dry-run") == 0, capsys.readouterr().out
        plan = capsys.readouterr().out
        assert f"--data_json_path {dataset(project, model) / 'videos2caption.json'} \\" in plan, trainer
        assert (f"#   --data_json_path {dataset(project, model) / 'videos2caption.json'} (script: "
                "data/rl_embeddings/videos2caption.json; this model's own dataset") in plan


def test_a_dataset_of_another_model_is_refused_at_the_dry_run_and_at_start(project, capsys):
    assert cli(project, "launch", "preprocess-wan", "--device", "cpu") == 0
    capsys.readouterr()
    wan_json = dataset(project, "wan") / "videos2caption.json"
    says = f"--data_json_path: {wan_json} is the Wan2.1-T2V-1.3B dataset (made by `dancegrpo-npu launch preprocess-wan`"
    assert cli(project, "launch", "flux", "--nproc-per-node", "8", "--dry-run", "--",
               "--data_json_path", str(wan_json)) == 1
    assert says in capsys.readouterr().out.split("# could not start here:")[1]
    runs = set(project.runs_dir.iterdir())
    assert cli(project, "launch", "flux", "--device", "cpu", "--", "--data_json_path", str(wan_json)) == 1
    err = capsys.readouterr().err
    assert says in err and "not FLUX.1-dev's" in err and len(err.strip().splitlines()) == 1
    assert set(project.runs_dir.iterdir()) == runs  # nothing started

    # preprocessing FLUX into Wan2.1's directory would overwrite it
    assert cli(project, "launch", "preprocess", "--device", "cpu", "--", "--output_dir", str(dataset(project, "wan"))) == 1
    assert f"--output_dir: {dataset(project, 'wan')} holds the Wan2.1-T2V-1.3B dataset" in capsys.readouterr().err
    assert json.loads(wan_json.read_text())[0]["caption"] == "Wan2.1-T2V-1.3B"


def test_upstreams_layout_is_reachable_by_its_path(project, capsys):
    shared = project.workdir / "data" / "rl_embeddings" / "videos2caption.json"
    assert cli(project, "launch", "flux", "--nproc-per-node", "8", "--dry-run", "--",
               "--data_json_path", str(shared)) == 0
    assert f"--data_json_path {shared} \\" in capsys.readouterr().out
