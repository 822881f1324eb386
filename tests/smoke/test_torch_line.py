"""The port on the torch of the NPU lines, on the CPU: the FLUX smoke, the Wan smoke and an exact resume.

The suite runs torch 2.14.1; an Ascend host runs the torch its torch_npu is built for: 2.10.0 by
default, 2.7.1 on MindSpeed-MM's line (docs/ascend-910b.md).  For each line this builds a
virtualenv with the README's own command (``PYTHON=python3.12 ./scripts/bootstrap.sh --deps-only
--torch 2.10 --with diffusers-0.35``: PyPI's torch, several GB the first time), the 2.10 line on
Python 3.12 (the newest Python the port supports), the 2.7 line on Python 3.10 (MindSpeed-MM's),
and runs the tool from it.  The distributed checkpoint, FSDP1, state-dict options and profiler the
port calls are torch's own: the smokes (the FLUX one profiles a step) and the resume run them.

Extended tier: minutes of downloads and training; ``./scripts/test.sh --all`` runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from interpreters import runnable

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
pytestmark = [pytest.mark.extended, pytest.mark.upstream, pytest.mark.slow]


# line -> (its torch and torchvision, the Python it is checked on)
LINES = {"2.10": ("2.10.0", "0.25.0", "3.12"), "2.7": ("2.7.1", "0.22.1", "3.10")}


@pytest.fixture(scope="module", params=sorted(LINES))
def line_venv(request) -> Path:
    """The line's virtualenv on its Python, built (or found up to date) by bootstrap."""
    line = request.param
    python = runnable(f"python{LINES[line][2]}")
    if python is None:
        pytest.fail(f"no Python {LINES[line][2]} on this machine: the torch {line} line is checked on it")
    venv = ROOT / f".venv-torch{line}"
    env = {**os.environ, "PYTHON": python, "DANCEGRPO_VENV": str(venv)}
    env.pop("DANCEGRPO_VENV_DIFFUSERS_0_35", None)
    proc = subprocess.run([str(ROOT / "scripts" / "bootstrap.sh"), "--deps-only", "--torch", line, "--with",
                           "diffusers-0.35"], env=env, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return venv


def line_of(venv: Path) -> tuple[str, str, str]:
    return LINES[venv.name.removeprefix(".venv-torch")]


def tool(venv: Path, project_root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(SRC), "DANCEGRPO_VENV": str(venv), **(env or {})}
    environ.pop("DANCEGRPO_VENV_DIFFUSERS_0_35", None)
    return subprocess.run([str(venv / "bin" / "python"), "-m", "dancegrpo_npu", "-C", str(project_root), *args],
                          env=environ, capture_output=True, text=True, timeout=1800)


def test_the_venv_has_the_lines_torch_on_its_python(line_venv):
    out = subprocess.run([str(line_venv / "bin" / "python"), "-c",
                          "import sys, torch, torchvision; print('%d.%d' % sys.version_info[:2], torch.__version__.split('+')[0], "
                          "torchvision.__version__.split('+')[0])"], capture_output=True, text=True, check=True)
    torch, torchvision, python = line_of(line_venv)
    assert out.stdout.split() == [python, torch, torchvision]


@pytest.mark.parametrize("trainer", ["flux", "wan"])
def test_the_smoke_passes_on_the_lines_torch(line_venv, patched_tree, trainer):
    runs_dir = patched_tree.project.runs_dir
    before = set(runs_dir.iterdir()) if runs_dir.is_dir() else set()
    profile = ("--", "--profile_steps", "2") if trainer == "flux" else ()  # torch.profiler on this torch too
    proc = tool(line_venv, patched_tree.project.root, "smoke", "--trainer", trainer, "--nproc", "2", *profile)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = set(runs_dir.iterdir()) - before
    job = json.loads((run / "environment.json").read_text())  # what the ranks' interpreter had
    assert job["packages"]["torch"].startswith(line_of(line_venv)[0])
    assert job["python_executable"].startswith(str(line_venv))
    if profile:
        assert len(list(run.rglob("*.pt.trace.json"))) == 2, sorted(run.rglob("*"))  # one trace a rank


def test_a_killed_flux_run_resumes_exactly_on_the_lines_torch(line_venv, patched_tree):
    """3 steps, a checkpoint after each, killed between the shard writes of step 3's save (so step 2 is
    `latest`); `launch --resume` continues it, and `compare` finds it bit-equal to the uninterrupted run."""
    root = patched_tree.project.root
    runs_dir = patched_tree.project.runs_dir
    common = ("smoke", "--trainer", "flux", "--steps", "3", "--checkpointing-steps", "1", "--rng", "cpu", "--record")
    before = set(runs_dir.iterdir()) if runs_dir.is_dir() else set()
    proc = tool(line_venv, root, *common)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (ref,) = set(runs_dir.iterdir()) - before
    before.add(ref)
    proc = tool(line_venv, root, *common, env={"DANCEGRPO_CHECKPOINT_FAULT": "3"})
    assert proc.returncode != 0
    (cut,) = set(runs_dir.iterdir()) - before
    proc = tool(line_venv, root, "launch", "--resume", cut.name)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = tool(line_venv, root, "compare", str(ref), str(cut))
    assert proc.returncode == 0 and "first divergence: none" in proc.stdout, proc.stdout[-3000:] + proc.stderr
