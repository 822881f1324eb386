"""Resume checkpoints (overlay/dancegrpo_port/checkpoints.py, resume.py) without a training run:
the manifest that makes a checkpoint complete, ``latest`` skipping torn ones with one line, the
one rename, the total limit, the free-space check, the refusals of a checkpoint of another run,
and the Resume feature saving and loading a small model, its optimizer, LR scheduler and
generators in process (``torch.distributed.checkpoint`` without a process group).  The real
trainers resume in tests/patches/test_resume.py (slow)."""

from __future__ import annotations

import json
import signal
import sys
from types import SimpleNamespace

import pytest
from overlay_runner import OVERLAY, run_python  # noqa: F401  (puts overlay/ on sys.path; run_python is a fixture)

torch = pytest.importorskip("torch")

from dancegrpo_port import checkpoints as ck  # noqa: E402
from dancegrpo_port import hooks  # noqa: E402
from dancegrpo_port.metrics import MetricsLog  # noqa: E402
from dancegrpo_port.resume import Resume, skip_batches  # noqa: E402


def made(root, step, files=None, manifest=True, **fields):
    d = root / ck.checkpoint_name(step)
    d.mkdir(parents=True)
    for name, data in (files or {"__0_0.distcp": b"x" * 10, "rank_0.pt": b"y" * 3}).items():
        (d / name).write_bytes(data)
    if manifest:
        ck.write_manifest(d, {"step": step, **fields})
    return d


def test_the_manifest_names_every_file_with_its_size(tmp_path):
    d = made(tmp_path, 3, {"__0_0.distcp": b"a" * 7, ".metadata": b"m", "rank_0.pt": b"r" * 2}, world_size=1)
    manifest = ck.read_manifest(d)
    assert manifest["files"] == {".metadata": 1, "__0_0.distcp": 7, "rank_0.pt": 2}
    assert manifest["step"] == 3 and manifest["world_size"] == 1 and not (d / "manifest.json.tmp").exists()


@pytest.mark.parametrize("damage, words", [
    (lambda d: (d / "__0_0.distcp").write_bytes(b"x" * 4), "has 4 bytes, the manifest says 10"),
    (lambda d: (d / "rank_0.pt").unlink(), "rank_0.pt is missing"),
    (lambda d: (d / "manifest.json").unlink(), "has no manifest.json"),
    (lambda d: (d / "manifest.json").write_text("{"), "manifest.json is unreadable"),
])
def test_a_torn_checkpoint_is_one_line_and_latest_skips_it(tmp_path, damage, words):
    made(tmp_path, 1)
    torn = made(tmp_path, 2)
    damage(torn)
    with pytest.raises(ck.CheckpointProblem, match=words):
        ck.read_manifest(torn)
    said = []
    assert ck.latest(tmp_path, said.append) == tmp_path / "step-000001"
    assert len(said) == 1 and "step-000002 skipped" in said[0] and words.split()[-1] in said[0]


def test_latest_is_the_newest_complete_one_and_a_save_in_progress_is_invisible(tmp_path):
    assert ck.latest(tmp_path) is None
    made(tmp_path, 2)
    made(tmp_path, 10)
    tmp = tmp_path / ".tmp-step-000011"
    tmp.mkdir()
    (tmp / "__0_0.distcp").write_bytes(b"half")
    assert ck.latest(tmp_path) == tmp_path / "step-000010"
    final = tmp_path / "step-000011"
    ck.write_manifest(tmp, {"step": 11})
    ck.publish(tmp, final)  # one rename
    assert not tmp.exists() and ck.latest(tmp_path) == final


def test_the_total_limit_keeps_the_newest(tmp_path):
    for step in (1, 2, 3, 4):
        made(tmp_path, step)
    assert ck.prune(tmp_path, None) == []
    gone = ck.prune(tmp_path, 2)
    assert sorted(p.name for p in gone) == ["step-000001", "step-000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000003", "step-000004"]


def test_free_space_and_fit_are_one_line(tmp_path):
    assert ck.space_problem(tmp_path, 100, free=1000) is None
    assert "MiB needed" in ck.space_problem(tmp_path, 2**30, free=2**20)
    ident = {"world_size": 2, "num_generations": 2, "h": 64, "w": 64, "t": 1, "sampling_steps": 4,
             "train_batch_size": 1, "code": "abc"}
    assert ck.fit_problem(ident, dict(ident)) is None
    line = ck.fit_problem(ident, {**ident, "world_size": 1, "code": "def"})
    assert line == "it is of another run: world_size 2 (this run: 1), code 'abc' (this run: 'def')"


def test_resume_flags_are_checked_at_start():
    base = SimpleNamespace(train_batch_size=1, num_generations=2, use_group=True, gradient_accumulation_steps=2,
                           sample_batch_size=1, vae_decode_chunk=None, profile_steps=None, rng="device", record=False,
                           record_steps=None, record_modules=False, replay=None, seed=42, output_dir="out",
                           resume_from_checkpoint="latest", checkpoints_total_limit=None)
    assert hooks.argument_problem(base, environ={}) is None  # upstream's flag works now
    assert "at least 1" in hooks.argument_problem(SimpleNamespace(**{**vars(base), "checkpoints_total_limit": 0}), {})
    assert "--output_dir" in hooks.argument_problem(SimpleNamespace(**{**vars(base), "output_dir": None}), {})


def test_metrics_of_steps_after_the_checkpoint_go_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    MetricsLog(0, str(path)).resumed(2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_a_sampler_continues_after_the_used_batches_for_one_pass():
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(10), num_replicas=2, rank=1, shuffle=True, seed=7)
    full = list(sampler)
    skip_batches(sampler, 7, 2)  # 5 samples a pass, 2 batches of 2: 7 batches = 3 passes + 1 batch
    assert list(sampler) == full[2:] and list(sampler) == full


# ---------------------------------------------------------------- the feature, in process


def args_for(out, **over):
    base = dict(output_dir=str(out), checkpointing_steps=1, max_train_steps=4, checkpoints_total_limit=None,
                resume_from_checkpoint=None, num_generations=2, h=64, w=64, t=1, sampling_steps=4, train_batch_size=1)
    return SimpleNamespace(**{**base, **over})


def training_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler, generator):
    loss = model(torch.randn(2, 4, generator=generator)).square().sum() + model.bias.sum() * torch.rand(()).item()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()


def test_a_rank_without_a_shard_of_a_small_parameter_counts_no_bytes_of_it():
    """FSDP1 on 2 ranks leaves a parameter smaller than the world size with no local shard on one
    rank; its ShardedTensor's local_tensor() refuses that ("Only single local shard is
    supported"), which once stopped the Wan2.1 smoke at its first checkpoint."""
    import torch

    from dancegrpo_port.resume import _bytes

    class NoLocalShard(torch.Tensor):
        def local_shards(self):
            return []

        def local_tensor(self):
            raise NotImplementedError("Only single local shard is supported. Number of shards: 0")

    empty = torch.Tensor._make_subclass(NoLocalShard, torch.zeros(3))
    assert _bytes({"model": {"w": empty, "b": torch.zeros(4)}, "step": 2}) == 16


def test_the_feature_saves_and_restores_the_whole_state(tmp_path, capsys):
    out = tmp_path / "outputs"
    model, optimizer, scheduler = training_state()
    gen = torch.Generator().manual_seed(5)
    saver = Resume(args_for(out, checkpoints_total_limit=1), 0, 1, torch.device("cpu"), gen)
    for step in (1, 2):
        train_step(model, optimizer, scheduler, gen)
        saver.checkpoint_save(step, transformer=model, optimizer=optimizer, lr_scheduler=scheduler)
    assert sorted(p.name for p in (out / "resume").iterdir()) == ["step-000002"]  # the limit, 1
    expected_weights = {k: v.clone() for k, v in model.state_dict().items()}
    expected_moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    train_step(model, optimizer, scheduler, gen)  # the step an uninterrupted run does next
    after3 = {k: v.clone() for k, v in model.state_dict().items()}

    model2, optimizer2, scheduler2 = training_state(seed=1)
    gen2 = torch.Generator().manual_seed(99)
    resumed = []
    loader = Resume(args_for(out, resume_from_checkpoint="latest"), 0, 1, torch.device("cpu"), gen2,
                    on_resume=resumed.append)
    assert loader.checkpoint_load(0, transformer=model2, optimizer=optimizer2, lr_scheduler=scheduler2) == 2
    assert resumed == [2] and "resumed from" in capsys.readouterr().err
    assert all(torch.equal(model2.state_dict()[k], v) for k, v in expected_weights.items())
    assert torch.equal(optimizer2.state_dict()["state"][0]["exp_avg"], expected_moments)
    assert scheduler2.state_dict()["last_epoch"] == 2
    torch.manual_seed(1234)  # whatever the trainer draws before the step's rollout is undone there
    loader.rollout_begin(2, (16, 8, 8), 4, True)
    train_step(model2, optimizer2, scheduler2, gen2)
    assert all(torch.equal(model2.state_dict()[k], v) for k, v in after3.items())


def test_a_checkpoint_of_another_run_or_a_torn_one_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "outputs"
    model, optimizer, scheduler = training_state()
    Resume(args_for(out), 0, 1, torch.device("cpu")).checkpoint_save(4, transformer=model, optimizer=optimizer,
                                                                       lr_scheduler=scheduler)
    path = out / "resume" / "step-000004"
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    for args, words in ((args_for(out, resume_from_checkpoint=str(path), h=128), "h 64 (this run: 128)"),
                        (args_for(out, resume_from_checkpoint=str(path)), None)):
        if words is None:  # other world size: the same checkpoint, a run of 2 ranks
            feature, words = Resume(args, 0, 2, torch.device("cpu")), "world_size 1 (this run: 2)"
        else:
            feature = Resume(args, 0, 1, torch.device("cpu"))
        with pytest.raises(SystemExit) as exit_:
            feature.checkpoint_load(0, transformer=model, optimizer=optimizer, lr_scheduler=scheduler)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
        assert "Traceback" not in err
    shard = path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-5])
    with pytest.raises(SystemExit):
        Resume(args_for(out, resume_from_checkpoint=str(path)), 0, 1, torch.device("cpu")).checkpoint_load(
            0, transformer=model, optimizer=optimizer, lr_scheduler=scheduler)
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "truncated" in err
    before["__0_0.distcp"] = before["__0_0.distcp"][:-5]
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # nothing overwritten


def test_a_kill_during_a_save_leaves_the_previous_checkpoint_latest(run_python, tmp_path):
    code = f"""
from types import SimpleNamespace
import torch
from dancegrpo_port.resume import Resume
model = torch.nn.Linear(4, 3)
optimizer = torch.optim.AdamW(model.parameters())
args = SimpleNamespace(**{vars(args_for(tmp_path / "outputs"))!r})
feature = Resume(args, 0, 1, torch.device("cpu"))
for step in (1, 2):
    feature.checkpoint_save(step, transformer=model, optimizer=optimizer)
print("not killed")
"""
    proc = run_python(code, env={"DANCEGRPO_CHECKPOINT_FAULT": "2"}, check=False)
    assert proc.returncode == -signal.SIGKILL and "not killed" not in proc.stdout, proc.stderr
    root = tmp_path / "outputs" / "resume"
    torn = root / ".tmp-step-000002"
    assert (torn / "__0_0.distcp").is_file() and not (torn / "manifest.json").exists()
    assert ck.latest(root) == root / "step-000001" and not (root / "step-000002").exists()


def test_a_full_disk_stops_the_save_in_one_line_and_keeps_the_previous(tmp_path, capsys, monkeypatch):
    out = tmp_path / "outputs"
    model, optimizer, scheduler = training_state()
    feature = Resume(args_for(out), 0, 1, torch.device("cpu"))
    feature.checkpoint_save(1, transformer=model, optimizer=optimizer, lr_scheduler=scheduler)
    monkeypatch.setattr(ck.shutil, "disk_usage", lambda path: SimpleNamespace(free=1000))
    with pytest.raises(SystemExit) as exit_:
        feature.checkpoint_save(2, transformer=model, optimizer=optimizer, lr_scheduler=scheduler)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 1 and len(err.splitlines()) == 1 and "MiB free" in err and "step-000001" in err
    assert sorted(p.name for p in (out / "resume").iterdir()) == ["step-000001"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
