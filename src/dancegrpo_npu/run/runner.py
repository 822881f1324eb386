"""Running a checked launch plan in its run directory, and keeping the record whatever happens.

torchrun's output (every rank's lines, prefixed by torchrun's --tee) is copied to the terminal
and to ``logs/console.log``; each rank's own stdout/stderr files are under ``logs/torchrun/``.
``summary.json`` says "running" while the job runs and is rewritten at the end: succeeded,
failed (with the failing rank's last lines and exception: ``run.failure``), interrupted (Ctrl-C), terminated (SIGTERM),
stalled (the stall watchdog, ``run.watchdog``, ended workers that made no progress, and the job
ended: its verdict is the failure, every firing is kept in ``stalls``) or error (torchrun could
not be started).  The watchdog runs beside torchrun unless ``--stall-timeout off``; the job gets
the run directory in ``contract.RUN_DIR_ENV``, where each rank writes its heartbeat and stacks.  The run directory is named on stderr when the run
starts; a run that stops (interrupted, terminated, failed, stalled) ends with a line naming it, its last
complete checkpoint and the command that continues it (``run.resume.continuation``), also kept
in summary.json as ``continue_with``.

A full disk must not cost the record: summary.json is written at the start with room reserved
for the final one, which, when a new file cannot be written any more, is written into that room
in place (``_final_summary``), saying why.  A run directory whose first files cannot be written
is removed again, and the launch is one line naming the path and the reason.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from dancegrpo_npu.contract import HEARTBEAT_DIR, RUN_DIR_ENV, STALLED
from dancegrpo_npu.run import directory
from dancegrpo_npu.run.watchdog import Watchdog
from dancegrpo_npu.rundirs.rundir import metrics_summary
from dancegrpo_npu.errors import DancegrpoError, RunInterrupted
from dancegrpo_npu.files import cannot_write
from dancegrpo_npu.run.fingerprint import fingerprint, trainer_matmul_precision
from dancegrpo_npu.run.environment import recorded_value, shell_script
from dancegrpo_npu.run.failure import failure_detail, rank_logs
from dancegrpo_npu.project import Project
from dancegrpo_npu.run.plan import RunRecord


class _Terminated(Exception):
    """SIGTERM reached the launcher (a scheduler stopping the job)."""


@contextmanager
def _sigterm_raises():
    """Turn SIGTERM into an exception so the record is finished; only possible on the main thread."""

    def handler(signum, frame):
        raise _Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def _launch_json(plan) -> dict:
    spec = plan.spec
    return {
        "script": spec.script,
        "script_path": str(plan.script_path),
        "device": spec.device,
        "profile": plan.profile,
        "nproc_per_node": spec.nproc_per_node,
        "nnodes": spec.nnodes,
        "node_rank": spec.node_rank,
        "world_size": plan.world_size,
        "master_addr": spec.master_addr or "127.0.0.1",
        "master_port": spec.master_port,
        "strict": spec.strict,
        "profile_steps": spec.profile_steps,  # --profile: the steps traced into <run>/profile/
        "upstream_defaults": spec.upstream_defaults,
        # upstream's recipe the arguments start from: its script, how it was scaled, what differs
        "recipe": None if plan.recipe is None else {
            "name": plan.recipe.name, "script": str(plan.recipe.path), "world_size": plan.recipe.world_size,
            "scaling": plan.recipe_scaling, "differences": list(plan.recipe_notes)},
        "user_args": list(spec.args),
        "script_args": list(plan.script_args),
        "command": list(plan.command),
        "cwd": str(plan.run_dir),
        "env_set": [{"name": n, "value": recorded_value(n, v), "source": why} for n, v, why in plan.env_set],
        "launched_from": os.getcwd(),
        "tree": plan.tree_state,
    }


def _summary(plan, status: str, returncode: int | None, start: float, end: float | None, **extra) -> dict:
    summary = {
        "status": status,
        "returncode": returncode,
        "script": plan.spec.script,
        "device": plan.spec.device,
        "profile": plan.profile,
        "device_kind": None,  # what the device resolved to (environment.json's probe)
        "world_size": plan.world_size,
        "start": _iso(start),
        "end": _iso(end) if end else None,
        "wall_time_s": round(end - start, 3) if end else None,
    }
    summary.update(metrics_summary(plan.run_dir))
    summary.update(_continued(plan))
    summary["rank_logs"] = [str(p.relative_to(plan.run_dir)) for p in rank_logs(plan.run_dir)]
    summary.update(extra)
    return summary


def _continued(plan) -> dict:
    """How often the run was continued: resumes (launch --resume) and elastic restarts."""
    from dancegrpo_npu.run.resume import restarts

    try:
        resumes = len(json.loads((plan.run_dir / "launch.json").read_text()).get("resumes", []))
    except (OSError, ValueError):
        resumes = 0
    return {"resumes": resumes, "restarts": restarts(plan.run_dir)}


# Bytes of summary.json kept from the start: the final summary (failure tail included) fits.
SUMMARY_RESERVE = 32 * 1024


def _stream(proc: subprocess.Popen, console: Path) -> str | None:
    """Copy torchrun's output to the console log and the terminal (while the terminal takes it);
    returns why the console log could not be written to the end (a full disk), or None."""
    echo, log, log_error = True, None, None
    try:
        log = open(console, "ab")
    except OSError as e:
        log_error = f"{console}: {e.strerror or e}"
    with log if log is not None else open(os.devnull, "wb"):
        for line in iter(proc.stdout.readline, b""):
            if log is not None and log_error is None:
                try:
                    log.write(line)
                    log.flush()
                except OSError as e:  # keep the job and the terminal going; the record says so
                    log_error = f"{console}: {e.strerror or e}"
            if echo:
                try:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()
                except (AttributeError, OSError, ValueError):  # `launch ... | head`: keep logging
                    echo = False
    return log_error


def _stop(proc: subprocess.Popen, sig: int) -> None:
    """Pass the signal on to torchrun (it stops its workers), then make sure it is gone."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_plan(project: Project, plan):
    """Run ``plan`` (its run directory exists and is empty, or is the run it resumes:
    ``spec.resume_of``); returns the RunRecord."""
    from dancegrpo_npu.run.resume import launch_identity, resumed_launch_json

    run_dir = plan.run_dir
    start = time.time()
    try:
        (run_dir / "logs").mkdir(exist_ok=True)
        (run_dir / "images").mkdir(exist_ok=True)  # upstream's shell script does `mkdir images`
        launch_record = {**_launch_json(plan), "identity": launch_identity(project, plan.tree_state)}
        if plan.spec.resume_of is not None:  # the first launch's record stays; the resume is added
            launch_record = resumed_launch_json(json.loads((run_dir / "launch.json").read_text()), launch_record)
        else:
            (run_dir / "command.sh").write_text(shell_script(plan))
            os.chmod(run_dir / "command.sh", 0o755)
        directory.write_json(run_dir / "launch.json", launch_record)
        _reserve_summary(run_dir / "summary.json", _summary(plan, "running", None, start, None))
    except OSError as e:
        shutil.rmtree(run_dir, ignore_errors=True)  # no half-made record
        raise cannot_write(Path(e.filename or run_dir), e) from None
    # stderr: the smoke sends the job's stdout away unless -v, and the run's name must be seen
    print(f"dancegrpo-npu: run directory {run_dir}", file=sys.stderr, flush=True)
    status, returncode, extra, device_kind, fp = "interrupted", None, {}, None, None
    log_error, interrupted, stalls = None, False, []
    watchdog = Watchdog(run_dir, getattr(plan.spec, "stall_timeout", None))
    try:
        with _sigterm_raises():
            fp = _fingerprint(project, plan)
            _write_or_note(run_dir / "environment.json", fp)
            device_kind = (fp.get("devices") or {}).get("kind")
            shutil.rmtree(run_dir / HEARTBEAT_DIR, ignore_errors=True)  # a resumed run's earlier ranks
            try:
                proc = subprocess.Popen(
                    list(plan.command), cwd=run_dir, env={**plan.env, RUN_DIR_ENV: str(run_dir)},
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
            except OSError as e:
                status, extra = "error", {"failure": {"error": f"could not start torchrun: {e}"}}
                raise DancegrpoError(f"could not start torchrun: {e}", f"the record is in {run_dir}") from e
            watchdog.start()
            try:
                log_error = _stream(proc, run_dir / "logs" / "console.log")
                returncode = proc.wait()
            except BaseException as e:
                status = "terminated" if isinstance(e, _Terminated) else "interrupted"
                _stop(proc, signal.SIGTERM if isinstance(e, _Terminated) else signal.SIGINT)
                returncode = proc.returncode
                raise
            finally:
                stalls = watchdog.stop()
            status = "succeeded" if returncode == 0 else "failed"
            if returncode != 0:
                extra = {"failure": failure_detail(run_dir)}
                if stalls:  # the watchdog ended the workers: its verdict is why, not their signal
                    status = STALLED
                    extra = {"failure": {**extra["failure"], "error": stalls[-1]["error"], "stalled": True}}
    except _Terminated:
        pass  # recorded below; the exit code says it
    except KeyboardInterrupt:
        interrupted = True  # recorded below, then raised again saying how to continue the run
    finally:
        if fp is not None:  # what only the trainer could see, once it has run
            fp["matmul_precision"] = trainer_matmul_precision(run_dir)
            _write_or_note(run_dir / "environment.json", fp)
        if log_error:
            extra = {**extra, "record_errors": [log_error]}
        if stalls:
            extra = {**extra, "stalls": stalls}
        if status in ("interrupted", "terminated", "failed", STALLED):
            extra = {**extra, "continue_with": _continuation(project, plan, status)}
        summary = _summary(plan, status, returncode, start, time.time(), device_kind=device_kind, **extra)
        summary = _final_summary(run_dir / "summary.json", summary)
    print(_one_line(run_dir, summary), flush=True)
    advice = summary.get("continue_with") or {}
    if interrupted:
        raise RunInterrupted(advice.get("line") or f"run {run_dir.name} interrupted; record: {run_dir}")
    for line in closing_lines(summary):
        print(line, flush=True)
    rc = returncode if returncode not in (None, 0) or summary["status"] == "succeeded" else 1
    return RunRecord(run_dir=run_dir, returncode=rc, command=plan.command, summary=summary)


def closing_lines(summary: dict) -> list[str]:
    """What a finished run prints after its summary line: how to go on (a stopped run's
    continuation), then, when a rank refused its arguments in a line of its own (argparse's, the
    overlay's, absl's, a SystemExit's message), that line: the last the user reads is the
    trainer's reason, not torchrun's report that a rank exited."""
    lines = []
    advice = summary.get("continue_with") or {}
    if advice.get("line"):
        lines.append(f"dancegrpo-npu: {advice['line']}")
    failure = summary.get("failure") or {}
    if failure.get("refusal") and failure.get("error"):
        lines.append(f"dancegrpo-npu: {failure['error']}")
    return lines


def _continuation(project: Project, plan, status: str) -> dict | None:
    """How the stopped run goes on (run.resume.continuation); a record must never stop on it."""
    from dancegrpo_npu.run.resume import continuation

    if not plan.script.output_in_run_dir:  # preprocessing: its product is a dataset, not checkpoints
        return {"checkpoint": None, "step": None, "command": None,
                "line": f"run {plan.run_dir.name} {status}; preprocessing keeps no checkpoints: run the same "
                        "command again to write its dataset anew"}
    try:
        return continuation(project, plan.spec.verb, plan.run_dir, plan.script_args, status)
    except Exception as e:  # noqa: BLE001 - best effort by design, the error is recorded
        return {"error": f"{type(e).__name__}: {e}"}


def _reserve_summary(path: Path, summary: dict) -> None:
    """summary.json with SUMMARY_RESERVE bytes (JSON allows the trailing blanks)."""
    text = json.dumps(summary, indent=2, default=str) + "\n"
    directory.write_atomic(path, text + " " * max(0, SUMMARY_RESERVE - len(text.encode())))


def _write_or_note(path: Path, data: dict) -> None:
    try:
        directory.write_json(path, data)
    except OSError:
        pass  # a full disk: the final summary, written into its reserved room, says so


def _final_summary(path: Path, summary: dict) -> dict:
    """Write the final summary; when the disk takes no new file, into the room summary.json
    has had since the start, with the reason, shortened to fit.  Returns the summary (in full)."""
    try:
        directory.write_json(path, summary)
        return summary
    except OSError as e:
        reason = f"{path.name}: {e.strerror or e}"
    summary = {**summary, "record_errors": [*summary.get("record_errors", []), reason]}
    if summary["status"] == "succeeded":
        summary["status"] = "failed"  # its outputs may be cut short as well
    failure = summary.get("failure") or {}
    if not failure.get("error"):
        summary["failure"] = {**failure, "error": f"the run's record could not be written: {reason}"}
    candidates = (summary, {**summary, "failure": {k: v for k, v in summary["failure"].items() if k != "tail"}},
                  {k: summary[k] for k in ("status", "returncode", "failure", "record_errors", "script", "world_size")})
    try:
        size = path.stat().st_size
        for candidate in candidates:
            data = (json.dumps(candidate, default=str) + "\n").encode()
            if len(data) <= size:
                with open(path, "r+b") as f:
                    f.write(data + b" " * (size - len(data)))
                    f.flush()
                    os.fsync(f.fileno())
                break
    except OSError:
        pass
    return summary


def _fingerprint(project: Project, plan) -> dict:
    """The fingerprint, or why it could not be taken: a record must never stop a launch."""
    try:
        return fingerprint(project, plan.env, plan.tree_state, python=plan.command[0], devices=plan.devices)
    except Exception as e:  # noqa: BLE001 - best effort by design, the error is recorded
        return {"error": f"{type(e).__name__}: {e}"}


def _one_line(run_dir: Path, s: dict) -> str:
    # the exit the user's shell gets: an interrupted launch exits 130 whatever torchrun returned
    code = 130 if s["status"] == "interrupted" else s["returncode"]
    text = f"dancegrpo-npu: {s['status']} (exit {code}) after {s['wall_time_s']:.1f} s, {s['steps']} step(s)"
    reward = s.get("reward")
    if reward:
        text += f", reward {reward['first']:.4g} -> {reward['last']:.4g}"
    if s.get("failure", {}).get("log"):
        text += f"; see {run_dir / s['failure']['log']}"
    if s.get("record_errors"):
        text += f"; could not write {', '.join(s['record_errors'])}"
    return text + f"; record: {run_dir}"
