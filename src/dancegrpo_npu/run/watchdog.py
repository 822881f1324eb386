"""The stall watchdog: a thread of the process that runs torchrun (launch, smoke), on every node
for that node's ranks.

Each rank marks its progress (the seam's last event, its step and time) in
``<run>/heartbeats/rank-N.json`` (the overlay's ``dancegrpo_port/heartbeat.py``).  The watchdog
reads those files once a second.  A rank has stalled when its last event is older than its
limit:

* before its first step (loading the models, the process group, a resume's checkpoint):
  ``LOADING_S`` (30 min), or ``--stall-timeout`` when that is longer;
* from its first step's start: ``--stall-timeout SECONDS``; by default ``FACTOR`` (4) times
  the longest time the run has taken so far for a complete step or between two events (a
  checkpoint save included), with a floor of ``FLOOR_S`` (10 min).  docs/troubleshooting.md
  says why these.

When a rank has stalled the watchdog asks every local rank for its stacks (``STACKS_SIGNAL``:
faulthandler writes every thread into ``<run>/stacks/rank-N.txt``), reads the main thread's
innermost frame and the source line there, says in one line which rank(s) stalled (the first
suspect first: the one whose last progress is the oldest among those not waiting in a collective
of torch.distributed, since a rank that reached a collective waits there for the one that did not,
whenever it got there; then the others, oldest first), with the last event, its step, how long ago
and the line each is on, then ends the workers: SIGTERM, SIGKILL after ``GRACE_S``.  torchrun
sees its workers fail: with ``--max-restarts`` it starts them again (they resume from the newest
complete checkpoint) and the watchdog watches the new ones; without, the job ends and the runner
records the run as ``stalled`` with the command that continues it.
"""

from __future__ import annotations

import argparse
import json
import linecache
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dancegrpo_npu.argtypes import positive
from dancegrpo_npu.contract import HEARTBEAT_DIR, STACKS_DIR, STACKS_FILE, STACKS_SIGNAL
from dancegrpo_npu.files import process_alive

OFF = "off"
FLOOR_S = 600.0  # the least a default limit is, after the first step has started
FACTOR = 4.0  # the default limit: this many times the slowest step (or gap between events) so far
LOADING_S = 1800.0  # before the first step: loading the models, the process group, a checkpoint
GRACE_S = 15.0  # between SIGTERM and SIGKILL
POLL_S = 1.0
STACKS_WAIT_S = 5.0  # how long the ranks get to write their stacks


def stall_timeout(text: str):
    """``--stall-timeout``: seconds (finite, above 0), or ``off``; argparse's one-line error else."""
    if str(text).strip().lower() == OFF:
        return OFF
    try:
        return positive(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (give seconds, or off to turn the watchdog off)") from None


def describe(timeout) -> str:
    """The limit in words, for the plan and the docs."""
    if timeout == OFF:
        return "off"
    if timeout is None:
        return (f"{FACTOR:g}x the slowest step so far, at least {FLOOR_S:g} s; before the first step "
                f"{LOADING_S:g} s")
    return f"{timeout:g} s; before the first step {max(LOADING_S, timeout):g} s"


# ------------------------------------------------------------------ stacks


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_LIBRARY = re.compile(r"/(?:site-packages|dist-packages)/|/lib/python3\.\d+/")
_COLLECTIVE = re.compile(r"/torch(?:_npu)?/distributed/")  # c10d's collectives, FSDP's, torch_npu's


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    text: str = ""

    @property
    def library(self) -> bool:
        return bool(_LIBRARY.search(self.file))

    def words(self) -> str:
        where = f"{self.file} line {self.line} in {self.function}"
        return f"{where}: {self.text}" if self.text else where

    def as_json(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function, "text": self.text}


def parse_stacks(text: str) -> dict[int, list[tuple[str, int, str]]]:
    """faulthandler's dump -> {thread id: [(file, line, function), ...] innermost first}; a thread
    dumped twice (two dumps in the text) keeps its last."""
    threads: dict[int, list] = {}
    current = None
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            current = threads[int(head.group(2), 16)] = []
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            current.append((frame.group(1), int(frame.group(2)), frame.group(3)))
        elif not line.strip():
            current = None
    return threads


def source_line(path: str, number: int, cwd: Path | None = None) -> str:
    """The text of line ``number`` of ``path`` (relative to ``cwd``), stripped; "" when unreadable."""
    p = Path(path)
    if not p.is_absolute() and cwd is not None:
        p = cwd / p
    linecache.checkcache(str(p))
    return linecache.getline(str(p), number).strip()


def in_collective(frames: list[Frame]) -> bool:
    """The innermost frames (the library's, above the first of the run's own code) are in
    torch.distributed: the rank waits for the others there."""
    for frame in frames:
        if not frame.library:
            return False
        if _COLLECTIVE.search(frame.file):
            return True
    return False


def main_frames(text: str, thread: str | None, cwd: Path | None = None) -> list[Frame]:
    """The main thread's frames (innermost first) in a rank's dump, each with its source line;
    the thread the heartbeat names, else the dump's last thread (the oldest: the main one)."""
    threads = parse_stacks(text)
    if not threads:
        return []
    try:
        frames = threads.get(int(thread, 16)) if thread else None
    except ValueError:
        frames = None
    if frames is None:
        frames = list(threads.values())[-1]
    return [Frame(f, n, fn, source_line(f, n, cwd)) for f, n, fn in frames]


# ------------------------------------------------------------------ heartbeats


@dataclass
class Beat:
    """One rank's heartbeat file, as read."""

    data: dict

    def __getattr__(self, name):
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def loading(self) -> bool:
        return self.data.get("first_step") is None

    def where(self) -> str:
        """"step_begin, step 2" / "checkpoint_save, step 2 (upstream's save_checkpoint)"."""
        text = str(self.data.get("event"))
        step = self.data.get("step")
        if self.loading and self.data.get("event") != "checkpoint_save":
            text += ", before the first step" if step in (None, 0) else f", before step {step + 1}"
        elif step is not None:
            text += f", step {step}"
        if self.data.get("detail"):
            text += f" ({self.data['detail']})"
        return text


def read_beats(run_dir: Path, host: str) -> list[Beat]:
    """This host's heartbeats in the run directory, one per rank (the newest attempt's)."""
    beats: dict[int, Beat] = {}
    for path in sorted((run_dir / HEARTBEAT_DIR).glob("rank-*.json")):
        try:
            data = json.loads(path.read_text())
            rank, when = int(data["rank"]), float(data["time"])
            int(data["pid"])  # a heartbeat names the process to signal
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced, or not a heartbeat
        if data.get("host") != host or not math.isfinite(when):
            continue
        beats[rank] = Beat(data)
    return [beats[r] for r in sorted(beats)]


# ------------------------------------------------------------------ the watchdog


@dataclass
class Watchdog:
    run_dir: Path
    timeout: object = None  # None: derived from the run; OFF; or seconds
    host: str = field(default_factory=socket.gethostname)
    clock: object = time.time
    floor_s: float = FLOOR_S
    factor: float = FACTOR
    loading_s: float = LOADING_S
    grace_s: float = GRACE_S
    poll_s: float = POLL_S
    stacks_wait_s: float = STACKS_WAIT_S
    say: object = None  # one line to the user (default: stderr)
    kill: object = os.kill
    alive: object = process_alive
    stalls: list = field(default_factory=list)  # each firing's record (summary.json's "stalls")
    ended: set = field(default_factory=set)  # pids the watchdog ended: their heartbeats are old news

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = None

    # -------------------------------------------------------------- limits

    def limit(self, beat: Beat, beats: list[Beat]) -> float:
        """How long ``beat``'s rank may go without progress (see the module's doc)."""
        if beat.loading:
            return max(self.loading_s, self.timeout if isinstance(self.timeout, (int, float)) else 0.0)
        if isinstance(self.timeout, (int, float)):
            return float(self.timeout)
        slowest = max((max(b.data.get("slowest_step") or 0.0, b.data.get("longest_gap") or 0.0) for b in beats),
                      default=0.0)
        return max(self.floor_s, self.factor * slowest)

    def watched(self) -> list[Beat]:
        """The local ranks to watch: alive, not ended by the watchdog, not past their run's end."""
        return [b for b in read_beats(self.run_dir, self.host)
                if b.data.get("pid") not in self.ended and b.data.get("event") != "run_end" and self.alive(b.pid)]

    def check(self) -> dict | None:
        """One look: when a rank has stalled, its stacks, the verdict and the workers ended
        (the record, also in ``stalls``); else None."""
        if self.timeout == OFF:
            return None
        beats = self.watched()
        now = self.clock()
        stalled = [(b, self.limit(b, beats)) for b in beats]
        stalled = [(b, lim) for b, lim in stalled if now - float(b.time) > lim]
        if not stalled:
            return None
        return self.fire(beats, stalled)

    # -------------------------------------------------------------- firing

    def stacks(self, beats: list[Beat]) -> dict[int, list[Frame]]:
        """Ask every rank for its stacks; each rank's main thread, read from what it added."""
        paths = {b.rank: self.run_dir / STACKS_DIR / STACKS_FILE.format(rank=b.rank) for b in beats}
        before = {}
        for b in beats:
            try:
                before[b.rank] = paths[b.rank].stat().st_size
            except OSError:
                before[b.rank] = 0
            try:
                self.kill(int(b.pid), getattr(signal, STACKS_SIGNAL))
            except (OSError, ValueError):
                pass
        deadline, sizes, steady = time.monotonic() + self.stacks_wait_s, {}, 0
        while time.monotonic() < deadline:
            now = {r: (p.stat().st_size if p.exists() else 0) for r, p in paths.items()}
            if all(now[r] > before[r] for r in now) and now == sizes:
                steady += 1
                if steady >= 2:
                    break
            else:
                steady = 0
            sizes = now
            time.sleep(0.1)
        frames = {}
        for b in beats:
            try:
                with open(paths[b.rank], "rb") as f:
                    f.seek(before[b.rank])
                    text = f.read().decode("utf-8", "replace")
            except OSError:
                text = ""
            frames[b.rank] = main_frames(text, b.data.get("thread"), self.run_dir)
        return frames

    def fire(self, beats: list[Beat], stalled: list[tuple[Beat, float]]) -> dict:
        now = self.clock()
        frames = self.stacks(beats)
        stalled_ranks = {b.rank for b, _ in stalled}
        limit = max(lim for _, lim in stalled)
        ranks = []
        # the first suspect: the rank whose last progress is the oldest among those not waiting in a
        # collective (a rank that reached one waits for the rank that did not, whenever it got there)
        order = sorted(beats, key=lambda b: (in_collective(frames.get(b.rank) or []), float(b.time)))
        for b in order:
            at = frames.get(b.rank) or []
            caller = next((f for f in at if not f.library), None) if at and at[0].library else None
            ranks.append({"rank": b.rank, "pid": b.pid, "stalled": b.rank in stalled_ranks,
                          "in_collective": in_collective(at), "event": b.event,
                          "step": b.data.get("step"), "detail": b.data.get("detail"), "where": b.where(),
                          "ago_s": round(now - float(b.time), 1), "attempt": b.data.get("attempt", 0),
                          "at": at[0].as_json() if at else None, "called_from": caller.as_json() if caller else None})
        record = {"time": now, "limit_s": limit, "first_suspect": ranks[0]["rank"], "ranks": ranks,
                  "stacks": str(self.run_dir / STACKS_DIR), "grace_s": self.grace_s}
        record["error"] = short_verdict(record)
        record["line"] = verdict_line(record)
        self.stalls.append(record)
        self._say(f"dancegrpo-npu: {record['line']}")
        self.end_workers([int(b.pid) for b in beats])
        return record

    def end_workers(self, pids: list[int]) -> None:
        """SIGTERM, then SIGKILL what still runs after the grace period."""
        self.ended.update(pids)
        for pid in pids:
            try:
                self.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(self.alive(p) for p in pids):
            time.sleep(0.1)
        for pid in pids:
            if self.alive(pid):
                try:
                    self.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def _say(self, line: str) -> None:
        if self.say is not None:
            self.say(line)
        else:
            print(line, file=sys.stderr, flush=True)

    # -------------------------------------------------------------- the thread

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception as e:  # noqa: BLE001 - a watchdog that fails must not stop the run
                self._say(f"dancegrpo-npu: the stall watchdog stopped: {type(e).__name__}: {e}")
                return

    def start(self) -> "Watchdog":
        if self.timeout != OFF:
            self._thread = threading.Thread(target=self._run, name="dancegrpo-stall-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> list:
        """Stop watching (an ending in progress finishes first); the stalls recorded."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return list(self.stalls)


def _at(rank: dict) -> str:
    at = rank.get("at")
    if not at:
        return "no stack (the rank did not answer)"
    text = ("waiting in a collective " if rank.get("in_collective") else "") + f"at {Frame(**at).words()}"
    if rank.get("called_from"):
        text += f", called from {Frame(**rank['called_from']).words()}"
    return text


def short_verdict(record: dict) -> str:
    """The first suspect in a few words (summary.json's failure.error; `runs` shows it)."""
    first = record["ranks"][0]
    return (f"rank {first['rank']} stalled in {first['where']}: no progress for {first['ago_s']:.0f} s "
            f"(limit {record['limit_s']:.0f} s), {_at(first)}")


def verdict_line(record: dict) -> str:
    """Every local rank in one line: the stalled ones (the first suspect first) with their last
    event, its step, how long ago and the line each is on; the others in short."""
    parts = []
    for r in record["ranks"]:
        if r["stalled"]:
            who = f"rank {r['rank']}" + (" (first suspect)" if r["rank"] == record["first_suspect"] else "")
            parts.append(f"{who} in {r['where']}, {r['ago_s']:.0f} s ago, {_at(r)}")
        else:
            parts.append(f"rank {r['rank']} progressed {r['ago_s']:.0f} s ago ({r['where']}), {_at(r)}")
    stalled = sum(1 for r in record["ranks"] if r["stalled"])
    return (f"stalled: {stalled} of {len(record['ranks'])} local rank{'s' if len(record['ranks']) != 1 else ''} "
            f"made no progress for {record['limit_s']:.0f} s: " + "; ".join(parts)
            + f"; stacks in {record['stacks']}; ending the workers (SIGTERM, SIGKILL after {record['grace_s']:.0f} s)")
