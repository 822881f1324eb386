"""Shared fixtures.

- ``upstream_source`` (session): a fetchable real upstream DanceGRPO, from
  $DANCEGRPO_SOURCE or the lock's URL (git's insteadOf mirrors apply); otherwise the
  test is skipped with a reason starting "upstream unavailable:" (scripts/test.sh
  counts those).
- in CI (``CI`` set to true/1/yes, as GitHub Actions, GitLab and most CI services set
  it) a test skipped with a reason starting "upstream unavailable:" FAILS instead,
  however the skip was raised (this fixture, or a test's own ``pytest.skip``): the
  tests of the port itself need upstream, and a CI run that skipped them all would
  pass without testing the port.  On a user's machine skipping stays right.
- ``patched_tree`` (session): a copy of this project's upstream.lock, patches/ and
  overlay/ in a temporary project, with the real upstream fetched and the series
  applied; ``.project`` (a Project) and ``.tree`` (the patched work tree).
- ``shared_runs`` (session): runs and fixtures made once per test run and read by every test
  that needs them, on either xdist worker (tests/shared_runs.py).
- the ``upstream`` marker, for tests that use them.
- ``DANCEGRPO_TEST_CPU_LOG=DIR``: each test's CPU time (its own process's and that of the
  processes it started and waited for, with their children), one JSON line a test in
  ``DIR/<worker>.jsonl``; ``scripts/test_cost.py DIR`` adds it up by file and by trainer family.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from shared_runs import SharedRuns, shared_root

# the tests' shared checks report their failing asserts as a test's own do
pytest.register_assert_rewrite("smoke_runs")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
LS_REMOTE_TIMEOUT_S = 20
# Every skip for lack of upstream starts with this; scripts/test_summary.py counts them.
UPSTREAM_UNAVAILABLE = "upstream unavailable:"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def require_msprobe() -> None:
    """The msprobe extra (mindstudio-probe) is optional for users: without it a test that needs
    it is skipped, saying so; under CI, where scripts/bootstrap.sh installs it, it fails."""
    import importlib.util

    if importlib.util.find_spec("msprobe") is None:
        why = "the msprobe extra (mindstudio-probe) is not installed: pip install 'dancegrpo-npu[msprobe]'"
        if in_ci():
            pytest.fail(f"CI: {why}")
        pytest.skip(why)


def require_video_extra() -> None:
    """pyproject's video extra (trl, datasets, PyAV: what VideoAlign, the video trainers' reward,
    imports) is skipped without, saying so; under CI, where scripts/bootstrap.sh installs it, it
    fails."""
    import importlib.util

    missing = [name for name in ("trl", "datasets", "av") if importlib.util.find_spec(name) is None]
    if missing:
        why = f"the video extra is not installed ({', '.join(missing)}): pip install 'dancegrpo-npu[video]'"
        if in_ci():
            pytest.fail(f"CI: {why}")
        pytest.skip(why)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "upstream: needs the real upstream DanceGRPO (skipped when it cannot be fetched; fails under CI=true)"
    )
    config.stash[CPU_LOG_FILE] = cpu_log_file()
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        # A worker's share of the cores for the jobs it starts (OMP_NUM_THREADS wins in
        # host.cpus.cpu_threads): by default a job's ranks share every usable core, which the other
        # worker's job uses too, and OpenMP's threads then spin against each other.
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // int(workers)))


@pytest.hookimpl(hookwrapper=True)  # the old-style wrapper: pyproject allows pytest 7.4
def pytest_runtest_makereport(item, call):
    """Under CI, a skip for lack of upstream becomes a failure that says why."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and call.excinfo is not None and call.excinfo.errisinstance(pytest.skip.Exception):
        reason = str(call.excinfo.value.msg)
        if reason.startswith(UPSTREAM_UNAVAILABLE):
            report.outcome = "failed"
            report.longrepr = (
                f"{reason}\nCI={os.environ['CI']}: a test that needs upstream fails in CI instead of being skipped; "
                "give the CI job upstream (a mirror through git's url.<base>.insteadOf, or DANCEGRPO_SOURCE)"
            )


CPU_LOG = "DANCEGRPO_TEST_CPU_LOG"
CPU_LOG_OF = "DANCEGRPO_TEST_CPU_LOG_OF"  # "<pid of the test run's first pytest>:<directory>", for its workers
CPU_LOG_FILE = pytest.StashKey()


def cpu_log_file() -> Path | None:
    """The file this pytest process logs each test's CPU time to, or None.  The test run's first
    process takes $DANCEGRPO_TEST_CPU_LOG, refusing a directory that holds another run's log (its
    tests would count twice), and hands it on to its own xdist workers only: a pytest that a test
    starts (tests/test_ci_upstream.py) inherits the environment, and must not write into the log."""
    given = os.environ.pop(CPU_LOG, None)
    if given:
        directory = Path(given).resolve()
        if any(directory.glob("*.jsonl")):
            raise pytest.UsageError(f"{CPU_LOG}={given} already holds a CPU log; give a new or empty directory")
        os.environ[CPU_LOG_OF] = f"{os.getpid()}:{directory}"
        return directory / "main.jsonl"
    pid, _, directory = os.environ.get(CPU_LOG_OF, "").partition(":")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and pid.isdigit() and os.getppid() == int(pid):
        return Path(directory) / f"{worker}.jsonl"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With $DANCEGRPO_TEST_CPU_LOG, the test's CPU time, set-up and teardown included.  CI here is
    bound by the CPU, so CPU time, not the wall clock of a noisy machine, is what a test costs; a
    run shared by several tests (tests/shared_runs.py) is paid by the first that asks for it."""
    log = item.config.stash.get(CPU_LOG_FILE, None)
    if log is None:
        yield
        return
    import json
    import time

    before, start = os.times(), time.monotonic()
    yield
    after = os.times()
    own = after.user - before.user + after.system - before.system
    children = after.children_user - before.children_user + after.children_system - before.children_system
    line = {"test": item.nodeid, "cpu_s": round(own + children, 3), "children_cpu_s": round(children, 3),
            "wall_s": round(time.monotonic() - start, 3), "slow": item.get_closest_marker("slow") is not None}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(json.dumps(line) + "\n")


def _probe_source() -> tuple[str | None, str]:
    """(source, "") when the real upstream can be fetched, else (None, why not)."""
    from dancegrpo_npu.engine.lock import load_lock

    env = os.environ.get("DANCEGRPO_SOURCE")
    if env:
        path = Path(env).expanduser()
        if env.endswith((".tar.gz", ".tgz")):
            if not path.is_file():
                return None, f"DANCEGRPO_SOURCE={env} does not exist"
            from dancegrpo_npu.engine.lock import sha256_file

            try:
                want = load_lock(PROJECT_ROOT / "upstream.lock").archive_sha256
            except Exception as e:
                return None, f"cannot read upstream.lock ({e})"
            if sha256_file(path) != want:
                return None, f"DANCEGRPO_SOURCE={env} does not have the sha256 upstream.lock's archive_sha256 records"
            return str(path), ""
        source = env
    else:
        try:
            source = load_lock(PROJECT_ROOT / "upstream.lock").url
        except Exception as e:  # a broken lock is reported by the lock tests themselves
            return None, f"cannot read upstream.lock ({e})"
    if shutil.which("git") is None:
        return None, "git is not installed"
    try:
        proc = subprocess.run(
            ["git", "ls-remote", "--heads", source],
            capture_output=True,
            timeout=LS_REMOTE_TIMEOUT_S,
            env=dict(os.environ, GIT_TERMINAL_PROMPT="0"),
        )
    except subprocess.TimeoutExpired:
        return None, f"git ls-remote {source} timed out after {LS_REMOTE_TIMEOUT_S} s"
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
        first = next((ln for ln in lines if ln.startswith("fatal:")), lines[-1])
        return None, f"git ls-remote {source} failed ({first})"
    return source, ""


@pytest.fixture(scope="session")
def upstream_source() -> str:
    source, why = _probe_source()
    if source is None:
        pytest.skip(f"{UPSTREAM_UNAVAILABLE} {why}; set DANCEGRPO_SOURCE to a git URL, directory or .tar.gz")
    return source


@dataclass(frozen=True)
class PatchedTree:
    project: "object"  # dancegrpo_npu.project.Project
    tree: Path


def copy_project(dest: Path) -> Path:
    """This project's lock, series and overlay, copied into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(PROJECT_ROOT / "upstream.lock", dest / "upstream.lock")
    shutil.copytree(PROJECT_ROOT / "patches", dest / "patches")
    if (PROJECT_ROOT / "overlay").is_dir():
        shutil.copytree(PROJECT_ROOT / "overlay", dest / "overlay", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


@pytest.fixture(scope="session")
def patched_tree(upstream_source, tmp_path_factory) -> PatchedTree:
    from dancegrpo_npu.engine.apply import apply_worktree
    from dancegrpo_npu.engine.fetch import fetch
    from dancegrpo_npu.project import find_project

    root = copy_project(tmp_path_factory.mktemp("patched") / "project")
    project = find_project(root)
    fetch(project, source=upstream_source)
    apply_worktree(project)
    return PatchedTree(project=project, tree=project.workdir)


@pytest.fixture
def dry_run_tree(patched_tree, monkeypatch, tmp_path) -> PatchedTree:
    """The session's patched tree, with this test's own runs directory (DANCEGRPO_RUNS under
    ``tmp_path``): for a launch --dry-run, which plans a run directory and writes none."""
    monkeypatch.setenv("DANCEGRPO_RUNS", str(tmp_path / "runs"))
    return patched_tree


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory) -> SharedRuns:
    return SharedRuns(shared_root(tmp_path_factory.getbasetemp()))


def pytest_collection_modifyitems(config, items):
    """Files with training runs (``slow`` tests) first, the most first; then the others, the most
    tests first.  A file runs on one xdist worker (scripts/test.sh: --dist loadfile,
    --no-loadscope-reorder), so the long files start early and the many short ones fill in at the
    end, instead of one worker running the last long file while the other has nothing left.
    Within a file the order is the file's."""

    def file_of(item) -> str:
        return item.nodeid.split("::")[0]

    first: dict[str, int] = {}
    tests: dict[str, int] = {}
    runs: dict[str, int] = {}
    for i, item in enumerate(items):
        name = file_of(item)
        first.setdefault(name, i)
        tests[name] = tests.get(name, 0) + 1
        runs[name] = runs.get(name, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: (runs[file_of(item)] == 0, -(runs[file_of(item)] or tests[file_of(item)]),
                                 first[file_of(item)]))
