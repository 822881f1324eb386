"""Imported by the per-patch tests (not a conftest: tests/conftest.py is imported by name).

Per-patch tests run the PATCHED upstream tree (``patched_tree`` from tests/conftest.py) in
fresh interpreters: ``run_in_tree`` puts the tree (and, for fake_npu tests, the FAKE
torch_npu with its dist-info, tests/fakes) on PYTHONPATH.  As pip leaves a real torch_npu,
the fake is then installed: ``importlib.metadata`` and diffusers' ``is_torch_npu_available()``
see it, and ``import torch`` loads it through its ``torch.backends`` entry point."""

from __future__ import annotations

from pathlib import Path

import pytest
from snippet import run_snippet

FAKES = Path(__file__).resolve().parents[1] / "fakes"


@pytest.fixture
def run_in_tree(patched_tree, tmp_path):
    def run(code: str, *, args=(), env=None, fake_npu: bool = False, check=True, timeout=300):
        paths = [str(patched_tree.tree)] + ([str(FAKES)] if fake_npu else [])
        base = {"WANDB_MODE": "disabled", "DANCEGRPO_DEVICE": "cpu"}
        if fake_npu:  # the fake as torch loads it, whatever this shell says (an Ascend host may set these)
            base["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
        drop = ("DANCEGRPO_", "WANDB_") + (("ASCEND_RT_VISIBLE_DEVICES", "FAKE_TORCH_NPU") if fake_npu else ())
        return run_snippet(code, tmp_path, paths, {**base, **(env or {})},
                           args=args, drop=drop, check=check, timeout=timeout)

    return run


def shared_preprocessing(shared_runs, project):
    """The patched preprocess_flux_embedding.py on 2 CPU ranks over the fixture pipeline, launched
    like any run, once a test run (tests/shared_runs.py), with the exit probe on its ranks
    (test_clean_exit.py reads its reports; test_preprocess.py the dataset): (run record,
    fixtures, the dataset's directory)."""
    from dancegrpo_npu.project import Project
    from dancegrpo_npu.run.launch import LaunchSpec, launch
    from shared_runs import flux_fixtures, probe_env, tree_digest

    fixtures = flux_fixtures(shared_runs, project)
    env = probe_env(shared_runs)

    def make(d: Path):
        record = launch(Project(root=project.root, workdir=project.workdir, runs=d / "runs"), LaunchSpec(
            script="preprocess", nproc_per_node=2, device="cpu", strict=True, name="preprocess",
            upstream_defaults=False, env=(("OMP_NUM_THREADS", "1"), *env),
            args=("--model_path", str(fixtures.model_dir), "--output_dir", str(d / "rl_embeddings"),
                  "--prompt_dir", str(fixtures.prompts), "--dataloader_num_workers", "0")))
        return record, d / "rl_embeddings"

    record, out = shared_runs.get({"preprocess": 2, "tree": tree_digest(project.workdir), "env": env}, make)
    assert record.returncode == 0, f"see {record.run_dir / 'logs'}"
    return record, fixtures, out
