"""What a smoke run prints: a line a step while the run's own output is hidden, and the
figures of its result explained where they are shown (no training here: the run is stood in for).
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from dancegrpo_npu.smoke import runner
from dancegrpo_npu.smoke.checks import CheckpointCheck, StepFigures


def _metrics_line(step: int) -> bytes:
    return (json.dumps({"step": step, "reward_mean": 0.25 + step / 100, "loss": 0.0, "grad_norm": 0.03,
                        "step_time": 4.5}) + "\n").encode()


def test_a_line_per_step_without_verbose(tmp_path):
    runs = tmp_path / "runs"
    (runs / "20260101-090000-smoke").mkdir(parents=True)  # an older run: not the one watched
    (runs / "20260101-090000-smoke" / "metrics.jsonl").write_bytes(_metrics_line(1))
    out = io.StringIO()
    progress = runner.StepProgress(out, runs, steps=2)
    progress.POLL_S = 0
    with runner._quiet(True, progress):
        import sys

        print("dancegrpo-npu: run directory ...")  # launch's own lines stay hidden
        run = runs / "20260101-100000-smoke"
        run.mkdir()
        sys.stdout.buffer.write(b"[rank0]: the job's output\n")
        (run / "metrics.jsonl").write_bytes(_metrics_line(1) + _metrics_line(2)[:20])  # step 2 half written
        sys.stdout.buffer.write(b"[rank0]: more output\n")
        assert out.getvalue() == "smoke: step 1 of 2 done: reward 0.2600, loss 0, grad norm 0.03, 4.5 s\n"
        (run / "metrics.jsonl").write_bytes(_metrics_line(1) + _metrics_line(2))
    # the last step is shown when the run ends, with no output after it
    assert out.getvalue().splitlines() == [
        "smoke: step 1 of 2 done: reward 0.2600, loss 0, grad norm 0.03, 4.5 s",
        "smoke: step 2 of 2 done: reward 0.2700, loss 0, grad norm 0.03, 4.5 s",
    ]


def _result(loss: float, check: CheckpointCheck, equal_weights=None, why=None) -> runner.SmokeResult:
    steps = tuple(StepFigures(s, 0.25, loss, 0.03, 4.5) for s in (1, 2))
    return runner.SmokeResult(Path("runs/x"), steps, check, 9.0, equal_weights, why)


QWEN_UNCHANGED = tuple(f"transformer_blocks.1.{n}" for n in (
    "attn.add_q_proj.weight", "attn.add_q_proj.bias", "attn.to_add_out.weight", "attn.to_add_out.bias",
    "attn.norm_added_q.weight", "txt_mlp.net.0.proj.weight", "txt_mlp.net.0.proj.bias", "txt_mlp.net.2.weight",
    "txt_mlp.net.2.bias"))


def test_a_loss_of_0_and_tensors_that_did_not_change_are_explained_where_shown():
    check = CheckpointCheck(Path("outputs/checkpoint-2-0"), "QwenImageTransformer2DModel.from_pretrained", 68, 77,
                            1e-3, 1e-7, 2, QWEN_UNCHANGED)
    from dancegrpo_npu.trainers.qwenimage import smoke as qwen

    text = runner.format_result(_result(0.0, check, why=qwen.unchanged_note(check)))
    assert "loss 0 is upstream's GRPO loss by construction" in text and "every ratio is 1" in text
    assert "68 of 77 trainable tensors changed" in text
    assert "the other 9 are block 1's text-stream parts" in text and "no gradient reaches them" in text
    text = runner.format_result(_result(-0.12, check))
    assert "by construction" not in text  # a loss that is not 0 needs no note
    other = CheckpointCheck(Path("c"), "x", 3, 4, 1e-3, 1e-7, 2, ("proj_out.weight",))
    assert "the other 1 moved no further than weight decay alone: proj_out.weight" in runner.format_result(
        _result(0.0, other, why=qwen.unchanged_note(other)))  # not the row's reason: named


def test_one_process_is_not_said_to_hold_the_same_weights_as_the_others(tmp_path, monkeypatch):
    """The equal-weights check compares ranks: with one there is nothing to compare or print, and a
    row that does not check it (no --weights_digest in its arguments) is not checked at two."""
    from dancegrpo_npu import registry
    from dancegrpo_npu.smoke import trained

    calls = []
    monkeypatch.setattr(runner, "_launch", lambda *a: type("R", (), {"run_dir": tmp_path})())
    monkeypatch.setattr(runner, "read_metrics", lambda *a: ())
    monkeypatch.setattr(runner, "check_training_moved", lambda check: None)
    monkeypatch.setattr(trained, "check_equal_weights", lambda run_dir, nproc: calls.append(nproc) or 42)
    checked = CheckpointCheck(Path("c"), "x", 4, 4, 1.0, 0.0, 2)
    for name, nproc, said in (("wan", 1, False), ("wan", 2, True), ("flux", 2, False)):
        spec = registry.get(name)
        hooks = {spec.smoke.fixtures: lambda *a: None, spec.smoke.arguments: lambda *a: (),
                 spec.smoke.checkpoint: lambda *a: checked}
        monkeypatch.setattr(registry, "load", hooks.get)
        result = runner._pipeline(None, runner.SmokeOptions(trainer=name, nproc=nproc, steps=2), spec, {}, 0.0)
        text = runner.format_result(result)
        assert ("every rank holds the same weights" in text) == said, (name, nproc, text)
    assert calls == [2]
    assert not registry.get("flux").smoke.equal_weights and registry.get("wan").smoke.equal_weights


def test_the_unchanged_tensors_named_are_those_qwen_image_gives_no_gradient():
    """The reason printed is the model's: in the smoke's tiny Qwen-Image (2 blocks), a loss on the
    output reaches every parameter but the last block's text-stream parts."""
    from depset_035 import diffusers_035_python

    snippet = (
        "import torch\n"
        "from diffusers import QwenImageTransformer2DModel\n"
        "from dancegrpo_npu.trainers.qwenimage import fixtures as q\n"
        "torch.manual_seed(0)\n"
        "m = QwenImageTransformer2DModel(**q.TRANSFORMER_CONFIG)\n"
        "B, h, w, T = 2, 4, 4, 8\n"
        "out = m(hidden_states=torch.randn(B, h * w, 64), encoder_hidden_states=torch.randn(B, T, 32),\n"
        "        encoder_hidden_states_mask=torch.ones(B, T, dtype=torch.long), timestep=torch.tensor([0.5, 0.5]),\n"
        "        img_shapes=[[(1, h, w)]] * B, txt_seq_lens=[T] * B, return_dict=False)[0]\n"
        "(out ** 2).sum().backward()\n"
        "print(sum(1 for _ in m.parameters()))\n"
        "print(','.join(k for k, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0))\n"
    )
    src = str(Path(runner.__file__).resolve().parents[2])
    r = subprocess.run([diffusers_035_python(), "-c", snippet], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    total, names = r.stdout.strip().splitlines()[-2:]
    assert int(total) == 77 and tuple(names.split(",")) == QWEN_UNCHANGED
    from dancegrpo_npu.trainers.qwenimage import smoke as qwen

    note = qwen.unchanged_note(CheckpointCheck(Path("c"), "x", 68, 77, 1e-3, 1e-7, 2, tuple(names.split(","))))
    assert note.startswith("the other 9 are block 1's text-stream parts")


@pytest.mark.parametrize("group", [[0.1, 0.3, 0.2, 0.9], [0.5, 0.5001, 0.4, 0.2, 0.7, 0.1]])
def test_upstreams_loss_is_0_when_every_ratio_is_1(group):
    """The loss note's arithmetic, as upstream's train_one_step computes it: group-normalised
    advantages, -advantage x ratio (clipped), averaged over the samples' accumulation."""
    import torch

    rewards = torch.tensor(group)
    advantages = torch.clamp((rewards - rewards.mean()) / (rewards.std() + 1e-8), -5.0, 5.0)
    ratio = torch.ones(())
    total = 0.0
    for adv in advantages:
        unclipped, clipped = -adv * ratio, -adv * torch.clamp(ratio, 1 - 1e-4, 1 + 1e-4)
        total += (torch.maximum(unclipped, clipped) / len(group)).item()
    assert abs(total) <= runner.ZERO_LOSS


def test_smoke_help_covers_every_trainer_of_the_registry(monkeypatch, capsys):
    """`smoke --help` lists the registry's smoked trainers, each with its script, reward and the class
    its checkpoint loads with, not FLUX's alone: a row added to the registry is listed too."""
    from dataclasses import replace

    from dancegrpo_npu import registry
    from dancegrpo_npu.cli import main

    hunyuan = registry.get("hunyuan")
    extra = replace(hunyuan, name="tiny-video", smoke=replace(hunyuan.smoke, title="a tiny video GRPO"))
    monkeypatch.setitem(registry.REGISTRY, "tiny-video", extra)
    with pytest.raises(SystemExit) as done:
        main(["smoke", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    description = text[:text.index("positional arguments")]
    for name in registry.smoked():
        spec = registry.get(name)
        assert f"{name} {spec.smoke.title}" in description, name
        assert spec.relpath.rsplit("/", 1)[-1] in description, name
    assert "VideoAlign reward; the checkpoint loads with HunyuanVideoTransformer3DModel" in description
    assert "tiny-video a tiny video GRPO: train_grpo_hunyuan.py" in description
