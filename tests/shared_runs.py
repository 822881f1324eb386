"""Runs and fixtures made once per test run and read by every test that needs them, on either
pytest-xdist worker (``shared_runs``, a session fixture of tests/conftest.py).

A training run is the suite's costly unit (tens of seconds, most of it the ranks' imports), and
many tests read the same one: the alignment tests, compare, the rollout batching, a resume's
uninterrupted reference, the smokes.  ``SharedRuns.launch`` and ``SharedRuns.smoke`` make a run
the first time it is asked for and hand the same record to every later request, from any test
file on any worker: the key is everything that decides the run - the work tree's files (so a tree
without a patch, or with a planted fault, is another key), the launch spec or smoke options with
the project's own paths taken out, and the environment variables the job reads.  The first
asker holds a file lock on the key while it makes the run; a second asker waits for it and reads
the result.  A run that raised is not kept: the next asker makes it again, and fails the same way.

Shared runs are read, never changed: a test that continues, resumes or compares *into* a run
copies it first (``private_copy``).  They live under the session's base temporary directory
(pytest-N/, which the workers' popen-gwN/ directories sit in), so a test run never reads
another test run's records.

``smoke_fixtures`` seeds a project's build directory with a trainer's smoke fixtures, built once a
test run: every project copy (the patched tree, the trees without a patch) and every worker uses
them instead of building its own.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import pickle
import shutil
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

# What of the tests' environment reaches a job and can change it (the rest is the shell's).
JOB_ENV_PREFIXES = ("DANCEGRPO_", "WANDB_", "FAKE_TORCH_NPU", "TORCH_", "OMP_", "MKL_", "HF_", "CUDA_", "ASCEND_",
                    "PYTHONPATH", "TOKENIZERS_", "CI")


def shared_root(basetemp: Path) -> Path:
    """The directory the workers of one test run share: pytest-N/ under xdist (each worker's
    basetemp is pytest-N/popen-gwN), the run's own basetemp without it."""
    return (basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp) / "shared"


def tree_digest(tree: Path) -> str:
    """The work tree's files (names and bytes, byte-code and git's store left out): equal for the
    workers' copies of one series, different for a tree without a patch or with a planted edit."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(tree).rglob("*") if p.is_file() and ".git" not in p.relative_to(tree).parts
                       and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(tree)).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _job_env() -> dict[str, str]:
    """The variables a job reads, each value as a digest (a key is written beside its run)."""
    return {k: hashlib.sha256(v.encode()).hexdigest()[:16] for k, v in sorted(os.environ.items())
            if k.startswith(JOB_ENV_PREFIXES)}


def _portable(value, project) -> object:
    """``value`` as JSON, the project's own paths replaced by placeholders: the workers' copies
    of one project then give one key."""
    text = json.dumps(value, sort_keys=True, default=str)
    for path, name in ((project.workdir, "<tree>"), (project.root, "<project>")):
        text = text.replace(str(path), name)
    return json.loads(text)


@contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    with open(lock_file, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # waits while another worker makes it
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def private_copy(run_dir: Path, dest: Path) -> Path:
    """A copy of a shared run to change (resume, continue, compare into): ``dest/<run's name>``."""
    dest.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(run_dir, dest / run_dir.name, symlinks=True))


@dataclasses.dataclass(frozen=True)
class SharedRuns:
    root: Path

    def get(self, key: dict, make: Callable[[Path], T]) -> T:
        """``make(directory)``'s result for ``key``, made once: the first call runs it in an empty
        directory of the key's own, every later call (any worker) reads what it returned."""
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
        self.root.mkdir(parents=True, exist_ok=True)
        entry, result = self.root / digest, self.root / digest / "result.pickle"
        with _locked(self.root / f"{digest}.lock"):
            if result.is_file():
                return pickle.loads(result.read_bytes())
            shutil.rmtree(entry, ignore_errors=True)  # what a make that raised left
            entry.mkdir()
            (entry / "key.json").write_text(json.dumps(key, indent=1, sort_keys=True, default=str))
            made = make(entry)
            result.write_bytes(pickle.dumps(made))
            return made

    def launch(self, project, spec):
        """``launch(project, spec)``'s RunRecord, the run made once; its directory is shared."""
        from dancegrpo_npu.project import Project
        from dancegrpo_npu.run.launch import launch

        key = {"launch": _portable(dataclasses.asdict(spec), project), "tree": tree_digest(project.workdir),
               "env": _job_env()}
        return self.get(key, lambda d: launch(Project(root=project.root, workdir=project.workdir, runs=d / "runs"),
                                              spec))

    def smoke(self, project, options):
        """``run_smoke(project, options)``'s SmokeResult, or the DancegrpoError it ended with, the
        run made once; its directory is shared."""
        from dancegrpo_npu.errors import DancegrpoError
        from dancegrpo_npu.project import Project
        from dancegrpo_npu.smoke.runner import run_smoke

        def make(d: Path):
            try:
                return run_smoke(Project(root=project.root, workdir=project.workdir, runs=d / "runs"), options)
            except DancegrpoError as e:  # a smoke that fails is a result to read, as one that passes
                return e

        key = {"smoke": _portable(dataclasses.asdict(options), project), "tree": tree_digest(project.workdir),
               "env": _job_env()}
        return self.get(key, make)


FLUX_FIXTURES = "fixtures-flux"  # where the FLUX smoke keeps its fixtures in a project's build directory
SCRATCH = "fixtures-project"  # the project every worker's fixtures are built in


def smoke_fixtures(shared: SharedRuns, project, trainer: str):
    """What the smoke of ``trainer`` reads from ``project``'s build directory (its row's fixtures
    hook's result), each of its builds made once a test run: in one scratch project every worker
    shares (the builders lock each directory they build), then linked into ``project``'s (a build
    is swapped in whole, never changed in place, so the links are never written through)."""
    from dancegrpo_npu import registry
    from dancegrpo_npu.smoke.fixtures import STAMP_NAME

    spec = registry.smoke_spec(trainer)
    hook = registry.load(spec.smoke.fixtures)
    scratch = _scratch(shared, project)

    def build(_: Path) -> None:
        hook(scratch, None, spec)

    shared.get({"smoke fixtures": trainer}, build)
    for built in sorted(scratch.build_dir.iterdir()):
        dest = project.build_dir / built.name
        if not built.name.startswith(".") and (built / STAMP_NAME).is_file() and not dest.exists():
            shutil.copytree(built, dest, copy_function=os.link)
    return hook(project, None, spec)  # the builds found current: reused


def _scratch(shared: SharedRuns, project):
    from dancegrpo_npu.project import Project

    return Project(root=shared.root / SCRATCH, workdir=project.workdir)


def flux_fixtures(shared: SharedRuns, project):
    """The FLUX smoke's fixtures in ``project``'s build directory, where the smoke reads them (the
    test run's one build); the tests' own launches take them from there too."""
    built = smoke_fixtures(shared, project, "flux")
    assert built.root == project.build_dir / FLUX_FIXTURES, f"the FLUX smoke's fixtures moved to {built.root}"
    return built


def flux_build(shared: SharedRuns):
    """The FLUX smoke's fixtures of the test run's one build, outside any project (read only;
    needs no upstream tree): the scratch project's, which the builder locks and reuses."""
    from dancegrpo_npu.trainers.flux.fixtures import build_fixtures

    return build_fixtures(shared.root / SCRATCH / "build" / FLUX_FIXTURES)


def flux_spec(fixtures, *extra: str, nproc: int = 1, lora: bool = False, steps: int = 2, generations: int = 2,
              checkpointing_steps: int | None = None, env=(), align=None, max_restarts: int = 0):
    """The FLUX trainer launched as the smoke launches it (upstream's recipe shrunk, strict mode,
    the CPU, no upstream defaults) with ``extra`` trainer arguments after the smoke's own: one
    spec for every file's FLUX runs, so that equal runs are one shared run."""
    from dancegrpo_npu.run.align_flags import AlignOptions
    from dancegrpo_npu.run.launch import LaunchSpec
    from dancegrpo_npu.smoke.runner import job_env
    from dancegrpo_npu.trainers.flux.smoke import trainer_args

    args = trainer_args(fixtures, lora, steps, generations, checkpointing_steps) + tuple(extra)
    return LaunchSpec(script="flux-lora" if lora else "flux", args=args, nproc_per_node=nproc, device="cpu",
                      name="flux", env=job_env("cpu", nproc) + tuple(env), upstream_defaults=False, strict=True,
                      align=align or AlignOptions(), max_restarts=max_restarts)


# The clean exit's probe (tests/patches/test_clean_exit.py): the runs that carry it are shared with
# the tests that read other things of them (the 2-rank FLUX smoke, the 2-rank preprocessing).
EXIT_PROBE = textwrap.dedent('''\
    """Test probe (tests/shared_runs.py, for tests/patches/test_clean_exit.py): the thread names
    of a rank, during the run and in its last atexit handler, into $EXIT_PROBE_DIR/rank<RANK>.json
    (a relative directory: in the rank's working directory, the run directory)."""
    import atexit, json, os, threading

    def _names():
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as f:
                    names.append(f.read().strip())
            except OSError:  # the thread ended meanwhile
                pass
        return sorted(names)

    if os.environ.get("RANK") is not None and os.environ.get("EXIT_PROBE_DIR"):
        _seen, _stop = set(), threading.Event()

        def _sample():
            while not _stop.wait(0.05):
                _seen.update(_names())

        _sampler = threading.Thread(target=_sample, name="exit-probe", daemon=True)
        _sampler.start()

        @atexit.register  # registered first, so called last: after every other handler
        def _at_exit():
            _stop.set()
            _sampler.join()
            os.makedirs(os.environ["EXIT_PROBE_DIR"], exist_ok=True)
            path = os.path.join(os.environ["EXIT_PROBE_DIR"], f"rank{os.environ['RANK']}.json")
            with open(path, "w") as f:
                json.dump({"seen": sorted(_seen), "at_exit": _names()}, f)
    ''')

EXIT_PROBE_REPORTS = "exit-probe"  # the probe's reports, in the run directory


def probe_env(shared_runs) -> tuple[tuple[str, str], ...]:
    """The job environment that puts the probe on the ranks: the same for every test and worker,
    so that the runs that carry it are shared."""

    def write(site: Path) -> Path:
        (site / "sitecustomize.py").write_text(EXIT_PROBE)
        return site

    site = shared_runs.get({"exit-probe": EXIT_PROBE}, write)
    return (("PYTHONPATH", str(site)), ("EXIT_PROBE_DIR", EXIT_PROBE_REPORTS))
