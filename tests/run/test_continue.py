"""A run that stops - Ctrl-C, SIGTERM (a scheduler's preemption) or a failure after start -
is recorded as such, and its last line names the run, its last complete checkpoint and the
command that continues it, or says that it has none yet and how to get them
(``run.resume.continuation``).  On the synthetic tree, with a stand-in trainer that writes a
resume checkpoint in the port's layout and then fails or waits to be stopped."""

from __future__ import annotations

import json
import signal
import textwrap
import threading

import pytest
from synthetic_tree import make_project, trust_synthetic_tree

from dancegrpo_npu.cli import main
from dancegrpo_npu.project import find_project
from dancegrpo_npu.run import resume

STOPPING_TRAINER = textwrap.dedent('''\
    """FAKE trainer from dancegrpo-npu's tests (test_continue.py); not upstream's."""
    import argparse, json, os, sys, time

    p = argparse.ArgumentParser()
    p.add_argument("--output_dir")
    p.add_argument("--checkpointing_steps", type=int, default=2)
    p.add_argument("--saved", type=int, default=0)  # complete checkpoints to write: steps 2, 4, ...
    p.add_argument("--torn", action="store_true")  # the newest one's file cut short after its manifest
    p.add_argument("--then", default="fail")  # fail | wait
    args, _ = p.parse_known_args()
    if int(os.environ["RANK"]) == 0:
        for n in range(1, args.saved + 1):
            step = os.path.join(args.output_dir, "resume", "step-%06d" % (n * args.checkpointing_steps))
            os.makedirs(step)
            with open(os.path.join(step, "rank_0.pt"), "wb") as f:
                f.write(b"state" * 10)
            with open(os.path.join(step, "manifest.json"), "w") as f:
                json.dump({"format": 1, "files": {"rank_0.pt": 50}}, f)
            if args.torn and n == args.saved:
                with open(os.path.join(step, "rank_0.pt"), "wb") as f:
                    f.write(b"cut")
    open("started", "w").close()
    if args.then == "fail":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("RuntimeError: stopped on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(60)  # the test stops it at once; if its signal goes astray, the run "succeeded" and fails it
''')


@pytest.fixture
def project(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / "proj"))
    (project.workdir / "fastvideo" / "train_grpo_flux.py").write_text(STOPPING_TRAINER)
    return project


def launch_args(project, *trainer):
    return ["-C", str(project.root), "launch", "flux", "--device", "cpu", "--no-upstream-defaults", "--",
            *trainer]


def the_run(project):
    (run,) = list(project.runs_dir.iterdir())
    return run, json.loads((run / "summary.json").read_text())


def last_line(text):
    return text.strip().splitlines()[-1]


def test_a_failed_run_names_its_last_complete_checkpoint_and_the_command(project, capsys):
    assert main(launch_args(project, "--saved", "2")) == 1  # torchrun: a worker failed
    out, err = capsys.readouterr()
    run, summary = the_run(project)
    assert f"dancegrpo-npu: run directory {run}" in err  # said when it starts
    checkpoint = run / "outputs" / "resume" / "step-000004"
    assert last_line(out) == (f"dancegrpo-npu: run {run.name} failed; its last complete checkpoint is step 4 "
                              f"({checkpoint}); continue it from there with: dancegrpo-npu -C {project.root} "
                              f"launch --resume {run.name}")
    assert summary["status"] == "failed" and summary["continue_with"]["step"] == 4


def test_a_torn_checkpoint_is_not_the_one_named(project, capsys):
    assert main(launch_args(project, "--saved", "2", "--torn")) == 1  # torchrun: a worker failed
    run, summary = the_run(project)
    assert "its last complete checkpoint is step 2" in last_line(capsys.readouterr().out)
    assert summary["continue_with"]["checkpoint"] == str(run / "outputs" / "resume" / "step-000002")


def test_a_run_without_a_checkpoint_says_how_to_get_them(project, capsys):
    assert main(launch_args(project, "--checkpointing_steps", "50")) == 1  # torchrun: a worker failed
    run, summary = the_run(project)
    assert last_line(capsys.readouterr().out) == (
        f"dancegrpo-npu: run {run.name} failed before its first complete checkpoint (the trainer saves one "
        "after every 50 steps), so nothing can be continued: start it again with `-- --checkpointing_steps N` "
        "to have one every N steps")
    assert summary["continue_with"]["checkpoint"] is None


def signal_state(signum) -> dict:
    """How this process takes ``signum``: its handler, and whether the main thread blocks it."""
    return {"handler": signal.getsignal(signum),
            "blocked": signum in signal.pthread_sigmask(signal.SIG_BLOCK, [])}


def stop_once_started(project, signum, done: threading.Event, seen: dict):
    """Send ``signum`` to this process's main thread (as Ctrl-C or a scheduler does; the main
    thread is the launcher, blocked reading torchrun's output) once the trainer runs, or give up
    when the launch is ``done``.  Sent to the thread itself: a signal to the process may be taken
    by another thread, and then the launcher, blocked in its read, sees it only when the trainer
    ends on its own.  ``seen``: when it was sent, for the test's message."""
    main_thread = threading.main_thread().ident

    def watch():
        while not done.is_set():
            runs = list(project.runs_dir.iterdir()) if project.runs_dir.is_dir() else []
            if any((run / "started").exists() for run in runs):
                seen["sent"] = True
                signal.pthread_kill(main_thread, signum)
                return
            done.wait(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def as_a_shell_starts_it():
    """The launcher as a user's terminal starts it: SIGINT raises KeyboardInterrupt, and the main
    thread blocks neither signal.  A test run started in the background (`./scripts/test.sh &`,
    a CI runner's job without job control) has SIGINT ignored from its shell, and pytest and its
    workers inherit that: the signal was lost and the test waited out its stand-in trainer.  The
    test's premise is the user's process, so it is put back for the test and restored after."""
    found = signal_state(signal.SIGINT)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM])
    yield found
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(signal.SIGINT, handler)


@pytest.mark.parametrize("signum, status, code", [(signal.SIGINT, "interrupted", 130),
                                                  (signal.SIGTERM, "terminated", None)])
def test_a_stopped_run_says_how_to_continue_it(project, capsys, signum, status, code, as_a_shell_starts_it):
    done, seen = threading.Event(), {"sent": False, "found before the test": as_a_shell_starts_it}
    watcher = stop_once_started(project, signum, done, seen)
    try:
        rc = main(launch_args(project, "--saved", "1", "--then", "wait"))
    finally:
        done.set()
        watcher.join()
    out, err = capsys.readouterr()
    run, summary = the_run(project)
    assert summary["status"] == status and (code is None or rc == code) and rc != 0, (seen, out[-2000:], err[-2000:])
    said = last_line(err if signum == signal.SIGINT else out)
    assert said == (f"dancegrpo-npu: run {run.name} {status}; its last complete checkpoint is step 2 "
                    f"({run / 'outputs' / 'resume' / 'step-000002'}); continue it from there with: "
                    f"dancegrpo-npu -C {project.root} launch --resume {run.name}")
    assert "re-run the same command" not in err


def test_the_command_names_what_the_run_was_started_with(project, tmp_path, monkeypatch):
    run = project.runs_dir / "20260101-100000-smoke"
    monkeypatch.chdir(project.root)
    assert resume.continue_command(project, "smoke", run) == "dancegrpo-npu smoke --resume 20260101-100000-smoke"
    elsewhere = find_project(project.root, tmp_path / "tree", tmp_path / "runs")
    assert resume.continue_command(elsewhere, "smoke", tmp_path / "runs" / run.name) == (
        f"dancegrpo-npu --workdir {tmp_path / 'tree'} smoke --resume {tmp_path / 'runs' / run.name}")


def test_failed_preprocessing_says_to_run_it_again(project, capsys):
    script = project.workdir / "fastvideo" / "data_preprocess" / "preprocess_flux_embedding.py"
    script.write_text(STOPPING_TRAINER)
    assert main(["-C", str(project.root), "launch", "preprocess", "--device", "cpu"]) == 1
    run, summary = the_run(project)
    assert last_line(capsys.readouterr().out) == (f"dancegrpo-npu: run {run.name} failed; preprocessing keeps no "
                                                  "checkpoints: run the same command again to write its dataset anew")
