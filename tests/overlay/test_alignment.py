"""overlay/dancegrpo_port/alignment*.py on their own (no upstream, no training): the noise
source (--rng device|cpu, --replay), the recorder (records/ as the alignment contract
describes it), the argument checks and the GRPO health figures.

``fake_step`` calls the seam (dancegrpo_port/hooks.py) the way the patched trainers do, in
the same order, with made-up stage values, with the alignment feature alone plugged in; the
trainers themselves are run by tests/patches/test_alignment_patches.py.
"""

from __future__ import annotations

import argparse
import json

import pytest
from overlay_runner import OVERLAY  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from dancegrpo_port import alignment, hooks  # noqa: E402  (overlay/ is on sys.path)
from dancegrpo_port import alignment_records as records  # noqa: E402
from dancegrpo_port import upstream_args  # noqa: E402
from dancegrpo_port.alignment_health import Health  # noqa: E402
from dancegrpo_port.contract import HEALTH_KEYS as KEYS  # noqa: E402
from dancegrpo_port.contract import parse_steps  # noqa: E402

H = W = 32  # latents 4x4, tokens 2x2 = 4
TOKENS = (H // 16) * (W // 16)


def make_args(**kw) -> argparse.Namespace:
    base = dict(rng="cpu", seed=42, record=False, record_steps=None, record_modules=False, replay=None,
                clip_range=1e-4, num_generations=2, use_group=True, train_batch_size=2, h=H, w=W, t=1,
                sampling_steps=4, init_same_noise=False, eta=0.3, timestep_fraction=0.6, max_train_steps=2,
                gradient_accumulation_steps=2)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.fixture(autouse=True)
def no_current_run(monkeypatch):
    monkeypatch.setattr(hooks, "_FEATURES", [])


def start(args, rank: int = 0, world_size: int = 1) -> None:
    """The run's alignment feature on the seam, alone (hooks.run_start adds the others)."""
    hooks.install([alignment.Alignment(alignment.start(args, rank, world_size))])


FIGURES: list[dict] = []  # each fake step's figures, as the seam's step_end hands them to metrics.jsonl


def fake_step(step: int, args, rollout_batch: int = 1) -> dict:
    """One GRPO step's calls into the module, in the trainer's order; returns the noise the
    "trainer" got (as the trainer's dtypes: bfloat16 latents, float32 SDE noise)."""
    hooks.step_begin(step)
    B, S = upstream_args.samples_per_step(args), args.sampling_steps
    lh, lw = args.h // 8, args.w // 8
    hooks.rollout_begin(B, (16, lh, lw), S, args.init_same_noise)
    if args.init_same_noise:
        shared = hooks.initial_latents((1, 16, lh, lw), device="cpu", dtype=torch.bfloat16)
    inits, sdes = [], []
    for batch_idx in torch.chunk(torch.arange(B), B // rollout_batch):
        hooks.rollout_batch(batch_idx)
        n = len(batch_idx)
        init = shared if args.init_same_noise else hooks.initial_latents((n, 16, lh, lw), device="cpu",
                                                                        dtype=torch.bfloat16)
        inits.append(init)
        like = torch.zeros(n, TOKENS, 64)
        with hooks.model_call("transformer", torch.nn.Identity()):
            sdes.append(torch.stack([hooks.sde_noise(like, i) for i in range(S)], dim=1))
        hooks.sampled(torch.full((n, S + 1, TOKENS, 64), float(step)), torch.full((n, S), -1.0 * step))
        hooks.decoded([torch.full((args.h, args.w, 3), step, dtype=torch.uint8)] * n, batch_idx, "flux")
    rewards = torch.arange(B, dtype=torch.float32) + step
    hooks.advantages(rewards, rewards - rewards.mean())
    perms = hooks.timestep_perms(B, S - 1)
    T = int((S - 1) * args.timestep_fraction)
    for b in range(B):
        for t in range(T):
            old = torch.tensor([-1.0 * step])
            new = old + (0.0 if b < args.gradient_accumulation_steps else 0.5)
            ratio = torch.exp(new - old)
            hooks.trained_pair(new, old, ratio, (-ratio).mean() / T)
        if (b + 1) % args.gradient_accumulation_steps == 0:
            hooks.update(torch.tensor(0.25 * (b + 1)))
    FIGURES.append(hooks.step_end(step))
    return {"init": torch.cat(inits) if not args.init_same_noise else shared, "sde": torch.cat(sdes), "perms": perms}


# ---------------------------------------------------------------- --rng cpu


def test_cpu_draws_follow_the_documented_order():
    args = make_args(init_same_noise=False)
    start(args, rank=1, world_size=2)
    got = fake_step(1, args)
    g = torch.Generator("cpu").manual_seed(42 * 1000 + 1)
    B, S = 4, 4
    init, sde = [], []
    for _ in range(B):
        init.append(torch.randn((1, 16, 4, 4), generator=g))
        sde.append(torch.randn((S, TOKENS, 64), generator=g))
    perms = torch.stack([torch.randperm(S - 1, generator=g) for _ in range(B)])
    assert torch.equal(got["init"], torch.cat(init).to(torch.bfloat16))
    assert torch.equal(got["sde"], torch.stack(sde))
    assert torch.equal(got["perms"], perms)


def test_cpu_draws_with_init_same_noise_start_with_the_shared_draw():
    args = make_args(init_same_noise=True)
    start(args, rank=0, world_size=1)
    got = fake_step(1, args)
    g = torch.Generator("cpu").manual_seed(42 * 1000)
    shared = torch.randn((1, 16, 4, 4), generator=g)
    first_sde = torch.randn((4, TOKENS, 64), generator=g)
    assert torch.equal(got["init"], shared.to(torch.bfloat16))
    assert torch.equal(got["sde"][0], first_sde)


@pytest.mark.parametrize("same", [False, True])
def test_cpu_draws_are_reproducible_and_independent_of_batching(same):
    runs = []
    for rollout_batch in (1, 2, 4, 1):
        args = make_args(init_same_noise=same)
        start(args, rank=0, world_size=1)
        runs.append([fake_step(step, args, rollout_batch) for step in (1, 2)])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(runs[0][0]["sde"], runs[0][1]["sde"])  # a step's noise is new


def test_cpu_draws_differ_between_ranks_and_seeds():
    def sde(rank, seed):
        args = make_args(seed=seed)
        start(args, rank=rank, world_size=2)
        return fake_step(1, args)["sde"]

    assert torch.equal(sde(0, 42), sde(0, 42))
    assert not torch.equal(sde(0, 42), sde(1, 42))
    assert not torch.equal(sde(0, 42), sde(0, 43))


def test_cpu_draws_leave_the_global_generators_alone():
    torch.manual_seed(7)
    state = torch.get_rng_state()
    args = make_args()
    start(args, rank=0, world_size=1)
    fake_step(1, args)
    assert torch.equal(torch.get_rng_state(), state)


# ---------------------------------------------------------------- --rng device


def upstream_draws(B: int, S: int, same: bool):
    """What upstream's sample_reference_model / flux_step / train_one_step draw, in order."""
    out = []
    if same:
        out.append(torch.randn((1, 16, 4, 4), device="cpu", dtype=torch.bfloat16))
    for _ in range(B):  # rollout batch 1
        if not same:
            out.append(torch.randn((1, 16, 4, 4), device="cpu", dtype=torch.bfloat16))
        like = torch.zeros(1, TOKENS, 64)
        out += [torch.randn_like(like) for _ in range(S)]
    out.append(torch.stack([torch.randperm(S - 1) for _ in range(B)]))
    return out


@pytest.mark.parametrize("same", [False, True])
@pytest.mark.parametrize("record", [False, True])
def test_device_draws_are_upstreams_call_for_call(same, record, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = make_args(rng="device", init_same_noise=same, record=record)
    torch.manual_seed(3)
    want = upstream_draws(4, 4, same)
    after_upstream = torch.get_rng_state()
    torch.manual_seed(3)
    start(args, rank=0, world_size=1)
    got = fake_step(1, args)
    assert torch.equal(torch.get_rng_state(), after_upstream)  # nothing drawn besides
    init = [want[0]] if same else [want[i * 5] for i in range(4)]
    sde = [torch.stack(want[i * 5 + 1: i * 5 + 5], dim=1) for i in range(4)] if not same else \
        [torch.stack(want[1 + i * 4: 5 + i * 4], dim=1) for i in range(4)]
    assert torch.equal(got["init"], torch.cat(init))
    assert torch.equal(got["sde"], torch.cat(sde))
    assert torch.equal(got["perms"], want[-1])


def test_without_start_the_module_draws_as_upstream():
    torch.manual_seed(5)
    want = (torch.randn((1, 16, 4, 4), dtype=torch.bfloat16), torch.randn_like(torch.zeros(2, 3)), torch.randperm(3))
    torch.manual_seed(5)
    got = (hooks.initial_latents((1, 16, 4, 4), "cpu", torch.bfloat16),
           hooks.sde_noise(torch.zeros(2, 3), 0), hooks.timestep_perms(1, 3)[0])
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert not list(__import__("pathlib").Path().glob("records"))


# ---------------------------------------------------------------- records


CONTRACT = {  # name: (shape, dtype) for B=4 samples, S=4, T=int(3 * 0.6)=1, K=2 optimizer steps
    "noise.init": ((4, 16, 4, 4), torch.float32),
    "noise.sde": ((4, 4, TOKENS, 64), torch.float32),
    "noise.perms": ((4, 3), torch.int64),
    "latents": ((4, 5, TOKENS, 64), torch.float32),
    "log_probs": ((4, 4), torch.float32),
    "images": ((4, H, W, 3), torch.uint8),
    "rewards": ((4,), torch.float32),
    "advantages": ((4,), torch.float32),
    "train.log_prob": ((4, 1), torch.float32),
    "train.old_log_prob": ((4, 1), torch.float32),
    "train.ratio": ((4, 1), torch.float32),
    "train.loss": ((4, 1), torch.float32),
    "grad_norm": ((2,), torch.float32),
}


@pytest.mark.parametrize("rng", ["device", "cpu"])
def test_the_recorder_writes_the_contracts_names_shapes_and_dtypes(rng, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = make_args(rng=rng, record=True, record_steps="2")
    start(args, rank=0, world_size=1)
    fake_step(1, args)
    got = fake_step(2, args)
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == ["index.json", "step_000002"]
    tensors = load_file(tmp_path / "records" / "step_000002" / "rank_0.safetensors")
    assert {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()} == CONTRACT
    assert torch.equal(tensors["noise.sde"], got["sde"]) and torch.equal(tensors["noise.perms"], got["perms"])
    assert torch.equal(tensors["noise.init"].to(torch.bfloat16), got["init"])
    assert torch.equal(tensors["grad_norm"], torch.tensor([0.5, 1.0]))
    assert torch.equal(tensors["rewards"], torch.arange(4.0) + 2) and tensors["images"].max() == 2
    index = json.loads((tmp_path / "records" / "index.json").read_text())
    assert index == {"format": 1, "script": index["script"], "world_size": 1, "rng": rng, "seed": 42, "h": H, "w": W,
                     "t": 1, "num_generations": 2, "sampling_steps": 4, "init_same_noise": False, "eta": 0.3,
                     "clip_range": 1e-4, "timestep_fraction": 0.6, "sde_window": None, "replayed_from": None,
                     "steps": [2], "modules": False}


def test_cpu_noise_is_recorded_as_drawn_in_float32(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = make_args(record=True, init_same_noise=True)
    start(args, rank=0, world_size=1)
    fake_step(1, args)
    g = torch.Generator("cpu").manual_seed(42 * 1000)
    recorded = load_file(tmp_path / "records" / "step_000001" / "rank_0.safetensors")["noise.init"]
    assert torch.equal(recorded, torch.randn((1, 16, 4, 4), generator=g))  # not rounded to bfloat16


@pytest.mark.parametrize("rng", ["device", "cpu"])
@pytest.mark.parametrize("same", [False, True])
def test_replay_hands_out_the_recorded_noise_and_records_the_same(rng, same, tmp_path, monkeypatch):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    torch.manual_seed(11)
    args = make_args(rng=rng, record=True, init_same_noise=same)
    start(args, rank=0, world_size=1)
    source = [fake_step(step, args) for step in (1, 2)]
    monkeypatch.chdir(tmp_path / "b")
    torch.manual_seed(12)  # another global state: replay must not draw
    args = make_args(rng=rng, record=True, init_same_noise=same, replay=str(tmp_path / "a" / "records"))
    assert alignment.argument_problem(args, {"WORLD_SIZE": "1", "RANK": "0"}) is None
    start(args, rank=0, world_size=1)
    replayed = [fake_step(step, args, rollout_batch=2) for step in (1, 2)]
    for a, b in zip(source, replayed):
        assert all(torch.equal(a[k], b[k]) for k in a)
    for step in ("step_000001", "step_000002"):
        ta = load_file(tmp_path / "a" / "records" / step / "rank_0.safetensors")
        tb = load_file(tmp_path / "b" / "records" / step / "rank_0.safetensors")
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    index = json.loads((tmp_path / "b" / "records" / "index.json").read_text())
    assert index["replayed_from"] == str(tmp_path / "a" / "records")


# ------------------------------------------- best-of-n's order and a conditioning's draws


def video_step(step: int, args, keep: int = 2) -> dict:
    """A step as the HunyuanVideo and SkyReels-I2V seams call it: the rollout's noise, the first
    frame's draws on condition_generator(), best-of-n's order of the ``keep`` kept, then the
    kept samples' timestep permutations."""
    hooks.step_begin(step)
    B, S = upstream_args.samples_per_step(args), args.sampling_steps
    hooks.rollout_begin(B, (16, 4, 4), S, False)
    hooks.rollout_batch(torch.arange(B))
    init = hooks.initial_latents((B, 16, 4, 4), device="cpu", dtype=torch.bfloat16)
    frame = torch.randn((1, 16, 4, 4), generator=hooks.condition_generator())  # as diffusers' randn_tensor
    hooks.advantages(torch.arange(B, dtype=torch.float32), torch.zeros(B))
    order = hooks.selection_order(keep, "cpu")
    perms = hooks.timestep_perms(keep, S - 1)
    hooks.step_end(step)
    return {"init": init, "frame": frame, "order": order, "perms": perms}


def test_cpu_draws_a_first_frame_and_best_of_n_order_after_the_rollouts_noise():
    args = make_args()
    torch.manual_seed(7)
    state = torch.get_rng_state()
    start(args, rank=1, world_size=2)
    got = video_step(1, args, keep=3)
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is not drawn from
    g = torch.Generator("cpu").manual_seed(42 * 1000 + 1)
    for _ in range(4):
        torch.randn((1, 16, 4, 4), generator=g), torch.randn((4, TOKENS, 64), generator=g)
    assert torch.equal(got["frame"], torch.randn((1, 16, 4, 4), generator=g))
    assert torch.equal(got["order"], torch.randperm(3, generator=g))
    assert torch.equal(got["perms"], torch.stack([torch.randperm(3, generator=g) for _ in range(3)]))


def test_device_draws_best_of_n_order_and_first_frame_as_upstream():
    args = make_args(rng="device")
    start(args, rank=0, world_size=1)
    assert hooks.condition_generator() is None  # diffusers then draws on the device, as upstream
    torch.manual_seed(3)
    got = video_step(1, args)
    torch.manual_seed(3)
    init = torch.randn((4, 16, 4, 4), dtype=torch.bfloat16)
    frame = torch.randn((1, 16, 4, 4))
    order = torch.randperm(2, device="cpu")
    assert torch.equal(got["init"], init) and torch.equal(got["frame"], frame) and torch.equal(got["order"], order)
    hooks.install([])
    assert hooks.condition_generator() is None  # without a run: upstream's


def test_best_of_n_order_is_recorded_and_replayed(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    args = make_args(rng="cpu", record=True)
    start(args, rank=0, world_size=1)
    source = video_step(1, args, keep=2)
    tensors = load_file(tmp_path / "a" / "records" / "step_000001" / "rank_0.safetensors")
    assert torch.equal(tensors["noise.order"], source["order"]) and tensors["noise.order"].dtype == torch.int64
    monkeypatch.chdir(tmp_path / "b")
    args = make_args(rng="cpu", record=True, replay=str(tmp_path / "a" / "records"))
    start(args, rank=0, world_size=1)
    replayed = video_step(1, args, keep=2)
    assert torch.equal(replayed["order"], source["order"]) and torch.equal(replayed["perms"], source["perms"])
    # a record without best-of-n (the image trainers') cannot drive one: said, not guessed
    monkeypatch.chdir(tmp_path / "a")
    args = make_args(rng="cpu", record=True, record_steps="2")
    start(args, rank=0, world_size=1)
    fake_step(1, args), fake_step(2, args)
    args = make_args(rng="cpu", replay=str(tmp_path / "a" / "records"))
    start(args, rank=0, world_size=1)
    hooks.step_begin(2)
    with pytest.raises(RuntimeError, match="step 2 has no noise.order"):
        hooks.selection_order(2, "cpu")


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("spec, steps", [
    (None, None), ("all", None), ("3", {3}), ("1-3,7", {1, 2, 3, 7}), (" 2 - 4 , 4", {2, 3, 4}), ("5-5", {5}),
])
def test_record_steps(spec, steps):
    assert parse_steps(spec, "--record_steps") == (None if steps is None else frozenset(steps))


@pytest.mark.parametrize("spec, message", [
    ("", "'' is not understood"), ("1,,2", "'' is not understood"), ("a-3", "'a-3' is not understood"),
    ("0-2", "'0-2' is not a step or an increasing range of steps counted from 1"),
    ("5-2", "'5-2' is not a step or an increasing range"), ("-1", "'-1' is not understood"),
    ("1.5", "'1.5' is not understood"),
])
def test_record_steps_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_steps(spec, "--record_steps")


def test_format_steps():
    assert records.format_steps([5, 1, 2, 3, 9, 10]) == "1-3,5,9-10" and records.format_steps([]) == ""


@pytest.mark.parametrize("kw, message", [
    (dict(rng="gpu"), "--rng 'gpu' is not one of device, cpu"),
    (dict(rng="cpu", seed=None), "--rng cpu needs --seed"),
    (dict(record_modules=True), "--record_modules needs --record"),
    (dict(record_steps="1-2"), "--record_steps needs --record"),
    (dict(record=True, record_steps="x"), "--record_steps 'x': 'x' is not understood; give a step N, a range A-B"),
    (dict(replay="/nowhere/records"), "--replay /nowhere/records: no index.json there"),
])
def test_bad_arguments_are_one_line(kw, message):
    problem = alignment.argument_problem(make_args(**kw), {})
    assert problem.startswith(message) and "\n" not in problem


def test_good_arguments_pass():
    assert alignment.argument_problem(make_args(rng="device", seed=None), {}) is None
    assert alignment.argument_problem(make_args(record=True, record_steps="1-3", record_modules=True), {}) is None


def test_check_args_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        hooks.check_arguments(make_args(rng="cpu", seed=None))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: --rng cpu needs --seed" in err


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A records/ of 2 steps at make_args()' settings, world size 1."""
    monkeypatch.chdir(tmp_path)
    args = make_args(record=True)
    start(args, rank=0, world_size=1)
    for step in (1, 2):
        fake_step(step, args)
    return tmp_path / "records"


@pytest.mark.parametrize("kw, env, message", [
    (dict(h=64), {}, "does not fit this run: h 32 (this run: 64)"),
    (dict(h=64, w=64, num_generations=4), {}, "h 32 (this run: 64), w 32 (this run: 64), num_generations 2 (this run: 4)"),
    (dict(sampling_steps=8), {}, "sampling_steps 4 (this run: 8)"),
    (dict(init_same_noise=True), {}, "init_same_noise False (this run: True)"),
    (dict(sde_window_size=2), {}, "sde_window None (this run: [2, 0, None, 0, None])"),  # recorded without one
    (dict(), {"WORLD_SIZE": "2"}, "world_size 1 (this run: 2)"),
    (dict(max_train_steps=5), {}, "step(s) 3-5 of this run were not recorded (recorded: 1-2)"),
    (dict(train_batch_size=1), {}, "noise.init of step 1 is (4, 16, 4, 4), this run needs (2, '...')"),
])
def test_replay_misfit_is_named(recorded, kw, env, message):
    problem = alignment.argument_problem(make_args(replay=str(recorded), **kw), env)
    assert message in problem and "\n" not in problem


def test_replay_of_a_damaged_record(recorded):
    (recorded / "step_000002" / "rank_0.safetensors").write_bytes(b"not safetensors")
    problem = alignment.argument_problem(make_args(replay=str(recorded)), {})
    assert problem.startswith(f"--replay {recorded}: cannot read {recorded / 'step_000002' / 'rank_0.safetensors'}")
    (recorded / "index.json").write_text("{")
    assert "cannot read index.json" in alignment.argument_problem(make_args(replay=str(recorded)), {})


def test_replay_fits(recorded):
    assert alignment.argument_problem(make_args(replay=str(recorded)), {"WORLD_SIZE": "1", "RANK": "0"}) is None


# ---------------------------------------------------------------- module records


class Block(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.lin, self.act = torch.nn.Linear(3, 3), act

    def forward(self, x):
        return self.act(self.lin(x)), x


class Wrapper(torch.nn.Module):  # named like FSDP's
    def __init__(self, inner):
        super().__init__()
        self._fsdp_wrapped_module = inner

    def forward(self, x):
        return self._fsdp_wrapped_module(x)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        act = torch.nn.SiLU()  # one module in two blocks, as diffusers' resnets share theirs
        self.blocks = torch.nn.ModuleList([Wrapper(Block(act)), Block(act)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)[0]
        return {"out": x}


def test_module_capture_names_order_and_values():
    torch.manual_seed(0)
    model, x = Model(), torch.randn(2, 3)
    wrapped = Wrapper(model)  # the root wrapped too, as FSDP wraps the transformer
    capture = records.ModuleCapture("transformer", wrapped)
    wrapped(x)
    wrapped(x + 1)  # only the first call is kept
    capture.remove()
    assert capture.order == [
        "transformer/blocks.0.lin", "transformer/blocks.0.act", "transformer/blocks.0.0", "transformer/blocks.0.1",
        "transformer/blocks.1.lin", "transformer/blocks.1.act", "transformer/blocks.1.0", "transformer/blocks.1.1",
        "transformer.out"]
    h0 = torch.nn.functional.silu(model.blocks[0]._fsdp_wrapped_module.lin(x))
    h1 = torch.nn.functional.silu(model.blocks[1].lin(h0))
    assert torch.equal(capture.tensors["transformer/blocks.0.act"], h0.detach())
    assert torch.equal(capture.tensors["transformer/blocks.1.act"], h1.detach())
    assert torch.equal(capture.tensors["transformer.out"], h1.detach())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in wrapped.modules())


def test_modules_are_recorded_once_in_step_1(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = make_args(record=True, record_modules=True)
    start(args, rank=0, world_size=1)
    model = Model()
    for step in (1, 2):
        hooks.step_begin(step)
        for _ in range(2):
            with hooks.model_call("transformer", model):
                model(torch.ones(1, 3) * step)
        with hooks.rewarding(model.blocks[1]):
            model.blocks[1](torch.ones(1, 3))
        hooks.step_end(step)
    assert all(not m._forward_hooks for m in model.modules())
    order = json.loads((tmp_path / "records" / "modules" / "rank_0.json").read_text())["order"]
    tensors = load_file(tmp_path / "records" / "modules" / "rank_0.safetensors")
    assert order[-4:] == ["reward/lin", "reward/act", "reward.0", "reward.1"] and set(order) == set(tensors)
    assert all(v.dtype == torch.float32 for v in tensors.values())
    assert torch.equal(tensors["transformer/blocks.0.1"], torch.ones(1, 3))  # step 1's first forward
    assert json.loads((tmp_path / "records" / "index.json").read_text())["modules"] is True


def test_no_module_hooks_without_record_modules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    start(make_args(record=True))
    hooks.step_begin(1)
    model = Model()
    with hooks.model_call("transformer", model):
        assert all(not m._forward_hooks for m in model.modules())


# ---------------------------------------------------------------- GRPO health


def test_health_figures():
    health = Health(clip_range=0.1, group_size=2)
    health.observe("rewards", torch.tensor([1.0, 1.0, 0.0, 2.0]))  # group 0 all equal
    health.observe("advantages", torch.tensor([0.0, 0.0, -0.7, 0.7]))
    old = torch.tensor([-2.0])
    health.pair(old.clone(), old, torch.ones(1))  # before the first update: ratio exactly 1
    health.pair(old + 0.25, old, torch.exp(torch.tensor([0.25])))
    health.stepped()
    health.pair(old - 0.5, old, torch.exp(torch.tensor([-0.5])))
    m = health.metrics()
    assert set(m) == set(KEYS)
    assert m["zero_std_groups"] == 1 and (m["adv_min"], m["adv_max"]) == pytest.approx((-0.7, 0.7))
    assert m["reward_std"] == pytest.approx(torch.tensor([1.0, 1.0, 0.0, 2.0]).std().item())
    assert m["ratio_min"] == pytest.approx(0.60653066) and m["ratio_max"] == pytest.approx(1.28402542)
    assert m["ratio_mean"] == pytest.approx((1 + 1.28402542 + 0.60653066) / 3)
    assert m["clip_frac"] == pytest.approx(2 / 3) and m["clip_frac_first"] == pytest.approx(1 / 2)
    assert m["approx_kl"] == pytest.approx(0.5 * (0.25**2 + 0.5**2) / 3)
    assert m["logprob_diff_max"] == 0.25 and m["logprob_diff_mean"] == pytest.approx(0.125)


def test_health_without_pairs_is_null_and_one_group_without_use_group():
    health = Health(clip_range=0.1, group_size=None)
    health.observe("rewards", torch.tensor([0.5, 0.5, 0.5]))
    m = health.metrics()
    assert m["zero_std_groups"] == 1 and m["reward_std"] == 0.0
    assert all(m[k] is None for k in ("ratio_min", "ratio_mean", "clip_frac", "approx_kl", "logprob_diff_max",
                                      "logprob_diff_mean", "clip_frac_first", "adv_min"))
    health.reset()
    assert health.metrics()["reward_std"] is None


def test_fake_steps_health_matches_what_was_trained():
    args = make_args(rng="cpu")
    start(args, rank=0, world_size=1)
    fake_step(1, args)
    m = FIGURES[-1]
    # samples 0 and 1 before the first update (new == old), samples 2 and 3 after (+0.5)
    assert m["logprob_diff_max"] == 0.0 and m["clip_frac_first"] == 0.0
    assert m["ratio_max"] == pytest.approx(float(torch.exp(torch.tensor(0.5)))) and m["clip_frac"] == 0.5
