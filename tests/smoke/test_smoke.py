"""``dancegrpo-npu smoke`` - and, through it, the whole port on this machine's device.

The slow tests run the patched stock trainers (full and LoRA, 1 and 2 processes) through
``launch`` on the fixtures, in strict mode, and plant faults in copies of the tree (a zeroed
backward, an update that drops its gradient, an exception) that the smoke must refuse; they
need the real upstream (``patched_tree``, ``upstream_source``) and are skipped with "upstream
unavailable: ..." without it.  The others test the smoke's own checks on hand-made inputs.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_fixtures import built  # noqa: F401  (a fixture)

from conftest import copy_project

from dancegrpo_npu import registry
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.smoke import checks, passes
from dancegrpo_npu.smoke import runner as smoke
from dancegrpo_npu.smoke.checks import DecayBudget
from dancegrpo_npu.trainers.flux import smoke as flux

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def write_metrics(run_dir: Path, rows) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def row(step, **kw):
    base = {"step": step, "loss": 0.1, "grad_norm": 0.2, "reward_mean": 0.3, "step_time": 0.5, "lr": 1e-3}
    base.update(kw)
    return base


def test_read_metrics(tmp_path):
    write_metrics(tmp_path, [row(1), row(2, loss=-0.5)])
    steps = smoke.read_metrics(tmp_path, 2)
    assert [s.step for s in steps] == [1, 2] and steps[1].loss == -0.5
    write_metrics(tmp_path, [row(1, loss=0.0)])  # GRPO's loss is 0 at the first inner iteration: fine
    assert smoke.read_metrics(tmp_path, 1)[0].loss == 0.0


@pytest.mark.parametrize("rows, message", [
    ([row(1)], r"has steps \[1\], expected 1..2"),
    ([row(1), row(2, loss=math.nan)], "step 2 has non-finite loss"),
    ([row(1, reward_mean=math.inf), row(2)], "step 1 has non-finite reward_mean"),
    ([{"step": 1}], "line 1 is not a metrics record"),
    ([row(1), row(2), row(3)], r"has steps \[1, 2, 3\], expected 1..2"),
    ([row(1), row(2, grad_norm=0.0)], "training did nothing: the grad norm of step 2 is 0"),
    ([row(1, grad_norm=-0.0), row(2)], "training did nothing: the grad norm of step 1 is -0"),
    ([row(1, reward_std=0.01, adv_min=-1.0, adv_max=1.0), row(2, reward_std=0.0, adv_min=0.0, adv_max=0.0)],
     r"step 2 learned nothing: its rewards are all equal \(reward_std 0"),
    ([row(1, reward_std=0.5, adv_min=0.0, adv_max=0.0, zero_std_groups=2), row(2)],
     r"step 1 learned nothing: every group's rewards are equal \(2 group\(s\) of std 0\)"),
])
def test_read_metrics_refuses(tmp_path, rows, message):
    write_metrics(tmp_path, rows)
    with pytest.raises(DancegrpoError, match=message) as err:
        smoke.read_metrics(tmp_path, 2)
    if "did nothing" in message:
        assert "no gradient reached the trainable weights" in err.value.hint
    if "learned nothing" in message:
        assert "GRPO learns from the differences between a group's rewards" in err.value.hint


def test_one_step_of_equal_rewards_is_the_tiny_reward_saturating_not_a_constant_reward(tmp_path):
    """A reward that told the other steps' samples apart is not constant: the message says that
    the tiny reward saturated at that step; only when every step's rewards are equal is the reward
    model blamed."""
    told_apart = dict(reward_std=0.02, adv_min=-0.7, adv_max=0.7)
    equal = dict(reward_std=0.0, adv_min=0.0, adv_max=0.0)
    write_metrics(tmp_path, [row(1, **told_apart), row(2, **told_apart), row(3, **equal),
                             row(4, **dict(told_apart, reward_std=0.5))])
    with pytest.raises(DancegrpoError) as err:
        smoke.read_metrics(tmp_path, 4)
    assert err.value.message.startswith("smoke: step 3 learned nothing: its rewards are all equal (reward_std 0")
    assert err.value.message.endswith("the tiny reward saturated there: it told the samples apart at steps 1, 2 "
                                      "and 4 (reward_std up to 0.5) and scored this step's alike")
    assert "broken reward model" not in err.value.one_line() and "tiny reward of random weights" in err.value.hint
    write_metrics(tmp_path, [row(1, **equal), row(2, **equal)])
    with pytest.raises(DancegrpoError) as err:
        smoke.read_metrics(tmp_path, 2)
    assert "saturated" not in err.value.message and "a constant or broken reward model" in err.value.hint


def test_no_metrics_file_points_at_the_logs(tmp_path):
    with pytest.raises(DancegrpoError) as err:
        smoke.read_metrics(tmp_path, 2)
    assert "wrote no" in err.value.message and str(tmp_path / "logs") in err.value.hint


def test_trainer_args_are_upstreams_recipe_shrunk(built):
    args = flux.trainer_args(built, lora=False)
    value = {a: b for a, b in zip(args, args[1:]) if a.startswith("--") and not b.startswith("--")}
    assert (value["--h"], value["--w"], value["--sampling_steps"], value["--num_generations"]) == ("64", "64", "4", "2")
    assert value["--max_train_steps"] == value["--checkpointing_steps"] == str(smoke.STEPS) == "2"
    assert value["--gradient_accumulation_steps"] == "2"  # the default before --generations existed
    samples = int(value["--train_batch_size"]) * int(value["--num_generations"])
    assert samples % int(value["--gradient_accumulation_steps"]) == 0
    assert value["--hps_model"].endswith(".json") and "--use_hpsv2" in args and "--lora_rank" not in args
    assert "--lora_rank" in flux.trainer_args(built, lora=True)


@pytest.mark.parametrize("steps, generations", [(1, 2), (3, 4), (5, 3)])
def test_steps_and_generations_set_the_run(built, steps, generations):
    value = smoke.flag_values(flux.trainer_args(built, lora=False, steps=steps, generations=generations))
    assert value["--max_train_steps"] == value["--checkpointing_steps"] == str(steps)
    assert value["--num_generations"] == value["--gradient_accumulation_steps"] == str(generations)
    # one optimizer update a step, on the whole group (the seam refuses a remainder)
    budget = checks.decay_budget(flux.trainer_args(built, lora=False, steps=steps, generations=generations), steps)
    assert budget == DecayBudget(1e-3, 1e-4, steps - 1)


def test_arguments_after_the_smokes_own_win(built):
    options = smoke.SmokeOptions(extra_args=("--learning_rate", "5e-4", "--weight_decay=0.01", "--h", "128"))
    args = smoke.trainer_arguments(None, built, options, registry.get("flux"))
    assert args[-5:] == options.extra_args
    value = smoke.flag_values(args)
    assert (value["--learning_rate"], value["--weight_decay"], value["--h"]) == ("5e-4", "0.01", "128")
    assert checks.decay_budget(args, 2) == DecayBudget(5e-4, 0.01, 1)
    options = smoke.SmokeOptions(extra_args=("--gradient_accumulation_steps", "1"))
    assert checks.decay_budget(smoke.trainer_arguments(None, built, options, registry.get("flux")),
                               3).updates == 4  # 2 updates a step


def _decayed(state: dict, budget: DecayBudget) -> dict:
    """Exactly what torch's AdamW does to weights whose gradients are zero: weight decay only."""
    params = {k: torch.nn.Parameter(v.clone()) for k, v in state.items()}
    opt = torch.optim.AdamW(params.values(), lr=budget.learning_rate, weight_decay=budget.weight_decay)
    for _ in range(budget.updates):
        for p in params.values():
            p.grad = torch.zeros_like(p)
        opt.step()
    return {k: p.detach() for k, p in params.items()}


def test_a_change_weight_decay_explains_is_no_training(built, tmp_path):
    """A zeroed-gradient run: "66 of 66 tensors changed (max 1.19e-07)" was decay."""
    from diffusers import FluxTransformer2DModel

    budget = DecayBudget(1e-3, 1e-4, 3)
    model = FluxTransformer2DModel.from_pretrained(str(built.model_dir), subfolder="transformer")
    start = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(_decayed(start, budget))
    model.save_pretrained(tmp_path / "checkpoint-4-0")
    check = checks.check_full_checkpoint(tmp_path, built.model_dir, 4, budget, "FluxTransformer2DModel")
    decayed = sum(not torch.equal(v, model.state_dict()[k]) for k, v in start.items())
    assert decayed > 0 and 0 < check.max_change <= check.decay_max  # decay did change weights...
    assert (check.changed, check.total) == (0, len(start))  # ...but no tensor moved beyond it
    with pytest.raises(DancegrpoError, match="training did nothing: none of the .* beyond what AdamW's weight decay"):
        checks.check_training_moved(check)
    with torch.no_grad():  # one Adam step of a real gradient: about lr on each element
        model.proj_out.bias.sub_(budget.learning_rate)
    model.save_pretrained(tmp_path / "checkpoint-4-0")
    check = checks.check_full_checkpoint(tmp_path, built.model_dir, 4, budget, "FluxTransformer2DModel")
    assert check.changed == 1
    checks.check_training_moved(check)


def test_an_unchanged_checkpoint_is_caught(built, tmp_path):
    from diffusers import FluxTransformer2DModel

    budget = DecayBudget(1e-3, 1e-4, 1)
    model = FluxTransformer2DModel.from_pretrained(str(built.model_dir), subfolder="transformer")
    model.save_pretrained(tmp_path / "checkpoint-2-0")
    check = checks.check_full_checkpoint(tmp_path, built.model_dir, 2, budget, "FluxTransformer2DModel")
    assert (check.changed, check.total) == (0, len(model.state_dict()))
    with pytest.raises(DancegrpoError, match="training did nothing"):
        checks.check_training_moved(check)
    with torch.no_grad():
        model.proj_out.bias.add_(0.5)
    model.save_pretrained(tmp_path / "checkpoint-2-0")
    check = checks.check_full_checkpoint(tmp_path, built.model_dir, 2, budget, "FluxTransformer2DModel")
    assert check.changed == 1 and check.max_change == pytest.approx(0.5)


def test_a_checkpoint_saved_before_any_update_must_hold_the_start(built, tmp_path):
    """--steps 1: checkpoint-1-0 is saved at the start of step 1, before the only update."""
    from diffusers import FluxTransformer2DModel

    none = DecayBudget(1e-3, 1e-4, 0)
    model = FluxTransformer2DModel.from_pretrained(str(built.model_dir), subfolder="transformer")
    model.save_pretrained(tmp_path / "checkpoint-1-0")
    check = checks.check_full_checkpoint(tmp_path, built.model_dir, 1, none, "FluxTransformer2DModel")
    assert (check.changed, check.updates, check.decay_max) == (0, 0, 0.0)
    checks.check_training_moved(check)  # passes: nothing could have moved yet
    with torch.no_grad():
        model.proj_out.bias.add_(1e-6)
    model.save_pretrained(tmp_path / "checkpoint-1-0")
    with pytest.raises(DancegrpoError, match="saved before any update, yet 1 of"):
        checks.check_training_moved(checks.check_full_checkpoint(tmp_path, built.model_dir, 1, none,
                                                                 "FluxTransformer2DModel"))


def test_a_lora_checkpoint_is_read_with_the_hub_offline(built, tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 (an air-gapped host) is read by diffusers at import: patched where it
    is read.  A checkpoint saved as upstream saves one loads, and its lora_B moved."""
    import diffusers.loaders.lora_base as lora_base
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from peft import LoraConfig, get_peft_model_state_dict

    transformer = FluxTransformer2DModel.from_pretrained(str(built.model_dir), subfolder="transformer")
    transformer.add_adapter(LoraConfig(r=4, lora_alpha=8, init_lora_weights=True,
                                       target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
    with torch.no_grad():
        for name, parameter in transformer.named_parameters():
            if ".lora_B." in name:
                parameter.add_(0.5)
    FluxPipeline.save_lora_weights(tmp_path / "lora-checkpoint-2-0",
                                   transformer_lora_layers=get_peft_model_state_dict(transformer))
    monkeypatch.setattr(lora_base, "HF_HUB_OFFLINE", True)
    check = flux.check_lora_checkpoint(tmp_path, built.model_dir, 2, DecayBudget(1e-3, 1e-4, 1))
    assert check.changed == check.total > 0 and check.max_change == pytest.approx(0.5)


def test_missing_checkpoints_are_reported(built, tmp_path):
    budget = DecayBudget(1e-3, 1e-4, 1)
    with pytest.raises(DancegrpoError, match="wrote no checkpoint .*checkpoint-2-0"):
        checks.check_full_checkpoint(tmp_path, built.model_dir, 2, budget, "FluxTransformer2DModel")
    with pytest.raises(DancegrpoError, match="wrote no LoRA checkpoint .*lora-checkpoint-3-0"):
        flux.check_lora_checkpoint(tmp_path, built.model_dir, 3, budget)


def test_bad_options_are_refused_before_anything_runs(tmp_path):
    from dancegrpo_npu.project import Project

    project = Project(root=tmp_path, workdir=tmp_path / "nowhere")
    with pytest.raises(DancegrpoError, match="--nproc must be at least 1"):
        smoke.run_smoke(project, smoke.SmokeOptions(nproc=0))
    with pytest.raises(DancegrpoError, match="unknown device 'tpu'"):
        smoke.run_smoke(project, smoke.SmokeOptions(device="tpu"))
    refusals = [
        (smoke.SmokeOptions(steps=0), "--steps must be at least 1, not 0"),
        (smoke.SmokeOptions(generations=1), "--generations must be at least 2, not 1"),
        (smoke.SmokeOptions(extra_args=("--max_train_steps", "5")), "--max_train_steps cannot be given after --"),
        (smoke.SmokeOptions(extra_args=("--num_generations=4",)), "--num_generations cannot be given after --"),
        (smoke.SmokeOptions(extra_args=("--checkpointing_steps", "1")), "--checkpointing_steps cannot be given"),
        (smoke.SmokeOptions(extra_args=("--output_dir", "x")), "--output_dir cannot be given after --"),
        (smoke.SmokeOptions(extra_args=("128",)), "script argument '128' is not a --flag"),
    ]
    for options, message in refusals:
        with pytest.raises(DancegrpoError, match=message) as err:
            smoke.run_smoke(project, options)
        assert err.value.exit_code == 2 and "\n" not in err.value.one_line()
    assert not (tmp_path / "build").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("state", ["missing", "edited"])
def test_the_tree_is_checked_before_the_fixtures_are_built(tmp_path, capsys, state):
    from synthetic_upstream import setup

    from dancegrpo_npu.cli import main

    # a project of its own: no tree, or a tree with the trainer that is not lock + series + overlay
    s = setup(tmp_path, files={"fastvideo/train_grpo_flux.py": "print()\n"}, fetch=state == "edited")
    if state == "edited":
        (s.tree / "fastvideo" / "train_grpo_flux.py").write_text("print('edited')\n")
    rc = main(["-C", str(s.project.root), "smoke"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1, err
    assert ("no patched upstream tree at" if state == "missing" else "is not lock + series + overlay") in err
    assert not list(s.project.build_dir.glob("fixtures*")) and not s.project.runs_dir.exists()


def test_the_cli_passes_the_options_and_the_tree(tmp_path, monkeypatch, capsys):
    from dancegrpo_npu.cli import main

    (tmp_path / "upstream.lock").write_text("")
    seen = {}

    def fake_run(project, options, verified=None):
        seen.update(project=project, options=options)
        checkpoint = smoke.CheckpointCheck(tmp_path / "c", "X", 1, 1, 0.001, 1e-7, options.steps - 1)
        return smoke.SmokeResult(tmp_path, (), checkpoint, 1.0)

    monkeypatch.setattr(smoke, "run_smoke", fake_run)
    monkeypatch.setattr(passes, "inputs_sha256", lambda project, options, verified=None: None)
    rc = main(["-C", str(tmp_path), "smoke", "--workdir", str(tmp_path / "other-tree"), "--steps", "3",
               "--generations", "4", "--lora", "--", "--h", "128", "--learning_rate", "5e-4"])
    assert rc == 0
    assert seen["project"].workdir == tmp_path / "other-tree"
    o = seen["options"]
    assert (o.steps, o.generations, o.lora, o.extra_args) == (3, 4, True, ("--h", "128", "--learning_rate", "5e-4"))
    out = capsys.readouterr().out
    assert out.startswith("smoke: LoRA FLUX GRPO, 3 steps at 64x64, 4 sampling steps, 4 generations, ")
    assert f"; tree {tmp_path / 'other-tree'}\n" in out
    assert "smoke: trainer arguments after the smoke's own: --h 128 --learning_rate 5e-4\n" in out
    assert main(["-C", str(tmp_path), "smoke"]) == 0
    assert (seen["options"].steps, seen["options"].generations, seen["options"].extra_args) == (2, 2, ())
    assert seen["project"].workdir == tmp_path / "build" / "DanceGRPO"
    out = capsys.readouterr().out
    assert "2 steps at 64x64, 4 sampling steps, 2 generations," in out
    assert "; 1 process, device " in out  # one, not "1 process(es)"
    assert main(["-C", str(tmp_path), "smoke", "--nproc", "2"]) == 0
    assert "; 2 processes, device " in capsys.readouterr().out
    assert main(["-C", str(tmp_path), "smoke", "--generations", "1"]) == 2
    assert "--generations must be at least 2" in capsys.readouterr().err


def test_format_result(tmp_path):
    result = smoke.SmokeResult(
        run_dir=tmp_path, wall_time_s=12.34,
        steps=(smoke.StepFigures(1, 0.25, -0.001, 0.1, 0.5), smoke.StepFigures(2, 0.5, 0.002, 0.2, 0.25)),
        checkpoint=smoke.CheckpointCheck(tmp_path / "c", "X.from_pretrained", 3, 4, 0.01, 4.4e-7, 1))
    text = smoke.format_result(result)
    assert "   1     0.2500" in text
    assert "3 of 4 trainable tensors changed (max |change| 0.01; weight decay alone: up to 4.4e-07)" in text
    assert text.splitlines()[-1] == f"smoke: passed in 12.3 s; record: {tmp_path}"
    one_step = smoke.SmokeResult(tmp_path, result.steps[:1], smoke.CheckpointCheck(tmp_path / "c", "X", 0, 4, 0.0, 0.0, 0), 1.0)
    assert "it holds the starting weights" in smoke.format_result(one_step)


# ---- the real thing: the patched stock trainers ---------------------------------------------


def shared_smoke(shared_runs, nproc: int, lora: bool) -> smoke.SmokeOptions:
    """The options of each of the four smokes; each run is shared (tests/shared_runs.py) with the
    tests that read other things of it: the 1-process full smoke, as a user runs it, is the
    alignment tests' plain run; the 2-process one carries the clean exit's probe
    (test_clean_exit.py); the 1-process LoRA one records with --rng cpu (the alignment tests'
    LoRA run); the 2-process LoRA one runs with upstream's wandb settings (below)."""
    from shared_runs import probe_env

    from dancegrpo_npu.run.align_flags import AlignOptions

    if not lora:
        return smoke.SmokeOptions(nproc=nproc, device="cpu", env=probe_env(shared_runs) if nproc == 2 else ())
    if nproc == 1:
        return smoke.SmokeOptions(lora=True, device="cpu", align=AlignOptions(rng="cpu", record=True))
    # upstream's scripts disable wandb with WANDB_DISABLED next to WANDB_MODE=online; wandb
    # >= 0.31 ignores the former and, without an API key, fails at once: wandb-disabled.patch at work
    return smoke.SmokeOptions(nproc=2, lora=True, device="cpu", env=(("WANDB_DISABLED", "true"), ("WANDB_MODE", "online")))


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("nproc, lora", [(1, False), (2, False), (1, True), (2, True)],
                         ids=["full-1proc", "full-2proc", "lora-1proc", "lora-2proc"])
def test_smoke_run(patched_tree, shared_runs, nproc, lora, monkeypatch):
    from shared_runs import flux_fixtures
    from smoke_runs import passed

    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # the wandb-disabled run's premise (no key)
    flux_fixtures(shared_runs, patched_tree.project)
    result = passed(shared_runs.smoke(patched_tree.project, shared_smoke(shared_runs, nproc, lora)))
    assert [s.step for s in result.steps] == [1, 2]
    assert all(math.isfinite(v) for s in result.steps for v in (s.reward_mean, s.loss, s.grad_norm))
    assert all(s.grad_norm > 0 for s in result.steps)
    assert result.checkpoint.changed > 0 and result.checkpoint.updates == 1
    assert result.checkpoint.max_change > 100 * result.checkpoint.decay_max  # Adam's steps, not decay
    assert result.checkpoint.path.name == ("lora-checkpoint-2-0" if lora else "checkpoint-2-0")
    launch_record = json.loads((result.run_dir / "launch.json").read_text())
    env_set = {e["name"]: e["value"] for e in launch_record["env_set"]}
    assert env_set["DANCEGRPO_NPU_STRICT"] == "1" and env_set["DANCEGRPO_DEVICE"] == "cpu"
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["world_size"] == nproc
    # the devices the record names were probed by the child that checked the arguments, in the job's
    # environment: no second interpreter before torchrun
    devices = json.loads((result.run_dir / "environment.json").read_text())["devices"]
    assert devices["kind"] == "cpu" and devices["requested"] == "cpu" and "probed_with" in devices
    # every rank sampled and rewarded its images
    assert sorted(p.name for p in (result.run_dir / "images").iterdir()) == [
        f"flux_{rank}_{i}.png" for rank in range(nproc) for i in range(2)]
    assert len((result.run_dir / "reward.txt").read_text().split()) == 2


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("steps, generations, extra", [(1, 2, ()), pytest.param(3, 4, ("--learning_rate", "5e-4"), marks=pytest.mark.extended)],
                         ids=["1-step", "3-steps-4-generations"])
def test_smoke_steps_generations_and_trainer_args(patched_tree, steps, generations, extra):
    options = smoke.SmokeOptions(device="cpu", steps=steps, generations=generations, extra_args=extra)
    result = smoke.run_smoke(patched_tree.project, options)
    assert [s.step for s in result.steps] == list(range(1, steps + 1))
    assert result.checkpoint.path.name == f"checkpoint-{steps}-0"
    # one update a step; checkpoint N holds the weights after step N-1 (1 step: the start)
    assert result.checkpoint.updates == steps - 1
    assert result.checkpoint.changed == (0 if steps == 1 else result.checkpoint.total)
    assert sorted(p.name for p in (result.run_dir / "images").iterdir()) == [f"flux_0_{i}.png" for i in range(generations)]
    script_args = json.loads((result.run_dir / "launch.json").read_text())["script_args"]
    assert script_args[-len(extra) - 2:] == [*extra, "--output_dir", str(result.run_dir / "outputs")]


@pytest.mark.slow
@pytest.mark.upstream
def test_a_failing_run_is_one_clear_error(patched_tree, monkeypatch):
    # wandb online without an API key: rank 0 stops at wandb.init, after loading everything
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(DancegrpoError) as err:
        smoke.run_smoke(patched_tree.project, smoke.SmokeOptions(device="cpu", env=(("WANDB_MODE", "online"),)))
    assert err.value.message.startswith("smoke: the training run failed (exit 1): ")
    assert "No API key configured" in err.value.message
    assert err.value.hint.startswith("see ") and "stderr.log" in err.value.hint
    assert "\n" not in err.value.one_line()


# ---- faults planted in a copy of the tree: the smoke must refuse them ------------------------


def planted_project(upstream_source, root: Path, script: str, old: str, new: str):
    """A copy of this project whose series ends with one more patch, replacing ``old`` (found
    exactly once) by ``new`` in ``fastvideo/<script>``: the tree is exactly lock + series +
    overlay, so launch runs it like the real one."""
    from dancegrpo_npu.engine.apply import apply_worktree
    from dancegrpo_npu.engine.fetch import fetch
    from dancegrpo_npu.project import find_project
    from dancegrpo_npu.rebase.export import export_edits

    project = find_project(copy_project(root))
    fetch(project, source=upstream_source)
    apply_worktree(project)
    trainer = project.workdir / "fastvideo" / script
    text = trainer.read_text()
    assert text.count(old) == 1, f"{old!r} is not in {script} exactly once: the plant needs updating"
    trainer.write_text(text.replace(old, new))
    export_edits(project, "planted-fault", "a fault planted by tests/smoke/test_smoke.py")
    return project


BACKWARD = "            loss.backward()\n"
ZERO_BACKWARD = "            (loss * 0).backward()\n"


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.extended)], ids=["full", "lora"])
def test_a_zeroed_backward_fails_the_smoke(upstream_source, shared_runs, tmp_path, lora):
    """With `(loss * 0).backward()` the full smoke once passed on weight decay alone."""
    from shared_runs import flux_fixtures

    script = "train_grpo_flux_lora.py" if lora else "train_grpo_flux.py"
    project = planted_project(upstream_source, tmp_path / "project", script, BACKWARD, ZERO_BACKWARD)
    flux_fixtures(shared_runs, project)  # the test run's one build, not one of its own
    with pytest.raises(DancegrpoError) as err:
        smoke.run_smoke(project, smoke.SmokeOptions(device="cpu", lora=lora))
    assert err.value.message == "smoke: training did nothing: the grad norm of step 1 is 0"
    assert "no gradient reached the trainable weights" in err.value.hint


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.extended  # CI keeps the zeroed backward of the full trainer
def test_an_update_that_drops_its_gradient_fails_the_smoke(upstream_source, tmp_path):
    """The grad norm is computed (and not 0), but the gradient is zeroed before the update:
    AdamW still applies weight decay, so every weight changes a little - and that is all."""
    step = "            optimizer.step()\n"
    dropped = "            optimizer.zero_grad(set_to_none=False)\n" + step
    project = planted_project(upstream_source, tmp_path / "project", "train_grpo_flux.py", step, dropped)
    with pytest.raises(DancegrpoError) as err:
        smoke.run_smoke(project, smoke.SmokeOptions(device="cpu"))
    assert err.value.message.startswith("smoke: training did nothing: none of the 66 trainable tensors in ")
    assert "moved beyond what AdamW's weight decay alone does over 1 update(s)" in err.value.message
    assert err.value.hint.startswith("the grad norm was not 0, so the gradient is computed but the update does not")


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.extended  # CI keeps a failing run's one clear error (wandb)
def test_a_failed_run_reports_its_exception_not_the_progress_bar(upstream_source, tmp_path):
    """The error once was tqdm's "Steps: 0%| | 0/100000", printed after the traceback."""
    raising = '            raise RuntimeError("planted failure")\n'
    project = planted_project(upstream_source, tmp_path / "project", "train_grpo_flux.py", BACKWARD, raising)
    with pytest.raises(DancegrpoError) as err:
        smoke.run_smoke(project, smoke.SmokeOptions(device="cpu"))
    assert err.value.message == "smoke: the training run failed (exit 1): RuntimeError: planted failure"
    assert err.value.hint.endswith("/0/stderr.log")


def test_if_needed_reuses_only_a_pass_on_identical_inputs(patched_tree, tmp_path):
    """bootstrap.sh's rerun skips the smoke only for the same tree, series, overlay, fixtures and options."""
    project = patched_tree.project
    opts = smoke.SmokeOptions(device="cpu")
    key = passes.inputs_sha256(project, opts)
    assert key and key == passes.inputs_sha256(project, opts)
    assert key != passes.inputs_sha256(project, smoke.SmokeOptions(device="cpu", lora=True))
    others = [smoke.SmokeOptions(device="cpu", steps=3), smoke.SmokeOptions(device="cpu", generations=4),
              smoke.SmokeOptions(device="cpu", extra_args=("--h", "128"))]
    assert len({key, *(passes.inputs_sha256(project, o) for o in others)}) == 4
    cache = project.overlay_dir / "dancegrpo_port" / "__pycache__"  # what importing overlay/ leaves
    cache.mkdir(exist_ok=True)
    try:
        (cache / "device.cpython-311.pyc").write_bytes(b"\0")
        assert passes.inputs_sha256(project, opts) == key  # byte-code is not an input, as for apply
    finally:
        shutil.rmtree(cache)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    passed = project.build_dir / passes.PASSED_NAME
    try:
        passes.record_pass(project, key, smoke.SmokeResult(run_dir, (), None, 0.0))
        assert passes.previous_pass(project, key) == run_dir
        assert passes.previous_pass(project, "0" * 64) is None
        damaged = json.loads(passed.read_text())
        passed.write_text(json.dumps({**damaged, "0" * 64: 1}))  # a hand-edited record is no traceback
        assert passes.previous_pass(project, "0" * 64) is None and passes.previous_pass(project, key) == run_dir
        trainer = patched_tree.tree / "fastvideo" / "train_grpo_flux.py"
        original = trainer.read_bytes()
        try:
            trainer.write_bytes(original + b"# a local edit\n")
            assert passes.inputs_sha256(project, opts) is None  # not the tree that passed
        finally:
            trainer.write_bytes(original)
        (run_dir / "summary.json").unlink()
        assert passes.previous_pass(project, key) is None  # the record is gone: run again
    finally:
        passed.unlink(missing_ok=True)


def test_if_needed_remembers_each_set_of_options(patched_tree, tmp_path):
    """A LoRA smoke after the full one must not make bootstrap's full smoke run again."""
    project = patched_tree.project
    keys = [passes.inputs_sha256(project, smoke.SmokeOptions(device="cpu", lora=lora)) for lora in (False, True)]
    runs = []
    for i, key in enumerate(keys):
        run_dir = tmp_path / f"run{i}"
        run_dir.mkdir()
        (run_dir / "summary.json").write_text("{}")
        runs.append(run_dir)
    try:
        for key, run_dir in zip(keys, runs):
            passes.record_pass(project, key, smoke.SmokeResult(run_dir, (), None, 0.0))
        assert [passes.previous_pass(project, k) for k in keys] == runs
    finally:
        (project.build_dir / passes.PASSED_NAME).unlink(missing_ok=True)


def test_no_strict_reaches_the_launch(monkeypatch, tmp_path):
    """--no-strict (for an ablation tree that runs float64 on purpose) turns strict mode off in
    the launch the smoke plans; by default the smoke launches with strict mode on."""
    from dancegrpo_npu.cli import build_parser

    assert build_parser().parse_args(["smoke", "--no-strict"]).no_strict is True
    assert build_parser().parse_args(["smoke"]).no_strict is False
    seen = []
    ended = SimpleNamespace(returncode=0, run_dir=tmp_path)  # a run that ended well: its record, as launch's
    monkeypatch.setattr("dancegrpo_npu.run.launch.launch",
                        lambda project, spec, dry_run=False, verified=None: seen.append(spec) or ended)
    project = SimpleNamespace(runs_dir=tmp_path)  # where the step lines would be read from
    smoke._launch(project, smoke.SmokeOptions(), ())
    smoke._launch(project, smoke.SmokeOptions(strict=False), ())
    assert [spec.strict for spec in seen] == [True, False]
