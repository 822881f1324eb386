"""Exact resume: the whole training state, saved sharded and atomically; a feature on the seam.

Upstream's ``--resume_from_checkpoint`` did nothing, and its checkpoints hold the weights only,
written in place at the *start* of a step.  Here a checkpoint is the training state after a
step, so a run continued from it ends where the uninterrupted run ends:

- the fp32 master weights and the optimizer state, sharded, through
  ``torch.distributed.checkpoint`` (``get_state_dict``/``set_state_dict``: each rank writes and
  reads its own shards, nothing is gathered to rank 0);
- per rank (``rank_R.pt``): the step, the LR scheduler, every random generator the step draws
  from (torch's CPU generator, the device's, python's and numpy's, and ``--rng cpu``'s), and
  the data position; rank 0's also holds the EMA (upstream keeps it on rank 0 only).

Layout, under ``<output_dir>/resume/``::

    step-000002/   a complete checkpoint: the shards, rank_R.pt, and manifest.json (written
                   last: every file with its size, the run's identity) ...
    .tmp-step-000003/  one being written; it becomes step-000003/ by one rename

``latest`` is the newest complete one: a checkpoint whose manifest is missing, unreadable or
does not match its files is skipped with one line.  Before a save the free space is checked
against the checkpoint's size; too little stops the run with one line and the previous
checkpoints stay as they are.  ``--checkpoints_total_limit K`` keeps the newest K (default 2).  A checkpoint
is taken after each step that is a multiple of ``--checkpointing_steps`` and after the last one.

On resume (``--resume_from_checkpoint latest|DIR``), a checkpoint of another run shape (world
size, generations, sizes, the trainer and port code) is refused in one line, before anything is
loaded.  The data continues after the batches the run had used, and the random generators are
restored before the first resumed step draws (``resume``): what it draws is what the
uninterrupted run drew.  Self-contained: torch and the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from dancegrpo_port.contract import (CHECKPOINT_DIR, CHECKPOINT_FAULT_ENV, CHECKPOINT_FIT, CHECKPOINT_FORMAT,
                                     CHECKPOINT_MANIFEST)

PREFIX = "step-"
TMP_PREFIX = ".tmp-"
MARGIN = 1.05  # free space wanted over the checkpoint's size (file system overhead)
TOTAL_LIMIT = 2  # upstream's recipe saves every 40 of 300 steps: 8 full training states of FLUX otherwise


class CheckpointProblem(Exception):
    """What is wrong with a checkpoint or a save, in one line."""


# ---------------------------------------------------------------- files (no torch)


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def checkpoint_step(path: Path) -> int | None:
    name = Path(path).name
    if not name.startswith(PREFIX) or not name[len(PREFIX):].isdigit():
        return None
    return int(name[len(PREFIX):])


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_manifest(directory: Path, fields: dict) -> dict:
    """manifest.json in ``directory``: every other file in it with its size, and ``fields``
    (written to a temporary name, synced, then renamed: a manifest is whole or absent)."""
    directory = Path(directory)
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != CHECKPOINT_MANIFEST:
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            files[str(path.relative_to(directory))] = path.stat().st_size
    manifest = {"format": CHECKPOINT_FORMAT, **fields, "files": files}
    tmp = directory / (CHECKPOINT_MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / CHECKPOINT_MANIFEST)
    _fsync_dir(directory)
    return manifest


def read_manifest(directory: Path) -> dict:
    """The manifest of a complete checkpoint; CheckpointProblem (one line) when it is not one."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointProblem(f"{directory} is not a directory")
    path = directory / CHECKPOINT_MANIFEST
    if not path.is_file():
        raise CheckpointProblem(f"{directory.name} has no {CHECKPOINT_MANIFEST} (a save that did not finish)")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        if manifest.get("format") != CHECKPOINT_FORMAT or not isinstance(files, dict):
            raise ValueError(f"format {manifest.get('format')!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointProblem(f"{directory.name}: {CHECKPOINT_MANIFEST} is unreadable ({exc})") from None
    for name, size in files.items():
        file = directory / name
        if not file.is_file():
            raise CheckpointProblem(f"{directory.name}: {name} is missing")
        actual = file.stat().st_size
        if actual != size:
            raise CheckpointProblem(f"{directory.name}: {name} has {actual} bytes, the manifest says {size} "
                                    "(a truncated or changed file)")
    return manifest


def complete_checkpoints(root: Path, say=None) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint under ``root``, newest first; each
    incomplete one is skipped with one line through ``say``."""
    root = Path(root)
    found = sorted(((checkpoint_step(p), p) for p in root.glob(PREFIX + "*") if checkpoint_step(p) is not None),
                   reverse=True)
    out = []
    for step, path in found:
        try:
            read_manifest(path)
        except CheckpointProblem as problem:
            if say:
                say(f"checkpoint {path} skipped: {problem}")
            continue
        out.append((step, path))
    return out


def latest(root: Path, say=None) -> Path | None:
    """The newest complete checkpoint under ``root`` (None when there is none)."""
    done = complete_checkpoints(root, say)
    return done[0][1] if done else None


def prune(root: Path, keep: int | None) -> list[Path]:
    """Remove all but the newest ``keep`` complete checkpoints (None: keep all); returns them."""
    if keep is None:
        return []
    gone = [path for _, path in complete_checkpoints(root)[keep:]]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def publish(tmp: Path, final: Path) -> None:
    """Make a written checkpoint visible: one rename (a complete one of the same step is replaced)."""
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(final.parent)


def space_problem(root: Path, needed: int, free: int | None = None) -> str | None:
    """Why a checkpoint of ``needed`` bytes does not fit under ``root``, or None."""
    if free is None:
        free = shutil.disk_usage(root).free
    if free < needed * MARGIN:
        return f"{needed / 2**20:.1f} MiB needed, {free / 2**20:.1f} MiB free in {root}"
    return None


def fit_problem(manifest: dict, expected: dict) -> str | None:
    """What differs between a checkpoint's run and this one, in one line (CHECKPOINT_FIT)."""
    differ = [f"{key} {manifest.get(key)!r} (this run: {expected.get(key)!r})"
              for key in CHECKPOINT_FIT if manifest.get(key) != expected.get(key)]
    return "it is of another run: " + ", ".join(differ) if differ else None


def code_digest(script: str) -> str:
    """The trainer script and the port's package: what a checkpoint's state is the state of."""
    h = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for path in [Path(script).resolve(), *sorted(package.glob("*.py"))]:
        try:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        except OSError:
            h.update(path.name.encode() + b"\0missing\0")
    return h.hexdigest()[:16]


def run_identity(args, world_size: int, script: str | None = None) -> dict:
    """The run's shape (CHECKPOINT_FIT); a trainer without one of the flags has None there."""
    shape = {key: getattr(args, key, None) for key in CHECKPOINT_FIT if key not in ("world_size", "code")}
    return {"world_size": world_size, **shape, "code": code_digest(script or sys.argv[0])}


def inject_fault(step: int, point: str, root: Path, rank: int, environ=None) -> None:
    """A test's injected fault, once per rank: SIGKILL at ``point`` of this step's save when
    CHECKPOINT_FAULT_ENV is ``STEP`` (point "shards": between the shard writes and the rest) or
    ``STEP:saved`` (once the checkpoint is complete).  A restart after it saves normally."""
    value = (os.environ if environ is None else environ).get(CHECKPOINT_FAULT_ENV, "").strip()
    wanted, _, where = value.partition(":")
    if wanted != str(step) or (where or "shards") != point:
        return
    marker = Path(root) / f".fault-{step}-{point}-rank{rank}"
    if marker.exists():
        return
    marker.touch()
    os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------- flags


def add_arguments(parser) -> None:
    parser.add_argument(
        "--checkpoints_total_limit",
        type=int,
        default=TOTAL_LIMIT,
        help=f"keep only the newest K resume checkpoints in <output_dir>/resume (default {TOTAL_LIMIT}: one "
        "holds the weights and the optimizer, about 3x the fp32 weights)",
    )


def argument_problem(args, environ=None) -> str | None:
    """What is wrong with the resume flags (one line), or None (``environ``: not read)."""
    limit = getattr(args, "checkpoints_total_limit", None)
    if limit is not None and limit < 1:
        return f"--checkpoints_total_limit must be at least 1, not {limit}"
    if getattr(args, "resume_from_checkpoint", None) and not getattr(args, "output_dir", None):
        return "--resume_from_checkpoint needs --output_dir, where the checkpoints are"
    return None
