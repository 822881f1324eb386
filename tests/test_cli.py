"""The CLI shell: help, -C, one-line errors without tracebacks."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "dancegrpo_npu", *args], cwd=cwd, capture_output=True, text=True)


def test_help_lists_verbs():
    r = run("--help")
    assert r.returncode == 0
    assert "series" in r.stdout and "upstream.lock" in r.stdout


def test_series_lists_patches_in_order():
    r = run("series")
    assert r.returncode == 0, r.stderr
    names = [line.split()[1] for line in r.stdout.splitlines() if line.strip()[:1].isdigit()]
    listed = [n for n in (ROOT / "patches" / "series").read_text().split("\n") if n.strip() and not n.startswith("#")]
    assert names == [n.strip() for n in listed]


def test_not_a_project_is_one_line_error(tmp_path):
    r = run("-C", str(tmp_path), "series")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "no upstream.lock" in r.stderr and "-C DIR" in r.stderr


def test_C_after_the_verb(tmp_path):
    r = run("series", "-C", str(tmp_path))
    assert r.returncode == 1 and "no upstream.lock" in r.stderr


def test_cli_starts_without_torch():
    code = "import sys; import dancegrpo_npu.cli as c; c.build_parser(); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip() == "False", r.stderr
