"""After a rebase, every trainer's script is imported under its dependency set: a module-level
import that lines merged cleanly brought in, which breaks the trainers at start, ends the
rebase naming its file, line, nearest patch and upstream commit."""

from __future__ import annotations

import re
from pathlib import Path

from dancegrpo_npu.engine.series import load_series
from dancegrpo_npu.project import find_project
from dancegrpo_npu.rebase.imports import check_trainer_imports
from dancegrpo_npu.rebase.session import start_rebase
from dancegrpo_npu.vcs.gitcmd import Git
from rebase_helpers import History, PatchSpec, git, make_project, run_cli, set_line
from test_rebase import DATE

MISSING = "dancegrpo_npu_no_such_module"


def module(name: str, lines: int) -> str:
    """Valid Python, every line distinct."""
    return "".join(f"{name}_value_{i} = {i}\n" for i in range(1, lines + 1))


def trainers_upstream(path: Path) -> History:
    """flux and sd (the default set) import fastvideo/utils/load.py; wan (diffusers-0.35) does not."""
    h = History(path)
    h.write("fastvideo/__init__.py", "")
    h.write("fastvideo/utils/__init__.py", "")
    h.write("fastvideo/utils/load.py", module("load", 30))
    for script in ("train_grpo_flux.py", "train_grpo_sd.py"):
        h.write(f"fastvideo/{script}", "from fastvideo.utils import load\n" + module("train", 20)
                + 'if __name__ == "__main__":\n    raise SystemExit("main must not run")\n')
    h.write("fastvideo/train_grpo_wan_2_1.py", module("wan", 10))
    h.commit("initial upstream")
    return h


SPECS = [PatchSpec("0001-load-device.patch", "Load onto the run's device",
                   {"fastvideo/utils/load.py": set_line(12, "load_value_12 = 'npu'")})]


def a_project(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", DATE)
    monkeypatch.delenv("DANCEGRPO_SOURCE", raising=False)
    history = trainers_upstream(tmp_path / "upstream")
    base = git(history.path, "rev-parse", "HEAD")
    return history, find_project(make_project(tmp_path / "project", history, base, SPECS))


def fork_with_a_missing_import(history: History) -> str:
    """Upstream's next commit: a module-level import of a module no set has, two lines from the
    patch's line, so the patch is 3-way merged and the import comes in outside any conflict."""
    history.edit_line("fastvideo/utils/load.py", 14, f"from {MISSING} import WanTransformer3DModel")
    return history.commit("load: the Wan transformer")


def test_a_cleanly_merged_import_that_breaks_the_trainers_ends_the_rebase(tmp_path, monkeypatch):
    history, project = a_project(tmp_path, monkeypatch)
    commit = fork_with_a_missing_import(history)

    result = start_rebase(project, "main")

    assert result.status == "done" and re.search(r"0001-load-device.patch\s+3-way merged", result.report), result.report
    assert result.message.startswith(
        "the rebase is done, but trainers fail at import: "
        f"fastvideo/utils/load.py:14 `from {MISSING} import WanTransformer3DModel`: "
        f"ModuleNotFoundError: No module named '{MISSING}'; breaks flux, sd (diffusers-0.32); "
        "nearest patch: 0001-load-device.patch (hunk 1/1 -9,7 +9,7, 2 line(s) from its change); "
        f"the line: upstream {commit[:12]} 'load: the Wan transformer' (new since the locked commit)"
    ), result.message
    assert "IMPORT FAILS: fastvideo/utils/load.py:14" in result.report
    assert "main must not run" not in result.report  # imported as a module, its main not run


def test_the_cli_does_not_report_success_silently(tmp_path, monkeypatch):
    history, project = a_project(tmp_path, monkeypatch)
    fork_with_a_missing_import(history)

    r = run_cli(project.root, "rebase", "--onto", "main")

    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "fastvideo/utils/load.py:14" in r.stderr and "Traceback" not in r.stderr
    assert "dancegrpo-npu export NAME" in r.stderr
    assert "IMPORT FAILS: fastvideo/utils/load.py:14" in r.stdout


def test_a_rebase_whose_trainers_import_reports_them_and_a_set_not_installed(tmp_path, monkeypatch):
    history, project = a_project(tmp_path, monkeypatch)
    monkeypatch.setenv("DANCEGRPO_VENV_DIFFUSERS_0_35", str(tmp_path / "no-such-venv"))
    history.write("README.md", "news\n")
    history.commit("news")

    result = start_rebase(project, "main")

    assert result.status == "done" and not result.message, result.report
    assert "trainer imports: 2 of 2 trainer script(s) import under their dependency set (flux, sd)" in result.report
    assert re.search(r"NOT CHECKED: wan: .*diffusers-0.35 dependency set .* not installed", result.report), result.report


def test_the_check_imports_each_set_s_trainers_with_that_set_s_python(tmp_path, monkeypatch):
    """The wan script under the diffusers-0.35 set's python: here a virtualenv-shaped directory
    whose python is a script that records it ran."""
    history, project = a_project(tmp_path, monkeypatch)
    import sys

    venv = tmp_path / "venv-035"
    (venv / "bin").mkdir(parents=True)
    ran = tmp_path / "ran"
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho \"$@\" > /dev/null; touch {ran}\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    (project.workdir / "fastvideo/train_grpo_wan_2_1.py").write_text(f"import {MISSING}\n")

    check = check_trainer_imports(project.workdir, load_series(project.patches_dir), Git(project.workdir),
                                  git(history.path, "rev-parse", "HEAD"), [],
                                  {"DANCEGRPO_VENV_DIFFUSERS_0_35": str(venv), "PATH": "/usr/bin:/bin"})

    assert ran.exists()
    assert [(f.trainers, f.depset, f.file, f.line) for f in check.failures] == [
        (("wan",), "diffusers-0.35", "fastvideo/train_grpo_wan_2_1.py", 1)]
    assert "added by the series, not upstream" in check.failures[0].origin  # not committed upstream
