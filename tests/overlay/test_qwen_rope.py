"""The real-valued Qwen-Image RoPE (overlay/dancegrpo_port/models/qwen_rope.py), checked with
diffusers 0.35: qwen_rope_checks.py run by the diffusers-0.35 set's interpreter (the suite's
has diffusers 0.32, without Qwen-Image).  Skipped with the reason when the set is not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CHECKS = HERE / "qwen_rope_checks.py"
EXPECTED = 5  # the checks in qwen_rope_checks.py


def test_the_real_rope_checks_pass_with_diffusers_035(tmp_path):
    from depset_035 import diffusers_035_python

    python = diffusers_035_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANCEGRPO_")}
    env.update(PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parents[1] / "src")]), OMP_NUM_THREADS="1")
    proc = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "-s", str(CHECKS)],
                          cwd=HERE, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{EXPECTED} passed" in proc.stdout.splitlines()[-1], proc.stdout[-2000:]
    worst = [float(x) for x in re.findall(r"max \|real - complex\| = (\S+)", proc.stdout)]
    assert len(worst) == 3 and max(worst) <= 1e-6
