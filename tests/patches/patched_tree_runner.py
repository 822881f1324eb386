"""Imported by the per-patch tests (not a conftest: tests/conftest.py is imported by name).

Per-patch tests run the PATCHED upstream tree (``patched_tree`` from tests/conftest.py) in
fresh interpreters: ``run_in_tree`` puts the tree (and, for fake_npu tests, the FAKE
torch_npu with its dist-info, tests/fakes) on PYTHONPATH.  As pip leaves a real torch_npu,
the fake is then installed: ``importlib.metadata`` and diffusers' ``is_torch_npu_available()``
see it, and ``import torch`` loads it through its ``torch.backends`` entry point."""

from __future__ import annotations

import textwrap
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


EXIT_PROBE = textwrap.dedent('''\
    """Test probe (patched_tree_runner.py, for tests/patches/test_clean_exit.py): the thread names of a rank, during the run
    and in its last atexit handler, into $EXIT_PROBE_DIR/rank<RANK>.json (a relative directory:
    in the rank's working directory, the run directory)."""
    import atexit, json, os, threading

    def _names():
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as f:
                    names.append(f.read().strip())
            except OSError:  # the thread ended meanwhile
                pass
        return sorted(names)

    if os.environ.get("RANK") is not None and os.environ.get("EXIT_PROBE_DIR"):
        _seen, _stop = set(), threading.Event()

        def _sample():
            while not _stop.wait(0.05):
                _seen.update(_names())

        _sampler = threading.Thread(target=_sample, name="exit-probe", daemon=True)
        _sampler.start()

        @atexit.register  # registered first, so called last: after every other handler
        def _at_exit():
            _stop.set()
            _sampler.join()
            os.makedirs(os.environ["EXIT_PROBE_DIR"], exist_ok=True)
            path = os.path.join(os.environ["EXIT_PROBE_DIR"], f"rank{os.environ['RANK']}.json")
            with open(path, "w") as f:
                json.dump({"seen": sorted(_seen), "at_exit": _names()}, f)
    ''')

EXIT_PROBE_REPORTS = "exit-probe"  # the probe's reports, in the run directory


def probe_env(shared_runs) -> tuple[tuple[str, str], ...]:
    """The job environment that puts the probe on the ranks: the same for every test and worker,
    so that the runs that carry it are shared."""

    def write(site: Path) -> Path:
        (site / "sitecustomize.py").write_text(EXIT_PROBE)
        return site

    site = shared_runs.get({"exit-probe": EXIT_PROBE}, write)
    return (("PYTHONPATH", str(site)), ("EXIT_PROBE_DIR", EXIT_PROBE_REPORTS))


def shared_preprocessing(shared_runs, project):
    """The patched preprocess_flux_embedding.py on 2 CPU ranks over the fixture pipeline, launched
    like any run, once a test run (tests/shared_runs.py), with the exit probe on its ranks
    (test_clean_exit.py reads its reports; test_preprocess.py the dataset): (run record,
    fixtures, the dataset's directory)."""
    from dancegrpo_npu.project import Project
    from dancegrpo_npu.run.launch import LaunchSpec, launch
    from shared_runs import flux_fixtures, tree_digest

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
