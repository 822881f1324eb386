"""Each rank's heartbeat and its stacks on request (overlay/dancegrpo_port/heartbeat.py), as the seam
marks them, and the stall watchdog (dancegrpo_npu.run.watchdog) reading them from real processes:
a rank sleeping in a function, and its peer blocked in a gloo collective, both dumped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from overlay_runner import OVERLAY

from dancegrpo_port import heartbeat  # noqa: E402  (overlay/ is on sys.path)

from dancegrpo_npu.contract import RUN_DIR_ENV
from dancegrpo_npu.run.watchdog import Watchdog, parse_stacks


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_mark_is_kept_in_memory_and_the_thread_writes_the_latest_at_most_once_a_second(tmp_path, monkeypatch):
    writes = []
    real_replace = os.replace
    monkeypatch.setattr(heartbeat.os, "replace", lambda a, b: (writes.append(b), real_replace(a, b)))
    beat = heartbeat.start(0, {RUN_DIR_ENV: str(tmp_path), "LOCAL_RANK": "0"})
    try:
        first = len(writes)
        for i in range(20000):  # far more events than a step has
            heartbeat.mark("sde_noise", 3)
        heartbeat.mark("step_end", 3, "the last")
        assert len(writes) == first  # nothing on the caller's path
        time.sleep(2.5)
        assert 1 <= len(writes) - first <= 3  # once a second at most, only what changed
        data = json.loads((tmp_path / "heartbeats" / "rank-0.json").read_text())
        assert (data["event"], data["step"], data["detail"], data["pid"]) == ("step_end", 3, "the last", os.getpid())
        assert data["events"] == 20001
        done = len(writes)
        time.sleep(1.5)
        assert len(writes) == done  # no new mark: nothing written
    finally:
        heartbeat.stop()
    assert beat is not None and heartbeat.current() is None


def test_without_the_run_directory_nothing_is_written_or_registered(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert heartbeat.start(0, {}) is None
    heartbeat.mark("step_begin", 1)
    assert list(tmp_path.iterdir()) == []


def test_a_run_without_a_stall_leaves_no_stacks_file_and_one_asked_keeps_its_dump(tmp_path):
    heartbeat.start(3, {RUN_DIR_ENV: str(tmp_path)})
    heartbeat.stop()
    assert not (tmp_path / "stacks" / "rank-3.txt").exists()
    heartbeat.start(3, {RUN_DIR_ENV: str(tmp_path)})
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.2)
    finally:
        heartbeat.stop()
    text = (tmp_path / "stacks" / "rank-3.txt").read_text()
    assert "test_heartbeat.py" in text and "most recent call first" in text


def test_step_times_and_gaps_are_kept_for_the_default_limit(tmp_path):
    clock = Clock()
    beat = heartbeat.Heartbeat(str(tmp_path), 0, {}, clock)
    beat.mark("checkpoint_load", 0)
    clock.t += 100  # loading is no gap between events
    beat.mark("step_begin", 1)
    clock.t += 2
    beat.mark("sampled")
    clock.t += 1
    beat.mark("step_end", 1)
    assert (beat.first_step, beat.slowest_step, beat.longest_gap) == (1100.0, 3.0, 2.0)
    assert beat.last[:2] == ("step_end", 1)
    beat.mark("sampled")
    assert beat.last[:2] == ("sampled", 1)  # the step of the last step_begin


def test_every_event_of_the_seam_marks_progress_and_upstreams_save_is_a_checkpoint_save(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from dancegrpo_port import hooks

    monkeypatch.setattr(hooks, "_FEATURES", [])
    beat = heartbeat.Heartbeat(str(tmp_path), 0, {})
    monkeypatch.setattr(heartbeat, "_CURRENT", [beat])
    hooks.step_begin(2)
    assert beat.last[:2] == ("step_begin", 2)
    with hooks.rewarding(None):
        assert beat.last[:2] == ("rewarding", 2)
    list(hooks.training([1]))
    assert beat.last[0] == "training"
    hooks.step_end(2, loss=0.0)
    hooks.checkpoint_save(2)
    assert beat.last[:3] == ("checkpoint_save", 2, None)
    hooks.upstream_checkpoint_save(3)
    assert beat.last[:3] == ("checkpoint_save", 3, "upstream's save_checkpoint")
    assert beat.events == 6


# ------------------------------------------------------------------ real processes, real signals

RANK = r'''
import os, sys, time
sys.path.insert(0, {overlay!r})
import torch
import torch.distributed as dist
from dancegrpo_port import heartbeat

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2)
heartbeat.start(rank)
heartbeat.mark("step_begin", 2)
print("ready", flush=True)
if rank == 1:
    time.sleep(600)  # the planted stall
else:
    time.sleep(0.5)  # its progress comes after rank 1's last
    heartbeat.mark("rewards_gathered", 2)
    out = [torch.zeros(1) for _ in range(2)]
    dist.all_gather(out, torch.ones(1))  # waits for rank 1
'''


def test_a_sleeping_rank_and_its_peer_blocked_in_a_collective_are_both_dumped(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "rank.py"
    script.write_text(RANK.format(overlay=str(OVERLAY)))
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(29400 + os.getpid() % 500), RUN_DIR_ENV: str(tmp_path), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True))
    lines = []
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        time.sleep(1.5)  # rank 0 reaches its all_gather; each heartbeat written
        dog = Watchdog(tmp_path, 1.0, say=lines.append, grace_s=5)
        record = dog.check()
        assert record is not None
        codes = [p.wait(timeout=30) for p in procs]  # the watchdog ended them
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [r["rank"] for r in record["ranks"]] == [1, 0] and record["first_suspect"] == 1
    line = lines[0]
    assert "rank 1 (first suspect) in step_begin, step 2" in line
    assert "time.sleep(600)  # the planted stall" in line
    assert "rank 0 in rewards_gathered, step 2" in line and "in all_gather" in line
    assert "dist.all_gather(out, torch.ones(1))  # waits for rank 1" in line  # its caller, out of torch
    stacks = {r: (tmp_path / "stacks" / f"rank-{r}.txt").read_text() for r in (0, 1)}
    assert "in all_gather" in stacks[0] and f'File "{script}", line 14 in <module>' in stacks[1]
    assert all(parse_stacks(text) for text in stacks.values())
    assert codes == [-signal.SIGTERM, -signal.SIGTERM]


def test_main_thread_is_read_from_a_dump_of_every_thread():
    text = ("Thread 0x00000000000000aa (most recent call first):\n"
            '  File "/x/threading.py", line 3 in wait\n\n'
            "Current thread 0x00000000000000bb (most recent call first):\n"
            '  File "/t/train.py", line 9 in step\n'
            '  File "/t/train.py", line 20 in <module>\n')
    threads = parse_stacks(text)
    assert threads == {0xAA: [("/x/threading.py", 3, "wait")],
                       0xBB: [("/t/train.py", 9, "step"), ("/t/train.py", 20, "<module>")]}
    assert Path(OVERLAY).is_dir()
