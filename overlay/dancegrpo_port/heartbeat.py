"""Each rank's progress and its stacks, for the stall watchdog of the process that runs torchrun.

The seam's dispatcher (hooks.py) marks every event the trainer passes to it: its name, the step
and the time, in memory (``mark``: a tuple assigned, nothing written, nothing waited for).  A
daemon thread writes the latest mark, at most once a second and only when it changed, to
``<run>/heartbeats/rank-N.json`` (written to a temporary file, then ``os.replace``: a reader
never sees half a file).  Because the thread writes what the main thread last marked, the event
a rank stopped after is on disk within a second, however soon after the previous one it came.

At ``start`` the rank also registers ``faulthandler`` on ``contract.STACKS_SIGNAL`` (all
threads, not chained), into ``<run>/stacks/rank-N.txt``, opened for appending: a restarted rank
keeps what an earlier attempt dumped.  faulthandler writes from its C signal handler, so a rank
whose main thread is blocked inside a collective (gloo, HCCL) or a sleep still answers.  A rank
that ends normally removes its stacks file when nothing was dumped into it.

Where: launch sets ``contract.RUN_DIR_ENV`` to the run directory; without it (a run started by
hand, a test that imports the seam) nothing is written and nothing is registered.

What the file says (JSON): ``rank``, ``local_rank``, ``pid``, ``host``, ``thread`` (the main
thread's id, as faulthandler names it), ``attempt`` (torchrun's restart count), ``started``,
``event``, ``step``, ``detail``, ``time`` (of the event), ``first_step`` (when the first step
began, None while loading), ``slowest_step`` (the longest step_begin -> step_end so far),
``longest_gap`` (the longest time between two events after the first step began), ``events``
(how many) and ``written``.  Standard library only.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import threading
import time

from dancegrpo_port.contract import (
    HEARTBEAT_DIR, HEARTBEAT_FILE, RUN_DIR_ENV, STACKS_DIR, STACKS_FILE, STACKS_SIGNAL,
)

INTERVAL_S = 1.0  # at most one write a second per rank


class Heartbeat:
    """One rank's marks, written by a background thread (``start``) to its heartbeat file."""

    def __init__(self, run_dir: str, rank: int, environ=None, clock=time.time):
        environ = os.environ if environ is None else environ
        self.rank, self.clock = rank, clock
        self.path = os.path.join(run_dir, HEARTBEAT_DIR, HEARTBEAT_FILE.format(rank=rank))
        self.stacks_path = os.path.join(run_dir, STACKS_DIR, STACKS_FILE.format(rank=rank))
        now = clock()
        self.fixed = {"rank": rank, "local_rank": _int(environ.get("LOCAL_RANK"), rank), "pid": os.getpid(),
                      "host": socket.gethostname(), "thread": f"0x{threading.main_thread().ident:016x}",
                      "attempt": _int(environ.get("TORCHELASTIC_RESTART_COUNT"), 0), "started": now}
        self.last = ("run_start", None, None, now)  # (event, step, detail, time): the main thread's last mark
        self.events = 0
        self.step = None
        self.first_step = self.step_began = self.slowest_step = None
        self.longest_gap = 0.0
        self.written = None  # the mark last written
        self.stacks = None
        self._stop = threading.Event()
        self._thread = None

    # ------------------------------------------------------------ the trainer's side

    def mark(self, event: str, step=None, detail=None) -> None:
        """An event of the seam: in memory only (the thread writes it)."""
        now = self.clock()
        if self.first_step is not None:  # loading before the first step is no gap between events
            self.longest_gap = max(self.longest_gap, now - self.last[3])
        if step is None:
            step = self.step
        if event == "step_begin":
            self.step = step
            self.step_began = now
            if self.first_step is None:
                self.first_step = now
        elif event == "step_end" and self.step_began is not None:
            took = now - self.step_began
            self.slowest_step = took if self.slowest_step is None else max(self.slowest_step, took)
            self.step_began = None
        self.events += 1
        self.last = (event, step, detail, now)

    # ------------------------------------------------------------ the file

    def record(self) -> dict:
        event, step, detail, when = self.last
        return {**self.fixed, "event": event, "step": step, "detail": detail, "time": when,
                "first_step": self.first_step, "slowest_step": self.slowest_step,
                "longest_gap": self.longest_gap, "events": self.events, "written": self.clock()}

    def write(self) -> None:
        """The latest mark to the file, when it changed since the last write (tmp + os.replace)."""
        last = self.last
        if last is self.written:
            return
        data = json.dumps(self.record())
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(data + "\n")
            os.replace(tmp, self.path)
            self.written = last
        except OSError:
            pass  # a full disk must not stop training: the watchdog then sees no progress

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self.write()

    def start(self) -> None:
        """Write the first mark, start the writer thread and register the stacks signal."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        os.makedirs(os.path.dirname(self.stacks_path), exist_ok=True)
        self.write()
        self._thread = threading.Thread(target=self._run, name="dancegrpo-heartbeat", daemon=True)
        self._thread.start()
        try:
            self.stacks = open(self.stacks_path, "a")
            faulthandler.register(getattr(signal, STACKS_SIGNAL), file=self.stacks, all_threads=True, chain=False)
        except (OSError, AttributeError, ValueError, RuntimeError):
            self.stacks = None  # no stacks on request: the heartbeat still works

    def stop(self) -> None:
        """The end of the run: the last mark written, the thread stopped, an empty stacks file removed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * INTERVAL_S)
        self.write()
        if self.stacks is not None:
            faulthandler.unregister(getattr(signal, STACKS_SIGNAL))
            self.stacks.close()
            self.stacks = None
            try:
                if os.path.getsize(self.stacks_path) == 0:
                    os.remove(self.stacks_path)
            except OSError:
                pass


def _int(text, default: int) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


_CURRENT: list = [None]  # this process's Heartbeat, once run_start made it


def start(rank: int, environ=None) -> Heartbeat | None:
    """At run_start: this rank's heartbeat, when launch named the run directory; else None."""
    environ = os.environ if environ is None else environ
    run_dir = environ.get(RUN_DIR_ENV)
    stop()
    if not run_dir:
        return None
    beat = Heartbeat(run_dir, rank, environ)
    beat.start()
    _CURRENT[0] = beat
    return beat


def current() -> Heartbeat | None:
    return _CURRENT[0]


def mark(event: str, step=None, detail=None) -> None:
    """The seam's event, when this process has a heartbeat (else nothing)."""
    beat = _CURRENT[0]
    if beat is not None:
        beat.mark(event, step, detail)


def stop() -> None:
    beat, _CURRENT[0] = _CURRENT[0], None
    if beat is not None:
        beat.stop()
