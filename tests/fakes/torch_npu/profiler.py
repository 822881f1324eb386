"""FAKE ``torch_npu.profiler`` (see torch_npu/__init__.py): records what it is asked, profiles nothing.

What it imitates, from the Ascend Extension for PyTorch API reference (torch_npu.profiler.profile,
ProfilerActivity, tensorboard_trace_handler):

* ``ProfilerActivity.CPU`` / ``ProfilerActivity.NPU``;
* ``tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True)``: a callable for
  ``on_trace_ready``; a ``dir_name`` or ``worker_name`` with characters outside letters, digits,
  ``. / _ -``, ``~`` and spaces, or a ``dir_name`` that is a symbolic link, is refused, as the input-path
  check of torch_npu's profiler (``PathManager``) refuses it (the documentation is stricter: letters,
  digits and underscores);
* ``profile(activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
  profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
  experimental_config=None)`` with ``start()``, ``stop()``, ``step()`` and the context manager;
  ``stop()`` calls ``on_trace_ready(prof)`` (no schedule: the whole start..stop is one trace).

What the handler writes is NOT a trace: the real one writes ``<worker>_<timestamp>_ascend_pt/``
with the collected data; the fake writes ``<worker>_fake_ascend_pt/FAKE_NOT_A_TRACE`` so a test
can see where the trace would go.  Every call lands in ``torch_npu.calls``.
"""

from __future__ import annotations

import enum
import os
import re
from pathlib import Path

import torch_npu

__fake__ = True


class ProfilerActivity(enum.Enum):
    CPU = "CPU"
    NPU = "NPU"


def _check_path(what: str, value: str | None) -> None:
    if value is None:
        return
    if not re.fullmatch(r"(\.|/|_|-|\s|[~0-9a-zA-Z])+", value) or os.path.islink(value):
        raise RuntimeError(f"fake torch_npu.profiler: invalid input path ({what}): {value}")


def tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True):
    _check_path("dir_name", dir_name)
    _check_path("worker_name", worker_name)
    torch_npu.calls.append(("profiler.tensorboard_trace_handler",
                            {"dir_name": dir_name, "worker_name": worker_name, "analyse_flag": analyse_flag}))

    def handler(prof):
        folder = Path(dir_name or ".") / f"{worker_name or 'worker'}_fake_ascend_pt"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "FAKE_NOT_A_TRACE").write_text(f"fake torch_npu.profiler, pid {os.getpid()}\n")
        torch_npu.calls.append(("profiler.trace_ready", {"folder": str(folder)}))

    return handler


class profile:  # noqa: N801  (torch_npu's name)
    def __init__(self, activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
                 profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
                 experimental_config=None, use_cuda=None):
        self.on_trace_ready = on_trace_ready
        self.running = False
        torch_npu.calls.append(("profiler.profile", {
            "activities": [a.value for a in (activities or [])], "schedule": schedule,
            "record_shapes": record_shapes, "profile_memory": profile_memory, "with_stack": with_stack}))

    def start(self):
        if self.running:
            raise RuntimeError("fake torch_npu.profiler: start() while already started")
        self.running = True
        torch_npu.calls.append(("profiler.start", {}))

    def stop(self):
        if not self.running:
            raise RuntimeError("fake torch_npu.profiler: stop() without start()")
        self.running = False
        torch_npu.calls.append(("profiler.stop", {}))
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def step(self):
        torch_npu.calls.append(("profiler.step", {}))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
