"""Where things are: one project directory (lock, series, overlay) and its work tree.

Every command works on the project directory it is run in, or on ``-C DIR``, so a
copy of the project with another series works the same way.  The patched upstream
tree defaults to ``build/DanceGRPO`` inside the project; ``--workdir`` moves it.  Run records
go to ``runs/`` in the project unless ``--runs-dir DIR`` or ``$DANCEGRPO_RUNS`` names another
directory (a cluster's shared file system, say); the option wins over the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError

LOCK_NAME = "upstream.lock"
DEFAULT_WORKDIR = Path("build") / "DanceGRPO"
RUNS_ENV = "DANCEGRPO_RUNS"


@dataclass(frozen=True)
class Project:
    root: Path
    workdir: Path
    runs: Path | None = None  # None: runs/ in the project

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def series_path(self) -> Path:
        return self.patches_dir / "series"

    @property
    def overlay_dir(self) -> Path:
        return self.root / "overlay"

    @property
    def build_dir(self) -> Path:
        """Generated things beside the tree (fixtures, caches); gitignored."""
        return self.root / "build"

    @property
    def runs_dir(self) -> Path:
        return self.runs if self.runs is not None else self.root / "runs"


def find_project(
    directory: str | os.PathLike | None = None,
    workdir: str | os.PathLike | None = None,
    runs_dir: str | os.PathLike | None = None,
) -> Project:
    """The project at ``directory`` (default: the current directory).

    ``workdir`` and ``runs_dir`` are resolved against the current directory when relative
    (they are what the user typed); the defaults against the project root.
    """
    root = Path(directory or os.getcwd()).expanduser().resolve()
    if not root.is_dir():
        raise DancegrpoError(f"{root} is not a directory", "pass -C with the dancegrpo-npu project directory", exit_code=2)
    if not (root / LOCK_NAME).is_file():
        raise DancegrpoError(
            f"{root} is not a dancegrpo-npu project (it has no {LOCK_NAME})",
            "run the command in the project directory, or pass -C DIR",
            exit_code=2,
        )
    if workdir is None:
        tree = root / DEFAULT_WORKDIR
    else:
        tree = Path(workdir).expanduser()
        tree = tree if tree.is_absolute() else Path.cwd() / tree
    runs = None if not runs_dir else Path(os.path.abspath(Path(runs_dir).expanduser()))
    return Project(root=root, workdir=Path(os.path.abspath(tree)), runs=runs)


def project_from_args(args, environ: dict[str, str] | None = None) -> Project:
    """The project for parsed CLI arguments (``-C``, ``--workdir``, ``--runs-dir``, else
    ``$DANCEGRPO_RUNS``)."""
    environ = os.environ if environ is None else environ
    runs = getattr(args, "runs_dir", None) or environ.get(RUNS_ENV) or None
    return find_project(getattr(args, "project_dir", None), getattr(args, "workdir", None), runs)
