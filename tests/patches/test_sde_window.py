"""The SDE window (sde-window.patch; dancegrpo_port/sde_window.py) in the real trainers, on the
tiny fixtures, 1 rank, strict mode, --rng cpu --record:

- off is upstream: without a window flag each flow trainer's smoke on the full series and on the
  series without sde-window (`apply --without`) are bit-equal: `compare` exits 0, first
  divergence none, every record tensor equal (CI: FLUX and Wan2.1, whose run on the full series
  is its 1-rank smoke's; the others extended);
- W=4 on FLUX (6 sampling steps, the window moving by 1 every step, K=1 D=1, until it ends at the
  last trainable step): metrics.jsonl has each step's window, [0, 4) [1, 5) [1, 5); each sample
  trains exactly 4 timesteps, all inside its step's window, in the order of the noise source's
  permutation, with the rollout's log-probs (an ODE step's slot is 0); the records hold SDE noise
  for the window's steps only; the ratio is exactly 1 before the first update;
- that run killed once checkpoint 2 is complete and resumed is bit-equal to it: the schedule
  continues from the checkpoint's step; a --replay of it is bit-equal to it too;
- a W=2 smoke passes, its metrics.jsonl giving each step's window (CI: Wan2.1; every other flow
  trainer extended);
- the tree without sde-window stops a run asked for a window at its first SDE step.
The runs are shared (tests/shared_runs.py: each distinct one once a test run; FLUX's recorded run
without the flag is the rollout batching's reference), and copied before anything is written into
one.
"""

from __future__ import annotations

import json

import pytest
from conftest import copy_project, require_video_extra
from shared_runs import flux_fixtures, flux_spec, smoke_fixtures
from smoke_runs import assert_a_cut_run_resumes_exactly, metrics, passed
from test_alignment_patches import assert_same_records, compare_says_aligned, ok

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

pytestmark = [pytest.mark.slow, pytest.mark.upstream]

PATCH = "sde-window.patch"
# FLUX at 6 sampling steps (0..4 trained) with a window of 4 moving by 1 each step, K=1 D=1
SLIDING = ("--sampling_steps", "6", "--sde_window_size", "4", "--sde_window_shift_every", "1",
           "--sde_window_stride", "1")
WINDOWS = [[0, 4], [1, 5], [1, 5]]  # steps 1..3: [S + n - 1, ...) until it ends at step 4, then it stays
# the diffusers-0.35 trainers; the video trainers need the video extra (VideoAlign)
DEPSET_035 = ("wan", "qwenimage", "qwenimage-edit")
VIDEO = ("hunyuan", "skyreels-i2v")
OTHERS = ("flux-lora", "qwenimage", "qwenimage-edit", "hunyuan", "skyreels-i2v")  # extended


# Wan2.1's off run at 3 steps is its 1-rank smoke (tests/smoke/test_smoke_wan.py's ONE_RANK, --rng cpu
# --record): the shared run serves both, and the tree without the patch runs the same 3 steps
OFF_STEPS = {"wan": 3}


def steps_of(trainer: str) -> int:
    return {"flux": 2, "qwenimage-edit": 3}.get(trainer, 1)  # Qwen-Image-Edit's smoke: one step a pass of 3


def options(trainer="flux", steps=None, extra=(), env=(), checkpointing_steps=None, replay=None, generations=2):
    from dancegrpo_npu.run.align_flags import AlignOptions
    from dancegrpo_npu.smoke import runner as smoke

    return smoke.SmokeOptions(trainer=trainer, device="cpu", steps=steps or steps_of(trainer), generations=generations,
                              extra_args=tuple(extra),
                              env=tuple(env), checkpointing_steps=checkpointing_steps,
                              align=AlignOptions(rng=None if replay else "cpu", record=True, replay=replay))


class Runs:
    """Smokes of ``options(**kw)`` on the patched tree or the one without sde-window: a SmokeResult,
    or the DancegrpoError it ended with; and FLUX's recorded launch at the smoke's settings."""

    def __init__(self, shared, projects):
        self.shared, self.projects = shared, projects

    def __call__(self, tree="patched", **kw):
        trainer = kw.get("trainer", "flux")
        if trainer in DEPSET_035:
            from depset_035 import diffusers_035_python

            diffusers_035_python()
        if trainer in VIDEO:
            require_video_extra()
        project = self.projects[tree]()
        smoke_fixtures(self.shared, project, trainer)  # the test run's one build of the trainer's fixtures
        return self.shared.smoke(project, options(**kw))

    def flux_recorded(self, tree="patched"):
        """FLUX at the smoke's settings, --rng cpu --record, no window flag (the patched tree's is
        the rollout batching's reference run)."""
        project = self.projects[tree]()
        return ok(self.shared.launch(project, flux_spec(flux_fixtures(self.shared, project), "--rng", "cpu", "--record")))


@pytest.fixture(scope="module")
def runs(patched_tree, upstream_source, tmp_path_factory, shared_runs):
    made = {}

    def without():
        """The series without sde-window (`apply --without`): the overlay's feature is there, the
        trainers call upstream's flux_step, count and order."""
        if "without" not in made:
            from dancegrpo_npu.engine.apply import apply_worktree
            from dancegrpo_npu.engine.fetch import fetch
            from dancegrpo_npu.project import find_project

            project = find_project(copy_project(tmp_path_factory.mktemp("without-sde-window") / "project"))
            fetch(project, source=upstream_source)
            apply_worktree(project, without=(PATCH,))
            made["without"] = project
        return made["without"]

    return Runs(shared_runs, {"patched": lambda: patched_tree.project, "without": without})


@pytest.mark.parametrize("trainer", ["flux", "wan", *(pytest.param(t, marks=pytest.mark.extended) for t in OTHERS)])
def test_without_the_flag_the_run_is_the_series_without_the_patch_bit_for_bit(runs, trainer, capsys, tmp_path):
    if trainer == "flux":
        base, ours = runs.flux_recorded("without"), runs.flux_recorded()
    else:
        steps = OFF_STEPS.get(trainer, steps_of(trainer))
        base = passed(runs(tree="without", trainer=trainer, steps=steps)).run_dir
        ours = passed(runs(trainer=trainer, steps=steps)).run_dir
    compare_says_aligned(runs.projects["patched"](), base, ours, capsys, tmp_path)
    assert_same_records(base, ours)
    assert all("sde_window" not in m for m in metrics(ours))  # no window: upstream's line


def test_w4_trains_4_timesteps_a_sample_all_inside_the_window_and_records_its_noise_alone(runs):
    from safetensors.torch import load_file

    result = passed(runs(steps=3, extra=SLIDING, checkpointing_steps=1))
    lines = metrics(result.run_dir)
    assert [m["sde_window"] for m in lines] == WINDOWS and [m["timesteps_trained"] for m in lines] == [4] * 3
    summary = json.loads((result.run_dir / "summary.json").read_text())["sde_window"]
    assert (summary["first"], summary["last"], summary["timesteps_trained"]) == (WINDOWS[0], WINDOWS[-1], 4)
    for m in lines:  # the policy that sampled is the one trained first: the ratio is exactly 1
        assert m["logprob_diff_max"] == 0.0 and m["clip_frac_first"] == 0.0
    for step, (start, end) in enumerate(WINDOWS, 1):
        t = load_file(result.run_dir / "records" / f"step_{step:06d}" / "rank_0.safetensors")
        samples = t["rewards"].shape[0]
        assert t["noise.sde"].shape[:2] == (samples, 4)  # the window's steps' noise, no other
        assert t["noise.perms"].shape == (samples, 5)  # upstream's permutation of steps 0..4, as drawn
        inside = torch.zeros(6, dtype=torch.bool)
        inside[start:end] = True
        assert (t["log_probs"][:, inside] != 0).all() and (t["log_probs"][:, ~inside] == 0).all()
        assert t["train.log_prob"].shape == t["train.old_log_prob"].shape == (samples, 4)
        # the window's steps in the order the sample's permutation gives them
        trained = torch.tensor([[s for s in row if start <= s < end] for row in t["noise.perms"].tolist()])
        assert trained.shape == (samples, 4)
        assert torch.equal(t["train.old_log_prob"], torch.gather(t["log_probs"], 1, trained))


def test_a_sliding_window_resumed_in_the_middle_is_the_uninterrupted_run(runs, capsys):
    ref = passed(runs(steps=3, extra=SLIDING, checkpointing_steps=1))
    cut = options(steps=3, extra=SLIDING, checkpointing_steps=1, env=(("DANCEGRPO_CHECKPOINT_FAULT", "2:saved"),))
    project = runs.projects["patched"]()  # the cut run is this test's own, in the project's runs/
    project.runs_dir.mkdir(parents=True, exist_ok=True)
    before = set(project.runs_dir.iterdir())
    assert_a_cut_run_resumes_exactly(project, ref, cut, capsys)
    (resumed,) = set(project.runs_dir.iterdir()) - before
    assert [m["sde_window"] for m in metrics(resumed)] == WINDOWS


def test_a_replay_of_the_sliding_run_is_bit_equal_to_it(runs, capsys, tmp_path):
    """--replay takes the window's noise from the records (the schedule fits: launch checks it)."""
    ref = passed(runs(steps=3, extra=SLIDING, checkpointing_steps=1))
    replayed = passed(runs(steps=3, extra=SLIDING, checkpointing_steps=1, replay=str(ref.run_dir)))
    compare_says_aligned(runs.projects["patched"](), ref.run_dir, replayed.run_dir, capsys, tmp_path)
    assert_same_records(ref.run_dir, replayed.run_dir)
    assert [m["sde_window"] for m in metrics(replayed.run_dir)] == WINDOWS


@pytest.mark.parametrize("trainer", ["wan", *(pytest.param(t, marks=pytest.mark.extended) for t in OTHERS)])
def test_a_w2_smoke_passes_and_says_each_steps_window(runs, trainer):
    # at 2 generations the tiny HPS reward, in bfloat16, scored the two windowed Qwen-Image images of
    # step 1 alike (0.1260 both; pixels up to 71 apart): 4 generations give it a group to tell apart
    result = passed(runs(trainer=trainer, extra=("--sde_window_size", "2"), generations=4 if trainer == "qwenimage" else 2))
    lines = metrics(result.run_dir)
    assert [m["step"] for m in lines] == list(range(1, steps_of(trainer) + 1))
    assert all(m["sde_window"] == [0, 2] and m["timesteps_trained"] == 2 for m in lines)
    assert all(m["logprob_diff_max"] == 0.0 for m in lines)


@pytest.mark.extended  # CI runs the tree without the patch with the flag absent (the off comparisons)
def test_the_tree_without_the_patch_stops_a_window_at_its_first_sde_step(runs):
    failed = runs(tree="without", steps=1, extra=("--sde_window_size", "2"))
    assert not hasattr(failed, "run_dir"), "the tree without sde-window ran a window it does not sample"
    assert "--sde_window_size 2: this trainer sampled every step as an SDE step" in str(failed)
    assert "the sde-window patch is not in this tree" in str(failed)


def test_without_a_window_every_step_is_an_sde_step_and_upstreams_count_is_trained(runs):
    """The off run's records: every step's noise and log-prob, T = int(3 * 0.6) = 1 trained a sample."""
    from safetensors.torch import load_file

    t = load_file(runs.flux_recorded() / "records" / "step_000001" / "rank_0.safetensors")
    assert t["train.log_prob"].shape[1] == 1 and t["noise.sde"].shape[1] == 4 and (t["log_probs"] != 0).all()
