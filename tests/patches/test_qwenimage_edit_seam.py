"""The Qwen-Image-Edit trainer (fastvideo/train_grpo_qwenimage_edit.py, a near-copy of the
Qwen-Image trainer with reference-image latents) is on the seam as the Qwen-Image trainer is:
the same hooks, called in the same order (seam-train-grpo-qwenimage-edit mirrors
seam-train-grpo-qwenimage), with the Edit trainer's own pieces (its batch's reference size,
its three passes after a resume, each pass started afresh announced by data_pass_begin).  Read from the patched
tree, nothing run: the trainers need the diffusers-0.35 set, and their runs are the Qwen-Image
smokes' (slow)."""

from __future__ import annotations

import re

import pytest

HOOK_CALL = re.compile(r"\bhooks\.(\w+)\(")
QWENIMAGE, EDIT = "fastvideo/train_grpo_qwenimage.py", "fastvideo/train_grpo_qwenimage_edit.py"


def hook_calls(tree, path) -> list[str]:
    return HOOK_CALL.findall((tree / path).read_text())


@pytest.mark.upstream
def test_the_edit_trainer_calls_the_qwenimage_trainers_hooks_in_order(patched_tree):
    edit = hook_calls(patched_tree.tree, EDIT)
    assert [call for call in edit if call != "data_pass_begin"] == hook_calls(patched_tree.tree, QWENIMAGE)
    assert edit.count("data_pass_begin") == 1  # its passes over the data (the seam's, not a helper's)
    assert {"check_arguments", "run_start", "rollout_begin", "decoded", "checkpoint_load", "step_begin",
            "step_end", "checkpoint_save", "trained_model", "run_end", "add_arguments"} <= set(edit)


@pytest.mark.upstream
def test_the_edit_trainers_own_pieces_are_on_the_seam(patched_tree):
    source = (patched_tree.tree / EDIT).read_text()
    # the batch's reference image size, one value a batch (upstream indexes one sample)
    assert "batch_calculated_height = calculated_height[batch_idx]" not in source
    assert 'qwenimage.one_value(calculated_height, batch_idx, "reference image height")' in source
    assert 'qwenimage.one_value(calculated_width, batch_idx, "reference image width")' in source
    # the three passes: resumed where the run stopped, the steps numbered on across them
    assert "for epoch in range(3):" in source
    assert "qwenimage.resume_pass(init_steps, epoch, steps_per_epoch, sampler, args.train_batch_size)" in source
    assert "enumerate(train_dataloader, start=resumed)" in source
    # a pass started afresh gets a resume's generators back before its loader's iterator is made,
    # by the seam's own call (every seam call is in a seam patch, none in an overlay helper)
    passes = source[source.index("for epoch in range(3):"):source.index("enumerate(train_dataloader, start=resumed)")]
    assert re.search(r"if resumed == 0:\n\s+hooks\.data_pass_begin\(\)", passes), passes
    assert "run_step = epoch * steps_per_epoch + step + 1" in source  # 1, 2, ... over all passes
    assert source.count("run_step") == 4  # set once, then step_begin, step_end, checkpoint_save
    # the passes skip the used batches themselves: the checkpoint load gets no sampler
    load = source[source.index("hooks.checkpoint_load("):]
    assert "sampler" not in load[:load.index(")")]
