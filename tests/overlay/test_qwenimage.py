"""overlay/dancegrpo_port/qwenimage.py on its own (no upstream, no training): a rollout batch's
prompt length and reference-image size, and the Edit trainer's passes after a resume.  The
trainers themselves run in the Qwen-Image smokes (slow)."""

from __future__ import annotations

import pytest
from overlay_runner import OVERLAY  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from dancegrpo_port import qwenimage  # noqa: E402  (overlay/ is on sys.path)

# the repeated (--use_group) figures of two prompts with 4 generations each
HEIGHTS = torch.tensor([64, 64, 64, 64, 96, 96, 96, 96])


def test_one_sample_is_upstreams_index_exactly():
    batch_idx = torch.tensor([5])
    picked = qwenimage.one_value(HEIGHTS, batch_idx, "reference image height")
    assert torch.equal(picked, HEIGHTS[batch_idx]) and picked.item() == 96
    assert torch.equal(qwenimage.text_length(HEIGHTS, batch_idx), HEIGHTS[batch_idx])


@pytest.mark.parametrize("batch_idx, value", [([0, 1, 2, 3], 64), ([4, 5], 96), ([6, 7], 96)])
def test_a_batch_of_one_prompt_gives_its_one_value(batch_idx, value):
    picked = qwenimage.one_value(HEIGHTS, torch.tensor(batch_idx), "reference image height")
    assert picked.shape == (1,) and picked.item() == value  # upstream's .item() takes it as it is
    assert qwenimage.text_length(HEIGHTS, torch.tensor(batch_idx)) == value


def test_a_batch_across_prompts_is_refused_in_one_line():
    with pytest.raises(RuntimeError) as exc:
        qwenimage.one_value(HEIGHTS, torch.tensor([2, 3, 4, 5]), "reference image widths")
    message = str(exc.value)
    assert "\n" not in message and "different reference image widths [64, 64, 96, 96]" in message
    assert "--sample_batch_size divides --num_generations" in message
    with pytest.raises(RuntimeError, match=r"different lengths \[64, 96\]"):
        qwenimage.text_length(HEIGHTS, torch.tensor([3, 4]))


def batches(loader):
    return [b.tolist() for b in loader]


@pytest.mark.parametrize("init_steps, expected", [
    (0, [0, 0, 0]),      # no resume: every pass from its first batch
    (2, [2, 0, 0]),      # stopped inside the first pass
    (3, [3, 0, 0]),      # the first pass finished: it is skipped, the second starts afresh
    (4, [3, 1, 0]),
    (8, [3, 3, 2]),
    (9, [3, 3, 3]),      # all passes done
])
def test_resume_pass_counts_each_pass_done_steps(init_steps, expected):
    sampler = DistributedSampler(range(10), num_replicas=2, rank=0, shuffle=True, seed=3)
    got = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        got.append(qwenimage.resume_pass(init_steps, epoch, 3, sampler, 1))
        list(sampler)  # the pass, so a skip set for it is used up
    assert got == expected


def test_the_pass_a_run_stopped_in_goes_on_at_its_next_batch():
    """A resume at step 4 of passes of 3 steps (each pass its own order): the second pass's
    loader yields from its second batch, the third pass is whole."""
    def run(init_steps):
        sampler = DistributedSampler(range(12), num_replicas=2, rank=1, shuffle=True, seed=5)
        loader = DataLoader(list(range(12)), sampler=sampler, batch_size=2, drop_last=True)
        seen = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            done = qwenimage.resume_pass(init_steps, epoch, 3, sampler, 2)
            if done == 3:
                continue
            seen += [(epoch, step, b) for step, b in enumerate(batches(loader), start=done)]
        return seen

    whole, resumed = run(0), run(4)
    assert whole[0][2] != whole[3][2]  # the passes' orders differ (set_epoch), as upstream's
    assert resumed == whole[4:]


def test_a_pass_the_resume_starts_afresh_gets_the_generators_back_before_its_loader(tmp_path):
    """resume_pass says how much of each pass is done and restores nothing itself; the seam calls
    hooks.data_pass_begin() where it says 0 (tests/patches/test_qwenimage_edit_seam.py), and only
    a resume's pending generators are restored there, once: at a pass's first batch before the
    pass's DataLoader iterator draws its seed (the run resumed drew it after its checkpoint);
    inside a pass they wait for the first rollout (the iterator was made before the checkpoint)."""
    from types import SimpleNamespace

    from dancegrpo_port import hooks
    from dancegrpo_port.resume import Resume, rng_state

    args = SimpleNamespace(output_dir=str(tmp_path), checkpointing_steps=1, max_train_steps=4, train_batch_size=1,
                           checkpoints_total_limit=None, resume_from_checkpoint=None, num_generations=2, h=64,
                           w=64, t=1, sampling_steps=4)
    feature = Resume(args, 0, 1, torch.device("cpu"))
    torch.manual_seed(11)
    saved = rng_state(None, torch.device("cpu"))
    expected = torch.rand(3)
    sampler = DistributedSampler(range(8), num_replicas=1, rank=0, shuffle=True, seed=3)
    hooks.install([feature])
    try:
        feature.pending_rng = saved
        torch.manual_seed(99)
        assert qwenimage.resume_pass(3, 1, 2, sampler, 1) == 1  # inside the second pass: later
        assert qwenimage.resume_pass(3, 0, 2, sampler, 1) == 2  # a finished pass: nothing
        assert qwenimage.resume_pass(4, 2, 2, sampler, 1) == 0  # the third pass from its start
        assert feature.pending_rng is saved  # the helper restores nothing
        hooks.data_pass_begin()  # the seam's call there
        assert feature.pending_rng is None and torch.equal(torch.rand(3), expected)
        after = torch.get_rng_state()
        hooks.data_pass_begin()  # a later pass started afresh: nothing pending, nothing restored
        assert torch.equal(torch.get_rng_state(), after)
    finally:
        hooks.install([])
