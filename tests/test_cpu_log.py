"""Each test's CPU time under $DANCEGRPO_TEST_CPU_LOG (tests/conftest.py), and scripts/test_cost.py,
which adds it up by file and by trainer family.

The log is read from pytest run in a subprocess on a tiny test file, with tests/conftest.py loaded
as a plugin (as tests/test_ci_upstream.py does), in one process and on two xdist workers: one test
that burns CPU in a child process it waits for, one that burns it in its own process, one that
does neither, and one that runs a pytest of its own, which inherits the environment and must not
write into the log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import test_cost  # noqa: E402

BURN = 0.4  # CPU seconds each busy test spends

TINY_TESTS = f'''
import subprocess, sys, time
import pytest

def burn():
    end = time.process_time() + {BURN}
    while time.process_time() < end:
        pass

def test_in_a_child():
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + {BURN}\\nwhile time.process_time() < end: pass"], check=True)

@pytest.mark.slow
def test_in_its_own_process():
    burn()

def test_idle():
    pass

def test_a_pytest_of_its_own(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\\n")
    (tmp_path / "test_inner.py").write_text("def test_inner():\\n    pass\\n")
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "conftest", "-q", "test_inner.py"],
                   cwd=tmp_path, check=True, capture_output=True)
'''


def run_tiny(tmp_path: Path, log: Path, workers: int = 0) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: a training run\n")
    (tmp_path / "test_tiny.py").write_text(TINY_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "DANCEGRPO_TEST_CPU_LOG"))}
    env.update(DANCEGRPO_TEST_CPU_LOG=str(log), PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "conftest", "-q",
                           "-n", str(workers), "test_tiny.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("workers, files", [(0, {"main.jsonl"}), (2, {"gw0.jsonl", "gw1.jsonl"})])
def test_each_test_logs_its_cpu_its_childrens_included(tmp_path, workers, files):
    log = tmp_path / "cpu"
    proc = run_tiny(tmp_path, log, workers)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = {p.name for p in log.iterdir()}
    assert written and written <= files  # a file a worker that ran tests
    lines = [json.loads(line) for f in written for line in (log / f).read_text().splitlines()]
    assert sorted(line["test"] for line in lines) == [f"test_tiny.py::{name}" for name in (
        "test_a_pytest_of_its_own", "test_idle", "test_in_a_child", "test_in_its_own_process")]  # not test_inner
    lines = {line["test"]: line for line in lines}
    child, own, idle = (lines[f"test_tiny.py::{name}"] for name in ("test_in_a_child", "test_in_its_own_process", "test_idle"))
    assert child["children_cpu_s"] >= BURN * 0.9 and child["cpu_s"] >= child["children_cpu_s"]
    assert own["cpu_s"] >= BURN * 0.9 and own["children_cpu_s"] < BURN / 2
    assert idle["cpu_s"] < BURN / 2
    assert own["slow"] and not child["slow"] and not idle["slow"]


def test_a_log_directory_of_another_run_is_refused(tmp_path):
    log = tmp_path / "cpu"
    log.mkdir()
    (log / "gw0.jsonl").write_text('{"test": "x", "cpu_s": 1, "children_cpu_s": 0, "wall_s": 1}\n')
    proc = run_tiny(tmp_path, log)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert f"DANCEGRPO_TEST_CPU_LOG={log} already holds a CPU log; give a new or empty directory" in proc.stderr
    assert (log / "gw0.jsonl").read_text().count("\n") == 1  # nothing appended


def test_families_are_the_registrys_folders_and_their_trainers():
    from dancegrpo_npu import registry

    known = registry.families()
    assert sorted(t for trainers in known.values() for t in trainers) == sorted(registry.trainers())
    assert known["hunyuan"] == ["hunyuan", "skyreels-i2v"] and known["flux"] == ["flux", "flux-lora"]


@pytest.mark.parametrize("test_id, named", [
    ("tests/smoke/test_smoke_sd.py::test_two_ranks", ["sd"]),
    ("tests/smoke/test_smoke_hunyuan.py::test_resumes[skyreels-i2v]", ["hunyuan"]),
    ("tests/patches/test_sde_window.py::test_off[wan]", ["wan"]),  # "sde" is not "sd"
    ("tests/patches/test_sde_window.py::test_replay", []),
    ("tests/run/test_launch.py::test_dry_run[flux-lora-wan]", []),  # one word, no trainer's name
    ("tests/run/test_launch.py::test_two[flux wan]", ["flux", "wan"]),
])
def test_a_test_counts_for_the_families_its_id_names(test_id, named):
    from dancegrpo_npu import registry

    assert test_cost.named_families(test_id, registry.families()) == named


def test_the_cost_adds_up_by_file_and_splits_a_test_naming_two_families():
    known = {"flux": ("flux", "flux-lora"), "wan": ("wan",)}
    lines = [
        {"test": "tests/a.py::t[flux wan]", "cpu_s": 10.0, "wall_s": 11.0, "slow": True},
        {"test": "tests/a.py::u", "cpu_s": 2.0, "wall_s": 2.5},
        {"test": "tests/test_wan.py::v", "cpu_s": 4.0, "wall_s": 4.0, "slow": True},
    ]
    totals = test_cost.cost(lines, known)
    assert totals["cpu_s"] == 16.0 and totals["wall_s"] == 17.5 and totals["slow_cpu_s"] == 14.0
    assert totals["by_file"] == {"tests/a.py": 12.0, "tests/test_wan.py": 4.0}
    assert totals["by_family"] == {"flux": 5.0, "wan": 9.0, test_cost.NONE: 2.0}


def test_the_script_says_what_to_run_without_a_log(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        test_cost.main([str(tmp_path)])
    assert str(e.value) == (f"test_cost.py: error: no *.jsonl in {tmp_path}; run the tests with "
                            f"DANCEGRPO_TEST_CPU_LOG={tmp_path} first")
