"""FAKE ``torch_npu.profiler`` (see torch_npu/__init__.py): it writes folders, never a trace.

EMULATED, as the sources of the wheels the fake follows (profiler/profiler.py,
_profiler_path_creator.py, utils/_path_manager.py) do it:

* every public call swallows its exceptions (``no_exception_func``): it prints
  ``[time] [ERROR] [pid] profiler.py: Call <name> failed. Exception: <text>`` to stdout and
  returns None, so a refused call gives no trace and no error (a ``dir_name`` that is a
  file, a trace folder that cannot be made);
* the path rule WARNS, it refuses nothing: ``dir_name`` is expanded and resolved
  (``os.path.realpath``; a symbolic link gives the warning "Invalid input path is a soft
  chain: ..." - "symbolic link" in 2.10.0.post7, ``VERSION_RULES`` - and is followed), then
  the trace folder's absolute real path is held to ``(\\.|/|_|-|\\s|[~0-9a-zA-Z]|[\\u4e00-\\u9fa5])+``,
  4096 characters and 255 per component, each breach a ``UserWarning`` ("Invalid input path:
  ...", "Length of input path exceeds the limit.") and the trace is written all the same.
  (the plain 2.7.1 wheel, CANN 8.3.RC1's, raised there and lost the trace);
* ``tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True,
  async_mode=False)`` checks ``dir_name`` when it is called: refused, it returns None (no
  ``on_trace_ready``); ``profile`` takes keyword arguments only (among them
  ``custom_trace_id_callback``, before ``use_cuda``), and ``start()`` creates the
  trace folder ``<dir>/<worker_name or hostname>_<pid>_<%Y%m%d%H%M%S%f minus 3 digits>_ascend_pt``
  (checked again as a whole); ``stop()`` calls ``on_trace_ready``;
* ``ProfilerActivity.CPU`` / ``ProfilerActivity.NPU``.

NOT emulated: what the real one collects.  ``stop()`` writes ``FAKE_NOT_A_TRACE`` into the
trace folder so a test can see where the trace went; without ``on_trace_ready`` the real
profiler writes into a temporary folder it deletes, the fake writes nothing.  Every call
lands in ``torch_npu.calls``.
"""

from __future__ import annotations

import enum
import functools
import os
import re
import socket
import time
import warnings
from datetime import datetime, timezone

import torch_npu

__fake__ = True

MAX_PATH_LENGTH = 4096
MAX_FILE_NAME_LENGTH = 255
MAX_WORKER_NAME_LENGTH = 226
PATH_PATTERN = r"(\.|/|_|-|\s|[~0-9a-zA-Z]|[\u4e00-\u9fa5])+"


class ProfilerActivity(enum.Enum):
    CPU = "CPU"
    NPU = "NPU"


def _print_error_msg(message: str) -> None:
    stamp = time.strftime("[%Y-%m-%d %H:%M:%S]", time.localtime())
    print(f"{stamp} [ERROR] [{os.getpid()}] profiler.py: {message}", flush=True)


def no_exception_func(default_ret=None):
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            try:
                return func(*args, **kwargs)
            except Exception as ex:  # noqa: BLE001 - what torch_npu's profiler does
                _print_error_msg(f"Call {func.__name__} failed. Exception: {ex}")
                return default_ret
        return wrapper
    return decorator


def _check_input_directory_path(path: str) -> None:
    """utils._path_manager.PathManager.check_input_directory_path: warnings, then a file is refused."""
    if len(path) > MAX_PATH_LENGTH:
        warnings.warn("Length of input path exceeds the limit.")
    if os.path.islink(path):
        warnings.warn(f"Invalid input path is a {torch_npu.RULES['symlink_word']}: {path}")
    if not re.fullmatch(PATH_PATTERN, path):
        warnings.warn(f"Invalid input path: {path}")
    if any(len(name) > MAX_FILE_NAME_LENGTH for name in path.split("/")):
        warnings.warn("Length of input path exceeds the limit.")
    if os.path.isfile(path):
        raise RuntimeError("Invalid input path is a file path: {path}" + torch_npu._pta_error(1, "invalid parameter"))


def _get_realpath(path: str) -> str:
    """profiler.analysis.prof_common_func._path_manager.ProfilerPathManager.get_realpath."""
    if not path:
        raise RuntimeError("Input path is empty, please check. ErrorType: resource unavailable")
    path = os.path.expanduser(path)
    if os.path.islink(path):
        warnings.warn(f"Invalid input path is a {torch_npu.RULES['symlink_word']}: {path}")
    return os.path.realpath(path)


class _PathCreator:
    """profiler._profiler_path_creator.ProfPathCreator (one per process in the real one too)."""

    worker_name: str | None = None
    dir_path: str | None = None

    @classmethod
    def init(cls, worker_name=None, dir_name=None) -> None:
        ok_name = isinstance(worker_name, str) and 0 < len(worker_name) < MAX_WORKER_NAME_LENGTH
        cls.worker_name = worker_name if ok_name else None
        if isinstance(dir_name, str) and dir_name:
            dir_path = _get_realpath(dir_name)
            _check_input_directory_path(dir_path)
            cls.dir_path = dir_path
        else:
            cls.dir_path = None

    @classmethod
    def create_prof_dir(cls) -> str:
        dir_path = cls.dir_path or os.getcwd()
        worker = f"{cls.worker_name or socket.gethostname()}_{os.getpid()}"
        stamp = datetime.now(tz=timezone.utc).astimezone().strftime("%Y%m%d%H%M%S%f")[:-3]
        prof_path = os.path.join(dir_path, f"{worker}_{stamp}_ascend_pt")
        _check_input_directory_path(prof_path)
        os.makedirs(prof_path, mode=0o750, exist_ok=True)
        return prof_path


@no_exception_func()
def tensorboard_trace_handler(dir_name: str = None, worker_name: str = None, analyse_flag: bool = True,
                              async_mode: bool = False):
    torch_npu.calls.append(("profiler.tensorboard_trace_handler",
                            {"dir_name": dir_name, "worker_name": worker_name, "analyse_flag": analyse_flag}))
    _PathCreator.init(worker_name=worker_name, dir_name=dir_name)

    def handler_fn(prof_inst) -> None:
        if prof_inst.prof_path is not None:
            with open(os.path.join(prof_inst.prof_path, "FAKE_NOT_A_TRACE"), "w") as f:
                f.write(f"fake torch_npu.profiler, pid {os.getpid()}\n")
        torch_npu.calls.append(("profiler.trace_ready", {"folder": prof_inst.prof_path}))

    return handler_fn


class profile:  # noqa: N801  (torch_npu's name)
    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
                 profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
                 experimental_config=None, custom_trace_id_callback=None, use_cuda=None):
        self.on_trace_ready = on_trace_ready
        self.prof_path: str | None = None
        self.stopped = True
        torch_npu.calls.append(("profiler.profile", {
            "activities": [a.value for a in (activities or [])], "schedule": schedule,
            "on_trace_ready": on_trace_ready is not None,
            "record_shapes": record_shapes, "profile_memory": profile_memory, "with_stack": with_stack}))

    @no_exception_func()
    def start(self):
        self.stopped = False
        torch_npu.calls.append(("profiler.start", {}))
        if self.on_trace_ready:
            self.prof_path = _PathCreator.create_prof_dir()

    @no_exception_func()
    def stop(self):
        torch_npu.calls.append(("profiler.stop", {}))
        self.stopped = True
        if self.on_trace_ready:
            self.on_trace_ready(self)

    @no_exception_func()
    def step(self):
        torch_npu.calls.append(("profiler.step", {}))

    @no_exception_func()
    def __enter__(self):
        self.start()
        return self

    @no_exception_func()
    def __exit__(self, exe_type, exe_val, exc_tb):
        self.stop()
