"""The engine's verbs through the CLI: one line on stderr, non-zero exit, no traceback,
for every kind of bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_upstream import run_git, setup

from dancegrpo_npu.cli import main

SRC = Path(__file__).resolve().parents[2] / "src"


def _run(s, *args, capsys):
    rc = main(["-C", os.fspath(s.project.root), *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _one_line(rc, err, needle):
    assert rc != 0
    assert err.startswith("dancegrpo-npu: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert needle in err, err


def test_bad_series_inputs(tmp_path, capsys):
    s = setup(tmp_path)
    patches = s.project.patches_dir
    (patches / "series").write_text("0001-missing.patch\n")
    _one_line(*_run(s, "apply", capsys=capsys)[::2], "0001-missing.patch does not exist")
    (patches / "0001-missing.patch").write_text("Author: x\n---\n--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-a\n+b\n")
    _one_line(*_run(s, "apply", capsys=capsys)[::2], "no DEP-3 'Description:'")
    (patches / "0001-missing.patch").write_text("Description: nothing\n\njust prose, no diff\n")
    _one_line(*_run(s, "apply", capsys=capsys)[::2], "contains no unified diff")
    (patches / "series").write_bytes(b"\xff\xfe\n")
    _one_line(*_run(s, "status", capsys=capsys)[::2], "series")
    (patches / "series").unlink()
    _one_line(*_run(s, "verify", capsys=capsys)[::2], "series does not exist")


def test_not_a_project(tmp_path, capsys):
    rc = main(["-C", os.fspath(tmp_path), "apply"])
    _one_line(rc, capsys.readouterr().err, "not a dancegrpo-npu project")


def test_fetch_errors(tmp_path, capsys):
    s = setup(tmp_path, fetch=False)
    _one_line(*_run(s, "fetch", "--source", os.fspath(tmp_path / "nope.tar.gz"), capsys=capsys)[::2], "does not exist")
    _one_line(*_run(s, "fetch", "--source", "file:///no/such/repo", capsys=capsys)[::2], "cannot fetch upstream")
    rc, out, err = _run(s, "fetch", "--source", s.up.url(), capsys=capsys)
    assert rc == 0 and "fetched from" in out
    rc, out, err = _run(s, "fetch", "--source", s.up.url(), capsys=capsys)
    assert rc == 0 and "nothing to do" in out


def test_help_teaches(capsys):
    for verb in ("fetch", "apply", "status", "verify", "lock"):
        with pytest.raises(SystemExit) as e:
            main([verb, "--help"])
        assert e.value.code == 0
        text = capsys.readouterr().out
        assert verb in text and len(text) > 200


def test_cli_in_a_subprocess(tmp_path):
    """The real console path: python -m dancegrpo_npu fetch / apply / verify."""
    s = setup(tmp_path, fetch=False)
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", DANCEGRPO_SOURCE=s.up.url())
    cli = [sys.executable, "-m", "dancegrpo_npu", "-C", os.fspath(s.project.root)]
    for verb in ("fetch", "apply", "verify", "status"):
        proc = subprocess.run(cli + [verb], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, (verb, proc.stderr)
    assert run_git(s.tree, "rev-parse", "HEAD").decode().strip() == s.up.commit
    proc = subprocess.run(cli + ["--workdir", os.fspath(tmp_path / "none"), "verify"], env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "run `dancegrpo-npu fetch` first" in proc.stderr
