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
