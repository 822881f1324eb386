"""Phase times, peak memory and profiler traces of GRPO steps.

Two features on the seam (dancegrpo_port/hooks.py): ``PhaseTimes`` (time_<phase> seconds and
peak memory in every step's metrics.jsonl line) and ``Profile`` (``--profile_steps``).
Self-contained: it needs torch and ``dancegrpo_port.device`` only.

A GRPO step is four phases - ``rollout`` (sampling), ``decode`` (the VAE), ``reward``,
``train`` - and :class:`PhaseTimer` times each with the device synchronised at both ends
(kernels are asynchronous: without the synchronisation a phase's time would land in the
next one).  Entering a phase again within a step adds to its time (a batched rollout
samples, decodes and scores chunk after chunk).  Peak memory per phase is the device
allocator's ``max_memory_allocated`` after ``reset_peak_memory_stats`` on CUDA and the
NPU; on the CPU it is the process's peak RSS (``VmHWM``, reset by writing ``5`` to
``/proc/self/clear_refs``; ``ru_maxrss``, never reset, where that is not allowed), which
includes the weights.  ``dancegrpo-npu bench`` times the trainer's steps with this timer
too, so bench and training-run figures compare.

:class:`StepProfiler` writes a profiler trace of chosen steps: ``torch_npu.profiler`` on
the NPU (MindStudio Insight reads its ``*_ascend_pt`` folders), ``torch.profiler``
elsewhere (a Chrome trace JSON: Perfetto, TensorBoard).  Each phase is a
``record_function`` range, so the trace shows the four phases by name.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import resource
import sys
import time
from pathlib import Path

import torch

from dancegrpo_port.contract import DEVICE_KINDS, OPTIONAL_PHASES, PHASES, parse_steps
from dancegrpo_port.feature import Feature

DEVICE_PEAK_KIND = "device allocator"
HOST_PEAK_KIND = "host peak RSS (includes weights)"


def _active_kind() -> str:
    from dancegrpo_port import device

    return device.accelerator().kind


class PhaseTimer:
    """Wall seconds and peak memory of each phase of a step; see the module docstring."""

    def __init__(self, kind: str | None = None):
        self.kind = kind or _active_kind()
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"PhaseTimer: device kind {self.kind!r} is not one of cpu, cuda, npu")
        self._module = None if self.kind == "cpu" else getattr(torch, self.kind)
        self.peak_memory_kind = HOST_PEAK_KIND if self._module is None else DEVICE_PEAK_KIND
        self._current: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._seconds = dict.fromkeys(PHASES, 0.0)
        self._peaks: dict[str, int] = {}

    def _sync(self) -> None:
        if self._module is not None:
            self._module.synchronize()

    def _reset_peak(self) -> bool:
        """Start a new peak; False where the CPU's peak RSS cannot be reset."""
        if self._module is not None:
            self._module.reset_peak_memory_stats()
            return True
        try:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
            return True
        except OSError:
            return False

    def _peak(self, was_reset: bool) -> int | None:
        if self._module is not None:
            return int(self._module.max_memory_allocated())
        if was_reset:
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in Path("/proc/self/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        # the process's peak since it started: an upper bound of the phase's peak
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss) if sys.platform == "darwin" else int(rss) * 1024  # bytes on macOS, KiB on Linux

    @contextlib.contextmanager
    def phase(self, name: str):
        if name not in PHASES + OPTIONAL_PHASES:
            raise ValueError(f"unknown phase {name!r}: the phases are {', '.join(PHASES + OPTIONAL_PHASES)}")
        if self._current is not None:
            # a nested phase would reset the outer one's peak and count its time twice
            raise RuntimeError(f"phase {name!r} entered inside phase {self._current!r}: phases do not nest")
        self._current = name
        try:
            self._sync()
            was_reset = self._reset_peak()
            start = time.perf_counter()
            with torch.profiler.record_function(name):
                yield
                self._sync()  # inside the range, so the trace's range covers the device work
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - start
            peak = self._peak(was_reset)
            if peak is not None:
                self._peaks[name] = max(peak, self._peaks.get(name, 0))
        finally:
            self._current = None

    def step_metrics(self) -> dict:
        """This step's figures for metrics.jsonl, then a fresh step.  A phase not entered
        has time 0.0 and no peak; an optional phase not entered has neither."""
        metrics = {f"time_{p}": self._seconds[p] for p in PHASES + OPTIONAL_PHASES if p in self._seconds}
        metrics["peak_memory_bytes"] = {p: self._peaks[p] for p in PHASES + OPTIONAL_PHASES if p in self._peaks}
        metrics["peak_memory_kind"] = self.peak_memory_kind
        self._reset()
        return metrics


class StepProfiler:
    """A profiler trace of each chosen step, in ``out_dir/step_<N>/`` (every rank writes its
    own file, named by rank).  ``steps`` in the shared step syntax ("all": every step); None or
    "" means off: then every call is a no-op."""

    def __init__(self, steps: str | None, out_dir: str = "./profile"):
        off = steps in (None, "")
        chosen = None if off else parse_steps(steps, "--profile_steps")
        self.every_step = not off and chosen is None
        self.steps = chosen or frozenset()
        self.out_dir = Path(out_dir)
        self._open: tuple[int, object] | None = None  # (step, profiler) being traced
        self._kind: str | None = None
        if self.enabled:  # a step that raises never reaches step_end: its trace shows where it failed
            atexit.register(self.close, synchronize=False)

    @property
    def enabled(self) -> bool:
        return self.every_step or bool(self.steps)

    def step_begin(self, step: int) -> None:
        if not (self.every_step or step in self.steps):
            return
        self.close()  # a step whose step_end never came
        self._kind = self._kind or _active_kind()
        directory = self.out_dir / f"step_{step}"
        directory.mkdir(parents=True, exist_ok=True)
        profiler = self._make(directory)
        profiler.start()
        self._open = (step, profiler, directory)

    def step_end(self, step: int) -> None:
        if self._open is not None and self._open[0] == step:
            self.close()

    def close(self, synchronize: bool = True) -> None:
        """Stop the open trace, if any; stopping writes its files.  At exit after a failure
        the device is not synchronised: a failed step's kernels may never finish."""
        if self._open is None:
            return
        step, profiler, directory = self._open
        self._open = None
        if synchronize and self._kind != "cpu":
            getattr(torch, self._kind).synchronize()  # the step's kernels belong in its trace
        profiler.stop()
        if not self._trace_written(directory):
            print(self._no_trace_message(step, directory), file=sys.stderr, flush=True)

    def _worker(self) -> str:
        return f"rank_{int(os.environ.get('RANK', '0'))}"

    def _trace_written(self, directory: Path) -> bool:
        # torch_npu: <worker>_<pid>_<time>_ascend_pt/; torch.profiler: <worker>.<time>.pt.trace.json
        pattern = f"{self._worker()}_*_ascend_pt" if self._kind == "npu" else f"{self._worker()}.*.pt.trace.json"
        return any(directory.glob(pattern))

    def _no_trace_message(self, step: int, directory: Path) -> str:
        text = f"profile: step {step} left no trace in {os.path.realpath(directory)}"
        if self._kind == "npu":
            # it logs its own exceptions ("[ERROR] ... profiler.py: Call ... failed") and carries on
            text += "; torch_npu's profiler failed without raising: its [ERROR] line above says why"
        return text

    def _make(self, directory: Path):
        # torch_npu accepts letters, digits and underscores in a worker name
        worker = self._worker()
        if self._kind == "npu":
            from torch_npu import profiler as p

            return p.profile(
                activities=[p.ProfilerActivity.CPU, p.ProfilerActivity.NPU],
                on_trace_ready=p.tensorboard_trace_handler(str(directory), worker_name=worker),
                record_shapes=True, profile_memory=True)
        p = torch.profiler
        activities = [p.ProfilerActivity.CPU] + ([p.ProfilerActivity.CUDA] if self._kind == "cuda" else [])
        return p.profile(
            activities=activities,
            on_trace_ready=p.tensorboard_trace_handler(str(directory), worker_name=worker),
            record_shapes=True, profile_memory=True)


# ---------------------------------------------------------------- the features on the seam


class PhaseTimes(Feature):
    """Each phase of the step timed (the seam's sampling, decoding, rewarding and training
    contexts); the step's figures get time_<phase>, peak_memory_bytes and peak_memory_kind."""

    def __init__(self, timer: PhaseTimer):
        self.timer = timer

    def sampling(self):
        return self.timer.phase("rollout")

    def decoding(self, vae):
        return self.timer.phase("decode")

    def rewarding(self, model):
        return self.timer.phase("reward")

    def conditioning(self, model):
        return self.timer.phase("condition")

    def training(self):
        return self.timer.phase("train")

    def step_end(self, step: int, figures: dict) -> None:
        figures.update(self.timer.step_metrics())  # this rank's; every rank: it starts the next step


class Profile(Feature):
    """``--profile_steps``: a profiler trace of each chosen step (written once the step's time
    is taken: writing the trace is not the step's time)."""

    def __init__(self, profiler: StepProfiler):
        self.profiler = profiler

    def step_begin(self, step: int) -> None:
        self.profiler.step_begin(step)

    def step_end(self, step: int, figures: dict) -> None:
        self.profiler.step_end(step)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--profile_steps",
        type=str,
        default=None,
        help="write a profiler trace of these steps to ./profile/step_N/, e.g. 3, 2-4 or 1,5",
    )


def argument_problem(args, environ=None) -> str | None:
    """What is wrong with --profile_steps (one line), or None (``environ``: not read)."""
    steps = getattr(args, "profile_steps", None)
    if steps in (None, ""):
        return None
    try:
        parse_steps(steps, "--profile_steps")
    except ValueError as exc:
        return str(exc)
    return None
