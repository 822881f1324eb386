"""The named dependency sets a trainer runs with, and the interpreter of each.

Most trainers run with diffusers 0.32.0 (pyproject's ``train`` extra, in the virtualenv the
tool itself runs in: the default set).  Those whose models diffusers 0.32 does not have run
with ``diffusers-0.35``, the versions upstream's own scripts for them install
(``scripts/deps/diffusers-0.35.txt``); each row names its set.  That set is a second virtualenv layered
on the first (``scripts/bootstrap.sh --with diffusers-0.35``): it holds only the packages the
set pins, and what they need newer, ahead of a ``.pth`` file that appends the first
virtualenv's site-packages, so torch is installed once.  docs/dependencies.md says why two sets
and what was measured.

A trainer names its set in its registry row (``dancegrpo_npu.registry``); launch and smoke start it
with ``python_for(set)``.  The set's virtualenv is ``<the tool's virtualenv>-<set name>``
(``.venv-diffusers-0.35`` beside ``.venv``), or where ``DANCEGRPO_VENV_DIFFUSERS_0_35`` says.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError


@dataclass(frozen=True)
class DepSet:
    name: str  # what bootstrap.sh --with takes; the layered virtualenv's suffix
    pins: tuple[tuple[str, str], ...]  # (distribution, version) that define it
    layered: bool  # False: the virtualenv the tool runs in


DEFAULT = "diffusers-0.32"
DEPSETS: dict[str, DepSet] = {
    # pyproject.toml's train extra
    "diffusers-0.32": DepSet("diffusers-0.32", (("diffusers", "0.32.0"), ("transformers", "4.46.1"),
                                                ("peft", "0.13.2")), layered=False),
    # scripts/deps/diffusers-0.35.txt
    "diffusers-0.35": DepSet("diffusers-0.35", (("diffusers", "0.35.0"), ("transformers", "4.56.0"),
                                                ("peft", "0.17.0")), layered=True),
}


def env_name(name: str) -> str:
    """The variable that moves a set's virtualenv: diffusers-0.35 -> DANCEGRPO_VENV_DIFFUSERS_0_35."""
    return "DANCEGRPO_VENV_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def get(name: str) -> DepSet:
    if name not in DEPSETS:
        raise DancegrpoError(f"no dependency set {name!r}", f"one of: {', '.join(DEPSETS)}", exit_code=2)
    return DEPSETS[name]


def venv_dir(name: str, environ: dict[str, str] | None = None, prefix: str | None = None) -> Path:
    environ = os.environ if environ is None else environ
    given = environ.get(env_name(name))
    return Path(given).expanduser() if given else Path((prefix or sys.prefix) + "-" + name)


def python_for(name: str, environ: dict[str, str] | None = None, prefix: str | None = None,
               needed_by: str | None = None) -> str:
    """The interpreter that runs set ``name``; one error saying how to install it when it is not there."""
    depset = get(name)
    if not depset.layered:
        return sys.executable
    directory = venv_dir(name, environ, prefix)
    python = directory / "bin" / "python"
    if not os.access(python, os.X_OK):
        who = f"{needed_by} runs with" if needed_by else "this needs"
        pins = " ".join(f"{d}=={v}" for d, v in depset.pins)
        raise DancegrpoError(
            f"{who} the {name} dependency set ({pins}), which is not installed at {directory}",
            f"install it: ./scripts/bootstrap.sh --deps-only --with {name} (or set {env_name(name)} to "
            "the virtualenv that holds it; docs/dependencies.md)",
        )
    return str(python)
