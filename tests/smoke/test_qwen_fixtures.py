"""The tiny Qwen-Image and Qwen-Image-Edit fixtures, and their preprocessing through the port.

The smokes' fixtures, built with the diffusers-0.35 set (``build_qwen_fixtures``, cached by its
stamp) from the FLUX fixtures' prompts in the session's project:

- the datasets read through the patched tree's own LatentDataset and collate function of both
  dataset modules as the trainers read them: embeddings padded to 1024 (Edit: 5000) tokens of the
  text encoder's width, the mask's ones up to original_length, the captions, for Edit the
  reference image's latents at the calculated 128x128 (the smoke's; upstream's 1024x1024);
- the build's own check (the transformer's forward with the trainer's call, the VAE's decode of
  an 8x8 latent to 64x64) is recorded, and a second build reuses the directory;
- ``launch preprocess-qwenimage`` runs the patched script on the tiny pipeline and writes the
  fixtures' dataset bit for bit (the extended tier: ``preprocess-qwenimage-edit`` on one
  instruction, minutes on the CPU); upstream's script stops at its Mochi import (liger_kernel),
  which the patch removes;
- launch refuses bad inputs of both recipes in one line, before torchrun starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from dancegrpo_npu import registry
from dancegrpo_npu.cli import main
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.upstream

TEXT_WIDTH = 32  # trainers.qwenimage.fixtures.TEXT_CONFIG["hidden_size"]


def _tool(project_root, *args, timeout=600):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "dancegrpo_npu", "-C", str(project_root), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def _dataset_module(tree, name):
    spec = importlib.util.spec_from_file_location(f"_qwen_{name}", tree / "fastvideo" / "dataset" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports only torch, json, os, random
    return module


@pytest.fixture(scope="module")
def built(patched_tree):
    """The smokes' own fixtures, in the session's project: built once for these tests and the
    Qwen-Image smokes (when they run in the same process)."""
    from depset_035 import diffusers_035_python

    from dancegrpo_npu.smoke.fixtures import build_reward_fixtures
    from dancegrpo_npu.trainers.qwenimage.fixtures import build_qwen_fixtures

    python = diffusers_035_python()
    project = patched_tree.project
    prompts = build_reward_fixtures(project.build_dir / "fixtures-reward").prompts  # the smokes' prompts
    # where the rows' fixtures hook builds them (trainers.qwenimage.smoke.fixtures)
    plain, edit = (build_qwen_fixtures(project.build_dir / f"fixtures-{name}", prompts, python,
                                       edit=registry.get(name).smoke.param("edit"))
                   for name in ("qwenimage", "qwenimage-edit"))
    return {"python": python, "prompts": prompts.read_text().splitlines(), "plain": plain, "edit": edit,
            "prompts_file": prompts}


@pytest.mark.slow
def test_the_qwen_image_dataset_reads_as_the_trainer_reads_it(built, patched_tree):
    fixtures = built["plain"]
    module = _dataset_module(patched_tree.tree, "latent_qwenimage_rl_datasets")
    dataset = module.LatentDataset(str(fixtures.data_json), 1, 0.0)
    assert len(dataset) == len(built["prompts"])
    embeds, masks, captions, lengths = module.latent_collate_function([dataset[i] for i in range(len(dataset))])
    assert list(captions) == list(built["prompts"])
    assert embeds.shape == (len(dataset), 1024, TEXT_WIDTH) and masks.shape == (len(dataset), 1024)
    for embed, mask, length in zip(embeds, masks, lengths):
        assert 5 < length < 1024  # the prompt and the template's closing turn, not the dropped system turn
        assert mask[:length].eq(1).all() and mask[length:].eq(0).all()
        assert embed[length:].eq(0).all() and embed[:length].abs().sum(-1).gt(0).all()
        assert torch.isfinite(embed.float()).all()
    checks = json.loads((fixtures.root / "checks.json").read_text())
    assert checks == {"transformer_out": [1, 16, 64], "vae_decoded": [1, 3, 1, 64, 64], "pipeline": "QwenImagePipeline"}
    assert json.loads((fixtures.model_dir / "model_index.json").read_text())["_class_name"] == "QwenImagePipeline"


@pytest.mark.slow
def test_the_qwen_image_edit_dataset_reads_as_the_trainer_reads_it(built, patched_tree):
    fixtures = built["edit"]
    module = _dataset_module(patched_tree.tree, "latent_qwenimage_edit_rl_datasets")
    dataset = module.LatentDataset(str(fixtures.data_json), 1, 0.0)
    n = len(built["prompts"])
    embeds, masks, latents, captions, lengths, heights, widths = module.latent_collate_function(
        [dataset[i] for i in range(n)])
    assert list(captions) == list(built["prompts"])
    assert embeds.shape == (n, 5000, TEXT_WIDTH) and masks.shape == (n, 5000)
    # the reference image at calculate_dimensions(128 * 128, 1.0) (the smoke's; upstream's 1024 * 1024):
    # 8x downsampled, one frame
    assert latents.shape == (n, 16, 1, 16, 16) and torch.isfinite(latents.float()).all()
    assert list(heights) == [128] * n and list(widths) == [128] * n
    for mask, length in zip(masks, lengths):
        assert mask[:length].eq(1).all() and mask[length:].eq(0).all()
        assert length > 16  # the vision tokens of the reference image are kept, with the instruction
    checks = json.loads((fixtures.root / "checks.json").read_text())
    assert checks == {"transformer_out": [1, 32, 64], "vae_decoded": [1, 3, 1, 64, 64],
                      "pipeline": "QwenImageEditPipeline"}
    assert (fixtures.model_dir / "processor" / "preprocessor_config.json").is_file()
    sources = [json.loads(line)["source_image"] for line in fixtures.prompt_file.read_text().splitlines()]
    assert all((fixtures.image_dir / s).is_file() for s in sources) and len(sources) == n


@pytest.mark.slow
def test_a_second_build_reuses_the_fixtures(built):
    from dancegrpo_npu.trainers.qwenimage.fixtures import build_qwen_fixtures

    fixtures = built["plain"]
    stamp = fixtures.root / "fixtures.stamp.json"
    before = stamp.stat().st_mtime_ns
    assert build_qwen_fixtures(fixtures.root, built["prompts_file"], built["python"]) == fixtures
    assert stamp.stat().st_mtime_ns == before


@pytest.mark.slow
def test_launch_preprocess_qwenimage_writes_the_fixtures_dataset(built, patched_tree, tmp_path):
    fixtures = built["plain"]
    out = tmp_path / "rl_embeddings"
    r = _tool(patched_tree.project.root, "launch", "preprocess-qwenimage", "--device", "cpu", "--runs-dir",
              str(tmp_path / "runs"), "--", "--model_path", str(fixtures.model_dir), "--output_dir", str(out),
              "--prompt_dir", str(fixtures.prompt_file))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert json.loads((out / "videos2caption.json").read_text()) == json.loads(fixtures.data_json.read_text())
    for sub in ("prompt_embed", "prompt_attention_mask"):
        for path in sorted((fixtures.data_json.parent / sub).iterdir()):
            assert torch.equal(torch.load(out / sub / path.name), torch.load(path)), (sub, path.name)


@pytest.mark.slow
@pytest.mark.extended  # minutes: the script's bfloat16 VAE encodes a 1024x1024 image on the CPU
def test_launch_preprocess_qwenimage_edit_writes_the_fixtures_dataset(built, patched_tree, tmp_path):
    """On the first instruction: upstream's layout as the fixtures write it, at upstream's
    reference size (1024x1024; the fixtures' is the smoke's 128x128)."""
    fixtures = built["edit"]
    one = tmp_path / "edit_data.jsonl"
    one.write_text(fixtures.prompt_file.read_text().splitlines()[0] + "\n")
    out = tmp_path / "rl_embeddings"
    r = _tool(patched_tree.project.root, "launch", "preprocess-qwenimage-edit", "--device", "cpu", "--runs-dir",
              str(tmp_path / "runs"), "--", "--model_path", str(fixtures.model_dir), "--output_dir", str(out),
              "--prompt_dir", str(one), "--image_dir", str(fixtures.image_dir), timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    [entry] = json.loads((out / "videos2caption.json").read_text())
    ours = json.loads(fixtures.data_json.read_text())[0]
    assert entry.keys() == ours.keys() and entry["caption"] == ours["caption"]
    assert (entry["calculated_height"], entry["calculated_width"]) == (1024, 1024)
    embed, mask = torch.load(out / "prompt_embed" / "0.pt"), torch.load(out / "prompt_attention_mask" / "0.pt")
    assert embed.shape == torch.load(fixtures.data_json.parent / "prompt_embed" / "0.pt").shape
    assert mask[: entry["original_length"]].eq(1).all() and mask[entry["original_length"]:].eq(0).all()
    assert torch.load(out / "image_latents" / "0.pt").shape == (16, 1, 128, 128)


def test_upstreams_qwen_image_preprocessing_stops_at_its_mochi_import(patched_tree, tmp_path):
    """What preprocess-qwenimage.patch fixes first: the unused MochiPipeline import needs liger_kernel (CUDA-only)."""
    from depset_035 import diffusers_035_python

    tree = patched_tree.tree
    rel = "fastvideo/data_preprocess/preprocess_qwenimage_embedding.py"
    upstream = subprocess.run(["git", "-C", str(tree), "show", f"HEAD:{rel}"], capture_output=True, text=True,
                              check=True).stdout
    assert "cuda" not in (tree / rel).read_text().replace("cuda.device_count", "")  # the patched one: no CUDA left
    script = tmp_path / "preprocess_qwenimage_embedding.py"
    script.write_text(upstream)
    env = dict(os.environ, PYTHONPATH=str(tree), DANCEGRPO_DEVICE="cpu")
    r = subprocess.run([diffusers_035_python(), str(script), "--output_dir", str(tmp_path / "out")], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "No module named 'liger_kernel'" in r.stderr.strip().splitlines()[-1]


def _pipeline_dir(path, processor: bool):
    """A directory shaped like a saved Qwen-Image(-Edit) pipeline, for launch's input checks."""
    for name in ("transformer", "vae", "text_encoder"):
        (path / name).mkdir(parents=True)
        (path / name / "config.json").write_text("{}")
        (path / name / "model.safetensors").write_bytes(b"x")
    for name in ("tokenizer",) + (("processor",) if processor else ()):
        (path / name).mkdir()
        (path / name / "tokenizer_config.json").write_text("{}")
    (path / "model_index.json").write_text("{}")
    return path


@pytest.mark.parametrize("name, flag, value, says", [
    ("preprocess-qwenimage", "--model_path", "missing",
     "--model_path: the Qwen-Image weights directory {missing} does not exist"),
    ("preprocess-qwenimage-edit", "--model_path", "plain",
     "--model_path: the Qwen-Image-Edit weights directory {plain} is incomplete: processor/ is missing or empty"),
    ("preprocess-qwenimage-edit", "--image_dir", "empty",
     "--image_dir: the source-image directory {empty} is incomplete: it is empty"),
    ("preprocess-qwenimage-edit", "--prompt_dir", "missing", "--prompt_dir: {missing} does not exist"),
])
def test_launch_refuses_bad_preprocessing_inputs_in_one_line(patched_tree, tmp_path, capsys, name, flag, value, says):
    edit = name.endswith("-edit")
    (tmp_path / "empty").mkdir()
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "0.png").write_bytes(b"x")
    (tmp_path / "prompts").write_text('{"source_image": "0.png", "instruction": "a cat"}\n')
    paths = {"missing": str(tmp_path / "nothing"), "plain": str(_pipeline_dir(tmp_path / "plain", False)),
             "edit": str(_pipeline_dir(tmp_path / "edit", True)), "empty": str(tmp_path / "empty")}
    given = {"--model_path": paths["edit" if edit else "plain"], "--prompt_dir": str(tmp_path / "prompts"),
             "--output_dir": str(tmp_path / "out")}
    if edit:
        given["--image_dir"] = str(tmp_path / "images")
    given[flag] = paths[value]
    rc = main(["-C", str(patched_tree.project.root), "launch", name, "--device", "cpu", "--runs-dir",
               str(tmp_path / "runs"), "--", *[x for kv in given.items() for x in kv]])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc != 0 and len(lines) == 1, err
    assert says.format(**paths) in lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_launch_accepts_whole_preprocessing_inputs(patched_tree, tmp_path, capsys):
    """The same inputs, whole: the dry run finds nothing missing (the refusals above are the inputs')."""
    from depset_035 import diffusers_035_python

    diffusers_035_python()  # launch checks that the set is installed
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "0.png").write_bytes(b"x")
    (tmp_path / "prompts").write_text('{"source_image": "0.png", "instruction": "a cat"}\n')
    rc = main(["-C", str(patched_tree.project.root), "launch", "preprocess-qwenimage-edit", "--device", "cpu",
               "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--",
               "--model_path", str(_pipeline_dir(tmp_path / "edit", True)), "--prompt_dir", str(tmp_path / "prompts"),
               "--image_dir", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 0 and "could not start" not in out + err, out[-2000:] + err
    assert f"--image_dir {tmp_path / 'images'}" in out
