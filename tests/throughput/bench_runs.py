"""What the bench tests of the diffusers-0.35 presets share: the command, and the phases a run
times."""

from __future__ import annotations

import os
import subprocess
import sys

PHASES = {"rollout", "decode", "reward", "train"}


def bench(project_root, *args, env=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "dancegrpo_npu", "-C", str(project_root), "bench", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
