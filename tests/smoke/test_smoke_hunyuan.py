"""``dancegrpo-npu smoke --trainer hunyuan`` and ``--trainer skyreels-i2v``: upstream's HunyuanVideo
and SkyReels-I2V trainers on a tiny HunyuanVideo (the repo-local ``hunyuan_hf`` transformer; 32
input channels for SkyReels), ``AutoencoderKLHunyuanVideo``, the tiny VideoAlign reward and, for
SkyReels' first frame, the tiny FLUX pipeline (trainers.hunyuan.fixtures, trainers.hunyuan.videoalign).

The slow tests share their runs (each distinct run once a test run, ``HunyuanRuns``:
tests/shared_runs.py), for each trainer:

- one 2-rank strict run with --rng cpu --record and a checkpoint after every step (HunyuanVideo: 4
  steps, SkyReels-I2V: 3): the smoke passes (metrics, upstream's checkpoint loads with diffusers'
  HunyuanVideoTransformer3DModel.from_pretrained and moved, every rank holds the same weights after
  training: FSDP);
- the same run killed once its second checkpoint is complete, continued with ``launch --resume``:
  it ends as the uninterrupted run, ``compare`` exits 0 and every record is bit-equal (two --rng cpu
  --record runs aligned, the second resumed at 2 ranks);
- (extended) one 1-rank run of 4 generations sampled 4 at a time, and the same one at a time:
  ``compare`` exits 0, and clip_frac_first is 0;
- a reward that raises stops the run in one line naming VideoAlign and the sample: the video
  reader (upstream's torchvision reader asked for, on a torchvision without read_video;
  HunyuanVideo), and the reward model's forward on rank 1 only (SkyReels-I2V; every rank ends:
  none waits in a collective);
"""

from __future__ import annotations

import pytest
from conftest import require_video_extra
from smoke_runs import assert_a_cut_run_resumes_exactly, metrics, passed

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.smoke import runner as smoke

torch = pytest.importorskip("torch")

G = 2

# Rank 1's VideoAlign forward raises (the test's sitecustomize, on the run's PYTHONPATH): upstream
# scored such a sample -1.0; the port stops the step.
BREAK_FORWARD = '''
import importlib.abc, importlib.util, os, sys

TARGET = "fastvideo.models.videoalign.train_reward"


class BreakRewardForward(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)

            def forward(self, *args, **kwargs):
                raise RuntimeError("the reward model's forward failed (the test broke it)")

            module.Qwen2VLRewardModelBT.forward = forward

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("RANK") == "1":
    sys.meta_path.insert(0, BreakRewardForward())
'''


TRAINERS = ("hunyuan", "skyreels-i2v")
# The default tier's 2-rank runs: HunyuanVideo's of 4 steps (`smoke --trainer hunyuan --steps 4`
# once stopped at a step whose group the tiny VideoAlign scored alike); 3 at least, for a resume
# after checkpoint 2 to have a step to run.
STEPS = {"hunyuan": 4, "skyreels-i2v": 3}
CUT = (("DANCEGRPO_CHECKPOINT_FAULT", "2:saved"),)  # killed once checkpoint 2 is complete


def options(trainer="hunyuan", nproc=2, steps=2, generations=G, extra=(), align=True, **kw) -> smoke.SmokeOptions:
    from dancegrpo_npu.run.align_flags import AlignOptions

    return smoke.SmokeOptions(nproc=nproc, trainer=trainer, device="cpu", steps=steps, generations=generations,
                              extra_args=tuple(extra), align=AlignOptions(rng="cpu", record=True) if align else AlignOptions(),
                              **kw)


class HunyuanRuns:
    """Each distinct smoke run once a test run (tests/shared_runs.py): its SmokeResult, or the
    DancegrpoError it ended with."""

    def __init__(self, shared, project):
        self.shared, self.project = shared, project

    def __call__(self, **kw):
        return self.shared.smoke(self.project, options(**kw))

    def two_ranks(self, trainer):
        """The 2-rank strict run, a checkpoint after every step (the resume's reference)."""
        return self(trainer=trainer, steps=STEPS[trainer], checkpointing_steps=1)


@pytest.fixture(scope="module")
def runs(patched_tree, shared_runs):
    from shared_runs import smoke_fixtures

    require_video_extra()
    smoke_fixtures(shared_runs, patched_tree.project, "hunyuan")  # both rows': built once a test run
    return HunyuanRuns(shared_runs, patched_tree.project)


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("trainer", TRAINERS)
def test_two_ranks_strict_every_rank_holds_the_same_weights(runs, trainer):
    steps = STEPS[trainer]
    result = passed(runs.two_ranks(trainer))
    assert [s.step for s in result.steps] == list(range(1, steps + 1)) and all(s.grad_norm > 0 for s in result.steps)
    assert result.checkpoint.loaded_with == "HunyuanVideoTransformer3DModel.from_pretrained"
    assert result.checkpoint.path.name == f"checkpoint-{steps}-0"
    assert result.checkpoint.updates == steps - 1 and result.checkpoint.changed > 0
    assert result.equal_weights and result.equal_weights > 0
    assert sorted(p.name for p in (result.run_dir / "weights").iterdir()) == ["rank0.json", "rank1.json"]
    prefix = "hunyuan" if trainer == "hunyuan" else "skyreels"
    assert len(list((result.run_dir / "videos").glob(f"{prefix}_*.mp4"))) == 2 * G  # each rank's last step
    assert len(list((result.run_dir / "images").glob(f"{prefix}_*.png"))) == 2 * G  # their first frames


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_killed_run_resumes_exactly_and_is_aligned(runs, trainer, capsys):
    """The 2-rank run killed once checkpoint 2 is complete; `launch --resume` continues it and it
    ends as the uninterrupted run: `compare` exits 0 with no divergence, every record bit-equal,
    steps 1..N once each (two --rng cpu --record runs aligned: the second one cut and resumed)."""
    from dataclasses import replace

    ref = passed(runs.two_ranks(trainer))
    cut = replace(options(trainer=trainer, steps=STEPS[trainer], checkpointing_steps=1), env=CUT)
    assert_a_cut_run_resumes_exactly(runs.project, ref, cut, capsys)


@pytest.mark.slow
@pytest.mark.extended  # CI keeps the 2-rank smoke and its alignment
@pytest.mark.upstream
@pytest.mark.parametrize("trainer", TRAINERS)
def test_sample_batch_size_4_is_aligned_with_1(runs, trainer, capsys):
    """Four generations sampled four at a time against one at a time (1 rank): ``compare`` exits
    0 and the training pass recomputes the rollout's log-probs (clip_frac_first 0).  HunyuanVideo's
    batch takes its attention's output projections on contiguous inputs
    (``rollout.contiguous_projections``): on a strided slice a bfloat16 Linear rounds otherwise,
    and the tiny VideoAlign moved the rewards 0.2-3% apart."""
    from dancegrpo_npu.cli import main

    batched = passed(runs(trainer=trainer, nproc=1, generations=4, extra=("--sample_batch_size", "4")))
    one_at_a_time = passed(runs(trainer=trainer, nproc=1, generations=4))
    capsys.readouterr()
    assert main(["compare", str(one_at_a_time.run_dir), str(batched.run_dir)]) == 0
    assert "first divergence: none" in capsys.readouterr().out
    for m in metrics(batched.run_dir) + metrics(one_at_a_time.run_dir):
        assert m["clip_frac_first"] == 0.0, m


def assert_failed_on_the_reward(failed, rank: int, cause: str) -> None:
    assert isinstance(failed, DancegrpoError), failed
    line = failed.message
    assert "\n" not in line and "smoke: the training run failed" in line, line
    assert f"RewardError: VideoAlign reward failed on sample 0 of rank {rank}: " in line, line
    assert cause in line, line


@pytest.mark.slow
@pytest.mark.extended  # CI keeps the forward that raises on one rank of two
@pytest.mark.upstream
def test_a_video_reader_that_raises_stops_the_run_in_one_line(runs):
    """Upstream's torchvision reader, asked for, on a torchvision without read_video: each rank's
    first sample fails to read; upstream scored it -1.0 and trained on."""
    failed = runs(align=False, extra=("--reward_from_mp4",), env=(("FORCE_QWENVL_VIDEO_READER", "torchvision"),))
    assert_failed_on_the_reward(failed, 0, "read_video")


@pytest.mark.slow
@pytest.mark.upstream
def test_a_reward_forward_that_raises_on_one_rank_ends_every_rank(runs, tmp_path):
    """Rank 1's forward raises; rank 0's rewards are fine and it goes on to gather the step's
    rewards: torchrun ends it when rank 1 stops, and the run is failed with rank 1's line."""
    (tmp_path / "sitecustomize.py").write_text(BREAK_FORWARD)
    failed = runs(trainer="skyreels-i2v", align=False, env=(("PYTHONPATH", str(tmp_path)),))
    assert_failed_on_the_reward(failed, 1, "RuntimeError: the reward model's forward failed (the test broke it)")
