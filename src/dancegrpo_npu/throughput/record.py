"""The bench's run directory: a run record as a launch writes one (``run/directory.py``), so
``runs`` and ``plot`` read a bench like a training run (``compare`` reads records, which a bench
does not write).

Layout of ``runs/<YYYYmmdd-HHMMSS>-bench-<trainer>-<size>/``::

    launch.json       what was asked: the verb, the trainer, the size and its sizes, the sample batch sizes, the tree
    environment.json  the fingerprint (host, devices, packages, upstream, series) with the bench's facts
    summary.json      status, start/end, wall time, steps, reward and loss figures; why a failed bench failed
    metrics.jsonl     one line per timed step, written by the trainer's seam (MetricsLog): time_<phase>,
                      peak_memory_bytes, loss, grad_norm, reward_mean, step_time, sample_batch_size
    bench.json        the results, as ``--json`` writes them
    logs/console.log  the trainer's prints and progress bars
    reward.txt        the trainer's mean reward of each step (warm-up steps included)

It is made once the memory check has passed: a refused bench leaves no run behind.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.files import write_atomic
from dancegrpo_npu.run import directory
from dancegrpo_npu.rundirs.rundir import metrics_summary


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


def start(project, facts: dict, start_time: float) -> Path:
    """A new run directory with launch.json and a "running" summary.json."""
    run_dir = directory.create_run_dir(project.runs_dir, f"bench-{facts['preset']}", start_time)
    try:
        (run_dir / "logs").mkdir()
        directory.write_json(run_dir / "launch.json", {
            "verb": "bench", "script": "bench", "device": facts["device_kind"], "world_size": 1,
            "bench": {k: v for k, v in facts.items() if k != "tree"}, "cwd": str(run_dir),
            "launched_from": os.getcwd(), "tree": facts.get("tree"),
        })  # fmt: skip
        directory.write_json(run_dir / "summary.json", summary(run_dir, "running", start_time, None, facts))
    except OSError as e:
        raise DancegrpoError(f"bench: cannot write the run directory {run_dir}: {e.strerror or e}",
                             "give a writable --runs-dir (or DANCEGRPO_RUNS)") from None
    return run_dir


def summary(run_dir: Path, status: str, start_time: float, end_time: float | None, facts: dict, **extra) -> dict:
    return {
        "status": status,
        "returncode": None if end_time is None else (0 if status == "succeeded" else 1),
        "script": "bench",
        "device": facts["device_kind"],
        "device_kind": facts["device_kind"],
        "world_size": 1,
        "start": _iso(start_time),
        "end": _iso(end_time) if end_time else None,
        "wall_time_s": round(end_time - start_time, 3) if end_time else None,
        **metrics_summary(run_dir),
        **extra,
    }


def finish(run_dir: Path, status: str, start_time: float, facts: dict, fingerprint: dict | None,
           document: dict | None, error: str | None) -> str | None:
    """The final summary.json, environment.json and (after a measurement) bench.json; returns
    why the record could not be written, or None.  That does not hide the bench's own result
    or error: the caller says it as a warning."""
    extra = {"failure": {"error": error}} if error else {}
    try:
        if fingerprint is not None:
            directory.write_json(run_dir / "environment.json", fingerprint)
        if document is not None:
            write_atomic(run_dir / "bench.json", json.dumps(document, indent=2) + "\n")
        directory.write_json(run_dir / "summary.json", summary(run_dir, status, start_time, time.time(), facts, **extra))
    except OSError as e:
        return f"the run directory {run_dir} could not be written to the end: {e.strerror or e}"
    return None
