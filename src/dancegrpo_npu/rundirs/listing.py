"""``dancegrpo-npu runs``: the run records under runs/, one line each, oldest first."""

from __future__ import annotations

import socket

from dancegrpo_npu.files import process_alive
from dancegrpo_npu.rundirs.rundir import HEALTH_COLUMNS, TIMED_PHASES, RunInfo, read_metrics, window_summary


def status_of(run: RunInfo) -> str:
    """The recorded status; a "running" run whose launcher is gone on this host is "died"; a smoke
    run whose training run succeeded but whose checks failed (its SMOKE_VERDICT) is "failed"."""
    status = run.summary.get("status") or "?"
    if status == "succeeded" and run.smoke.get("passed") is False:
        return "failed"
    pid, host = run.environment.get("pid"), run.environment.get("host")
    if status == "running" and isinstance(pid, int) and host == socket.gethostname() and not process_alive(pid):
        return "died"
    return status


def _fmt(x) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else "-"


def row(run: RunInfo) -> dict:
    reward = run.summary.get("reward") or {}
    metrics = read_metrics(run.path)  # live: a running run's summary is only rewritten at its end
    health = {k: metrics.last(k) for k in ("reward_mean", *HEALTH_COLUMNS) if metrics.last(k) is not None}
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
        "phases_s": metrics.phase_means(),  # mean seconds per step of each timed phase ({} for older runs)
        "peak_memory_bytes": metrics.phase_peaks(),  # the largest peak of each phase over the steps
        "peak_memory_kind": metrics.peak_memory_kind,
        "sde_window": window_summary(metrics.sde_windows, len(metrics.steps)) if metrics.sde_windows else None,  # None: every step an SDE step
        "reason": failure_reason(run.summary) or smoke_failure(run),  # why a failed run failed, else None
        "resumes": run.summary.get("resumes") or 0,  # launch --resume / smoke --resume continued it
        "restarts": run.summary.get("restarts") or 0,  # torchrun's elastic restarts (--max-restarts)
        "stalls": len(run.summary.get("stalls") or []),  # times the stall watchdog ended the workers
    }


def smoke_failure(run: RunInfo) -> str | None:
    """What a smoke run's checks failed with (its SMOKE_VERDICT), else None."""
    if run.smoke.get("passed") is False:
        return str(run.smoke.get("error") or "the smoke's checks failed")
    return None


def failure_reason(summary: dict) -> str | None:
    failure = summary.get("failure") if isinstance(summary.get("failure"), dict) else {}
    errors = summary.get("record_errors") or []
    parts = [failure["error"]] if failure.get("error") else []
    parts += [f"could not write {e}" for e in errors if f"could not be written: {e}" not in " ".join(parts)]
    return "; ".join(parts) or None


def human_bytes(n: float) -> str:
    """1536 -> "1.5 KiB", 65e9 -> "60.5 GiB"."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" or abs(value) >= 100 else f"{value:.1f} {unit}"


def phase_lines(r: dict) -> list[str]:
    """The lines under a run that timed its phases: mean time per step, then peak memory."""
    lines = []
    if r["phases_s"]:
        times = "  ".join(f"{p} {r['phases_s'][p]:.3g}s" for p in TIMED_PHASES if p in r["phases_s"])
        lines.append(f"    time per step (mean): {times}")
    if r["peak_memory_bytes"]:
        peaks = "  ".join(f"{p} {human_bytes(r['peak_memory_bytes'][p])}" for p in TIMED_PHASES if p in r["peak_memory_bytes"])
        lines.append(f"    peak memory ({r['peak_memory_kind'] or 'kind not recorded'}): {peaks}")
    return lines


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
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    # each run's reason and phase lines go under its row (rows are out[1:], in the order of rows)
    return "\n".join([out[0]] + [text for r, line in zip(rows, out[1:], strict=True)
                                 for text in [line, *reason_lines(r), *continued_lines(r), *window_lines(r),
                                              *phase_lines(r)]])


def window_lines(r: dict) -> list[str]:
    """A run trained on an SDE window: its window at the first step and at the last, and the
    timesteps each sample trained."""
    window = r.get("sde_window")
    if not window:
        return []
    first, last = window["first"], window["last"]
    where = (f"[{first[0]}, {first[1]})" if first == last else
             f"[{first[0]}, {first[1]}) at step {window['first_step']} -> [{last[0]}, {last[1]}) at step {window['last_step']}")
    some = f" ({window['steps']} of {window['of_steps']} steps)" if window["steps"] < window["of_steps"] else ""
    return [f"    SDE window: {where}, {window['timesteps_trained']} timesteps trained a sample{some}"]


def reason_lines(r: dict) -> list[str]:
    return [f"    {r['status']}: {r['reason']}"] if r.get("reason") else []


def continued_lines(r: dict) -> list[str]:
    """A run continued from its checkpoints: how often (resumed N, restarted M), and how often the
    stall watchdog ended its workers, where it did and the run went on."""
    parts = [f"{word} {r[key]}" for word, key in (("resumed", "resumes"), ("restarted", "restarts")) if r.get(key)]
    stalls = r.get("stalls") or 0
    if stalls and r.get("status") != "stalled" and parts:
        parts.append(f"after the stall watchdog ended its workers {stalls} time{'s' if stalls != 1 else ''}")
    return [f"    continued from checkpoints: {', '.join(parts)}"] if parts else []
