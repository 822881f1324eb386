"""Reading a run's ``records/`` (the alignment contract's format 1)::

    records/index.json                       settings, recorded steps, whether modules are recorded
    records/step_000001/rank_0.safetensors   one file per rank per recorded step
    records/modules/rank_0.safetensors       module outputs of step 1 (with --record_modules)
    records/modules/rank_0.json              {"order": [names in execution order]}

Tensors are read one at a time (``safe_open``) as numpy arrays, so comparing a 720x720 step
(hundreds of MB per rank) holds two tensors in memory, not two files.
"""

from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from dancegrpo_npu.contract import MODULE_GROUPS, RECORDS_FORMAT, shown_steps
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.rundirs.rundir import find_run

# What two runs must share to be compared at all (else exit 2), with the words the error uses.
MUST_MATCH = (
    ("world_size", "world size"),
    ("h", "resolution (h)"),
    ("w", "resolution (w)"),
    ("t", "frames (t)"),
    ("num_generations", "generations"),
    ("sampling_steps", "sampling steps"),
)

def records_index(run_dir: Path, what: str = "--replay") -> dict:
    """``<run>/records/index.json``, or a one-line refusal naming what is missing."""
    index_path = run_dir / "records" / "index.json"
    try:
        index = json.loads(index_path.read_text())
    except FileNotFoundError:
        raise DancegrpoError(
            f"{what}: run {run_dir.name} has no records ({index_path} does not exist)",
            "record a run first: launch, smoke or bench with --record",
            exit_code=2,
        ) from None
    except (OSError, ValueError) as e:
        raise DancegrpoError(f"{what}: {index_path} is not readable JSON ({e})", "record the run again", 2) from None
    if not isinstance(index, dict) or index.get("format") != RECORDS_FORMAT:
        raise DancegrpoError(
            f"{what}: {index_path} is not a format-{RECORDS_FORMAT} records index",
            f"this dancegrpo-npu reads format {RECORDS_FORMAT} (docs/alignment.md); record the run again",
            exit_code=2,
        )
    return index


def module_group(name: str) -> str:
    """transformer | vae | reward: the model a module record belongs to ("reward/visual", and
    "reward.image_features", an item of the root's output); other names count as transformer."""
    head = name.split("/", 1)[0].split(".", 1)[0]
    return head if head in MODULE_GROUPS else "transformer"


def _safetensors():
    try:
        from safetensors import safe_open
    except ImportError:
        raise DancegrpoError(
            "compare needs the safetensors and numpy packages",
            "install the train extra: pip install 'dancegrpo-npu[train]'",
            exit_code=2,
        ) from None
    return safe_open


@dataclass(frozen=True)
class RunRecords:
    run_dir: Path
    index: dict

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def root(self) -> Path:
        return self.run_dir / "records"

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(sorted(s for s in self.index.get("steps") or [] if isinstance(s, int)))

    @property
    def world_size(self) -> int:
        return int(self.index.get("world_size") or 1)

    def step_file(self, step: int, rank: int) -> Path:
        return self.root / f"step_{step:06d}" / f"rank_{rank}.safetensors"

    def has_modules(self) -> bool:
        return bool(self.index.get("modules")) and (self.root / "modules" / "rank_0.json").is_file()

    def module_order(self, rank: int) -> list[str]:
        path = self.root / "modules" / f"rank_{rank}.json"
        try:
            order = json.loads(path.read_text()).get("order")
        except (OSError, ValueError, AttributeError):
            order = None
        if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
            raise DancegrpoError(f"{path} is missing or has no list 'order'", "record the run again", exit_code=2)
        return order

    def module_file(self, rank: int) -> Path:
        return self.root / "modules" / f"rank_{rank}.safetensors"


def load_records(runs_dir: Path, ref: str) -> RunRecords:
    run_dir = find_run(runs_dir, ref)
    return RunRecords(run_dir, records_index(run_dir, what="compare"))


def check_comparable(a: RunRecords, b: RunRecords) -> None:
    """Exit-2 refusals: runs whose tensors cannot be put side by side."""
    differ = [(words, a.index.get(key), b.index.get(key)) for key, words in MUST_MATCH
              if a.index.get(key) != b.index.get(key)]  # fmt: skip
    if differ:
        text = ", ".join(f"{words} {va} vs {vb}" for words, va, vb in differ)
        raise DancegrpoError(
            f"compare: {a.name} and {b.name} differ in {text}",
            "compare runs made with the same world size, resolution, generations and sampling steps",
            exit_code=2,
        )


def common_steps(a: RunRecords, b: RunRecords, wanted: tuple[int, ...] | None) -> tuple[int, ...]:
    steps = sorted(set(a.steps) & set(b.steps) & (set(wanted) if wanted is not None else set(a.steps)))
    if not steps:
        chosen = f"; --steps {shown_steps(wanted)}" if wanted is not None else ""
        raise DancegrpoError(
            f"compare: no common recorded step ({a.name}: {shown_steps(a.steps)}, "
            f"{b.name}: {shown_steps(b.steps)}{chosen})",
            "record the same steps in both runs (--record-steps)",
            exit_code=2,
        )
    return tuple(steps)


class TensorFile:
    """One safetensors file, read tensor by tensor as numpy arrays."""

    def __init__(self, handle, path: Path):
        self._h, self.path = handle, path
        self.names = frozenset(handle.keys())

    def get(self, name: str):
        return self._h.get_tensor(name) if name in self.names else None


@contextmanager
def open_pair(path_a: Path, path_b: Path) -> Iterator[tuple[TensorFile, TensorFile]]:
    safe_open = _safetensors()
    for p in (path_a, path_b):
        if not p.is_file():
            raise DancegrpoError(
                f"compare: {p} is missing although its run's index lists it",
                "the run was interrupted while recording, or the file was removed; compare other steps with --steps",
                exit_code=2,
            )
    with ExitStack() as stack:
        files = []
        for p in (path_a, path_b):
            try:
                files.append(TensorFile(stack.enter_context(safe_open(str(p), framework="np")), p))
            except Exception as e:  # noqa: BLE001 - safetensors raises several types for a bad file
                raise DancegrpoError(f"compare: {p} is not a readable safetensors file ({e})",
                                     "record the run again", exit_code=2) from None
        yield files[0], files[1]
