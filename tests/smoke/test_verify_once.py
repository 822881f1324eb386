"""The tree is verified once a command: one ``smoke`` (its pass's key, its checks, its launch) and one
launch (its plan, made again when its run directory's name was taken) each call ``verify_tree`` once,
and the verdict passed down carries the digests the smoke's key is made of.

The training run itself is stood in for (its metrics written as the trainer writes them); everything
before it runs as in a smoke: the real tree, the FLUX fixtures, the trainer's own parser.
"""

from __future__ import annotations

import json

import pytest
from tiny_fixtures import built  # noqa: F401  (a fixture)

from dancegrpo_npu.engine import treecheck

pytest.importorskip("diffusers")


@pytest.fixture
def counted(monkeypatch):
    """The engine's verify_tree, counted where launch and smoke reach it."""
    calls = []
    real = treecheck.verify_tree

    def verify_tree(project):
        calls.append(project.workdir)
        return real(project)

    monkeypatch.setattr(treecheck, "verify_tree", verify_tree)
    return calls


@pytest.fixture
def no_training(monkeypatch):
    """The launch's job stood in for: a run that ends well, with two steps of metrics."""
    from dancegrpo_npu.run import launch as launch_mod
    from dancegrpo_npu.run.plan import RunRecord

    def run_plan(project, plan):
        rows = [{"step": s, "reward_mean": 0.3, "reward_std": 0.1, "loss": 0.0, "grad_norm": 0.2, "step_time": 0.5}
                for s in (1, 2)]
        plan.run_dir.mkdir(parents=True, exist_ok=True)
        (plan.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return RunRecord(plan.run_dir, 0, plan.command, {"status": "succeeded"})

    monkeypatch.setattr(launch_mod, "run_plan", run_plan)


@pytest.mark.upstream
def test_one_smoke_verifies_the_tree_once(patched_tree, built, counted, no_training, monkeypatch, tmp_path,  # noqa: F811
                                          capsys):
    from dancegrpo_npu.cli import main
    from dancegrpo_npu.smoke import passes
    from dancegrpo_npu.smoke.checks import CheckpointCheck
    from dancegrpo_npu.trainers.flux import smoke as flux

    keys = []
    monkeypatch.setattr(flux, "fixtures", lambda project, options, spec: built)  # the session's, built once
    monkeypatch.setattr(flux, "checkpoint", lambda *a: CheckpointCheck(tmp_path / "c", "X", 1, 1, 0.1, 0.0, 1))
    monkeypatch.setattr(passes, "record_pass", lambda project, key, result: keys.append(key))  # the shared build/
    rc = main(["-C", str(patched_tree.project.root), "--runs-dir", str(tmp_path / "runs"), "smoke", "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    assert counted == [patched_tree.tree]
    # the pass's key is made of the verdict's digests: the tree as verified, not read again
    (key,) = keys
    assert key and key == passes.inputs_sha256(patched_tree.project, _options(), treecheck.tree_state(
        patched_tree.project, "fastvideo/train_grpo_flux.py"))


@pytest.mark.upstream
def test_one_launch_verifies_the_tree_once(patched_tree, built, counted, no_training, monkeypatch, tmp_path):  # noqa: F811
    from dancegrpo_npu.project import find_project
    from dancegrpo_npu.run import directory
    from dancegrpo_npu.run.launch import LaunchSpec, launch
    from dancegrpo_npu.trainers.flux.smoke import trainer_args

    project = find_project(patched_tree.project.root, runs_dir=tmp_path / "runs")
    spec = LaunchSpec(script="flux", args=trainer_args(built, lora=False), device="cpu", upstream_defaults=False)
    record = launch(project, spec)
    assert record.returncode == 0 and counted == [patched_tree.tree]
    assert record.summary["status"] == "succeeded"

    # the run directory's name taken meanwhile: the plan is made again for the one it got, and the
    # tree is not verified again for it
    real = directory.create_run_dir
    monkeypatch.setattr(directory, "create_run_dir", lambda runs, name, now: real(runs, name + "-again", now))
    counted.clear()
    record = launch(project, spec)
    assert record.run_dir.name.endswith("-again") and counted == [patched_tree.tree]


def test_a_verdict_passed_down_is_not_taken_again(tmp_path, counted):
    """require_tree with the command's verdict uses it: a verified one passes, another refuses in
    its own words, and neither verifies."""
    from dancegrpo_npu.errors import DancegrpoError
    from dancegrpo_npu.project import Project

    project = Project(root=tmp_path, workdir=tmp_path / "tree")
    verdict = {"state": "verified", "detail": "as verified", "without": []}
    assert treecheck.require_tree(project, "x.py", verdict) is verdict
    with pytest.raises(DancegrpoError, match="no patched upstream tree at"):
        treecheck.require_tree(project, "x.py", {"state": "missing", "detail": f"no patched upstream tree at {tmp_path}"})
    assert counted == []
    with pytest.raises(DancegrpoError):
        treecheck.require_tree(project, "x.py")  # none given: verified here (no tree: no verify to call)


def _options():
    from dancegrpo_npu.smoke.runner import SmokeOptions

    return SmokeOptions(device="cpu")


def test_the_verdict_of_a_verified_tree_carries_its_digests(patched_tree):
    """What the smoke's key is made of, from the verify report: the locked commit, the series and
    the overlay, digested as apply records them."""
    from dancegrpo_npu.engine.apply import overlay_sha256
    from dancegrpo_npu.engine.lock import load_lock
    from dancegrpo_npu.engine.series import load_series, series_sha256
    from dancegrpo_npu.engine.stage import read_overlay

    project = patched_tree.project
    state = treecheck.tree_state(project, "fastvideo/train_grpo_flux.py")
    assert state["state"] == "verified"
    assert (state["upstream_commit"], state["series_sha256"], state["overlay_sha256"]) == (
        load_lock(project.lock_path).commit, series_sha256(load_series(project.patches_dir)),
        overlay_sha256(read_overlay(project.overlay_dir)))
    assert set(treecheck.DIGESTS) <= set(state)
    json.dumps(state)  # recorded as it is in the run's launch.json


def test_a_smoke_key_needs_a_verified_tree(tmp_path):
    from dancegrpo_npu.project import Project
    from dancegrpo_npu.smoke import passes

    project = Project(root=tmp_path, workdir=tmp_path / "tree")
    unverified = {"state": "unverified", "detail": "differs", "differs": True}
    assert passes.inputs_sha256(project, _options(), unverified) is None
    assert passes.inputs_sha256(project, _options(), {"state": "verified", "detail": "no digests"}) is None


@pytest.mark.upstream
def test_a_short_run_bench_verifies_the_tree_once(patched_tree, built, counted, monkeypatch, tmp_path):  # noqa: F811
    """``bench`` of a trainer it times by a short run of its smoke: the tree verified once, that
    verdict is what each launch gets and what the bench's facts say."""
    from dancegrpo_npu import registry
    from dancegrpo_npu.throughput import phases, presets, short_run

    spec = next(s for s in registry.benched() if s.bench.short_run and s.smoke.fixtures.startswith("dancegrpo_npu.trainers.flux"))
    load = registry.load
    monkeypatch.setattr(registry, "load", lambda ref: (lambda *a: built) if ref == spec.smoke.fixtures else load(ref))
    launched = []

    def launch(project, config, spec, args, n, env, verified):
        launched.append(verified)
        return tmp_path

    monkeypatch.setattr(short_run, "_launch", launch)
    monkeypatch.setattr(short_run, "result_of_run", lambda run_dir, n, short: phases.Result(n, {}, {}, 2, True))
    monkeypatch.setattr(short_run, "_device_kind", lambda run_dir, device: "cpu")
    config = presets.resolve({"trainer": spec.name, "size": "tiny", "device": "cpu"})
    _, facts = short_run.run_short(patched_tree.project, config, lambda line: None)
    assert counted == [patched_tree.tree]
    assert launched and all(v is facts["tree"] for v in launched) and facts["tree"]["state"] == "verified"
