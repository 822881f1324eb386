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


def test_find_run_by_a_unique_part_anywhere_in_the_name(tmp_path):
    """The help says "a unique part of its name": the middle of a name finds it too; a prefix or
    suffix is still preferred where it is unique."""
    runs = tmp_path / "runs"
    fake_run(runs, "20260101-100000-gpu")
    fake_run(runs, "20260101-110000-gpu-2")
    assert find_run(runs, "1-100000-g").name == "20260101-100000-gpu"
    assert find_run(runs, "110000-gpu-").name == "20260101-110000-gpu-2"
    assert find_run(runs, "gpu").name == "20260101-100000-gpu"  # its suffix; the other only holds it
    with pytest.raises(DancegrpoError, match="ambiguous"):
        find_run(runs, "0000-gp")


def test_a_runs_directory_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "upstream.lock").write_text("")
    not_a_dir = tmp_path / "runs.txt"
    not_a_dir.write_text("")
    for argv in (["runs"], ["runs", "--json"], ["plot", "x"], ["compare", "a", "b"]):
        assert main(["-C", str(tmp_path), "--runs-dir", str(not_a_dir), *argv]) == 2, argv
        [line] = capsys.readouterr().err.strip().splitlines()
        assert f"the runs directory {not_a_dir} is a file, not a directory" in line and "no runs" not in line


def test_read_only_verbs_with_a_runs_directory_need_no_checkout(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "shared" / "runs"
    fake_run(runs, "20260101-100000-gpu", rewards=[0.3, 0.35])
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no upstream.lock here or above
    assert main(["runs", "--runs-dir", str(runs)]) == 0
    assert "20260101-100000-gpu" in capsys.readouterr().out
    monkeypatch.setenv("DANCEGRPO_RUNS", str(runs))
    assert main(["runs", "--json"]) == 0 and json.loads(capsys.readouterr().out)["name"] == "20260101-100000-gpu"
    assert main(["compare", "gpu", "gpu"]) == 2  # found: refused for what the run lacks, not for the place
    assert "run 20260101-100000-gpu has no records" in capsys.readouterr().err
    monkeypatch.delenv("DANCEGRPO_RUNS")
    assert main(["runs"]) == 2 and "not a dancegrpo-npu project" in capsys.readouterr().err


def test_a_runs_directory_that_is_a_file_is_named_when_a_run_is_created(tmp_path):
    """Not "free space or fix the permissions": the file in the way is named."""
    from dancegrpo_npu.run.directory import create_run_dir

    not_a_dir = tmp_path / "runs"
    not_a_dir.write_text("")
    for runs_dir in (not_a_dir, not_a_dir / "below"):
        with pytest.raises(DancegrpoError) as e:
            create_run_dir(runs_dir, "smoke")
        line = e.value.one_line()
        assert f"{not_a_dir} is a file, not a directory" in line and "--runs-dir DIR" in line
        assert "free space" not in line and "permissions" not in line
