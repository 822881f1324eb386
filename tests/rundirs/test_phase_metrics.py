"""runs and plot show the phase times and peak memory the trainers write to metrics.jsonl
(time_rollout/decode/reward/train, peak_memory_bytes, peak_memory_kind); older runs look as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_runs import fake_run

from dancegrpo_npu.cli import main
from dancegrpo_npu.rundirs.plot import make_figure
from dancegrpo_npu.rundirs.rundir import load_run, read_metrics
from dancegrpo_npu.rundirs.listing import human_bytes

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30


def timed_step(step, rollout, decode=2.0, reward=1.0, train=10.0, peaks=None, kind="device allocator"):
    """One metrics.jsonl record as the trainers write it (PhaseTimer.step_metrics merged in)."""
    return {"step": step, "loss": 1.0 / step, "reward_mean": 0.3 + step / 100,
            "time_rollout": rollout, "time_decode": decode, "time_reward": reward, "time_train": train,
            "peak_memory_bytes": peaks or {"rollout": 60 * GiB, "decode": 20 * GiB, "reward": 3 * GiB, "train": 70 * GiB},
            "peak_memory_kind": kind}  # fmt: skip


@pytest.fixture
def project(tmp_path):
    (tmp_path / "upstream.lock").write_text((REPO / "upstream.lock").read_text())
    return tmp_path


def test_read_metrics_collects_the_phase_columns(project):
    run = fake_run(project / "runs", "20260101-100000-npu", metrics=[
        timed_step(1, 300.0, peaks={"rollout": 61 * GiB, "train": 50 * GiB}),
        timed_step(2, 280.0, peaks={"rollout": 59 * GiB, "decode": 21 * GiB, "train": 72 * GiB}),
    ])  # fmt: skip
    m = read_metrics(run)
    assert m.phase_time["rollout"] == (300.0, 280.0)
    assert m.phase_means() == {"rollout": 290.0, "decode": 2.0, "reward": 1.0, "train": 10.0}
    assert m.phase_peaks() == {"rollout": 61 * GiB, "decode": 21 * GiB, "train": 72 * GiB}  # the largest; reward never
    assert m.peak_memory_kind == "device allocator"
    old = read_metrics(fake_run(project / "runs", "20260101-110000-old", metrics=[{"step": 1, "reward_mean": 0.3}]))
    assert old.phase_time == {} and old.phase_peaks() == {} and old.peak_memory_kind is None


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1000, "1000 B"), (1536, "1.5 KiB"), (512 * 2**20, "512 MiB"),
                                     (61.25 * GiB, "61.2 GiB"), (3 * 2**40, "3.0 TiB"), (5000 * 2**40, "5000 TiB")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_runs_shows_phase_lines_under_timed_runs_only(project, capsys):
    fake_run(project / "runs", "20260101-100000-old", metrics=[{"step": 1, "loss": 1.0, "reward_mean": 0.3}])
    fake_run(project / "runs", "20260101-110000-npu", metrics=[timed_step(1, 300.0), timed_step(2, 280.0)])
    fake_run(project / "runs", "20260101-120000-cpu", metrics=[
        timed_step(1, 4.0, peaks={"rollout": 1536 * 2**20}, kind="host peak RSS (includes weights)")])  # fmt: skip
    assert main(["-C", str(project), "runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("20260101-100000-old") and lines[2].startswith("20260101-110000-npu")  # none under old
    assert lines[3].split() == ["time", "per", "step", "(mean):", "rollout", "290s", "decode", "2s", "reward", "1s",
                                "train", "10s"]  # fmt: skip
    assert lines[4].strip() == "peak memory (device allocator): rollout 60.0 GiB  decode 20.0 GiB  reward 3.0 GiB  train 70.0 GiB"
    assert lines[5].startswith("20260101-120000-cpu")
    assert lines[7].strip() == "peak memory (host peak RSS (includes weights)): rollout 1.5 GiB"
    assert len(lines) == 8
    assert main(["-C", str(project), "runs", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["phases_s"] == {} and rows[0]["peak_memory_bytes"] == {} and rows[0]["peak_memory_kind"] is None
    assert rows[1]["phases_s"] == {"rollout": 290.0, "decode": 2.0, "reward": 1.0, "train": 10.0}
    assert rows[1]["peak_memory_bytes"]["train"] == 70 * GiB


def test_plot_adds_a_phase_panel_when_a_run_has_phase_times(project):
    old = fake_run(project / "runs", "20260101-100000-old", metrics=[{"step": s, "loss": 1.0, "reward_mean": 0.3} for s in (1, 2)])
    timed = fake_run(project / "runs", "20260101-110000-npu", metrics=[timed_step(1, 300.0), timed_step(2, 280.0)])
    before = [ax.get_title() for ax in make_figure([load_run(old)]).axes]
    assert "time per phase (s per step)" not in before and len(before) == 2  # reward, loss: as before
    fig = make_figure([load_run(old), load_run(timed)])
    panel = next(ax for ax in fig.axes if ax.get_title() == "time per phase (s per step)")
    label = "20260101-110000-npu (npu: Ascend910B3 ×8)"
    assert [line.get_label() for line in panel.get_lines()] == [f"{label}: {p}" for p in ("rollout", "decode", "reward", "train")]
    assert list(panel.get_lines()[0].get_ydata()) == [300.0, 280.0]
    assert list(panel.get_lines()[3].get_ydata()) == [10.0, 10.0]
    assert len(fig.axes) == 3


def test_plot_cli_with_a_timed_run(project, capsys):
    fake_run(project / "runs", "20260101-110000-npu", metrics=[timed_step(1, 300.0), timed_step(2, 280.0)])
    assert main(["-C", str(project), "plot", "npu"]) == 0
    assert Path(capsys.readouterr().out.strip()).stat().st_size > 0


def test_runs_and_plot_show_skyreels_condition_phase(project, capsys):
    """The phases a trainer enters only where it has them (the contract's OPTIONAL_PHASES:
    SkyReels-I2V's first frame, time_condition) are shown as the others are."""
    steps = [dict(timed_step(s, 4.0, peaks={"condition": 2 * GiB, "rollout": GiB}), time_condition=1.5 * s)
             for s in (1, 2)]
    run = fake_run(project / "runs", "20260101-110000-skyreels", metrics=steps)
    assert main(["-C", str(project), "runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[-2:] == ["condition", "2.25s"], lines
    assert lines[3].strip() == "peak memory (device allocator): rollout 1.0 GiB  condition 2.0 GiB"
    panel = next(ax for ax in make_figure([load_run(run)]).axes if ax.get_title() == "time per phase (s per step)")
    condition = [line for line in panel.get_lines() if line.get_label().endswith(": condition")]
    assert len(condition) == 1 and list(condition[0].get_ydata()) == [1.5, 3.0]
