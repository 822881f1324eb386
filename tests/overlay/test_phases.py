"""overlay/dancegrpo_port/phases.py: phase times, peak memory, profiler traces of chosen steps."""

from __future__ import annotations

import json
import re
import time

import pytest
from overlay_runner import run_python  # noqa: F401  (puts overlay/ on sys.path; run_python is a fixture)

pytest.importorskip("torch")

from dancegrpo_port import phases  # noqa: E402  (overlay/ is on sys.path, see overlay_runner)


def test_repeated_entries_add_up_and_each_step_starts_afresh():
    timer = phases.PhaseTimer("cpu")
    for _ in range(3):  # a batched rollout: sample, decode, score, chunk after chunk
        with timer.phase("rollout"):
            time.sleep(0.05)
        with timer.phase("decode"):
            time.sleep(0.02)
    with timer.phase("train"):
        time.sleep(0.03)
    first = timer.step_metrics()
    assert set(first) == {"time_rollout", "time_decode", "time_reward", "time_train",
                          "peak_memory_bytes", "peak_memory_kind"}
    assert first["time_rollout"] >= 0.15
    assert first["time_decode"] >= 0.06  # three entries of 0.02 s add up (no upper bounds: loaded machines)
    assert first["time_train"] >= 0.03
    assert first["time_reward"] == 0.0  # not entered: no time, no peak
    assert sorted(first["peak_memory_bytes"]) == ["decode", "rollout", "train"]
    assert all(isinstance(v, int) and v > 10 * 2**20 for v in first["peak_memory_bytes"].values())  # torch alone is more
    assert first["peak_memory_kind"] == "host peak RSS (includes weights)"

    with timer.phase("reward"):
        time.sleep(0.01)
    second = timer.step_metrics()
    assert second["time_rollout"] == second["time_decode"] == second["time_train"] == 0.0
    assert second["time_reward"] >= 0.01
    assert list(second["peak_memory_bytes"]) == ["reward"]


def test_cpu_peak_is_the_phase_peak_not_the_process_peak(run_python):
    """VmHWM is reset at each phase's start: a phase after a big allocation does not inherit it.
    In a fresh interpreter: in a long test process a 64 MiB tensor can come from heap pages that
    are already resident, which moves no RSS at all."""
    from pathlib import Path

    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pytest.skip("/proc/self/clear_refs cannot be written here (the fallback, ru_maxrss, never resets)")
    out = run_python(
        "import json, torch\n"
        "from dancegrpo_port import phases\n"
        "timer = phases.PhaseTimer('cpu')\n"
        "with timer.phase('rollout'):\n"
        "    big = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB, touched\n"
        "    del big\n"
        "with timer.phase('train'):\n"
        "    pass\n"
        "print(json.dumps(timer.step_metrics()['peak_memory_bytes']))\n"
    )
    peaks = json.loads(out.stdout.strip().splitlines()[-1])
    assert peaks["rollout"] - peaks["train"] > 48 * 2**20, peaks


def test_unknown_and_nested_phases_are_refused():
    timer = phases.PhaseTimer("cpu")
    with pytest.raises(ValueError, match=r"unknown phase 'sampling': the phases are rollout, decode, reward, train"):
        with timer.phase("sampling"):
            pass
    with pytest.raises(RuntimeError, match=r"phase 'decode' entered inside phase 'rollout'"):
        with timer.phase("rollout"):
            with timer.phase("decode"):
                pass
    with pytest.raises(KeyError):  # a failing phase body: its error goes through, the timer stays usable
        with timer.phase("train"):
            raise KeyError("x")
    with timer.phase("decode"):  # the refusals left the timer usable
        pass
    metrics = timer.step_metrics()
    assert metrics["time_decode"] > 0 and metrics["time_train"] == 0.0  # a failed pass is not timed


def test_profiler_off_does_nothing(tmp_path):
    for off in (None, ""):
        profiler = phases.StepProfiler(off, str(tmp_path / "profile"))
        assert not profiler.enabled
        profiler.step_begin(1)
        profiler.step_end(1)
        profiler.close()
    assert not (tmp_path / "profile").exists()
    with pytest.raises(ValueError, match="--profile_steps 'x'"):
        phases.StepProfiler("x")


def test_torch_profiler_traces_step_2_of_3_with_the_phase_ranges(run_python, tmp_path):
    run_python(
        """
        import torch
        from dancegrpo_port.phases import PhaseTimer, StepProfiler
        timer, profiler = PhaseTimer(), StepProfiler("2", "profile")
        for step in (1, 2, 3):
            profiler.step_begin(step)
            for name in ("rollout", "decode", "reward", "train"):
                with timer.phase(name):
                    torch.randn(64, 64) @ torch.randn(64, 64)
            timer.step_metrics()
            profiler.step_end(step)
        profiler.close()
        """,
        env={"DANCEGRPO_DEVICE": "cpu", "RANK": "1"},
    )
    out = tmp_path / "profile"
    assert sorted(p.name for p in out.iterdir()) == ["step_2"]
    traces = list((out / "step_2").glob("rank_1.*.pt.trace.json"))
    assert len(traces) == 1, list((out / "step_2").iterdir())
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"rollout", "decode", "reward", "train", "aten::mm"} <= names


def test_close_stops_a_trace_whose_step_never_ended(run_python, tmp_path):
    run_python(
        """
        import torch
        from dancegrpo_port.phases import StepProfiler
        profiler = StepProfiler("1-2", "profile")
        profiler.step_begin(1)
        torch.ones(3) + 1          # the step is cut short before step_end ...
        profiler.close()           # ... close() ends its trace, and a second close is a no-op
        profiler.close()
        """,
        env={"DANCEGRPO_DEVICE": "cpu"},
    )
    assert len(list((tmp_path / "profile" / "step_1").glob("rank_0.*.pt.trace.json"))) == 1
    assert not (tmp_path / "profile" / "step_2").exists()


def test_a_step_that_raises_still_leaves_its_trace(run_python, tmp_path):
    """The trainers call step_end only after a step that returned; a step that raises ends the
    process, and the trace of that step is written at exit (without synchronising)."""
    out = run_python(
        """
        import torch
        from dancegrpo_port.phases import StepProfiler
        profiler = StepProfiler("2", "profile")
        for step in (1, 2):
            profiler.step_begin(step)
            torch.ones(3) + 1
            if step == 2:
                raise RuntimeError("the step failed")
            profiler.step_end(step)
        """,
        env={"DANCEGRPO_DEVICE": "cpu"}, check=False,
    )
    assert out.returncode == 1 and "RuntimeError: the step failed" in out.stderr
    assert sorted(p.name for p in (tmp_path / "profile").iterdir()) == ["step_2"]
    assert len(list((tmp_path / "profile" / "step_2").glob("rank_0.*.pt.trace.json"))) == 1


@pytest.mark.fake_npu
def test_npu_uses_torch_npu_profiler_and_the_npu_allocator(run_python, tmp_path):
    """Against the FAKE torch_npu (tests/fakes/torch_npu): proves which calls the NPU branch
    makes, not that a trace is written on an NPU."""
    out = run_python(
        """
        import json, torch_npu
        from dancegrpo_port.phases import PhaseTimer, StepProfiler
        timer, profiler = PhaseTimer(), StepProfiler("2", "profile")
        for step in (1, 2, 3):
            profiler.step_begin(step)
            with timer.phase("rollout"):
                pass
            metrics = timer.step_metrics()
            profiler.step_end(step)
        print(json.dumps({"metrics": metrics, "calls": [[n, {k: str(v) for k, v in a.items()}] for n, a in torch_npu.calls]}))
        """,
        env={"DANCEGRPO_DEVICE": "npu", "FAKE_TORCH_NPU_PEAK_BYTES": "12345"},
        fake_npu=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["metrics"]["peak_memory_bytes"] == {"rollout": 12345}
    assert got["metrics"]["peak_memory_kind"] == "device allocator"
    names = [n for n, _ in got["calls"]]
    profiling = [n for n in names if n.startswith("profiler.")]
    assert profiling == ["profiler.tensorboard_trace_handler", "profiler.profile", "profiler.start",
                         "profiler.stop", "profiler.trace_ready"]
    calls = dict((n, a) for n, a in got["calls"])
    assert calls["profiler.profile"]["activities"] == "['CPU', 'NPU']"
    assert calls["profiler.tensorboard_trace_handler"]["dir_name"] == "profile/step_2"
    # per phase entry: synchronise, reset the peak, ..., synchronise, read the peak
    assert names.count("reset_peak_memory_stats") == names.count("max_memory_allocated") == 3
    assert names.count("synchronize") >= 6
    folders = [p.name for p in (tmp_path / "profile" / "step_2").iterdir()]
    assert len(folders) == 1 and re.fullmatch(r"rank_0_\d+_\d{17}_ascend_pt", folders[0])  # torch_npu's naming
    assert (tmp_path / "profile" / "step_2" / folders[0] / "FAKE_NOT_A_TRACE").is_file()
    assert sorted(p.name for p in (tmp_path / "profile").iterdir()) == ["step_2"]
    assert "left no trace" not in out.stderr


@pytest.mark.fake_npu
def test_a_trace_torch_npu_refused_silently_is_reported_in_one_line(run_python, tmp_path):
    """torch_npu's profiler logs its exceptions and raises nothing: the step runs, no trace is
    written - the step profiler says so.  (Here the trace folder cannot be made, which the real
    one logs as "Failed to make directory".)"""
    out = run_python(
        """
        from torch_npu import profiler as p
        from dancegrpo_port.phases import StepProfiler
        @p.no_exception_func()
        def tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True, async_mode=False):
            raise RuntimeError(f"Failed to make directory: {dir_name}")
        p.tensorboard_trace_handler = tensorboard_trace_handler
        profiler = StepProfiler("1", "profile")
        profiler.step_begin(1)
        profiler.step_end(1)
        print("trained on")
        """,
        env={"DANCEGRPO_DEVICE": "npu"}, fake_npu=True,
    )
    assert "trained on" in out.stdout and "[ERROR]" in out.stdout  # torch_npu's own log line, and no exception
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("profile:")]
    assert lines == [f"profile: step 1 left no trace in {tmp_path}/profile/step_1; torch_npu's profiler failed "
                     "without raising: its [ERROR] line above says why"]
    assert not list((tmp_path / "profile" / "step_1").iterdir())


@pytest.mark.fake_npu
def test_a_path_outside_torch_npus_rule_still_gets_its_trace(run_python, tmp_path):
    """The wheels the project installs only warn about a '+' in the real path (2.7.1 without a
    post release refused it): the trace is written."""
    run_dir = tmp_path / "runs+1"
    run_dir.mkdir()
    out = run_python(
        """
        from dancegrpo_port.phases import StepProfiler
        profiler = StepProfiler("1", "profile")
        profiler.step_begin(1)
        profiler.step_end(1)
        """,
        env={"DANCEGRPO_DEVICE": "npu"}, fake_npu=True, cwd=run_dir,
    )
    assert "left no trace" not in out.stderr and f"UserWarning: Invalid input path: {run_dir}/profile/step_1" in out.stderr
    assert len(list((run_dir / "profile" / "step_1").glob("rank_0_*_ascend_pt"))) == 1


# ---------------------------------------------------------------- on the seam


class FakeTimer:
    def __init__(self):
        self.log = []

    @__import__("contextlib").contextmanager
    def phase(self, name):
        self.log.append(("enter", name))
        yield
        self.log.append(("exit", name))

    def step_metrics(self):
        return {"time_decode": 1.0}


def test_the_seams_contexts_are_the_phases(monkeypatch):
    from dancegrpo_port import hooks

    monkeypatch.setattr(hooks, "_FEATURES", [])
    with hooks.decoding(None):  # no feature: nothing to report to, nothing fails
        pass
    assert list(hooks.training([1, 2])) == [1, 2]
    timer = FakeTimer()
    hooks.install([phases.PhaseTimes(timer)])
    with hooks.sampling():
        timer.log.append("sample")
    with hooks.decoding(None):
        timer.log.append("body")
    with hooks.rewarding(None):
        pass
    seen = []
    for item in hooks.training([1, 2]):
        seen.append((item, list(timer.log)))
    # the whole training loop is one phase: entered before the first item, left after the last
    assert timer.log == [("enter", "rollout"), "sample", ("exit", "rollout"), ("enter", "decode"), "body",
                         ("exit", "decode"), ("enter", "reward"), ("exit", "reward"), ("enter", "train"),
                         ("exit", "train")]
    assert seen[0][1][-1] == ("enter", "train") and seen[1][1][-1] == ("enter", "train")
    assert hooks.step_end(3, loss=0.5) == {"step": 3, "loss": 0.5, "time_decode": 1.0}


def test_the_condition_phase_is_timed_only_where_a_trainer_enters_it(monkeypatch):
    """SkyReels-I2V's first frame (the seam's conditioning): time_condition and its peak in that
    trainer's steps; no key at all in the others'."""
    from dancegrpo_port import hooks

    timer = phases.PhaseTimer("cpu")
    monkeypatch.setattr(hooks, "_FEATURES", [])
    hooks.install([phases.PhaseTimes(timer)])
    with hooks.conditioning(None):
        time.sleep(0.02)
    with_first_frame = timer.step_metrics()
    assert with_first_frame["time_condition"] >= 0.02 and "condition" in with_first_frame["peak_memory_bytes"]
    without = timer.step_metrics()
    assert "time_condition" not in without and "condition" not in without["peak_memory_bytes"]
    assert without["time_rollout"] == 0.0  # the fixed phases are there either way
