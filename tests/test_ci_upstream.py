"""Under CI, a test that needs upstream and cannot get it fails, saying why; elsewhere it skips.

Runs pytest in a subprocess on a tiny test file, with tests/conftest.py loaded as a plugin,
git's global config (and with it any insteadOf mirror) off, and DANCEGRPO_SOURCE pointing
at a directory that does not exist, so upstream is unavailable whatever this machine has.
scripts/test_summary.py (test.sh's closing lines) then counts the report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TINY_TESTS = '''
import pytest

@pytest.mark.upstream
def test_uses_the_fixture(upstream_source):
    assert upstream_source

def test_skips_by_itself():
    pytest.skip("upstream unavailable: this test's own reason")

def test_skips_for_another_reason():
    pytest.skip("no GPU here")
'''


def run_tiny(tmp_path: Path, ci: str | None) -> tuple[subprocess.CompletedProcess, str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_tiny.py").write_text(TINY_TESTS)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "DANCEGRPO_SOURCE")}
    env.update(
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_CONFIG_NOSYSTEM="1",
        DANCEGRPO_SOURCE=str(tmp_path / "no-such-upstream"),
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]),
    )
    if ci is not None:
        env["CI"] = ci
    report = tmp_path / "report.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "conftest", "-rA", f"--junitxml={report}", "test_tiny.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "test_summary.py"), str(report), str(proc.returncode)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return proc, summary


@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_a_test_needing_upstream_fails_saying_why(tmp_path, ci):
    proc, summary = run_tiny(tmp_path, ci)
    out = proc.stdout
    assert proc.returncode == 1, out
    assert "1 failed, 1 skipped, 1 error" in out  # the fixture fails at setup: pytest calls that an error
    assert "ERROR test_tiny.py::test_uses_the_fixture - upstream unavailable: git ls-remote" in out
    assert "no-such-upstream" in out and "does not appear to be a git repository" in out
    assert "FAILED test_tiny.py::test_skips_by_itself - upstream unavailable: this test's own reason" in out
    assert f"CI={ci}: a test that needs upstream fails in CI instead of being skipped" in out
    assert "SKIPPED [1] test_tiny.py:12: no GPU here" in out  # other skips stay skips
    assert "2 failed for lack of upstream" in summary
    assert "tests: 0 passed, 2 failed, 1 skipped" in summary


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_outside_ci_it_skips_with_the_reason(tmp_path, ci):
    proc, summary = run_tiny(tmp_path, ci)
    out = proc.stdout
    assert proc.returncode == 0, out
    assert "3 skipped" in out
    assert "SKIPPED [1] test_tiny.py:4: upstream unavailable: git ls-remote" in out
    assert "SKIPPED [1] test_tiny.py:9: upstream unavailable: this test's own reason" in out
    assert "3 skipped, 2 of them for lack of upstream" in summary and "failed for lack" not in summary
