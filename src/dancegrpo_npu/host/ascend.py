"""Facts about an Ascend host that launch and doctor both need, read without importing torch.

- The NPU environment a training job gets: Ascend's own DanceGRPO launch in MindSpeed-MM
  (its ``examples/dancegrpo/`` post-training script) sets these; each is a default that the
  user's environment or ``--env KEY=VALUE`` overrides.
- Which NPUs this host has: the driver creates one ``/dev/davinci<N>`` node per NPU (inside a
  container, one per NPU mapped in).  ``ASCEND_RT_VISIBLE_DEVICES`` takes logical ids
  ``0..count-1`` over those, like CUDA_VISIBLE_DEVICES, but torch_npu (2.7.1.post10, 2.10.0.post6,
  2.10.0.post7) counts them only in strictly ascending order: for ``3,2`` (or ``1,1``)
  ``torch.npu.device_count()`` is 0 (``torch_npu/npu/__init__.py``, ``_device_count_ascend_hal``:
  "`rts` need ascending order").  From 2.10.0.post7 ``is_available()`` is the CANN runtime's own
  count instead, which may be True for such a list: count NPUs with ``device_count()``.
- CANN: where it is and its version are ``torch_stack``'s (the same rule chooses the torch pair).
  The driver's version is the ``Version=`` line of ``/usr/local/Ascend/driver/version.info``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.host.torch_stack import read_key

DRIVER_VERSION_FILE = Path("/usr/local/Ascend/driver/version.info")


@dataclass(frozen=True)
class EnvDefault:
    name: str
    value: str
    why: str


NPU_ENV_DEFAULTS: tuple[EnvDefault, ...] = (
    EnvDefault("TASK_QUEUE_ENABLE", "2", "level-2 task queue: operators are dispatched from a second thread"),
    EnvDefault("COMBINED_ENABLE", "1", "fuse discontiguous-tensor copies into one operator"),
    EnvDefault("CPU_AFFINITY_CONF", "2", "bind each rank's threads to the CPU cores near its NPU"),
    EnvDefault("HCCL_CONNECT_TIMEOUT", "1200", "seconds HCCL waits for all ranks to connect (model loading is slow)"),
    EnvDefault("HCCL_BUFFSIZE", "800", "MB of HCCL communication buffer per rank"),
    EnvDefault("NPU_ASD_ENABLE", "0", "silent-data-corruption detection off (its checks cost step time)"),
    EnvDefault("ACLNN_CACHE_LIMIT", "100000", "aclnn operator cache entries (many shapes in sampling)"),
    EnvDefault(
        "MULTI_STREAM_MEMORY_REUSE", "2",
        "reuse memory across streams; torch_npu's docs call 2 'not recommended' (it keeps strong references "
        "to tensors); MindSpeed-MM's DanceGRPO launch sets it",
    ),
    EnvDefault(
        "PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True", "caching allocator grows segments instead of failing"
    ),
    EnvDefault("ASCEND_GLOBAL_LOG_LEVEL", "3", "CANN logs errors only (3 = ERROR)"),
    EnvDefault("ASCEND_SLOG_PRINT_TO_STDOUT", "0", "CANN logs go to ~/ascend/log, not into the rank logs"),
    EnvDefault("ASCEND_LAUNCH_BLOCKING", "0", "asynchronous launch; set 1 to find the operator that failed"),
)


def davinci_count(dev_dir: Path = Path("/dev")) -> int:
    """How many NPUs this host shows: the /dev/davinci<N> nodes (davinci_manager is not one)."""
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return 0
    return sum(1 for n in names if re.fullmatch(r"davinci\d+", n))


def parse_visible_devices(value: str, var: str = "ASCEND_RT_VISIBLE_DEVICES") -> list[int]:
    ids: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit():
            raise DancegrpoError(
                f"{var}={value!r} is not a comma-separated list of device numbers",
                f"set it like {var}=0,1,2,3",
                exit_code=2,
            )
        ids.append(int(part))
    if any(b <= a for a, b in zip(ids, ids[1:])):
        works = ",".join(str(i) for i in sorted(set(ids)))
        twice = sorted({i for i in ids if ids.count(i) > 1})
        what = f"names device {twice[0]} twice" if twice else "is not in ascending order"
        raise DancegrpoError(
            f"{var}={value!r} {what}: torch_npu then sees no NPU at all (device_count() is 0)",
            f"list each NPU once, in ascending order: {var}={works}",
            exit_code=2,
        )
    return ids


def check_visible_devices(
    value: str, nproc_per_node: int, count: int | None, var: str = "ASCEND_RT_VISIBLE_DEVICES"
) -> list[int]:
    """The visible-device list, checked against the process count and (unless ``count`` is
    None: the NPUs are on another host) against the NPUs present."""
    ids = parse_visible_devices(value, var)
    missing = [i for i in ids if count is not None and i >= count]
    if missing:
        have = f"NPUs 0-{count - 1}" if count else "no NPU"
        raise DancegrpoError(
            f"{var}={value} names device {missing[0]}, but this host shows {have} (/dev/davinci*)",
            "list only NPUs that exist (`npu-smi info` shows them), or run with --device cpu|cuda",
            exit_code=2,
        )
    if len(ids) != nproc_per_node:
        raise DancegrpoError(
            f"{var}={value} makes {len(ids)} NPU(s) visible but --nproc-per-node is {nproc_per_node}",
            "run one process per visible NPU: make the two agree",
            exit_code=2,
        )
    return ids


def driver_version(path: Path = DRIVER_VERSION_FILE) -> str | None:
    return read_key(path, "Version")


# torch_npu's PathManager._input_path_common_check, applied by its profiler to the REAL absolute
# path of each trace folder (utils/_path_manager.py, profiler/_profiler_path_creator.py).  The
# plain 2.7.1 wheel raised there, and its profiler swallows what it raises (no_exception_func): a
# refused path gave no trace, no error.  The wheels bootstrap installs on CANN 9.1.x (2.7.1.post10,
# 2.10.0.post6) and 2.10.0.post7 only warn and write the trace.
PROFILER_PATH_PATTERN = r"(\.|/|_|-|\s|[~0-9a-zA-Z]|[\u4e00-\u9fa5])+"
PROFILER_MAX_PATH = 4096
PROFILER_MAX_NAME = 255
# what the trainer adds under the directory: step_<N>/rank_<R>_<pid>_<17-digit time>_ascend_pt
PROFILER_TRACE_TAIL = "/step_99999/rank_9999_9999999_20260101000000000_ascend_pt"


# The torch_npu wheels read for what their profiler does with a path its rule refuses: plain 2.7.1
# (CANN 8.3.RC1's) swallows the error and writes no trace; these warn and write it
# (tests/npu/test_torch_npu_wheel.py reads them).  Any other wheel is taken to drop the trace.
PROFILER_WRITES_REFUSED_PATHS = ("2.7.1.post10", "2.10.0.post6", "2.10.0.post7")


def check_profiler_dir(directory: Path, torch_npu_version: str | None = None) -> None:
    """Refuse a trace directory whose traces the job's torch_npu profiler would silently not
    write (``torch_npu_version``: the job's, None where it is not installed here)."""
    real = os.path.realpath(directory)
    path = real + PROFILER_TRACE_TAIL
    bad = sorted({c for c in real if not re.fullmatch(PROFILER_PATH_PATTERN, c)})
    if bad:
        problem = f"has {', '.join(repr(c) for c in bad)}; it allows letters, digits, '.', '/', '_', '-', '~' and spaces"
    elif len(path) > PROFILER_MAX_PATH or any(len(n) > PROFILER_MAX_NAME for n in real.split("/")):
        problem = f"is longer than its limits ({PROFILER_MAX_PATH} characters, {PROFILER_MAX_NAME} per name)"
    else:
        return
    wheel = (torch_npu_version or "").split("+")[0]
    if wheel in PROFILER_WRITES_REFUSED_PATHS:
        return  # it warns and writes the trace
    have = f"torch_npu {wheel}" if wheel else "torch_npu not installed here"
    raise DancegrpoError(
        f"--profile: the real path of the traces, {real}, {problem}: torch_npu's profiler would write no trace "
        f"and raise nothing (so does 2.7.1; {', '.join(PROFILER_WRITES_REFUSED_PATHS)} write it with a warning; "
        f"this job has {have})",
        "put the runs where the real path has none: --runs-dir DIR (or DANCEGRPO_RUNS; a symbolic link helps only "
        "if its target's path is clean, the rule reads the real path)",
        exit_code=2,
    )
