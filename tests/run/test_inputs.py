"""run.inputs: what launch checks of a run's inputs before it starts (a dry run lists them)."""

from __future__ import annotations

import json

import pytest

from dancegrpo_npu.run.upstream_args import input_problems, script_info


def _dataset(tmp_path, sizes):
    path = tmp_path / "videos2caption.json"
    path.write_text(json.dumps([{"prompt_embed_path": f"{i}.pt", "calculated_height": h, "calculated_width": w}
                                for i, (h, w) in enumerate(sizes)]))
    return path


@pytest.mark.parametrize("sizes, batch, refused", [
    ([(1024, 1024), (832, 1248)], 2, True),  # upstream's recipe (--train_batch_size 2) on mixed sizes
    ([(1024, 1024), (832, 1248)], 1, False),
    ([(1024, 1024), (1024, 1024)], 2, False),
])
def test_the_edit_trainer_refuses_batches_its_collate_cannot_stack(tmp_path, sizes, batch, refused):
    data = _dataset(tmp_path, sizes)
    problems = input_problems(script_info("qwenimage-edit"), ["--data_json_path", str(data),
                                                               "--train_batch_size", str(batch)])
    found = [p for p in problems if "reference images of" in p]
    if refused:
        [line] = found
        assert line.startswith("--train_batch_size 2: ") and "2 sizes (832x1248, 1024x1024)" in line
        assert "give --train_batch_size 1" in line and "\n" not in line
    else:
        assert found == []
    # the Qwen-Image trainer has no reference images
    assert not [p for p in input_problems(script_info("qwenimage"), ["--data_json_path", str(data),
                                                                     "--train_batch_size", "2"])
                if "reference images" in p]


def _model(directory, name):
    (directory / name).mkdir(parents=True)
    (directory / name / "config.json").write_text("{}")
    (directory / name / "model.safetensors").write_bytes(b"0")


def test_a_directory_of_models_holds_what_its_row_names(tmp_path):
    """The kinds are generic: a row's Input names the subfolders its directory must hold."""
    from dancegrpo_npu.registry import Input
    from dancegrpo_npu.run.inputs import input_problem

    weights = Input(flag="--w", kind="models", models=("denoiser", "vae"), what="toy weights")
    _model(tmp_path, "vae")
    assert input_problem(weights, tmp_path) == (f"the toy weights directory {tmp_path} is incomplete: "
                                                "denoiser/ is missing")
    _model(tmp_path, "denoiser")
    assert input_problem(weights, tmp_path) is None
    (tmp_path / "denoiser" / "model.safetensors").unlink()
    assert "denoiser/ has no weight files" in input_problem(weights, tmp_path)


def test_a_pipeline_holds_its_index_its_models_and_its_rows_folders(tmp_path):
    from dancegrpo_npu.registry import Input
    from dancegrpo_npu.run.inputs import input_problem

    pipeline = Input(flag="--p", kind="pipeline", models=("denoiser",), folders=("tokenizer", "processor"),
                     what="toy pipeline")
    _model(tmp_path, "denoiser")
    assert input_problem(pipeline, tmp_path).endswith(
        "incomplete: model_index.json is missing, tokenizer/ is missing or empty, processor/ is missing or empty")
    (tmp_path / "model_index.json").write_text("{}")
    for name in ("tokenizer", "processor"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "vocab.json").write_text("{}")
    assert input_problem(pipeline, tmp_path) is None
    # the same directory as a pipeline of another row's folders
    other = Input(flag="--p", kind="pipeline", models=("denoiser",), folders=("tokenizer_2",), what="other")
    assert input_problem(other, tmp_path).endswith("incomplete: tokenizer_2/ is missing or empty")
