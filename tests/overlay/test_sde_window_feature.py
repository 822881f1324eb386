"""The SDE window (overlay/dancegrpo_port/sde_window.py and the contract's check and schedule) on
its own: the flags' one-line refusals, the window of each GRPO step (sliding, then staying at its
end), the seam's sampling step (upstream's SDE call without a window; the ODE form and a log-prob
slot of 0 outside one), the timesteps trained (the window's, in the permutation's order), the
noise source drawing the window's steps only, and the stop of a trainer that does not ask."""

from __future__ import annotations

import argparse

import pytest
from overlay_runner import OVERLAY  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")

from dancegrpo_port import alignment, contract, hooks, sde_window  # noqa: E402

STEPS = 16  # FLUX's recipe: steps 0..14 are trained, never 15


@pytest.fixture(autouse=True)
def no_features(monkeypatch):
    monkeypatch.setattr(hooks, "_FEATURES", [])


def values(**kw) -> dict:
    parser = argparse.ArgumentParser()
    sde_window.add_arguments(parser)
    return {**vars(parser.parse_args([])), "sampling_steps": STEPS, **kw}


# ---------------------------------------------------------------- the flags' check


@pytest.mark.parametrize("given, says", [
    (dict(sde_window_size=-1), "--sde_window_size -1 must be 0 (no window"),
    (dict(sde_window_size=16), "--sde_window_size 16 --sde_window_start 0: the window [0, 16) ends past the last "
                               "trainable step 14 of --sampling_steps 16"),
    (dict(sde_window_size=4, sde_window_start=12), "the window [12, 16) ends past the last trainable step 14"),
    (dict(sde_window_size=4, sde_window_start=-1), "--sde_window_start -1 must be a sampling step"),
    (dict(sde_window_shift_every=2), "--sde_window_shift_every needs --sde_window_size W"),
    (dict(sde_window_stride=1), "--sde_window_stride needs --sde_window_size W"),
    (dict(sde_window_start=3), "--sde_window_start needs --sde_window_size W"),
    (dict(sde_window_size=4, sde_window_stride=2), "--sde_window_stride needs --sde_window_shift_every K"),
    (dict(sde_window_size=4, sde_window_end=8), "--sde_window_end needs --sde_window_shift_every K"),
    (dict(sde_window_size=4, sde_window_shift_every=0), "--sde_window_shift_every 0 must be at least 1"),
    (dict(sde_window_size=4, sde_window_shift_every=1, sde_window_stride=0), "--sde_window_stride 0 must be at least 1"),
    (dict(sde_window_size=4, sde_window_shift_every=1, sde_window_end=15), "--sde_window_end 15 must be a step from "
                                                                           "the starting window's last, 3, to the last "
                                                                           "trainable step 14"),
    (dict(sde_window_size=4, sde_window_shift_every=1, sde_window_end=2), "--sde_window_end 2 must be a step from"),
])  # fmt: skip
def test_a_bad_window_is_refused_in_one_line(given, says):
    args = argparse.Namespace(**values(**given))
    problem = sde_window.argument_problem(args)
    assert problem and says in problem and "\n" not in problem
    assert hooks.argument_problem(argparse.Namespace(**{**vars(args), **UPSTREAM}), environ={}) == problem


# the flags every feature's check reads, as a trainer's parser gives them (no window)
UPSTREAM = dict(seed=42, clip_range=1e-4, num_generations=2, use_group=True, train_batch_size=1, h=32, w=32, t=1,
                init_same_noise=False, eta=0.3, timestep_fraction=0.6, max_train_steps=2, gradient_accumulation_steps=2,
                output_dir=None, checkpointing_steps=None, resume_from_checkpoint=None, rng="device", record=False,
                record_steps=None, record_modules=False, replay=None, sample_batch_size=1, vae_decode_chunk=None,
                profile_steps=None, checkpoints_total_limit=2)


@pytest.mark.parametrize("given", [
    dict(),  # no window: upstream's
    dict(sde_window_size=15),  # every trainable step
    dict(sde_window_size=4, sde_window_start=11),  # the last four trainable steps
    dict(sde_window_size=2, sde_window_shift_every=3, sde_window_stride=2, sde_window_end=9),
])
def test_a_window_that_fits_passes(given):
    assert sde_window.argument_problem(argparse.Namespace(**values(**given))) is None
    assert contract.arguments_problem(values(**given)) is None


def test_the_shared_check_is_the_windows_and_reads_what_a_trainer_without_the_flags_gives():
    assert "the window [0, 20) ends past" in contract.arguments_problem(values(sde_window_size=20))
    assert contract.arguments_problem({"sampling_steps": 16}) is None  # a parser without the flags: no window


# ---------------------------------------------------------------- the schedule


def test_a_window_that_does_not_slide_stays_where_it_starts():
    assert [contract.sde_window(values(sde_window_size=4, sde_window_start=2), n) for n in (0, 1, 2, 50)] == [(2, 6)] * 4
    assert contract.sde_window(values(), 1) is None


def test_with_k_1_and_d_1_step_n_starts_at_s_plus_n_minus_1_until_the_window_ends_at_e():
    window = values(sde_window_size=4, sde_window_start=3, sde_window_shift_every=1, sde_window_stride=1,
                    sde_window_end=10)
    starts = [contract.sde_window(window, n)[0] for n in range(1, 11)]
    assert starts == [3, 4, 5, 6, 7, 7, 7, 7, 7, 7]  # [7, 11) ends at step 10, E: there it stays
    assert contract.sde_window(window, 0) == (3, 7)  # the bench's warm-up step 0: the first step's


def test_every_k_steps_by_d_to_the_last_trainable_step_by_default():
    window = values(sde_window_size=2, sde_window_shift_every=3, sde_window_stride=4)
    assert [contract.sde_window(window, n) for n in (1, 3, 4, 7, 10, 13, 100)] == [
        (0, 2), (0, 2), (4, 6), (8, 10), (12, 14), (13, 15), (13, 15)]  # steps 0..14: it ends at 14


def test_the_fit_resolves_every_default():
    assert contract.sde_window_fit(values()) is None
    assert contract.sde_window_fit(values(sde_window_size=4)) == [4, 0, None, 0, None]
    assert contract.sde_window_fit(values(sde_window_size=4, sde_window_shift_every=2)) == [4, 0, 14, 2, 1]
    given = values(sde_window_size=4, sde_window_start=0, sde_window_shift_every=2, sde_window_stride=1, sde_window_end=14)
    assert contract.sde_window_fit(given) == contract.sde_window_fit(values(sde_window_size=4, sde_window_shift_every=2))


# ---------------------------------------------------------------- the rollout


class FluxStep:
    """A trainer's ``flux_step``: every call recorded; its SDE form's noise from the seam."""

    def __init__(self):
        self.calls = []

    def __call__(self, model_output, latents, eta, sigmas, index, prev_sample, grpo, sde_solver):
        self.calls.append((index, grpo, sde_solver, prev_sample))
        mean = latents + (sigmas[index + 1] - sigmas[index]) * model_output
        if not grpo:
            return mean, latents - sigmas[index] * model_output
        noise = hooks.sde_noise(mean, index)
        return mean + noise, latents, torch.full((latents.shape[0],), float(index + 1))


def sample(step, n=2, steps=6):
    sigmas = torch.linspace(1, 0, steps + 1)
    z = torch.ones(n, 3, 4)
    out = []
    for i in range(steps):
        z, _, log_prob = hooks.sampling_step(step, torch.ones_like(z), z, 0.3, sigmas, i)
        out.append(log_prob)
    return torch.stack(out, dim=1)


def feature(step=1, **given):
    window = sde_window.SdeWindow(values(sampling_steps=6, **given))
    window.step_begin(step)
    return window


def test_without_a_window_every_step_is_upstreams_sde_call():
    step = FluxStep()
    log_probs = sample(step)
    assert step.calls == [(i, True, True, None) for i in range(6)]  # flux_step(..., prev_sample=None, grpo=True, sde_solver=True)
    assert torch.equal(log_probs[0], torch.arange(1.0, 7.0))
    hooks.install([feature()])  # the feature installed, no window asked: the same
    step = FluxStep()
    sample(step)
    assert step.calls == [(i, True, True, None) for i in range(6)]


def test_outside_the_window_the_ode_step_and_a_log_prob_of_0():
    hooks.install([feature(sde_window_size=2, sde_window_start=1)])
    hooks.rollout_batch([0, 1])
    step = FluxStep()
    log_probs = sample(step)
    assert [(i, grpo, solver) for i, grpo, solver, _ in step.calls] == [
        (0, False, False), (1, True, True), (2, True, True), (3, False, False), (4, False, False), (5, False, False)]
    assert torch.equal(log_probs[0], torch.tensor([0.0, 2.0, 3.0, 0.0, 0.0, 0.0]))
    assert log_probs.dtype == torch.float32


def test_a_trainer_that_does_not_ask_stops_at_its_first_sde_step():
    """Without the sde-window patch the trainer calls flux_step's SDE form for every step: the
    first noise it asks for, before the noise source draws, stops it, naming why."""
    hooks.install([feature(sde_window_size=2), alignment.Alignment(noise_run(sde_window_size=2))])
    hooks.step_begin(1)
    hooks.rollout_begin(1, (16, 4, 4), 6, True)
    hooks.rollout_batch([0])
    latents, sigmas = torch.ones(1, 4, 64), torch.linspace(1, 0, 7)

    def upstreams_call():  # the unpatched trainer's: flux_step(..., grpo=True, sde_solver=True)
        return FluxStep()(torch.ones_like(latents), latents, 0.3, sigmas, 0, None, True, True)

    with pytest.raises(RuntimeError, match=r"--sde_window_size 2: this trainer sampled every step as an SDE step "
                                           r"\(its rollout has no SDE window: the sde-window patch is not in this tree\)"):
        upstreams_call()
    hooks.install([feature()])  # without a window nothing is asked, nothing stops
    hooks.rollout_batch([0])
    upstreams_call()


# ---------------------------------------------------------------- the training


def test_the_windows_steps_are_trained_first_in_the_permutations_order():
    perms = torch.tensor([[3, 0, 4, 1, 2], [2, 4, 3, 0, 1]])
    hooks.install([feature(sde_window_size=2, sde_window_start=2)])
    ordered = hooks.trained_order(perms)
    assert ordered.tolist() == [[3, 2, 0, 4, 1], [2, 3, 4, 0, 1]]  # [2, 4)'s steps first, then the rest, each in order
    assert hooks.trained_timesteps(3) == 2  # upstream's int(5 * 0.6) = 3 is not used
    assert sorted(ordered[:, :2].flatten().tolist()) == [2, 2, 3, 3]


def test_without_a_window_the_order_and_the_count_are_upstreams():
    perms = torch.tensor([[3, 0, 4, 1, 2]])
    assert hooks.trained_order(perms) is perms and hooks.trained_timesteps(3) == 3
    hooks.install([feature()])
    assert hooks.trained_order(perms) is perms and hooks.trained_timesteps(3) == 3


def test_the_steps_figures_say_the_window_and_the_timesteps_trained():
    hooks.install([sde_window.SdeWindow(values(sampling_steps=6, sde_window_size=2, sde_window_shift_every=1))])
    hooks.step_begin(1)
    assert hooks.step_end(1) == {"step": 1, "sde_window": [0, 2], "timesteps_trained": 2}
    hooks.step_begin(7)
    assert hooks.step_end(7)["sde_window"] == [3, 5]  # steps 0..4 are trained: it stays at [3, 5)
    hooks.install([feature()])
    hooks.step_begin(1)
    assert hooks.step_end(1) == {"step": 1}  # no window: upstream's line


# ---------------------------------------------------------------- the noise source


def noise_run(rng="cpu", **given) -> alignment.Run:
    args = argparse.Namespace(**{**UPSTREAM, **values(sampling_steps=6, **given), "rng": rng, "seed": 7})
    return alignment.start(args, 0, 1)


def test_cpu_noise_is_drawn_for_the_windows_steps_only():
    run = noise_run(sde_window_size=2, sde_window_start=3)
    hooks.install([alignment.Alignment(run), feature(sde_window_size=2, sde_window_start=3)])
    hooks.step_begin(1)
    hooks.rollout_begin(2, (16, 4, 4), 6, True)
    assert run.noise.sde.shape == (2, 2, 4, 64)  # (samples, W, tokens, 64)
    g = torch.Generator("cpu").manual_seed(7 * 1000)
    shared = torch.randn((1, 16, 4, 4), generator=g)
    drawn = [torch.randn((2, 4, 64), generator=g) for _ in range(2)]  # one (W, tokens, 64) a sample
    assert torch.equal(run.noise.init, shared) and torch.equal(run.noise.sde, torch.stack(drawn))
    hooks.rollout_batch([1])
    assert torch.equal(hooks.sde_noise(torch.zeros(1, 4, 64), 4), drawn[1][1:2])  # step 4: the window's second
    with pytest.raises(RuntimeError, match=r"SDE noise asked for at sampling step 2, outside step 1's SDE window \[3, 5\)"):
        hooks.sde_noise(torch.zeros(1, 4, 64), 2)


def test_device_noise_is_kept_for_the_windows_steps_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(**{**UPSTREAM, **values(sampling_steps=6, sde_window_size=2, sde_window_start=3),
                                 "rng": "device", "seed": 7, "record": True})
    run = alignment.start(args, 0, 1)
    hooks.install([alignment.Alignment(run), feature(sde_window_size=2, sde_window_start=3)])
    hooks.step_begin(1)
    hooks.rollout_begin(1, (16, 4, 4), 6, True)
    hooks.rollout_batch([0])
    drawn = [hooks.sde_noise(torch.zeros(1, 4, 64), i) for i in (3, 4)]
    assert run.noise.sde.shape == (1, 2, 4, 64) and torch.equal(run.noise.sde[0], torch.cat(drawn))
    assert run.recorder.index["sde_window"] == [2, 3, None, 0, None]  # what a replay of it must fit


def test_a_windowed_record_replays_its_noise_and_a_replay_with_another_window_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    given = dict(sde_window_size=2, sde_window_start=3)

    def args(**kw):
        return argparse.Namespace(**{**UPSTREAM, **values(sampling_steps=6, **given), "rng": "cpu", "seed": 7,
                                     "max_train_steps": 1, "init_same_noise": True, **kw})

    def rollout(run):
        hooks.install([alignment.Alignment(run), feature(**given)])
        hooks.step_begin(1)
        hooks.rollout_begin(2, (16, 4, 4), 6, True)
        hooks.rollout_batch([0, 1])
        noise = [hooks.sde_noise(torch.zeros(2, 4, 64), i) for i in (3, 4)]
        hooks.timestep_perms(2, 5)
        hooks.step_end(1)
        return noise

    drawn = rollout(alignment.start(args(record=True), 0, 1))
    assert alignment.argument_problem(args(replay="records"), {}) is None
    problem = alignment.argument_problem(args(replay="records", sde_window_start=2), {})
    assert "does not fit this run: sde_window [2, 3, None, 0, None] (this run: [2, 2, None, 0, None])" in problem
    replayed = rollout(alignment.start(args(replay="records"), 0, 1))
    assert all(torch.equal(a, b) for a, b in zip(replayed, drawn))
