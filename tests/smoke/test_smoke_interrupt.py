"""Ctrl-C during a checkpointed smoke: the smoke names its run when it starts, and its last line
is the command that continues it from its last complete checkpoint; that command, run as
printed, ends as the uninterrupted run (`compare`: every record bit-equal).

The tool runs as the user runs it, in a process group of its own, and the SIGINT goes to the
whole group, as a terminal's Ctrl-C does (the trainer's ranks get it too).  Three short FLUX
runs (the reference, the cut one, its resume): about 90 s.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from smoke_runs import assert_resumed_as_uninterrupted

SRC = Path(__file__).resolve().parents[2] / "src"
SMOKE = ("smoke", "--device", "cpu", "--steps", "3", "--checkpointing-steps", "1", "--rng", "cpu", "--record")

# extended: CI keeps the FLUX trainer's resume killed during a save (tests/patches/test_resume.py)
pytestmark = [pytest.mark.slow, pytest.mark.extended, pytest.mark.upstream]


def tool(project, runs: Path, *words: str) -> list[str]:
    return [sys.executable, "-m", "dancegrpo_npu", "-C", str(project.root), *words]


def env(runs: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(SRC), "DANCEGRPO_RUNS": str(runs)}


def new_run(runs: Path, before: set) -> Path | None:
    made = set(runs.iterdir()) - before if runs.is_dir() else set()
    return made.pop() if made else None


def test_ctrl_c_names_the_command_that_resumes_the_smoke_exactly(patched_tree, tmp_path, capsys):
    project, runs = patched_tree.project, tmp_path / "runs"
    ref = subprocess.run(tool(project, runs, *SMOKE), env=env(runs), cwd=tmp_path, capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    (ref_run,) = runs.iterdir()

    before = set(runs.iterdir())
    proc = subprocess.Popen(tool(project, runs, *SMOKE), env=env(runs), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline, cut = time.time() + 600, None
    while time.time() < deadline and proc.poll() is None:
        cut = cut or new_run(runs, before)
        if cut is not None and (cut / "outputs" / "resume" / "step-000002" / "manifest.json").exists():
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
            break
        time.sleep(0.1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert f"dancegrpo-npu: run directory {cut}" in err  # the smoke names its run when it starts
    last = err.strip().splitlines()[-1]
    command = f"dancegrpo-npu -C {project.root} smoke --resume {cut.name}"
    assert last == (f"dancegrpo-npu: run {cut.name} interrupted; its last complete checkpoint is step 2 "
                    f"({cut / 'outputs' / 'resume' / 'step-000002'}); continue it from there with: {command}")
    assert '"status": "interrupted"' in (cut / "summary.json").read_text()

    words = shlex.split(last.split("continue it from there with: ")[1])
    assert words[0] == "dancegrpo-npu"
    resumed = subprocess.run([sys.executable, "-m", "dancegrpo_npu", *words[1:]], env=env(runs), cwd=tmp_path,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "smoke: passed" in resumed.stdout
    assert_resumed_as_uninterrupted(project, ref_run, cut, capsys, steps=3)
