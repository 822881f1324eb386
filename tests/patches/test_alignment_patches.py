"""Alignment (the seam's, dancegrpo_port/alignment.py) in the real trainers: runs at the smoke's
settings (2 steps, 64x64, 4 sampling steps, 2 generations, HPSv2-shaped reward, strict mode) on
the tiny fixtures, launched like `dancegrpo-npu smoke` with more trainer arguments.

- the seam without the port's flags is upstream's run bit for bit: the same rewards, images and
  trained weights as the series without the seam (and the two rollout patches, which use it, and
  resume-assert, which edits next to its resume call: upstream's assert, always true, stays; and
  the SDE window, whose hooks sit on its lines);
- --rng cpu twice gives identical records, on 1 and 2 ranks (and with the LoRA trainer);
  --record_modules records the models' modules by their own names;
- `compare` of two --rng cpu runs, and of a run and its replay, exits 0 ("first divergence: none");
- --replay of a recorded run reproduces its records bitwise; a replay that does not fit is
  refused at start, one line a rank, before any model is loaded;
- metrics.jsonl has the GRPO health figures, the ratio exactly 1 before the first update;
- --record changes nothing in the run.
The runs are shared between the tests and with the other files that launch the same (one launch
per distinct set of arguments a test run: tests/shared_runs.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import copy_project
from shared_runs import flux_fixtures, flux_spec, private_copy

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

pytestmark = [pytest.mark.slow, pytest.mark.upstream]

SEAM = ("seam-train-grpo-flux.patch", "seam-train-grpo-flux-lora.patch")
# they call the seam's rollout module; resume-assert takes out the lines above the seam's resume call;
# the SDE window's hooks sit on the seam's lines
ON_THE_SEAM = ("batched-rollout.patch", "rewards-in-batches.patch", "resume-assert.patch", "sde-window.patch")
HEALTH = ("reward_std", "adv_min", "adv_max", "zero_std_groups", "ratio_min", "ratio_max", "ratio_mean",
          "clip_frac", "approx_kl", "logprob_diff_max", "logprob_diff_mean", "clip_frac_first")


@pytest.fixture(scope="session")
def tree_without_the_seam(upstream_source, tmp_path_factory):
    """A project applied without the seam (and the patches written on its lines)."""
    from dancegrpo_npu.engine.apply import apply_worktree
    from dancegrpo_npu.engine.fetch import fetch
    from dancegrpo_npu.project import find_project

    root = copy_project(tmp_path_factory.mktemp("without-the-seam") / "project")
    lines = (root / "patches" / "series").read_text().splitlines()
    assert all(name in lines for name in SEAM + ON_THE_SEAM)
    project = find_project(root)
    fetch(project, source=upstream_source)
    apply_worktree(project, without=SEAM + ON_THE_SEAM)  # `apply --without`: the patches after them move up
    return project


class Runs:
    """Launches at the smoke's settings, each distinct one once a test run: the runs are shared
    (tests/shared_runs.py) with the other files that launch the same (compare's, for one)."""

    def __init__(self, shared, projects):
        self.shared, self.projects = shared, projects

    def __call__(self, *extra: str, nproc: int = 1, lora: bool = False, tree: str = "patched"):
        project = self.projects[tree]
        return self.shared.launch(project, flux_spec(flux_fixtures(self.shared, project), *extra, nproc=nproc,
                                                     lora=lora))

    def plain(self) -> Path:
        """The smoke as a user runs it, 1 rank, no alignment flag (the trainer's default: --rng
        device): tests/smoke/test_smoke.py's run, shared; its trainer arguments are the launches'."""
        from smoke_runs import passed

        from dancegrpo_npu.smoke.runner import SmokeOptions

        project = self.projects["patched"]
        flux_fixtures(self.shared, project)
        return passed(self.shared.smoke(project, SmokeOptions(device="cpu"))).run_dir

    def lora_recorded(self, *extra: str) -> Path:
        """The LoRA trainer's smoke, 1 rank, --rng cpu --record, with ``extra`` trainer arguments
        (none: tests/smoke/test_smoke.py's LoRA run, shared)."""
        from smoke_runs import passed

        from dancegrpo_npu.run.align_flags import AlignOptions
        from dancegrpo_npu.smoke.runner import SmokeOptions

        project = self.projects["patched"]
        flux_fixtures(self.shared, project)
        options = SmokeOptions(lora=True, device="cpu", align=AlignOptions(rng="cpu", record=True), extra_args=extra)
        return passed(self.shared.smoke(project, options)).run_dir


@pytest.fixture(scope="module")
def runs(patched_tree, tree_without_the_seam, shared_runs):
    return Runs(shared_runs, {"patched": patched_tree.project, "without": tree_without_the_seam})


def ok(record) -> Path:
    assert record.returncode == 0, (record.run_dir / "logs" / "console.log").read_text()[-3000:]
    return record.run_dir


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def images(run_dir: Path) -> dict:
    from PIL import Image

    return {p.name: Image.open(p).tobytes() for p in sorted((run_dir / "images").iterdir())}


def load_records(run_dir: Path) -> dict:
    """{relative file: {tensor: tensor}} of a run's records/ (step and module files)."""
    from safetensors.torch import load_file

    root = run_dir / "records"
    return {str(p.relative_to(root)): load_file(p) for p in sorted(root.rglob("*.safetensors"))}


def compare_says_aligned(project, a: Path, b: Path, capsys, tmp_path: Path) -> None:
    """`dancegrpo-npu compare` of the two runs: exit 0, no divergence, the report written (into a
    copy of ``b``: the runs are shared, and compare writes its report into the run under test)."""
    from dancegrpo_npu.cli import main

    b = private_copy(b, tmp_path / "compared")
    capsys.readouterr()
    rc = main(["-C", str(project.root), "compare", str(a), str(b)])
    out = capsys.readouterr()
    assert rc == 0 and "Traceback" not in out.err, out.out + out.err
    assert "first divergence: none" in out.out and "noise.sde" in out.out and (b / "compare.png").is_file()


def assert_same_records(a: Path, b: Path) -> None:
    ra, rb = load_records(a), load_records(b)
    assert ra.keys() == rb.keys() and ra
    for name in ra:
        assert ra[name].keys() == rb[name].keys(), name
        different = [k for k in ra[name] if not torch.equal(ra[name][k], rb[name][k])]
        assert not different, f"{name}: {different}"


CPU_RECORD = ("--rng", "cpu", "--record")

# wall times and memory of the machine (the phase figures among them), not the run's numbers
WALL = ("step_time", "time_rollout", "time_decode", "time_reward", "time_train", "peak_memory_bytes")


def trained_weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    (checkpoint,) = (run_dir / "outputs").glob("checkpoint-*/diffusion_pytorch_model.safetensors")
    return load_file(checkpoint)


def test_rng_device_is_upstreams_run_bit_for_bit(runs):
    base = ok(runs(tree="without"))
    ours = runs.plain()
    assert not (base / "metrics.jsonl").exists()  # the tree without the seam: upstream's outputs only
    assert (ours / "reward.txt").read_text() == (base / "reward.txt").read_text()  # upstream's mean reward a step
    assert images(ours) == images(base) and len(images(base)) == 2
    mine, theirs = trained_weights(ours), trained_weights(base)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    # and the noise is upstream's, not just anything reproducible: --rng cpu gives other images
    assert images(ok(runs("--rng", "cpu", "--record", "--record_modules"))) != images(base)


def test_recording_changes_nothing(runs):
    plain = metrics(runs.plain())
    recorded_dir = ok(runs("--rng", "device", "--record"))
    recorded = metrics(recorded_dir)
    strip = lambda ms: [{k: v for k, v in m.items() if k not in WALL} for m in ms]  # noqa: E731
    assert strip(plain) == strip(recorded)
    assert images(recorded_dir) == images(runs.plain())
    assert not (runs.plain() / "records").exists()


@pytest.mark.parametrize("nproc", [1, 2])
def test_rng_cpu_runs_are_identical(runs, patched_tree, capsys, tmp_path, nproc):
    # the 1-rank pair's first run is the rollout batching's reference (test_rollout_batching.py)
    first, second = ok(runs(*CPU_RECORD, nproc=nproc)), ok(runs(*CPU_RECORD, "--seed", "42", nproc=nproc))
    assert_same_records(first, second)
    compare_says_aligned(patched_tree.project, first, second, capsys, tmp_path)
    files = load_records(first)
    assert sorted(files) == [f"step_{s:06d}/rank_{r}.safetensors" for s in (1, 2) for r in range(nproc)]
    index = json.loads((first / "records" / "index.json").read_text())
    assert (index["world_size"], index["rng"], index["steps"], index["modules"]) == (nproc, "cpu", [1, 2], False)
    if nproc == 2:  # each rank has its own noise
        assert not torch.equal(files["step_000001/rank_0.safetensors"]["noise.sde"],
                               files["step_000001/rank_1.safetensors"]["noise.sde"])


def test_module_records_name_the_models_modules(runs):
    """--record_modules: the transformer's, the VAE's and the reward model's module outputs, named
    as the model names them (no FSDP or checkpointing wrapper in a name); that two runs record the
    same is the replay's test (below), which records them in both."""
    run = ok(runs(*CPU_RECORD, "--record_modules"))
    files = load_records(run)
    assert json.loads((run / "records" / "index.json").read_text())["modules"] is True
    order = json.loads((run / "records" / "modules" / "rank_0.json").read_text())["order"]
    assert set(order) == set(files["modules/rank_0.safetensors"])
    assert {name.split("/")[0].split(".")[0] for name in order} == {"transformer", "vae", "reward"}
    assert "transformer/transformer_blocks.0.attn.0" in order and "transformer.0" in order
    assert not any("_fsdp_wrapped_module" in n or "_checkpoint_wrapped_module" in n for n in order)


def test_rng_cpu_runs_of_the_lora_trainer_are_identical_and_replay(runs):
    first = runs.lora_recorded()
    assert_same_records(first, runs.lora_recorded("--seed", "42"))
    replay = ok(runs("--replay", str(first / "records"), "--record", lora=True))
    assert_same_records(first, replay)


def test_replay_reproduces_the_recorded_run(runs, patched_tree, capsys, tmp_path):
    source = ok(runs("--rng", "cpu", "--record", "--record_modules"))
    replay = ok(runs("--replay", str(source / "records"), "--record", "--record_modules"))
    assert_same_records(source, replay)
    compare_says_aligned(patched_tree.project, source, replay, capsys, tmp_path)
    assert metrics(replay)[-1]["reward_mean"] == metrics(source)[-1]["reward_mean"]
    index = json.loads((replay / "records" / "index.json").read_text())
    assert index["replayed_from"] == str(source / "records") and index["rng"] == "device"


def test_replay_of_a_misfit_is_refused_at_start(runs):
    source = ok(runs("--rng", "cpu", "--record", "--record_modules"))
    record = runs("--replay", str(source / "records"), nproc=2)
    assert record.returncode != 0
    console = (record.run_dir / "logs" / "console.log").read_text()
    line = (f"train_grpo_flux.py: error: --replay {source / 'records'} does not fit this run: "
            "world_size 1 (this run: 2)")
    ranks = [entry for entry in console.splitlines() if entry.startswith("[default")]  # the trainers' own output
    # every rank refuses before loading anything; torchrun stops the others when the first exits,
    # so a rank may be gone before its own line reaches the console: at least one line, each of
    # them this one, and no rank got as far as loading the model
    refusals = [entry for entry in ranks if "error:" in entry]
    assert refusals and all(line in entry for entry in refusals), ranks
    assert not any("Traceback" in entry or "loading model" in entry for entry in ranks)


def test_metrics_have_the_grpo_health_figures(runs):
    for run_dir in (runs.plain(), ok(runs("--rng", "cpu", "--record", nproc=2))):
        for m in metrics(run_dir):
            assert set(HEALTH) <= set(m)
            # rollout batch 1 on the CPU: the recomputed log-prob is the sampling one, exactly
            assert m["logprob_diff_max"] == 0.0 and m["logprob_diff_mean"] == 0.0 and m["clip_frac_first"] == 0.0
            assert m["ratio_min"] == m["ratio_max"] == m["ratio_mean"] == 1.0 and m["clip_frac"] == m["approx_kl"] == 0.0
            assert m["zero_std_groups"] in range(0, 3)  # one prompt a rank, 1 or 2 ranks
            assert m["adv_min"] <= 0 <= m["adv_max"] and math.isfinite(m["reward_std"])


def test_the_record_holds_what_the_run_reported(runs):
    run_dir = ok(runs("--rng", "cpu", "--record", nproc=2))
    files = load_records(run_dir)
    for m in metrics(run_dir):
        parts = [files[f"step_{m['step']:06d}/rank_{r}.safetensors"] for r in range(2)]
        rewards = torch.cat([p["rewards"] for p in parts])
        assert rewards.mean().item() == m["reward_mean"]
        assert parts[0]["grad_norm"].tolist() == [m["grad_norm"]]
        ratios = torch.cat([p["train.ratio"].flatten() for p in parts])
        assert ratios.min().item() == m["ratio_min"] and ratios.max().item() == m["ratio_max"]
        assert [tuple(parts[0][k].shape) for k in ("latents", "images", "train.loss")] == [
            (2, 5, 16, 64), (2, 64, 64, 3), (2, 1)]
