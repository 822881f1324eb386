"""``dancegrpo-npu runs``: the run records under runs/, one line each, oldest first."""

from __future__ import annotations

import json
import os
import socket

from dancegrpo_npu.project import project_from_args
from dancegrpo_npu.run.records import HEALTH_KEYS, RunInfo, list_runs, read_metrics


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def status_of(run: RunInfo) -> str:
    """The recorded status; a "running" run whose launcher is gone on this host is "died"."""
    status = run.summary.get("status") or "?"
    pid, host = run.environment.get("pid"), run.environment.get("host")
    if status == "running" and isinstance(pid, int) and host == socket.gethostname() and not _alive(pid):
        return "died"
    return status


def _fmt(x) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else "-"


def row(run: RunInfo) -> dict:
    reward = run.summary.get("reward") or {}
    metrics = read_metrics(run.path)  # live: a running run's summary is only rewritten at its end
    health = {k: metrics.last(k) for k in ("reward_mean", *HEALTH_KEYS) if metrics.last(k) is not None}
    return {
        "name": run.name,
        "status": status_of(run),
        "device": run.device,
        "world_size": run.summary.get("world_size") or run.launch.get("world_size"),
        "steps": run.summary.get("steps", 0),
        "reward_first": reward.get("first"),
        "reward_last": reward.get("last"),
        "wall_time_s": run.summary.get("wall_time_s"),
        "path": str(run.path),
        "health": health,  # the last value of each GRPO health key metrics.jsonl has (alignment contract)
    }


def format_table(rows: list[dict]) -> str:
    header = ("RUN", "STATUS", "DEVICE", "WORLD", "STEPS", "REWARD first -> last", "CLIP_FRAC", "LOGP_DIFF_MAX", "WALL")
    lines = [header]
    for r in rows:
        trend = "-" if r["reward_first"] is None else f"{_fmt(r['reward_first'])} -> {_fmt(r['reward_last'])}"
        wall = "-" if r["wall_time_s"] is None else f"{r['wall_time_s']:.1f}s"
        health = r["health"]
        lines.append((r["name"], r["status"], r["device"], str(r["world_size"] or "-"), str(r["steps"]), trend,
                      _fmt(health.get("clip_frac")), _fmt(health.get("logprob_diff_max")), wall))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def register(sub, common) -> None:
    p = sub.add_parser(
        "runs",
        parents=[common],
        help="list the run records with their reward trend and GRPO health",
        description=(
            "List runs/<time>-<name>/ records: status, device, world size, steps, reward first -> last, the last "
            "clip fraction and log-prob difference before the first update (metrics.jsonl; should be 0), wall time. "
            "--json adds the last value of every GRPO health key."
        ),
    )
    p.add_argument("--json", action="store_true", help="one JSON object per run, for scripts")
    p.set_defaults(func=_cmd_runs)


def _cmd_runs(args) -> int:
    project = project_from_args(args)
    rows = [row(run) for run in list_runs(project.runs_dir)]
    if args.json:
        for r in rows:
            print(json.dumps(r))
    elif not rows:
        print(f"no runs in {project.runs_dir} yet (`dancegrpo-npu launch` makes them)")
    else:
        print(format_table(rows))
    return 0
