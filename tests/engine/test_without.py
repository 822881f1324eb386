"""apply --without PATCH: an ablation tree, the series minus some patches.

Refused, naming the patch, when a later patch no longer applies without it; status and
verify say "series without PATCH" (not a failure, and not the full series); a launch's
tree check passes and its fingerprint records what was left out; a plain apply restores
the full series.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_upstream import refused, setup, snapshot

from dancegrpo_npu.engine.apply import apply_worktree
from dancegrpo_npu.engine.fetch import fetch
from dancegrpo_npu.engine.status import inspect, verify_tree
from dancegrpo_npu.engine.treecheck import tree_state
from dancegrpo_npu.project import find_project
from dancegrpo_npu.rebase.session import start_rebase
from dancegrpo_npu.rebase.export import export_edits
from dancegrpo_npu.run.fingerprint import upstream_facts

TRAIN = "".join(f"line {i}\n" for i in range(1, 41))
SRC = Path(__file__).resolve().parents[2] / "src"


def _series(s):
    """module makes the module module-more then edits: module-more needs module; train is independent."""
    return {
        "train.patch": s.patch("train", {"fastvideo/train.py": TRAIN.replace("line 9\n", "line 9 npu\n")}),
        "module.patch": s.patch("a module", {"fastvideo/npu/dev.py": "DEVICE = 'npu'\n"}),
        "module-more.patch": s.diff_after(
            {"fastvideo/npu/dev.py": "DEVICE = 'npu'\n"}, {"fastvideo/npu/dev.py": "DEVICE = 'npu'\nSTRICT = True\n"}
        ),
    }


@pytest.fixture()
def s(tmp_path):
    s = setup(tmp_path, fetch=False)

    def diff_after(first, then):  # a patch written on top of ``first``
        from synthetic_upstream import add_commit, dep3, diff_of

        base = add_commit(s.up, first, "scratch: what module.patch makes")
        diff = diff_of(s.up, then, s.tmp / "scratch2", rev=base.commit)
        subprocess.run(["git", "reset", "-q", "--hard", "HEAD~1"], cwd=s.up.path, check=True)
        return dep3("more of the module", diff)

    s.diff_after = diff_after
    s.set_series(_series(s))
    s.fetch()
    return s


def cli(project, *args):
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "dancegrpo_npu", "-C", str(project.root), *args],
                          capture_output=True, text=True, env=env)


def test_apply_without_a_patch_and_back(s):
    s.apply(without=("train.patch",))
    assert (s.tree / "fastvideo/train.py").read_text() == TRAIN  # left out
    assert (s.tree / "fastvideo/npu/dev.py").read_text() == "DEVICE = 'npu'\nSTRICT = True\n"
    report = verify_tree(s.project)  # exactly what it is meant to be: no failure ...
    assert report.without == ("train.patch",)
    assert report.what == "lock + series without train.patch + overlay"  # ... and not the full series
    states = {p.name: p.state for p in inspect(s.project).patches}
    assert states == {"train.patch": "left out", "module.patch": "applied", "module-more.patch": "applied"}
    assert s.apply(without=("train",)).noop  # the same ablation again: nothing to do

    r = cli(s.project, "verify")
    assert r.returncode == 0 and "2 of 3 patches (series without train.patch)" in r.stdout
    r = cli(s.project, "status")
    assert "left out" in r.stdout and "verdict    exactly lock + series without train.patch + overlay" in r.stdout

    out = s.apply()  # a plain apply restores the full series
    assert not out.noop and out.without == ()
    assert (s.tree / "fastvideo/train.py").read_text() == TRAIN.replace("line 9\n", "line 9 npu\n")
    report = verify_tree(s.project)
    assert report.without == () and report.what == "lock + series + overlay"
    assert cli(s.project, "verify").stdout.endswith("+ 3 patches + overlay\n")


@pytest.mark.parametrize("name", ["train", "train.patch"])
def test_names_with_or_without_patch(s, name):
    assert s.apply(without=(name,)).without == ("train.patch",)


def test_the_cli_takes_a_patchs_name(s):
    r = cli(s.project, "apply", "--without", "module-more")  # not "module": that is module.patch's name
    assert r.returncode == 0, r.stderr
    assert "series without module-more.patch" in r.stdout


def test_a_patch_a_later_one_needs_is_refused_naming_both(s):
    s.apply()
    before = snapshot(s.tree)
    text = refused(s.apply, r"apply --without module.patch: module-more.patch no longer applies without it", without=("module",))
    assert "--without module-more.patch" in text  # what to do: leave it out too
    assert snapshot(s.tree) == before
    s.apply(without=("module", "module-more"))  # both out: fine
    assert not (s.tree / "fastvideo/npu").exists()
    assert verify_tree(s.project).without == ("module.patch", "module-more.patch")


def test_unknown_patch_is_a_one_line_error_and_touches_nothing(s):
    s.apply()
    before = snapshot(s.tree)
    applied_before = (s.tree / ".git/dancegrpo-npu/applied.json").read_bytes()
    r = cli(s.project, "apply", "--without", "0099-nope.patch")
    assert r.returncode == 2 and r.stdout == ""  # a name that names nothing: could not start
    assert r.stderr.count("\n") == 1 and "--without 0099-nope.patch: no patch of patches/series" in r.stderr
    assert snapshot(s.tree) == before
    assert (s.tree / ".git/dancegrpo-npu/applied.json").read_bytes() == applied_before


def test_launch_check_passes_and_records_what_was_left_out(s):
    s.apply(without=("train.patch",))
    state = tree_state(s.project)
    assert state["state"] == "verified" and state["without"] == ["train.patch"]
    assert "series without train.patch" in state["detail"]
    assert upstream_facts(s.project)["patches_left_out"] == ["train.patch"]
    s.apply()
    assert tree_state(s.project)["without"] == [] and upstream_facts(s.project)["patches_left_out"] == []


def test_rebase_and_export_refuse_an_ablation_tree(s):
    s.apply(without=("train.patch",))
    refused(start_rebase, r"series without train.patch \(apply --without\); rebase needs the whole series", s.project, "main")
    refused(export_edits, r"export needs the whole series.*run `dancegrpo-npu apply` there first", s.project, "x")


# --- the first use: the tree without the float32-RoPE patch (real upstream) ---------------

ROPE = "float32-rope.patch"
TRAINERS = ("fastvideo/train_grpo_flux.py", "fastvideo/train_grpo_flux_lora.py")


def calls(path: Path, name: str) -> int:
    """How many calls of ``name`` the module makes (parsed, not grepped)."""
    tree = ast.parse(path.read_text())
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name)


@pytest.mark.upstream
def test_tree_without_the_rope_patch_runs_diffusers_rope(tmp_path, upstream_source):
    from conftest import copy_project

    project = find_project(copy_project(tmp_path / "project"), workdir=tmp_path / "norope")
    fetch(project, source=upstream_source)
    out = apply_worktree(project, without=("float32-rope",))
    assert out.without == (ROPE,)
    report = verify_tree(project)
    assert report.without == (ROPE,) and "series without float32-rope.patch" in report.what
    for rel in TRAINERS:  # diffusers' FluxPosEmbed stays: no swap for the float32 one
        assert calls(project.workdir / rel, "install_float32_rope") == 0, rel
    apply_worktree(project)  # and the full series swaps it in
    for rel in TRAINERS:
        assert calls(project.workdir / rel, "install_float32_rope") == 1, rel
    assert verify_tree(project).without == ()
    assert json.loads((project.workdir / ".git/dancegrpo-npu/applied.json").read_text())["without"] == []
