"""Exact resume in the real trainers (dancegrpo_port/checkpoints.py, resume.py through the seam):
3 GRPO steps at the smoke's settings with --rng cpu --record, a checkpoint after every step,
killed with SIGKILL after step 2, continued from the newest complete checkpoint; the result is the
uninterrupted run's: `compare` exit 0 with no divergence (every stage bit-equal on the CPU), steps
1..3 once each in metrics.jsonl and records/index.json, the same final weights on disk.

- full trainer, 1 rank, through `launch --resume`: the kill falls between the shard writes of step
  3's checkpoint, which leaves step 2 as latest, and step 3's metrics line, written before the
  save, is not there twice; a resume that would change the run is refused in one line;
- full trainer, 2 ranks, --use_ema, through the smoke (`smoke --checkpointing-steps 1`, `smoke
  --resume`): the kill falls once checkpoint 2 is complete; the EMA (upstream's rank-0 EMA
  weights) is the uninterrupted run's too;
- LoRA trainer, 1 rank, `launch --max-restarts 1`: torchrun starts the workers again after the
  kill and they resume on their own; the run record counts the restart.

Each uninterrupted reference run is launched once a test run (tests/shared_runs.py); the cut
runs are the tests' own, since their resumes change them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

pytestmark = [pytest.mark.slow, pytest.mark.upstream]

STEPS = 3
FAULT = "DANCEGRPO_CHECKPOINT_FAULT"


def cli(project, *words: str, capsys) -> tuple[int, str]:
    from dancegrpo_npu.cli import main

    capsys.readouterr()
    rc = main(["-C", str(project.root), *words])
    out = capsys.readouterr()
    return rc, out.out + out.err


def spec(shared_runs, project, lora=False, nproc=1, env=(), max_restarts=0):
    from dancegrpo_npu.run.align_flags import AlignOptions
    from shared_runs import flux_fixtures, flux_spec

    return flux_spec(flux_fixtures(shared_runs, project), nproc=nproc, lora=lora, steps=STEPS, checkpointing_steps=1,
                     env=env, align=AlignOptions(rng="cpu", record=True), max_restarts=max_restarts)


def launch(shared_runs, project, **kw):
    """A run of the test's own (one it cuts or restarts)."""
    from dancegrpo_npu.run.launch import launch as launch_

    return launch_(project, spec(shared_runs, project, **kw))


def reference(shared_runs, project, **kw):
    """The uninterrupted run: shared, read only."""
    record = shared_runs.launch(project, spec(shared_runs, project, **kw))
    assert record.returncode == 0, (record.run_dir / "logs" / "console.log").read_text()[-3000:]
    return record.run_dir


def smoke_options(env=()):
    """2 ranks, --use_ema (1 rank at seed 42 has a step whose group's rewards are equal: no
    gradient, which the smoke refuses)."""
    from dancegrpo_npu.run.align_flags import AlignOptions
    from dancegrpo_npu.smoke.runner import SmokeOptions

    return SmokeOptions(device="cpu", nproc=2, steps=STEPS, checkpointing_steps=1, env=tuple(env),
                        extra_args=("--use_ema",), align=AlignOptions(rng="cpu", record=True))


def steps_once(run_dir: Path) -> None:
    lines = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines == list(range(1, STEPS + 1))
    assert json.loads((run_dir / "records" / "index.json").read_text())["steps"] == list(range(1, STEPS + 1))


def aligned(project, ref: Path, resumed: Path, capsys) -> None:
    """`compare` exit 0, and more than its tolerances: every recorded stage bit-equal."""
    from safetensors.torch import load_file

    rc, out = cli(project, "compare", str(ref), str(resumed), capsys=capsys)
    assert rc == 0 and "first divergence: none" in out and "Traceback" not in out, out
    files = sorted(p.relative_to(ref) for p in (ref / "records").rglob("*.safetensors"))
    assert files and files == sorted(p.relative_to(resumed) for p in (resumed / "records").rglob("*.safetensors"))
    for name in files:
        a, b = load_file(ref / name), load_file(resumed / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def final_state(run_dir: Path, tmp_path: Path) -> dict:
    """The last step's resume checkpoint, read back as one state dict (model and optimizer)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = run_dir / "outputs" / "resume" / f"step-{STEPS:06d}"
    assert (path / "manifest.json").is_file()
    out = tmp_path / f"{run_dir.name}.pt"
    dcp_to_torch_save(str(path), str(out))
    return torch.load(out, weights_only=False)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def same_final_weights(ref: Path, resumed: Path, tmp_path: Path) -> None:
    mine, theirs = final_state(resumed, tmp_path), final_state(ref, tmp_path)
    assert same(mine, theirs) and mine["model"] and mine["optimizer"]["state"]
    # the last step's update is on disk: upstream's checkpoint-3 holds the weights after step 2
    from safetensors.torch import load_file

    (upstream,) = (ref / "outputs").glob(f"checkpoint-{STEPS}-0/diffusion_pytorch_model.safetensors")
    before = load_file(upstream)
    shared = [k for k in mine["model"] if k in before]
    assert shared and any(not torch.equal(before[k], mine["model"][k]) for k in shared)


def test_the_full_trainer_killed_during_a_save_resumes_exactly(patched_tree, shared_runs, capsys, tmp_path):
    project = patched_tree.project
    ref = reference(shared_runs, project)
    cut = launch(shared_runs, project, env=((FAULT, "3"),)).run_dir
    resume = cut / "outputs" / "resume"
    # killed between the shard writes of checkpoint 3: 2 is the newest complete one
    assert sorted(p.name for p in resume.glob("step-*")) == ["step-000001", "step-000002"]
    assert (resume / ".tmp-step-000003").is_dir() and not (resume / ".tmp-step-000003" / "manifest.json").exists()
    assert [json.loads(x)["step"] for x in (cut / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    # what may not change is refused in one line, before anything starts
    rc, out = cli(project, "launch", "--resume", cut.name, "--", "--h", "128", capsys=capsys)
    assert rc == 2 and "would change the run: --h 64 (now 128)" in out and "Traceback" not in out, out
    rc, out = cli(project, "launch", "--resume", cut.name, capsys=capsys)
    assert rc == 0, out
    steps_once(cut)
    aligned(project, ref, cut, capsys)
    same_final_weights(ref, cut, tmp_path)
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["resumes"] == 1 and summary["steps"] == STEPS
    launch_record = json.loads((cut / "launch.json").read_text())
    assert launch_record["resumes"][0]["script_args"][-2:] == ["--resume_from_checkpoint", "latest"]


def test_two_ranks_with_ema_resume_exactly_through_the_smoke(patched_tree, shared_runs, capsys, tmp_path):
    from safetensors.torch import load_file
    from shared_runs import flux_fixtures
    from smoke_runs import passed

    from dancegrpo_npu.errors import DancegrpoError
    from dancegrpo_npu.smoke.runner import run_smoke

    project = patched_tree.project
    flux_fixtures(shared_runs, project)
    ref = passed(shared_runs.smoke(project, smoke_options())).run_dir
    before = set(project.runs_dir.iterdir()) if project.runs_dir.is_dir() else set()
    with pytest.raises(DancegrpoError, match="training run failed"):
        run_smoke(project, smoke_options(env=((FAULT, "2:saved"),)))
    (cut,) = set(project.runs_dir.iterdir()) - before
    assert [json.loads(x)["step"] for x in (cut / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    rc, out = cli(project, "smoke", "--resume", cut.name, capsys=capsys)
    assert rc == 0 and "smoke: passed" in out, out
    steps_once(cut)
    aligned(project, ref, cut, capsys)
    same_final_weights(ref, cut, tmp_path)
    ema = f"checkpoint-ema-{STEPS}-0/diffusion_pytorch_model.safetensors"  # saved at the start of step 3: resumed
    assert same(load_file(cut / "outputs" / ema), load_file(ref / "outputs" / ema)), ema
    # and after step 3's update, made after the resume: the last checkpoint's EMA (rank 0's file)
    last = Path("outputs") / "resume" / f"step-{STEPS:06d}" / "rank_0.pt"
    mine, theirs = (torch.load(run / last, weights_only=False)["ema"] for run in (cut, ref))
    assert mine and same(mine, theirs)
    rc, out = cli(project, "runs", capsys=capsys)
    assert rc == 0 and "resumed 1" in out, out


@pytest.mark.extended  # CI keeps the full trainer killed during a save
def test_the_lora_trainer_restarts_and_resumes_on_its_own(patched_tree, shared_runs, capsys):
    project = patched_tree.project
    ref = reference(shared_runs, project, lora=True)
    restarted = launch(shared_runs, project, lora=True, env=((FAULT, "3"),), max_restarts=1)
    assert restarted.returncode == 0, (restarted.run_dir / "logs" / "console.log").read_text()[-3000:]
    assert restarted.summary["restarts"] == 1 and restarted.summary["resumes"] == 0
    steps_once(restarted.run_dir)
    aligned(project, ref, restarted.run_dir, capsys)
    rc, out = cli(project, "runs", capsys=capsys)
    assert rc == 0 and "restarted 1" in out, out
