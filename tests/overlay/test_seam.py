"""The seam itself (overlay/dancegrpo_port/hooks.py, feature.py): the Feature base and its events,
the refusal of a feature whose method is no event, the one table of features that the flags,
the checks and run_start read, and the noise source as a feature like the others."""

from __future__ import annotations

import argparse
import re
from contextlib import nullcontext

import pytest
from overlay_runner import OVERLAY  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")

from dancegrpo_port import alignment, feature, hooks  # noqa: E402  (overlay/ is on sys.path)
from dancegrpo_port.feature import Feature, FeatureError, FeatureRow  # noqa: E402


@pytest.fixture(autouse=True)
def no_features(monkeypatch):
    monkeypatch.setattr(hooks, "_FEATURES", [])


def run_args(**kw) -> argparse.Namespace:
    """A trainer's parsed flags: upstream's the features read, and the port's defaults."""
    parser = argparse.ArgumentParser()
    hooks.add_arguments(parser)
    args = parser.parse_args([])
    base = dict(seed=42, clip_range=1e-4, num_generations=2, use_group=True, train_batch_size=1, h=32, w=32, t=1,
                sampling_steps=4, init_same_noise=False, eta=0.3, timestep_fraction=0.6, max_train_steps=2,
                gradient_accumulation_steps=2, output_dir=None, checkpointing_steps=None, resume_from_checkpoint=None)
    return argparse.Namespace(**{**vars(args), **base, **kw})


def test_the_base_has_a_no_op_for_every_event_the_seam_dispatches():
    source = (OVERLAY / "dancegrpo_port" / "hooks.py").read_text()
    kinds = {kind: set(re.findall(rf'\b_{kind}\("(\w+)"', source)) for kind in ("call", "around", "answer")}
    assert kinds["around"] == set(feature.CONTEXTS) and kinds["answer"] == set(feature.ANSWERS)
    dispatched = set().union(*kinds.values()) | set(re.findall(r"feature\.(\w+)\(init_steps", source))  # + checkpoint_load
    assert dispatched == feature.EVENTS
    base = Feature()
    for name in sorted(feature.EVENTS):
        method = getattr(base, name)
        if name in feature.CONTEXTS:
            assert isinstance(method(*[None] * (method.__code__.co_argcount - 1)), nullcontext)
        elif name == "checkpoint_load":
            assert method(7, transformer=None) == 7
        else:
            assert method(*[None] * (method.__code__.co_argcount - 1)) is None


def test_a_feature_whose_method_is_no_event_is_refused_at_install_in_one_line():
    class Typo(Feature):
        def step_ends(self, step, figures):  # step_end, misspelt: the seam would never call it
            pass

    kept = [Feature()]
    hooks.install(kept)
    with pytest.raises(FeatureError) as refused:
        hooks.install([Feature(), Typo()])
    message = str(refused.value)
    assert "\n" not in message and "Typo.step_ends" in message and "_step_ends" in message
    assert hooks.features() == kept  # nothing of the refused list is installed

    class Helper(Feature):  # a private helper and the events themselves are fine
        def step_end(self, step, figures):
            self._count(figures)

        def _count(self, figures):
            figures["n"] = figures.get("n", 0) + 1

    hooks.install([Helper(), Helper()])
    assert hooks.step_end(3) == {"step": 3, "n": 2}

    class NotAFeature:
        def step_end(self, step, figures):
            pass

    with pytest.raises(FeatureError, match=r"NotAFeature is not a dancegrpo_port\.feature\.Feature"):
        hooks.install([NotAFeature()])


def test_run_start_stops_on_a_misspelt_event_in_one_line(monkeypatch, capsys):
    class Misspelt(Feature):
        def rollout_batches(self, batch_idx):
            pass

    row = FeatureRow(name="misspelt", create=lambda context: Misspelt())
    monkeypatch.setattr(hooks, "FEATURES", hooks.FEATURES + (row,))
    with pytest.raises(SystemExit) as stopped:
        hooks.run_start(run_args(), 0, 1, torch.device("cpu"))
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Misspelt.rollout_batches is no event of the seam" in err
    assert hooks.features() == []


def test_every_feature_of_a_run_comes_from_the_table_in_its_order():
    hooks.run_start(run_args(), 0, 1, torch.device("cpu"))
    installed = hooks.features()
    assert len(installed) == len(hooks.FEATURES) == len({row.name for row in hooks.FEATURES})
    assert all(isinstance(f, Feature) for f in installed)
    assert [type(f).__name__ for f in installed] == ["Resume", "ImageFiles", "SdeWindow", "Alignment", "Batching",
                                                      "Profile", "PhaseTimes", "MetricsLog", "WeightDigest", "CleanExit"]
    resume, aligned = installed[0], installed[3]
    assert resume.port_generator is aligned.run.noise.generator  # one alignment run, shared


def test_a_row_added_to_the_table_brings_its_flag_its_check_and_its_feature(monkeypatch):
    class Counter(Feature):
        def __init__(self, every):
            self.every, self.seen = every, []

        def step_begin(self, step):
            self.seen.append(step)

    row = FeatureRow(
        name="counter",
        add_arguments=lambda parser: parser.add_argument("--count_every", type=int, default=1),
        argument_problem=lambda args, environ: "--count_every must be positive" if args.count_every < 1 else None,
        create=lambda context: Counter(context.args.count_every),
    )
    monkeypatch.setattr(hooks, "FEATURES", hooks.FEATURES + (row,))
    assert run_args().count_every == 1  # add_arguments read the table
    assert hooks.argument_problem(run_args(count_every=0), environ={}) == "--count_every must be positive"
    assert hooks.argument_problem(run_args(), environ={}) is None
    hooks.run_start(run_args(count_every=3), 0, 1, torch.device("cpu"))
    counter = hooks.features()[-1]
    assert isinstance(counter, Counter) and counter.every == 3
    hooks.step_begin(5)
    assert counter.seen == [5]


def test_the_noise_source_is_a_feature_not_a_global():
    assert not hasattr(alignment, "RUN")
    args = run_args(rng="cpu", seed=7)
    alignment.start(args, 0, 1)  # a run made but not installed changes no draw
    torch.manual_seed(3)
    upstream = torch.randn((1, 16, 4, 4), dtype=torch.bfloat16)
    torch.manual_seed(3)
    assert torch.equal(hooks.initial_latents((1, 16, 4, 4), "cpu", torch.bfloat16), upstream)

    class Zeros(Feature):  # the first feature that answers is the source
        def initial_latents(self, shape, device, dtype):
            return torch.zeros(shape, dtype=dtype)

    run = alignment.start(args, 0, 1)
    hooks.install([Feature(), Zeros(), alignment.Alignment(run)])
    assert not hooks.initial_latents((1, 16, 4, 4), "cpu", torch.bfloat16).any()
    hooks.install([Feature(), alignment.Alignment(run)])
    hooks.step_begin(1)
    hooks.rollout_begin(1, (16, 4, 4), 4, False)
    hooks.rollout_batch([0])
    expected = torch.randn((1, 16, 4, 4), generator=torch.Generator("cpu").manual_seed(7 * 1000))
    assert torch.equal(hooks.initial_latents((1, 16, 4, 4), "cpu", torch.float32), expected)


def test_the_metrics_log_takes_the_mean_reward_where_the_rewards_are_gathered(tmp_path):
    """The trainers return upstream's (loss, grad norm); the step's mean reward comes to
    metrics.jsonl through rewards_gathered, as upstream takes it (``gathered_reward.mean().item()``),
    in the line's place after the grad norm, on every rank; a step without rewards reports none."""
    import json

    from dancegrpo_port.metrics import MetricsLog

    logs = [MetricsLog(rank, str(tmp_path / f"metrics{rank}.jsonl")) for rank in (0, 1)]
    hooks.install(logs)
    gathered = torch.tensor([0.1, 0.2, 0.7, 0.3], dtype=torch.bfloat16)
    hooks.rewards_gathered(gathered)
    figures = hooks.step_end(1, loss=0.5, grad_norm=0.25, step_time=1.0, lr=1e-3)
    assert list(figures) == ["step", "loss", "grad_norm", "reward_mean", "step_time", "lr"]
    assert figures["reward_mean"] == gathered.mean().item()
    assert [json.loads(line) for line in (tmp_path / "metrics0.jsonl").read_text().splitlines()] == [figures]
    assert not (tmp_path / "metrics1.jsonl").exists()  # rank 0 writes the file
    assert "reward_mean" not in hooks.step_end(2, loss=0.5, grad_norm=0.25)  # no rewards gathered this step


def test_the_seam_names_no_trainer_and_no_features_constant():
    """hooks.py dispatches; what is a trainer's (decoded's image name) each seam passes, and what
    is a feature's comes from its row of the table, never from a default or a fallback of the bus.
    Read from its source: a default that is a trainer's name, or a feature module's CONSTANT used
    outside the table, fails here."""
    import ast
    import inspect

    from dancegrpo_npu import registry
    tree = ast.parse(inspect.getsource(hooks))
    features = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                and node.module == "dancegrpo_port" for alias in node.names}
    assert {"alignment", "phases", "rollout"} <= features
    table = next(n for n in tree.body if isinstance(n, ast.Assign) and [t.id for t in n.targets] == ["FEATURES"])
    in_table = {id(n) for n in ast.walk(table)}
    constants = [f"{n.value.id}.{n.attr}" for n in ast.walk(tree) if id(n) not in in_table
                 and isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in features
                 and n.attr.isupper()]
    assert not constants, f"hooks.py falls back to a feature's constant outside the table: {constants}"
    names = set(registry.names()) | {"flux", "qwenimage", "wan_2_1", "hunyuan", "skyreels", "sd"}
    defaults = [f"{f.name}({a.value!r})" for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                for a in f.args.defaults + [d for d in f.args.kw_defaults if d is not None]
                if isinstance(a, ast.Constant) and a.value in names]
    assert not defaults, f"hooks.py defaults to a trainer's name: {defaults}"
    assert inspect.signature(hooks.decoded).parameters["name"].default is inspect.Parameter.empty


def test_every_answer_event_has_upstreams_draw_from_the_table():
    """Before run_start (no feature installed) each answer event answers as upstream does: the
    rows' upstream_answers cover every one of feature.ANSWERS."""
    sources = [row.upstream_answers for row in hooks.FEATURES if row.upstream_answers is not None]
    assert sources and all(any(callable(getattr(s, event, None)) for s in sources) for event in feature.ANSWERS)
    torch.manual_seed(5)
    upstream = (torch.randn((2, 3)), torch.stack([torch.randperm(4) for _ in range(2)]), torch.randperm(3))
    torch.manual_seed(5)
    drawn = (hooks.initial_latents((2, 3), "cpu", torch.float32), hooks.timestep_perms(2, 4), hooks.selection_order(3, "cpu"))
    assert all(torch.equal(a, b) for a, b in zip(drawn, upstream))
    assert hooks.condition_generator() is None  # upstream's draws on the device
