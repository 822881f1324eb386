"""The stall watchdog (dancegrpo_npu.run.watchdog) on heartbeats the overlay's own writer makes, on a
clock of the test's: when it fires and when not (a slow but live run, loading, the default limit),
what its one line says (the first suspect, a checkpoint save), how it ends the workers, and
``--stall-timeout``'s refusals."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "overlay"))

from dancegrpo_port.heartbeat import Heartbeat  # noqa: E402

from dancegrpo_npu.cli import main  # noqa: E402
from dancegrpo_npu.run import watchdog as wd  # noqa: E402
from dancegrpo_npu.run.watchdog import OFF, Watchdog  # noqa: E402

HERE = Path(__file__)


class Clock:
    def __init__(self, t: float = 5000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Ranks:
    """Ranks of one node as the overlay's Heartbeat writes them, with fake pids; what the
    watchdog sends them is kept in ``sent``."""

    def __init__(self, run_dir: Path, clock: Clock, n: int = 2):
        self.clock, self.sent, self.dead = clock, [], set()
        self.beats = []
        for rank in range(n):
            beat = Heartbeat(str(run_dir), rank, {"LOCAL_RANK": str(rank)}, clock)
            beat.fixed["pid"] = 1000 + rank
            (run_dir / "heartbeats").mkdir(exist_ok=True)
            self.beats.append(beat)
        self.write()

    def mark(self, rank: int, event: str, step=None, detail=None) -> None:
        self.beats[rank].mark(event, step, detail)

    def all(self, event: str, step=None) -> None:
        for rank in range(len(self.beats)):
            self.mark(rank, event, step)

    def write(self) -> None:
        for beat in self.beats:
            beat.write()

    def kill(self, pid: int, sig: int) -> None:
        self.sent.append((pid, sig))
        if sig == signal.SIGKILL:
            self.dead.add(pid)

    def alive(self, pid: int) -> bool:
        return pid not in self.dead


def dog(tmp_path, ranks: Ranks, timeout=None, **kw) -> Watchdog:
    lines = []
    kw = {"floor_s": 10.0, "factor": 4.0, "loading_s": 100.0, "grace_s": 0.2, "stacks_wait_s": 0.2, **kw}
    w = Watchdog(tmp_path, timeout, clock=ranks.clock, kill=ranks.kill, alive=ranks.alive, say=lines.append, **kw)
    w.lines = lines
    return w


def steps(ranks: Ranks, clock: Clock, w: Watchdog, durations, events: int = 4, first: int = 1) -> None:
    """Steps of the given durations, each with ``events`` events spread over it; the watchdog looks
    after every event; it must never fire."""
    for n, took in enumerate(durations, start=first):
        ranks.all("step_begin", n)
        for _ in range(events):
            clock.t += took / (events + 1)
            ranks.all("sampled")
            ranks.write()
            assert w.check() is None, w.lines
        clock.t += took / (events + 1)
        ranks.all("step_end", n)
        ranks.write()
        assert w.check() is None, w.lines


def test_a_slow_but_live_run_is_never_ended(tmp_path):
    """Steps of 3x the first step's time, events between: neither the derived limit nor a given one
    shorter than a step fires; the same steps without events would."""
    clock = Clock()
    ranks = Ranks(tmp_path, clock)
    w = dog(tmp_path, ranks, floor_s=4.0)  # the floor below a step: the derived limit must follow the steps
    steps(ranks, clock, w, [2.0] + [6.0] * 5)
    assert w.limit(w.watched()[0], w.watched()) == pytest.approx(4 * 6.0)
    given = dog(tmp_path, ranks, timeout=3.0)  # shorter than a step: the events between keep it quiet
    steps(ranks, clock, given, [6.0] * 3, first=7)
    assert ranks.sent == [] and w.stalls == [] and given.stalls == []
    clock.t += 3.5  # no event for longer than the given limit: that fires
    assert given.check() is not None


def test_the_default_limit_is_a_few_slowest_steps_with_a_floor_and_loading_has_its_own(tmp_path):
    clock = Clock()
    ranks = Ranks(tmp_path, clock)
    w = dog(tmp_path, ranks)
    ranks.all("checkpoint_load", 0)
    ranks.write()
    clock.t += 99  # loading: its own limit (100 s), not the floor (10 s)
    assert w.check() is None
    given = dog(tmp_path, ranks, timeout=5.0)
    assert given.check() is None  # loading's limit holds with --stall-timeout too
    assert given.limit(given.watched()[0], []) == 100.0 and dog(tmp_path, ranks, timeout=500.0).limit(
        given.watched()[0], []) == 500.0  # ... unless that is longer
    steps(ranks, clock, w, [1.0])
    assert w.limit(w.watched()[0], w.watched()) == 10.0  # 4 x 1 s is under the floor
    clock.t += 10.5
    assert w.check() is not None


def test_the_verdict_names_the_oldest_rank_first_with_its_event_step_age_and_line(tmp_path):
    clock = Clock()
    ranks = Ranks(tmp_path, clock, n=3)
    w = dog(tmp_path, ranks, timeout=30.0)
    steps(ranks, clock, w, [1.0])
    ranks.mark(1, "step_begin", 2)  # rank 1 stops here
    clock.t += 5
    ranks.mark(0, "step_begin", 2)
    ranks.mark(2, "step_begin", 2)
    ranks.mark(0, "rewards_gathered")
    clock.t += 20
    ranks.mark(2, "sampled")  # rank 2 still goes on
    ranks.write()
    clock.t += 4
    assert w.check() is None  # rank 1: 29 s
    clock.t += 7
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    line = 28  # where rank 1 "is": a line of this file
    dumps = {1001: f'Thread 0x0000000000000001 (most recent call first):\n  File "{HERE}", line {line} in step\n',
             1000: f'Thread 0x0000000000000001 (most recent call first):\n  File "{HERE}", line 31 in step\n'}

    def kill(pid, sig):
        ranks.kill(pid, sig)
        if sig == signal.SIGUSR1 and pid in dumps:  # faulthandler's answer
            with open(stacks / f"rank-{pid - 1000}.txt", "a") as f:
                f.write(dumps[pid])

    w.kill = kill
    record = w.check()
    assert record is not None and record["first_suspect"] == 1
    assert [r["rank"] for r in record["ranks"]] == [1, 0, 2]
    assert [r["stalled"] for r in record["ranks"]] == [True, True, False]
    (said,) = w.lines
    text = HERE.read_text().splitlines()[line - 1].strip()
    assert said.startswith("dancegrpo-npu: stalled: 2 of 3 local ranks made no progress for 30 s: "
                           f"rank 1 (first suspect) in step_begin, step 2, 36 s ago, at {HERE} line {line} in step: "
                           f"{text}; rank 0 in rewards_gathered, step 2, 31 s ago, at {HERE} line 31 in step: return self.t; ")
    assert "rank 2 progressed 11 s ago (sampled, step 2), no stack (the rank did not answer)" in said
    assert record["error"] == f"rank 1 stalled in step_begin, step 2: no progress for 36 s (limit 30 s), at {HERE} " \
                              f"line {line} in step: {text}"
    # every local rank asked for its stacks, then ended: SIGTERM, SIGKILL after the grace period
    assert [s for s in ranks.sent if s[1] == signal.SIGUSR1] == [(1000, signal.SIGUSR1), (1001, signal.SIGUSR1),
                                                                  (1002, signal.SIGUSR1)]
    assert [s for s in ranks.sent if s[1] != signal.SIGUSR1] == [(p, signal.SIGTERM) for p in (1000, 1001, 1002)] + \
        [(p, signal.SIGKILL) for p in (1000, 1001, 1002)]
    assert w.check() is None  # the ended ranks' heartbeats are no longer watched (a restart's are)


def test_a_hang_in_a_checkpoint_save_is_named_so(tmp_path):
    clock = Clock()
    ranks = Ranks(tmp_path, clock)
    w = dog(tmp_path, ranks, timeout=20.0)
    steps(ranks, clock, w, [1.0])
    ranks.mark(0, "checkpoint_save", 2)  # the resume checkpoint after step 2
    ranks.mark(1, "checkpoint_save", 2, "upstream's save_checkpoint")  # upstream's, at step 2's start
    ranks.write()
    clock.t += 21
    record = w.check()
    assert "in checkpoint_save, step 2, 21 s ago" in w.lines[0]
    assert "in checkpoint_save, step 2 (upstream's save_checkpoint), 21 s ago" in w.lines[0]
    assert record["error"].startswith("rank 0 stalled in checkpoint_save, step 2: no progress for 21 s")


def test_off_watches_nothing(tmp_path):
    clock = Clock()
    ranks = Ranks(tmp_path, clock)
    w = dog(tmp_path, ranks, timeout=OFF)
    clock.t += 10 ** 6
    assert w.check() is None and w.start()._thread is None and ranks.sent == []


def test_a_rank_that_is_gone_or_ended_its_run_is_not_watched(tmp_path):
    clock = Clock()
    ranks = Ranks(tmp_path, clock)
    w = dog(tmp_path, ranks, timeout=5.0)
    steps(ranks, clock, w, [1.0])
    ranks.mark(0, "run_end")
    ranks.dead.add(1001)
    ranks.write()
    clock.t += 100
    assert w.check() is None


@pytest.mark.parametrize("verb", ["launch flux", "smoke"])
@pytest.mark.parametrize("value, why", [("0", "0 is not above 0"), ("-5", "-5 is not above 0"),
                                        ("nan", "'nan' is not a finite number"), ("inf", "'inf' is not a finite"),
                                        ("-inf", "'-inf' is not a finite")])
def test_stall_timeout_refuses_zero_negative_nan_and_inf_in_one_line(verb, value, why, capsys):
    assert main([*verb.split(), f"--stall-timeout={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--stall-timeout" in err[0] and why in err[0], err


def test_stall_timeout_off_and_seconds_reach_the_run(monkeypatch):
    from dancegrpo_npu.smoke import runner

    seen = []
    monkeypatch.setattr(runner, "run_smoke", lambda project, options, *verified: seen.append(options) or (_ for _ in ()).throw(
        SystemExit(0)))
    for value, want in (("off", OFF), ("OFF", OFF), ("90", 90.0)):
        with pytest.raises(SystemExit):
            main(["-C", str(ROOT), "smoke", "--device", "cpu", "--stall-timeout", value, "--max-restarts", "2"])
        assert (seen[-1].stall_timeout, seen[-1].max_restarts) == (want, 2)
    assert wd.stall_timeout("off") == OFF and wd.stall_timeout("1e3") == 1000.0


def test_a_rank_waiting_in_a_collective_is_no_first_suspect_though_it_got_there_first(tmp_path):
    """Rank 0 reached the step's first all_gather before rank 1 reached the line it sleeps on: the
    first suspect is rank 1, and rank 0 is said to be waiting in a collective."""
    clock = Clock()
    ranks = Ranks(tmp_path, clock)
    w = dog(tmp_path, ranks, timeout=10.0)
    steps(ranks, clock, w, [1.0])
    ranks.mark(0, "model_call", 2)
    clock.t += 1
    ranks.mark(1, "step_begin", 2)
    ranks.write()
    clock.t += 11
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    dumps = {1000: f'Thread 0x1 (most recent call first):\n  File "{c10d}", line 5 in all_gather\n'
                   f'  File "{HERE}", line 31 in __call__\n',
             1001: f'Thread 0x1 (most recent call first):\n  File "{HERE}", line 28 in step\n'}
    (tmp_path / "stacks").mkdir()

    def kill(pid, sig):
        ranks.kill(pid, sig)
        if sig == signal.SIGUSR1:
            with open(tmp_path / "stacks" / f"rank-{pid - 1000}.txt", "a") as f:
                f.write(dumps[pid])

    w.kill = kill
    record = w.check()
    assert record["first_suspect"] == 1 and [r["in_collective"] for r in record["ranks"]] == [False, True]
    assert (f"rank 0 in model_call, step 2, 12 s ago, waiting in a collective at {c10d} line 5 in all_gather, "
            f"called from {HERE} line 31 in __call__: return self.t") in w.lines[0]


def test_runs_says_a_run_went_on_after_the_watchdog_ended_its_workers():
    from dancegrpo_npu.rundirs.listing import continued_lines

    restarted = {"status": "succeeded", "restarts": 1, "resumes": 0, "stalls": 1}
    assert continued_lines(restarted) == [
        "    continued from checkpoints: restarted 1, after the stall watchdog ended its workers 1 time"]
    assert continued_lines({**restarted, "stalls": 0}) == ["    continued from checkpoints: restarted 1"]
