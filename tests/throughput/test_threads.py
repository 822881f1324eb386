"""CPU threads: bench sets them as smoke sets its ranks', says so, and an explicit
OMP_NUM_THREADS wins (more threads than free cores spin against each other: a tiny bench ran
30x slower with 2 threads than with 1 on a loaded 2-core host)."""

from __future__ import annotations

import os

import pytest



@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)


def test_smoke_ranks_get_the_same_rule(eight_cores, monkeypatch):
    from dancegrpo_npu.smoke import runner as smoke

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert ("OMP_NUM_THREADS", "4") in smoke.job_env("cpu", 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert ("OMP_NUM_THREADS", "1") in smoke.job_env("cpu", 2)


def test_bench_sets_torchs_threads_and_says_how(eight_cores):
    torch = pytest.importorskip("torch")
    from dancegrpo_npu.throughput.bench import format_table, set_cpu_threads

    before = torch.get_num_threads()
    try:
        assert set_cpu_threads({}, busy=7.0) == (1, "8 usable core(s) less 7.0 busy (load average) / 1 process(es); "
                                                    "OMP_NUM_THREADS wins")
        assert torch.get_num_threads() == 1
        assert set_cpu_threads({"OMP_NUM_THREADS": "2"}, busy=7.0)[0] == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    facts = {"preset": "flux-tiny", "row": "flux", "size": "tiny", "device_kind": "cpu", "dtype": "float32", "height": 64, "width": 64,
             "sampling_steps": 4, "generations": 4, "train_timesteps": 1, "steps": 1, "warmup_steps": 1,
             "peak_memory": "RSS", "torch_threads": 2, "torch_threads_from": "OMP_NUM_THREADS=2, yours"}
    header = format_table([], facts).splitlines()[0]
    assert header.endswith("1 warm-up; 2 CPU thread(s) (OMP_NUM_THREADS=2, yours)")


@pytest.mark.fake_npu
@pytest.mark.parametrize("emulates", ["2.10.0.post6", "2.10.0.post7"])
def test_smoke_auto_counts_npus_as_the_port_does(tmp_path, emulates):
    """ASCEND_RT_VISIBLE_DEVICES=3,2: torch_npu's device_count() is 0 (2.10.0.post7's is_available()
    is still True): the port runs on the CPU, so smoke gives its ranks the CPU threads."""
    from pathlib import Path

    from snippet import run_snippet

    tests = Path(__file__).resolve().parents[1]
    code = "from dancegrpo_npu.smoke import runner; print(dict(runner.job_env('auto', 2)).get('OMP_NUM_THREADS'))"
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1", "ASCEND_RT_VISIBLE_DEVICES": "3,2", "FAKE_TORCH_NPU_EMULATES": emulates}
    proc = run_snippet(code, tmp_path, [str(tests / "fakes"), str(tests.parent / "src")], env,
                       drop=("DANCEGRPO_", "ASCEND_", "FAKE_TORCH_NPU", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"))
    assert proc.stdout.strip() not in ("", "None")
