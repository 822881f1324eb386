"""``dancegrpo-npu smoke`` - and, through it, the whole port on this machine's device.

The slow tests run the patched stock trainers (full and LoRA, 1 and 2 processes) through
``launch`` on the fixtures, in strict mode; they need the real upstream (``patched_tree``)
and are skipped with "upstream unavailable: ..." without it.  The others test the
smoke's own checks on hand-made inputs.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from tiny_fixtures import built  # noqa: F401  (a fixture)

from dancegrpo_npu.smoke import command as smoke
from dancegrpo_npu.errors import DancegrpoError

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
    steps = smoke.read_metrics(tmp_path)
    assert [s.step for s in steps] == [1, 2] and steps[1].loss == -0.5


@pytest.mark.parametrize("rows, message", [
    ([row(1)], r"has steps \[1\], expected 1..2"),
    ([row(1), row(2, loss=math.nan)], "step 2 has non-finite loss"),
    ([row(1, reward_mean=math.inf), row(2)], "step 1 has non-finite reward_mean"),
    ([{"step": 1}], "line 1 is not a metrics record"),
])
def test_read_metrics_refuses(tmp_path, rows, message):
    write_metrics(tmp_path, rows)
    with pytest.raises(DancegrpoError, match=message):
        smoke.read_metrics(tmp_path)


def test_no_metrics_file_points_at_the_logs(tmp_path):
    with pytest.raises(DancegrpoError) as err:
        smoke.read_metrics(tmp_path)
    assert "wrote no" in err.value.message and str(tmp_path / "logs") in err.value.hint


def test_trainer_args_are_upstreams_recipe_shrunk(built):
    args = smoke.trainer_args(built, lora=False)
    value = {a: b for a, b in zip(args, args[1:]) if a.startswith("--") and not b.startswith("--")}
    assert (value["--h"], value["--w"], value["--sampling_steps"], value["--num_generations"]) == ("64", "64", "4", "2")
    assert value["--max_train_steps"] == value["--checkpointing_steps"] == str(smoke.STEPS)
    samples = int(value["--train_batch_size"]) * int(value["--num_generations"])
    assert samples % int(value["--gradient_accumulation_steps"]) == 0
    assert value["--hps_model"].endswith(".json") and "--use_hpsv2" in args and "--lora_rank" not in args
    assert "--lora_rank" in smoke.trainer_args(built, lora=True)


def test_an_unchanged_checkpoint_is_caught(built, tmp_path):
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel.from_pretrained(str(built.model_dir), subfolder="transformer")
    model.save_pretrained(tmp_path / f"checkpoint-{smoke.STEPS}-0")
    check = smoke.check_full_checkpoint(tmp_path, built.model_dir)
    assert (check.changed, check.total) == (0, len(model.state_dict()))
    with torch.no_grad():
        model.proj_out.bias.add_(0.5)
    model.save_pretrained(tmp_path / f"checkpoint-{smoke.STEPS}-0")
    check = smoke.check_full_checkpoint(tmp_path, built.model_dir)
    assert check.changed == 1 and check.max_change == pytest.approx(0.5)


def test_missing_checkpoints_are_reported(built, tmp_path):
    with pytest.raises(DancegrpoError, match="wrote no checkpoint"):
        smoke.check_full_checkpoint(tmp_path, built.model_dir)
    with pytest.raises(DancegrpoError, match="wrote no LoRA checkpoint"):
        smoke.check_lora_checkpoint(tmp_path, built.model_dir)


def test_bad_options_are_refused_before_anything_runs(tmp_path):
    from dancegrpo_npu.project import Project

    project = Project(root=tmp_path, workdir=tmp_path / "nowhere")
    with pytest.raises(DancegrpoError, match="--nproc must be at least 1"):
        smoke.run_smoke(project, smoke.SmokeOptions(nproc=0))
    with pytest.raises(DancegrpoError, match="unknown device 'tpu'"):
        smoke.run_smoke(project, smoke.SmokeOptions(device="tpu"))


def test_format_result(tmp_path):
    result = smoke.SmokeResult(
        run_dir=tmp_path, wall_time_s=12.34,
        steps=(smoke.StepFigures(1, 0.25, -0.001, 0.1, 0.5), smoke.StepFigures(2, 0.5, 0.002, 0.2, 0.25)),
        checkpoint=smoke.CheckpointCheck(tmp_path / "c", "X.from_pretrained", 3, 4, 0.01))
    text = smoke.format_result(result)
    assert "   1     0.2500" in text and "3 of 4 trainable tensors changed" in text
    assert text.splitlines()[-1] == f"smoke: passed in 12.3 s; record: {tmp_path}"


# ---- the real thing: the patched stock trainers ---------------------------------------------


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("nproc, lora", [(1, False), (2, False), (1, True), (2, True)],
                         ids=["full-1proc", "full-2proc", "lora-1proc", "lora-2proc"])
def test_smoke_run(patched_tree, nproc, lora, monkeypatch):
    env = ()
    if (nproc, lora) == (1, False):
        # upstream's scripts disable wandb with WANDB_DISABLED next to WANDB_MODE=online; wandb
        # >= 0.31 ignores the former and, without an API key, fails at once: patch 0012 at work
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
        env = (("WANDB_DISABLED", "true"), ("WANDB_MODE", "online"))
    result = smoke.run_smoke(patched_tree.project, smoke.SmokeOptions(nproc=nproc, lora=lora, device="cpu", env=env))
    assert [s.step for s in result.steps] == [1, 2]
    assert all(math.isfinite(v) for s in result.steps for v in (s.reward_mean, s.loss, s.grad_norm))
    assert result.checkpoint.changed > 0
    assert result.checkpoint.path.name == ("lora-checkpoint-2-0" if lora else "checkpoint-2-0")
    launch_record = json.loads((result.run_dir / "launch.json").read_text())
    env_set = {e["name"]: e["value"] for e in launch_record["env_set"]}
    assert env_set["DANCEGRPO_NPU_STRICT"] == "1" and env_set["DANCEGRPO_DEVICE"] == "cpu"
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["world_size"] == nproc
    # every rank sampled and rewarded its images
    assert sorted(p.name for p in (result.run_dir / "images").iterdir()) == [
        f"flux_{rank}_{i}.png" for rank in range(nproc) for i in range(2)]
    assert len((result.run_dir / "reward.txt").read_text().split()) == 2


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


def test_if_needed_reuses_only_a_pass_on_identical_inputs(patched_tree, tmp_path):
    """bootstrap.sh's rerun skips the smoke only for the same tree, series, overlay, fixtures and options."""
    project = patched_tree.project
    opts = smoke.SmokeOptions(device="cpu")
    key = smoke.inputs_sha256(project, opts)
    assert key and key == smoke.inputs_sha256(project, opts)
    assert key != smoke.inputs_sha256(project, smoke.SmokeOptions(device="cpu", lora=True))
    cache = project.overlay_dir / "fastvideo" / "__pycache__"  # what importing overlay/ leaves
    cache.mkdir()
    try:
        (cache / "device.cpython-311.pyc").write_bytes(b"\0")
        assert smoke.inputs_sha256(project, opts) == key  # byte-code is not an input, as for apply
    finally:
        shutil.rmtree(cache)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    passed = project.build_dir / smoke.PASSED_NAME
    try:
        smoke.record_pass(project, key, smoke.SmokeResult(run_dir, (), None, 0.0))
        assert smoke.previous_pass(project, key) == run_dir
        assert smoke.previous_pass(project, "0" * 64) is None
        damaged = json.loads(passed.read_text())
        passed.write_text(json.dumps({**damaged, "0" * 64: 1}))  # a hand-edited record is no traceback
        assert smoke.previous_pass(project, "0" * 64) is None and smoke.previous_pass(project, key) == run_dir
        trainer = patched_tree.tree / "fastvideo" / "train_grpo_flux.py"
        original = trainer.read_bytes()
        try:
            trainer.write_bytes(original + b"# a local edit\n")
            assert smoke.inputs_sha256(project, opts) is None  # not the tree that passed
        finally:
            trainer.write_bytes(original)
        (run_dir / "summary.json").unlink()
        assert smoke.previous_pass(project, key) is None  # the record is gone: run again
    finally:
        passed.unlink(missing_ok=True)


def test_if_needed_remembers_each_set_of_options(patched_tree, tmp_path):
    """A LoRA smoke after the full one must not make bootstrap's full smoke run again."""
    project = patched_tree.project
    keys = [smoke.inputs_sha256(project, smoke.SmokeOptions(device="cpu", lora=lora)) for lora in (False, True)]
    runs = []
    for i, key in enumerate(keys):
        run_dir = tmp_path / f"run{i}"
        run_dir.mkdir()
        (run_dir / "summary.json").write_text("{}")
        runs.append(run_dir)
    try:
        for key, run_dir in zip(keys, runs):
            smoke.record_pass(project, key, smoke.SmokeResult(run_dir, (), None, 0.0))
        assert [smoke.previous_pass(project, k) for k in keys] == runs
    finally:
        (project.build_dir / smoke.PASSED_NAME).unlink(missing_ok=True)
