"""runs: listing run records; reading metrics.jsonl / reward.txt robustly."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dancegrpo_npu.cli import main
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.run.directory import write_json
from dancegrpo_npu.rundirs.rundir import find_run, load_run, metrics_summary, read_metrics
from dancegrpo_npu.rundirs.listing import status_of


def fake_run(runs_dir, name, *, rewards=None, metrics=None, summary=None, environment=None):
    run = runs_dir / name
    run.mkdir(parents=True)
    write_json(run / "launch.json", {"script": "flux", "device": "auto", "world_size": 8})
    if rewards is not None:
        (run / "reward.txt").write_text("".join(f"{r}\n" for r in rewards))
    if metrics is not None:
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    write_json(
        run / "summary.json",
        {"status": "succeeded", "world_size": 8, "wall_time_s": 12.5, **metrics_summary(run), **(summary or {})},
    )
    write_json(run / "environment.json", environment or {"devices": {"kind": "npu", "names": ["Ascend910B3"]}})
    return run


def test_runs_lists_each_run_with_reward_trend(tmp_path, capsys):
    (tmp_path / "upstream.lock").write_text((Path(__file__).parents[2] / "upstream.lock").read_text())
    runs = tmp_path / "runs"
    fake_run(runs, "20260101-100000-gpu", rewards=[0.30, 0.31, 0.35], environment={"devices": {"kind": "cuda"}})
    fake_run(
        runs, "20260101-110000-npu", metrics=[{"step": s, "loss": 1.0, "reward_mean": 0.3 + s / 100} for s in (1, 2)]
    )
    fake_run(runs, "20260101-120000-bad", summary={"status": "failed"})
    assert main(["-C", str(tmp_path), "runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "RUN", "STATUS", "DEVICE", "WORLD", "STEPS", "REWARD", "first", "->", "last", "CLIP_FRAC", "LOGP_DIFF_MAX", "WALL"
    ]  # fmt: skip
    # runs without the GRPO health keys (older runs, reward.txt only) show "-" there
    assert lines[1].split() == ["20260101-100000-gpu", "succeeded", "cuda", "8", "3", "0.3", "->", "0.35", "-", "-", "12.5s"]
    assert lines[2].split() == ["20260101-110000-npu", "succeeded", "npu", "8", "2", "0.31", "->", "0.32", "-", "-", "12.5s"]
    assert lines[3].split() == ["20260101-120000-bad", "failed", "npu", "8", "0", "-", "-", "-", "12.5s"]
    assert main(["-C", str(tmp_path), "runs", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["reward_last"] for r in rows] == [0.35, 0.32, None]


def test_runs_shows_the_last_grpo_health_values(tmp_path, capsys):
    """The last non-null value of each key (null: a step without pairs to compute it on)."""
    (tmp_path / "upstream.lock").write_text((Path(__file__).parents[2] / "upstream.lock").read_text())
    health = [
        {"step": 1, "loss": 1.0, "reward_mean": 0.3, "clip_frac": 0.25, "logprob_diff_max": 2e-5, "approx_kl": 1e-9},
        {"step": 2, "loss": 0.5, "reward_mean": 0.4, "clip_frac": 0.5, "logprob_diff_max": None, "zero_std_groups": 1},
    ]
    fake_run(tmp_path / "runs", "20260101-100000-npu", metrics=health)
    assert main(["-C", str(tmp_path), "runs"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[-3:] == ["0.5", "2e-05", "12.5s"]
    assert main(["-C", str(tmp_path), "runs", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["health"] == {
        "reward_mean": 0.4, "clip_frac": 0.5, "logprob_diff_max": 2e-5, "approx_kl": 1e-9, "zero_std_groups": 1.0
    }  # fmt: skip


def test_runs_with_no_runs(tmp_path, capsys):
    (tmp_path / "upstream.lock").write_text("")
    assert main(["-C", str(tmp_path), "runs"]) == 0
    assert "no runs" in capsys.readouterr().out


def test_metrics_prefer_jsonl_and_skip_a_truncated_line(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "reward.txt").write_text("9\n9\n")
    (run / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 0.5, "reward_mean": 0.2, "step_time": 3}\n{"step": 2, "loss": 0.4, "rew'
    )
    m = read_metrics(run)
    assert (m.source, m.steps, m.reward, m.loss, m.skipped_lines) == ("metrics.jsonl", (1,), (0.2,), (0.5,), 1)


def test_metrics_fall_back_to_reward_txt_and_keep_nan(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "reward.txt").write_text("0.1\nnan\n0.3\n")
    m = read_metrics(run)
    assert m.source == "reward.txt" and m.steps == (1, 2, 3) and m.loss == ()
    assert m.reward[0] == 0.1 and m.reward[1] != m.reward[1]  # NaN stays visible


def test_running_run_whose_launcher_died(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a launcher pid that has exited
    dead = fake_run(
        tmp_path, "dead", summary={"status": "running"}, environment={"host": socket.gethostname(), "pid": gone.pid}
    )
    alive = fake_run(
        tmp_path, "alive", summary={"status": "running"}, environment={"host": socket.gethostname(), "pid": os.getpid()}
    )
    elsewhere = fake_run(
        tmp_path, "other", summary={"status": "running"}, environment={"host": "another-node", "pid": gone.pid}
    )
    assert [status_of(load_run(r)) for r in (dead, alive, elsewhere)] == ["died", "running", "running"]


def test_find_run_by_suffix_and_ambiguity(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs, "20260101-100000-gpu")
    fake_run(runs, "20260101-110000-npu")
    assert find_run(runs, "npu").name == "20260101-110000-npu"
    with pytest.raises(DancegrpoError, match="ambiguous"):
        find_run(runs, "20260101")
    with pytest.raises(DancegrpoError, match="no run 'tpu'"):
        find_run(runs, "tpu")
