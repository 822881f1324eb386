"""export and rebase keep what a patch says about modes: a new symlink, a new executable,
a mode change of an upstream file (through the history verbs)."""

from __future__ import annotations

import os

import pytest

from dancegrpo_npu.engine.status import inspect
from dancegrpo_npu.project import find_project
from dancegrpo_npu.rebase.session import start_rebase
from dancegrpo_npu.rebase.export import export_edits
from rebase_helpers import PatchSpec, base_history, git, make_project, set_line, verified

SPECS = [PatchSpec("0001-train.patch", "train on the chosen device", {"fastvideo/train.py": set_line(10, "device = pick()")})]


@pytest.fixture()
def exported(tmp_path, monkeypatch):
    """A project whose second patch, exported from hand edits, adds a symlink and an
    executable and makes an upstream file executable."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    history, base = base_history(tmp_path / "upstream")
    project = find_project(make_project(tmp_path / "project", history, base, SPECS))
    tree = project.workdir
    os.symlink("models/flux.py", tree / "fastvideo/flux_link.py")
    (tree / "fastvideo/run_npu.sh").write_text("#!/bin/sh\necho npu\n")
    os.chmod(tree / "fastvideo/run_npu.sh", 0o755)
    os.chmod(tree / "fastvideo/utils.py", 0o755)
    result = export_edits(project, "modes", description="a link, a script, a mode",
                          include=("fastvideo/flux_link.py", "fastvideo/run_npu.sh"))  # new files: asked for
    text = result.patch.read_text()
    assert "new file mode 120000" in text and "new file mode 100755" in text
    assert "old mode 100644\nnew mode 100755" in text
    assert verified(project.root) and not inspect(project).edits
    return history, project


def check_tree(project):
    tree = project.workdir
    assert (tree / "fastvideo/flux_link.py").is_symlink() and os.readlink(tree / "fastvideo/flux_link.py") == "models/flux.py"
    assert os.stat(tree / "fastvideo/run_npu.sh").st_mode & 0o100
    assert os.stat(tree / "fastvideo/utils.py").st_mode & 0o100
    assert verified(project.root)


def test_rebase_keeps_modes_and_symlinks(exported):
    history, project = exported
    before = {p.name: p.read_bytes() for p in project.patches_dir.iterdir()}
    history.write("README.md", "# upstream\n\nNew words.\n")
    new = history.commit("docs")

    result = start_rebase(project, "main")

    assert result.status == "done", result.report
    assert {p.name: p.read_bytes() for p in project.patches_dir.iterdir()} == before
    assert git(project.workdir, "rev-parse", "HEAD") == new
    check_tree(project)


def test_rebase_that_moves_the_mode_changed_file(exported):
    history, project = exported
    history.insert_lines("fastvideo/utils.py", 1, ["# licence"])  # utils.py moves: the mode patch is regenerated
    history.commit("licence header")

    result = start_rebase(project, "main")

    assert result.status == "done", result.report
    check_tree(project)
