"""Run directories read back: one directory per launch under ``runs/``.

Layout of ``runs/<YYYYmmdd-HHMMSS>-<name>/``::

    launch.json       what was asked and what ran: spec, script arguments, command, environment set
    command.sh        the same as a shell script: cd, exports, the torchrun command (re-runnable)
    environment.json  the fingerprint: host, devices, CANN, driver, package versions, upstream, series;
                      after the run also ``matmul_precision`` (TF32/HF32 as the trainer set them)
    summary.json      status, return code, start/end, wall time, steps, reward and loss figures
    logs/console.log  torchrun's own output with every rank's lines (each prefixed with its rank)
    logs/torchrun/    each rank's stdout.log / stderr.log (torchrun --log_dir --redirects)
    outputs/          the script's --output_dir (checkpoints), unless the user named another
    images/, reward.txt, metrics.jsonl, matmul_precision.json, wandb/   written by the script in its
                      working directory

``summary.json`` is written when the run starts (status "running") and rewritten when it ends,
whatever the end, so a run killed with the launcher still says what it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from dancegrpo_npu.contract import HEALTH_KEYS
from dancegrpo_npu.contract import OPTIONAL_PHASES
from dancegrpo_npu.contract import PHASES as STEP_PHASES
from dancegrpo_npu.contract import SDE_WINDOW_METRICS
from dancegrpo_npu.errors import DancegrpoError


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# GRPO health keys of metrics.jsonl (alignment contract; every run, recorded or not), and the
# grad norm upstream already logs.  A value is None where the step had no pairs to compute it on.
HEALTH_COLUMNS = ("grad_norm", *HEALTH_KEYS)

# Phase times of a GRPO step: the trainers write them through their seam (overlay
# dancegrpo_port/phases.py): time_<phase> seconds, and peak_memory_bytes {phase: bytes} with its
# kind, for every phase of the contract, those only some trainers enter too (an image-to-
# video trainer's condition).
TIMED_PHASES = STEP_PHASES + OPTIONAL_PHASES


@dataclass(frozen=True)
class Metrics:
    """Per-step figures of one run: from metrics.jsonl, else rewards from reward.txt."""

    steps: tuple[int, ...]
    reward: tuple[float, ...]
    loss: tuple[float, ...]  # empty when the source has no loss (reward.txt)
    step_time: tuple[float, ...]
    source: str | None  # "metrics.jsonl" | "reward.txt" | None
    skipped_lines: int = 0
    # HEALTH_COLUMNS present in metrics.jsonl: one value (or None) per step, aligned with steps
    health: dict[str, tuple[float | None, ...]] = field(default_factory=dict)
    # TIMED_PHASES present in metrics.jsonl (older runs: none): seconds, and peak bytes, per step
    phase_time: dict[str, tuple[float | None, ...]] = field(default_factory=dict)
    phase_peak: dict[str, tuple[float | None, ...]] = field(default_factory=dict)
    peak_memory_kind: str | None = None  # "device allocator" | "host peak RSS (includes weights)"
    # metrics.jsonl's first line that is no record, or why the file cannot be read (None: all read)
    problem: str | None = None
    # the steps trained with an SDE window (SDE_WINDOW_METRICS): (step, (start, end), timesteps trained a sample)
    sde_windows: tuple[tuple[int, tuple[int, int], int], ...] = ()

    def last(self, key: str) -> float | None:
        """The last non-null value of a health key (or reward_mean / loss), None without one."""
        column = {"reward_mean": self.reward, "loss": self.loss}.get(key) or self.health.get(key) or ()
        return next((v for v in reversed(column) if v is not None), None)

    def phase_means(self) -> dict[str, float]:
        """Mean seconds per step of each phase the run timed (step 1's warm-up included)."""
        out = {}
        for phase, column in self.phase_time.items():
            values = [v for v in column if v is not None]
            out[phase] = sum(values) / len(values)
        return out

    def phase_peaks(self) -> dict[str, float]:
        """The largest peak memory of each phase over the run's steps, in bytes."""
        return {phase: max(v for v in column if v is not None) for phase, column in self.phase_peak.items()}


def _num(x) -> float | None:
    """A number, or None.  NaN and inf are kept: a diverged run must show as diverged."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _complete(values: list) -> tuple[float, ...]:
    """A column, or () when some record lacks it (a half column would misalign with steps)."""
    return tuple(values) if all(v is not None for v in values) else ()


def _present(columns: dict[str, list]) -> dict[str, tuple]:
    return {k: tuple(v) for k, v in columns.items() if any(x is not None for x in v)}


def read_metrics(run_dir: Path) -> Metrics:
    """The run's per-step metrics.  A line that is no record (a truncated last line: a crash
    mid-write) is skipped, and the first such line is named in ``problem``."""
    jsonl = run_dir / "metrics.jsonl"
    problem = None
    try:
        text = jsonl.read_text(errors="replace") if jsonl.exists() else None
    except OSError as e:
        text, problem = None, f"{jsonl} cannot be read ({e.strerror or e})"
    if text is not None:
        steps, reward, loss, step_time, skipped = [], [], [], [], 0
        health: dict[str, list[float | None]] = {k: [] for k in HEALTH_COLUMNS}
        phase_time: dict[str, list[float | None]] = {p: [] for p in TIMED_PHASES}
        phase_peak: dict[str, list[float | None]] = {p: [] for p in TIMED_PHASES}
        peak_kind, windows = None, []
        window_key, trained_key = SDE_WINDOW_METRICS
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                step = int(rec["step"])
            except (ValueError, KeyError, TypeError):
                skipped += 1
                if problem is None:
                    after = f"after step {steps[-1]}" if steps else "before any step"
                    problem = f"{jsonl}: line {lineno} is not a JSON record with a step ({after}; a truncated write?)"
                continue
            steps.append(step)
            reward.append(_num(rec.get("reward_mean")))
            loss.append(_num(rec.get("loss")))
            step_time.append(_num(rec.get("step_time")))
            for key, column in health.items():
                column.append(_num(rec.get(key)))
            peaks = rec.get("peak_memory_bytes")
            peaks = peaks if isinstance(peaks, dict) else {}
            for phase in TIMED_PHASES:
                phase_time[phase].append(_num(rec.get(f"time_{phase}")))
                phase_peak[phase].append(_num(peaks.get(phase)))
            if isinstance(rec.get("peak_memory_kind"), str):
                peak_kind = rec["peak_memory_kind"]
            if isinstance(rec.get(window_key), list) and len(rec[window_key]) == 2:
                windows.append((step, tuple(rec[window_key]), rec.get(trained_key)))
        if steps:
            return Metrics(
                tuple(steps),
                _complete(reward),
                _complete(loss),
                _complete(step_time),
                "metrics.jsonl",
                skipped,
                _present(health),
                _present(phase_time),
                _present(phase_peak),
                peak_kind,
                problem,
                tuple(windows),
            )
    rewards_file = run_dir / "reward.txt"
    if rewards_file.is_file():
        rewards, skipped = [], 0
        for line in rewards_file.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            v = _num(line.strip())
            if v is None:
                skipped += 1
            else:
                rewards.append(v)
        if rewards:
            return Metrics(tuple(range(1, len(rewards) + 1)), tuple(rewards), (), (), "reward.txt", skipped,
                           problem=problem)
    return Metrics((), (), (), (), None, problem=problem)


def _figures(values: tuple[float, ...]) -> dict | None:
    if not values:
        return None
    return {
        "first": values[0],
        "last": values[-1],
        "mean": sum(values) / len(values),
        "min": min(values),
        "max": max(values),
        "count": len(values),
    }


def metrics_summary(run_dir: Path) -> dict:
    m = read_metrics(run_dir)
    images = run_dir / "images"
    return {
        "steps": max(m.steps) if m.steps else 0,
        "metrics_source": m.source,
        "reward": _figures(m.reward),
        "loss": _figures(m.loss),
        "step_time": _figures(m.step_time),
        "images": sum(1 for p in images.iterdir() if p.is_file()) if images.is_dir() else 0,
        **({"sde_window": window_summary(m.sde_windows, len(m.steps))} if m.sde_windows else {}),
    }


def window_summary(windows, steps: int) -> dict:
    """A run's SDE window (metrics.jsonl's sde_window of each step): the first such step's and the
    last's [start, end), the timesteps the last trained a sample, and how many of the run's
    ``steps`` had one (a bench run measures steps without it too)."""
    (first_step, first, _), (last_step, last, trained) = windows[0], windows[-1]
    return {"first": list(first), "last": list(last), "first_step": first_step, "last_step": last_step,
            "timesteps_trained": trained, "steps": len(windows), "of_steps": steps}


# A smoke run's verdict, written by ``smoke`` after its checks: {"passed": bool, "error": the one
# line it failed with, or null}.  The launch's summary says only how the training run ended; a smoke
# whose run succeeded can still fail its checks.
SMOKE_VERDICT = "smoke.json"


@dataclass(frozen=True)
class RunInfo:
    """What ``runs`` and ``plot`` show about one run directory."""

    path: Path
    summary: dict
    launch: dict
    environment: dict
    smoke: dict = field(default_factory=dict)  # SMOKE_VERDICT of a smoke run ({} for other runs)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def device(self) -> str:
        env = self.environment.get("devices") or {}
        return env.get("kind") or self.launch.get("device") or "?"

    @property
    def label(self) -> str:
        env = self.environment.get("devices") or {}
        names = env.get("names") or []
        world = self.summary.get("world_size") or self.launch.get("world_size")
        what = f"{self.device}"
        if names:
            what += f": {names[0]}"
        if world:
            what += f" ×{world}"
        return f"{self.name} ({what})"


def load_run(path: Path) -> RunInfo:
    return RunInfo(
        path=path,
        summary=read_json(path / "summary.json") or {},
        launch=read_json(path / "launch.json") or {},
        environment=read_json(path / "environment.json") or {},
        smoke=read_json(path / SMOKE_VERDICT) or {},
    )


@dataclass(frozen=True)
class RunsOnly:
    """What the read-only verbs (runs, plot, compare) need of a project: where the runs are."""

    runs_dir: Path


def check_runs_dir(runs_dir: Path) -> Path:
    """``runs_dir``, refused in one line when something other than a directory is there (a
    missing one is a runs directory with no runs yet)."""
    if runs_dir.exists() and not runs_dir.is_dir():
        raise DancegrpoError(f"the runs directory {runs_dir} is a file, not a directory",
                             "give --runs-dir (or DANCEGRPO_RUNS) the directory that holds the runs", exit_code=2)
    return runs_dir


def runs_of_args(args, environ: dict[str, str] | None = None):
    """Where the read-only verbs read runs: --runs-dir or $DANCEGRPO_RUNS as given, anywhere (no
    checkout needed), else runs/ of the project (-C or the current directory)."""
    import os

    from dancegrpo_npu.project import RUNS_ENV, project_from_args

    environ = os.environ if environ is None else environ
    given = getattr(args, "runs_dir", None) or environ.get(RUNS_ENV) or None
    if given:
        return RunsOnly(check_runs_dir(Path(os.path.abspath(Path(given).expanduser()))))
    project = project_from_args(args, environ)
    check_runs_dir(project.runs_dir)
    return project


def list_runs(runs_dir: Path) -> list[RunInfo]:
    check_runs_dir(runs_dir)
    if not runs_dir.is_dir():
        return []
    dirs = [
        p for p in runs_dir.iterdir() if p.is_dir() and ((p / "launch.json").exists() or (p / "summary.json").exists())
    ]
    return [load_run(p) for p in sorted(dirs, key=lambda p: p.name)]


def find_run(runs_dir: Path, ref: str) -> Path:
    """A run given as a path, a directory name under runs/, or a unique part of one: a prefix
    or suffix first, else anywhere in it (``1-100000-g`` finds ``20260101-100000-gpu``)."""
    p = Path(ref).expanduser()
    if p.is_dir() and ((p / "summary.json").exists() or (p / "launch.json").exists()):
        return p.resolve()
    candidate = runs_dir / ref
    if candidate.is_dir():
        return candidate
    check_runs_dir(runs_dir)
    names = sorted(d.name for d in runs_dir.iterdir() if d.is_dir()) if runs_dir.is_dir() else []
    # the name's ends first (`gpu` is 20260101-100000-gpu, not also 20260101-110000-gpu-2), then anywhere
    matches = [n for n in names if n.endswith(ref) or n.startswith(ref)]
    if not matches and ref:
        matches = [n for n in names if ref in n]
    if len(matches) == 1:
        return runs_dir / matches[0]
    if len(matches) > 1:
        raise DancegrpoError(
            f"run {ref!r} is ambiguous: {', '.join(matches)}", "give the full directory name", exit_code=2
        )
    raise DancegrpoError(f"no run {ref!r} in {runs_dir}", "`dancegrpo-npu runs` lists them", exit_code=2)
