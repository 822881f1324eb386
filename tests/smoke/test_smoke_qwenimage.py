"""``dancegrpo-npu smoke --trainer qwenimage | qwenimage-edit``: the patched stock Qwen-Image
trainers on tiny models built from diffusers' and transformers' classes (trainers.qwenimage.fixtures),
with the diffusers-0.35 dependency set (docs/dependencies.md).

For each trainer the slow tests share three runs (``QwenRuns``):

- one 2-rank strict run at G = 4 with --rng cpu --record: the smoke passes (metrics, the
  checkpoint loads with QwenImageTransformer2DModel.from_pretrained and moved, every rank holds
  the same weights after training, no complex tensor under strict mode);
- the same with --sample_batch_size 4: ``compare`` against the first exits 0 and
  clip_frac_first is 0 on every step of both (two --rng cpu --record runs aligned);
- one 1-rank strict run of 1 step.
"""

from __future__ import annotations

import json

import pytest
from depset_035 import diffusers_035_python
from smoke_runs import assert_a_cut_run_resumes_exactly, metrics, passed

from dancegrpo_npu import registry
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.smoke import runner as smoke

pytest.importorskip("torch")

G = 4
TRAINERS = ("qwenimage", "qwenimage-edit")
# the Edit trainer's three passes (trainers.qwenimage.smoke): the fewest steps it takes is one a pass
STEPS = {"qwenimage": 2, "qwenimage-edit": 3}
FEWEST = {"qwenimage": 1, "qwenimage-edit": 3}


def options(trainer, nproc=2, steps=2, generations=G, extra=(), align=False) -> smoke.SmokeOptions:
    from dancegrpo_npu.run.align_flags import AlignOptions

    return smoke.SmokeOptions(nproc=nproc, trainer=trainer, device="cpu", steps=steps, generations=generations,
                              extra_args=tuple(extra), align=AlignOptions(rng="cpu", record=True) if align else AlignOptions())


class QwenRuns:
    """Each distinct smoke run once: its SmokeResult, or the DancegrpoError it ended with."""

    def __init__(self, project):
        self.project, self.done = project, {}

    def __call__(self, trainer, **kw):
        key = (trainer, tuple(sorted(kw.items())))
        if key not in self.done:
            try:
                self.done[key] = smoke.run_smoke(self.project, options(trainer, **kw))
            except DancegrpoError as e:
                self.done[key] = e
        return self.done[key]


@pytest.fixture(scope="module")
def runs(patched_tree, shared_runs):
    from shared_runs import smoke_fixtures

    diffusers_035_python()
    for trainer in TRAINERS:  # built once a test run
        smoke_fixtures(shared_runs, patched_tree.project, trainer)
    return QwenRuns(patched_tree.project)


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("trainer", TRAINERS)
def test_two_ranks_strict(runs, trainer):
    from dancegrpo_npu.smoke.trained import last_checkpoint

    steps = STEPS[trainer]
    result = passed(runs(trainer, steps=steps, align=True))
    assert [s.step for s in result.steps] == list(range(1, steps + 1)) and all(s.grad_norm > 0 for s in result.steps)
    assert result.checkpoint.loaded_with == "QwenImageTransformer2DModel.from_pretrained"
    name, updates = last_checkpoint(steps, registry.smoke_spec(trainer).smoke.passes)
    assert result.checkpoint.path.name == name and result.checkpoint.updates == updates > 0
    assert result.checkpoint.changed > 0
    assert result.equal_weights == result.checkpoint.total
    images = sorted(p.name for p in (result.run_dir / "images").glob("*.png"))
    assert len(images) == 2 * G, images  # upstream's names: one file per rank and sample, each step writes it again


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("trainer", TRAINERS)
def test_sample_batch_size_4_is_aligned_with_1(runs, trainer, capsys):
    from dancegrpo_npu.cli import main

    one = passed(runs(trainer, steps=STEPS[trainer], align=True))
    batched = passed(runs(trainer, steps=STEPS[trainer], align=True, extra=("--sample_batch_size", str(G))))
    capsys.readouterr()
    assert main(["compare", str(one.run_dir), str(batched.run_dir)]) == 0
    assert "first divergence: none" in capsys.readouterr().out
    for m in metrics(one.run_dir) + metrics(batched.run_dir):
        assert m["clip_frac_first"] == 0.0
    index = json.loads((batched.run_dir / "records" / "index.json").read_text())
    assert index["steps"] == list(range(1, STEPS[trainer] + 1)) and index["rng"] == "cpu"


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("trainer", TRAINERS)
def test_one_rank_strict(runs, trainer):
    result = passed(runs(trainer, nproc=1, steps=FEWEST[trainer], generations=2))
    if trainer == "qwenimage":
        assert result.checkpoint.updates == 0 and result.checkpoint.changed == 0  # checkpoint-0-0: the start
    else:  # checkpoint-0-2, at the start of the third pass: the first two passes' updates
        assert result.checkpoint.path.name == "checkpoint-0-2" and result.checkpoint.updates == 2
        assert result.checkpoint.changed > 0
    assert all(s.grad_norm > 0 for s in result.steps)
    assert result.equal_weights is None  # one process: no other rank to compare with, and none is claimed


@pytest.mark.parametrize("kw, message", [
    ({"trainer": "qwenimage", "steps": 4, "nproc": 2}, "--steps 4: the Qwen-Image trainer needs 5 prompts on each"),
    ({"trainer": "qwenimage-edit", "lora": True}, "--lora names the trainer flux-lora, not qwenimage-edit"),
    ({"trainer": "qwenimage-edit", "steps": 2}, "--steps 2: the Qwen-Image-Edit trainer makes 3 passes over its prompts"),
    ({"trainer": "qwenimage-edit", "steps": 12, "nproc": 2}, "--steps 12: the Qwen-Image-Edit trainer needs 5 prompts on each of the 2 ranks (it saves the last checkpoint as it reaches step 4 of each of its 3 passes)"),
])
def test_the_smoke_refuses_at_start(kw, message):
    with pytest.raises(DancegrpoError) as info:
        smoke.check_options(smoke.SmokeOptions(**kw))
    assert message in info.value.message and info.value.exit_code == 2


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.extended
def test_a_killed_run_resumes_exactly(runs, capsys):
    """Resume comes to Qwen-Image through the seam: 3 steps on 1 rank with --rng cpu --record, a
    checkpoint after each, killed once checkpoint 2 is complete; `launch --resume` continues it in
    its own directory, and it ends as the uninterrupted run: every record bit-equal, steps 1..3
    once each."""
    from dataclasses import replace

    ref = passed(runs("qwenimage", nproc=1, steps=3, generations=2, align=True))
    cut = replace(options("qwenimage", nproc=1, steps=3, generations=2, align=True),
                  env=(("DANCEGRPO_CHECKPOINT_FAULT", "2:saved"),))
    assert_a_cut_run_resumes_exactly(runs.project, ref, cut, capsys)
