"""The stall watchdog on the FLUX smoke (2 ranks, gloo): a sleep planted in a rank's seam (the test's
sitecustomize, on the run's PYTHONPATH, wraps one call point of ``dancegrpo_port.hooks``; torchrun
itself never imports it).

- (CI) rank 1 sleeps at the start of step 2, --stall-timeout 10: the run ends within the limit
  plus the grace period, the verdict names rank 1 and the sleeping line, stacks/rank-1.txt shows
  it, summary.json and `runs` say stalled, and the last line is the command that continues it;
- (extended) the same with the issue's --stall-timeout 60;
- (extended) the same with --max-restarts 1, the sleep only in the first attempt: the run
  completes and `compare` against an uninterrupted run (which leaves no stacks) exits 0;
- (extended) a hang inside the checkpoint save of step 2 is named "in checkpoint_save, step 2";
- (extended) steps of 3x the first step's time, with events between: never ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from smoke_runs import assert_resumed_as_uninterrupted, metrics, passed

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.run.watchdog import GRACE_S
from dancegrpo_npu.smoke import runner as smoke

SRC = Path(__file__).resolve().parents[2] / "src"
SMOKE = ("smoke", "--device", "cpu", "--nproc", "2", "--steps", "3", "--checkpointing-steps", "1")

pytestmark = [pytest.mark.slow, pytest.mark.upstream]

PLANT = '''
import importlib.abc, importlib.util, os, sys, time


class Plant(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "dancegrpo_port.hooks":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            call = getattr(module, {event!r})

            def planted(step, *args, **kwargs):
                result = call(step, *args, **kwargs)
                rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
                if {when}:
                    time.sleep({seconds})  # the planted stall
                return result

            setattr(module, {event!r}, planted)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("DANCEGRPO_RUN_DIR"):  # the trainer's ranks
    sys.meta_path.insert(0, Plant())
'''


SLEEP_LINE = next(n for n, text in enumerate(PLANT.splitlines(), 1) if "time.sleep" in text)


def plant(where: Path, event: str, when: str, seconds: float = 3600) -> Path:
    """A sitecustomize in ``where`` that sleeps after the seam's ``event`` (its first argument is
    ``step``) on the ranks and attempts where ``when`` holds."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(PLANT.format(event=event, when=when, seconds=seconds))
    return where


def stalled_by_cli(project, tmp_path: Path, timeout: int):
    """The smoke as the user runs it, rank 1 asleep at step 2's start: (process, its run, seconds
    from the sleep's start to the run's end)."""
    runs = tmp_path / "runs"
    site = plant(tmp_path / "site", "step_begin", "rank == 1 and step == 2")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(site)]), "DANCEGRPO_RUNS": str(runs)}
    proc = subprocess.run([sys.executable, "-m", "dancegrpo_npu", "-C", str(project.root), *SMOKE,
                           "--stall-timeout", str(timeout)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    (run,) = runs.iterdir()
    slept = json.loads((run / "heartbeats" / "rank-1.json").read_text())
    assert (slept["event"], slept["step"]) == ("step_begin", 2)
    end = (run / "summary.json").stat().st_mtime
    return proc, run, end - slept["time"]


def assert_stalled_verdict(project, proc, run: Path, took: float, timeout: int) -> None:
    assert proc.returncode == 1, proc.stderr
    assert timeout <= took <= timeout + GRACE_S, took
    sleeping = 'time.sleep(3600)  # the planted stall'
    line = SLEEP_LINE
    (verdict,) = [line for line in proc.stderr.splitlines() if line.startswith("dancegrpo-npu: stalled: ")]
    assert verdict.startswith("dancegrpo-npu: stalled: ") and "rank 1 (first suspect) in step_begin, step 2, " in verdict
    assert f"sitecustomize.py line {line} in planted: {sleeping}" in verdict
    assert verdict.index("rank 1 (first suspect)") < verdict.index("rank 0 ")
    assert sleeping.split("  #")[0] not in (run / "stacks" / "rank-0.txt").read_text()
    stack = (run / "stacks" / "rank-1.txt").read_text()
    assert f'sitecustomize.py", line {line} in planted' in stack and "most recent call first" in stack
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "stalled" and summary["stalls"][0]["first_suspect"] == 1
    assert summary["failure"]["error"].startswith("rank 1 stalled in step_begin, step 2: no progress for ")
    command = f"dancegrpo-npu -C {project.root} smoke --resume {run.name}"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith(f"run {run.name} stalled; its last complete checkpoint is step 1 "
                         f"({run / 'outputs' / 'resume' / 'step-000001'}); continue it from there with: {command}")
    listing = subprocess.run([sys.executable, "-m", "dancegrpo_npu", "-C", str(project.root), "runs"],
                             env={**os.environ, "PYTHONPATH": str(SRC), "DANCEGRPO_RUNS": str(run.parent)},
                             capture_output=True, text=True)
    assert f"{run.name}  stalled" in listing.stdout
    assert "    stalled: rank 1 stalled in step_begin, step 2" in listing.stdout


def test_a_rank_asleep_at_step_2_is_named_with_its_line_and_the_run_can_be_continued(patched_tree, tmp_path):
    """CI's: --stall-timeout 10 (the issue's 60 runs in the extended tier, the same checks)."""
    proc, run, took = stalled_by_cli(patched_tree.project, tmp_path, 10)
    assert_stalled_verdict(patched_tree.project, proc, run, took, 10)


@pytest.mark.extended
def test_a_rank_asleep_at_step_2_with_a_60_s_limit(patched_tree, tmp_path):
    proc, run, took = stalled_by_cli(patched_tree.project, tmp_path, 60)
    assert_stalled_verdict(patched_tree.project, proc, run, took, 60)


def options(env=(), **kw) -> smoke.SmokeOptions:
    from dancegrpo_npu.run.align_flags import AlignOptions

    return smoke.SmokeOptions(nproc=2, device="cpu", steps=3, checkpointing_steps=1, env=env,
                              align=AlignOptions(rng="cpu", record="all"), **kw)


@pytest.mark.extended
def test_a_stalled_rank_restarts_from_the_last_checkpoint_and_the_run_ends_as_an_uninterrupted_one(
        patched_tree, tmp_path, capsys):
    project = patched_tree.project
    ref = passed(smoke.run_smoke(project, options(stall_timeout=10)))
    assert not [p for p in (ref.run_dir / "stacks").glob("*") if p.stat().st_size] \
        if (ref.run_dir / "stacks").is_dir() else True  # no stall: no stacks
    site = plant(tmp_path / "site", "step_begin", "rank == 1 and step == 2 and attempt == 0")
    restarted = passed(smoke.run_smoke(project, options((("PYTHONPATH", str(site)),), stall_timeout=10,
                                                        max_restarts=1)))
    summary = json.loads((restarted.run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["restarts"] == 1
    assert summary["stalls"][0]["first_suspect"] == 1 and summary["stalls"][0]["ranks"][0]["where"] == "step_begin, step 2"
    capsys.readouterr()
    assert_resumed_as_uninterrupted(project, ref.run_dir, restarted.run_dir, capsys, steps=3)


@pytest.mark.extended
def test_a_hang_inside_a_checkpoint_save_is_named_so(patched_tree, tmp_path):
    site = plant(tmp_path / "site", "checkpoint_save", "rank == 1 and step == 2")
    with pytest.raises(DancegrpoError) as err:
        smoke.run_smoke(patched_tree.project, smoke.SmokeOptions(
            nproc=2, device="cpu", steps=3, checkpointing_steps=1, stall_timeout=10,
            env=(("PYTHONPATH", str(site)),)))
    assert "smoke: the training run stalled (exit 1): rank 1 stalled in checkpoint_save, step 2: " in err.value.message
    assert "time.sleep(3600)" in err.value.message


@pytest.mark.extended
def test_a_slow_but_live_run_is_never_ended(patched_tree, tmp_path):
    """From step 2 each sampling step sleeps 0.8 s after its noise is drawn: steps of 3x the first
    step's time or more, longer than the limit, with events between."""
    site = plant(tmp_path / "site", "sde_noise", "(module.heartbeat.current().step or 0) >= 2", 0.8)
    result = passed(smoke.run_smoke(patched_tree.project, smoke.SmokeOptions(
        nproc=2, device="cpu", steps=3, stall_timeout=2.5, env=(("PYTHONPATH", str(site)),))))
    times = [m["step_time"] for m in metrics(result.run_dir)]
    assert all(t >= 3 * times[0] for t in times[1:]) and all(t > 2.5 for t in times[1:]), times
    assert "stalls" not in json.loads((result.run_dir / "summary.json").read_text())
