"""The named dependency sets (run.depsets): which interpreter a trainer runs with, the refusal
when a set is not installed, and that the table, pyproject and scripts/deps agree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import in_ci

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.registry import REGISTRY as SCRIPTS
from dancegrpo_npu.run import depsets

ROOT = Path(__file__).resolve().parents[2]


def test_default_set_is_the_tools_own_interpreter():
    assert depsets.python_for(depsets.DEFAULT) == sys.executable
    assert {info.depset for name, info in SCRIPTS.items() if name.startswith("flux")} == {depsets.DEFAULT}


def test_layered_set_beside_the_venv_or_where_the_variable_says(tmp_path):
    beside = Path(str(tmp_path / ".venv") + "-diffusers-0.35") / "bin" / "python"
    beside.parent.mkdir(parents=True)
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert depsets.python_for("diffusers-0.35", {}, prefix=str(tmp_path / ".venv")) == str(beside)
    moved = tmp_path / "elsewhere"
    env = {"DANCEGRPO_VENV_DIFFUSERS_0_35": str(moved)}
    assert depsets.env_name("diffusers-0.35") == "DANCEGRPO_VENV_DIFFUSERS_0_35"
    with pytest.raises(DancegrpoError) as info:
        depsets.python_for("diffusers-0.35", env, prefix=str(tmp_path / ".venv"), needed_by="wan")
    assert "wan runs with the diffusers-0.35 dependency set (diffusers==0.35.0" in info.value.message
    assert str(moved) in info.value.message
    assert "./scripts/bootstrap.sh --deps-only --with diffusers-0.35" in info.value.hint
    assert "DANCEGRPO_VENV_DIFFUSERS_0_35" in info.value.hint


def test_unknown_set_is_a_usage_error():
    with pytest.raises(DancegrpoError) as info:
        depsets.get("diffusers-9")
    assert info.value.exit_code == 2 and "diffusers-0.35" in info.value.hint


def _pins(lines) -> dict[str, str]:
    found = {}
    for line in lines:
        m = re.match(r'^\s*"?([A-Za-z0-9_.-]+)==([^";\s]+)', line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_the_table_is_what_bootstrap_installs():
    """The pins the tool names in its refusals are those of the files bootstrap.sh installs."""
    for name, depset in depsets.DEPSETS.items():
        if depset.layered:
            source = _pins((ROOT / "scripts" / "deps" / f"{name}.txt").read_text().splitlines())
        else:
            text = (ROOT / "pyproject.toml").read_text()
            source = _pins(text[text.index("train = ["):].split("]", 1)[0].splitlines())
        assert {d: source.get(d) for d, _ in depset.pins} == dict(depset.pins), name
    layered = sorted(p.stem for p in (ROOT / "scripts" / "deps").glob("*.txt"))
    assert layered == sorted(n for n, d in depsets.DEPSETS.items() if d.layered)


def test_the_installed_layer_runs_its_pins_over_the_first_venvs_torch():
    """The layer holds its pins and sees torch (and hpsv2) from the virtualenv the tool runs in."""
    try:
        python = depsets.python_for("diffusers-0.35")
    except DancegrpoError as e:
        if in_ci():
            pytest.fail(f"CI: {e.message} (scripts/test.sh installs it)")
        pytest.skip(e.message)
    code = ("import importlib.metadata as md, json, torch, diffusers, hpsv2; "
            "print(json.dumps([md.version(n) for n in ('diffusers','transformers','peft')] + [torch.__file__]))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                         check=True, timeout=300).stdout.strip().splitlines()[-1]
    import json

    import torch

    *versions, torch_file = json.loads(out)
    assert versions == [v for _, v in depsets.DEPSETS["diffusers-0.35"].pins]
    assert torch_file == torch.__file__  # not installed twice


def test_launch_starts_a_trainer_with_its_sets_interpreter(tmp_path, monkeypatch):
    """A trainer whose set is layered runs under that set's python; without it, launch refuses
    in one line before anything starts, and a dry run lists it as a problem."""
    from dataclasses import replace

    from synthetic_tree import make_project, trust_synthetic_tree

    from dancegrpo_npu.project import find_project
    from dancegrpo_npu.run import upstream_args
    from dancegrpo_npu.run.launch import LaunchSpec, build_plan

    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / "proj"))
    monkeypatch.setitem(SCRIPTS, "flux", replace(SCRIPTS["flux"], depset="diffusers-0.35"))
    layer = tmp_path / "layer"
    env = {"PATH": "/usr/bin:/bin", "DANCEGRPO_VENV_DIFFUSERS_0_35": str(layer)}
    spec = LaunchSpec(script="flux", device="cpu")
    plan = dict(environ=env, cwd=tmp_path, dev_dir=tmp_path)
    with pytest.raises(DancegrpoError) as info:
        build_plan(project, spec, project.runs_dir / "RUN", **plan)
    assert "flux runs with the diffusers-0.35 dependency set" in info.value.message
    dry = build_plan(project, spec, project.runs_dir / "RUN", dry_run=True, **plan)
    assert any("diffusers-0.35 dependency set" in p for p in dry.problems)
    (layer / "bin").mkdir(parents=True)
    (layer / "bin" / "python").write_text("#!/bin/sh\n")
    (layer / "bin" / "python").chmod(0o755)
    assert build_plan(project, spec, project.runs_dir / "RUN", **plan).command[0] == str(layer / "bin" / "python")
