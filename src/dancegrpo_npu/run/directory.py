"""A new run directory: its name, making it, and its JSON files written whole.

What a run directory holds is described in ``dancegrpo_npu.rundirs.rundir``, which reads it back.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.files import writing, write_atomic

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise DancegrpoError(
            f"run name {name!r} is not usable as a directory name",
            "use letters, digits, '.', '_' and '-' (at most 81 characters)",
            exit_code=2,
        )
    return name


def run_dir_name(name: str, now: float | None = None) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + "-" + check_name(name)


def create_run_dir(runs_dir: Path, name: str, now: float | None = None) -> Path:
    """A new, empty run directory; ``-2``, ``-3``... is added when the name is taken.  One that
    cannot be made is one line naming the path and the reason."""
    base = run_dir_name(name, now)
    with writing(runs_dir):
        runs_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        candidate = runs_dir / (base if n == 1 else f"{base}-{n}")
        with writing(candidate):
            try:
                candidate.mkdir()  # atomic: two launches in the same second get different names
            except FileExistsError:
                continue
        return candidate
    raise DancegrpoError(f"could not create a run directory for {base} in {runs_dir}", "remove old runs")


def write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
