"""The dataset each run read: the overlay's digest (dataset_index.digest), kept in the records
index of a recorded run (alignment.start), and what compare shows of it and says when the two
runs' differ (align/dataset.py)."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
from recorded_runs import make_run

from dancegrpo_npu.cli import main

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "overlay"


def _overlay_module(name: str):
    spec = importlib.util.spec_from_file_location(f"_overlay_{name}", OVERLAY / "dancegrpo_port" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dataset_index = _overlay_module("dataset_index")


def write_dataset(root: Path, prompts: int = 3, fill: bytes = b"e") -> Path:
    """A FLUX RL-embeddings dataset as preprocessing lays it out (tensor files as plain bytes)."""
    entries = []
    for i in range(prompts):
        name = f"{i}.pt"
        for folder in ("prompt_embed", "pooled_prompt_embeds", "text_ids"):
            (root / folder).mkdir(parents=True, exist_ok=True)
            (root / folder / name).write_bytes(fill * (100 + i) + folder.encode())
        entries.append({"prompt_embed_path": name, "text_ids": name, "pooled_prompt_embeds_path": name,
                        "caption": f"prompt {i}"})
    (root / "videos2caption.json").write_text(json.dumps(entries, indent=4))
    return root / "videos2caption.json"


# ------------------------------------------------------------------ the digest


def test_the_digest_is_the_index_and_every_file_it_names(tmp_path):
    index = write_dataset(tmp_path / "a")
    d = dataset_index.digest(index)
    assert d["path"] == str(index) and d["sha256"] == hashlib.sha256(index.read_bytes()).hexdigest()
    assert (d["rows"], d["files"], d["files_hashed"]) == (3, 9, 9) and "problem" not in d
    # the same data elsewhere has the same digest; one tensor file changed changes it
    same = dataset_index.digest(write_dataset(tmp_path / "b"))
    assert (same["sha256"], same["files_sha256"]) == (d["sha256"], d["files_sha256"])
    (tmp_path / "b" / "text_ids" / "2.pt").write_bytes(b"other")
    changed = dataset_index.digest(tmp_path / "b" / "videos2caption.json")
    assert changed["sha256"] == d["sha256"] and changed["files_sha256"] != d["files_sha256"]


def test_the_digest_reads_files_up_to_its_budget_and_names_what_is_missing(tmp_path):
    index = write_dataset(tmp_path)
    assert dataset_index.digest(index, files_budget=250)["files_hashed"] == 2  # 100 + 101 bytes, and a third is over
    (tmp_path / "prompt_embed" / "1.pt").unlink()
    d = dataset_index.digest(index)
    assert d["files_missing"] == 1 and "prompt_embed/1.pt" in d["problem"]


def test_a_prompt_file_is_its_lines_and_a_missing_file_says_so(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\na dog\n")
    assert dataset_index.digest(prompts)["rows"] == 2
    assert "cannot read" in dataset_index.digest(tmp_path / "absent.json")["problem"]


def test_a_recorded_run_keeps_its_datasets_digest_in_the_records_index(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    monkeypatch.syspath_prepend(str(OVERLAY))
    from dancegrpo_port import alignment

    index = write_dataset(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(rng="cpu", seed=42, record=True, record_steps=None, record_modules=False, replay=None,
                              clip_range=1e-4, num_generations=2, use_group=True, train_batch_size=2, h=32, w=32,
                              t=1, sampling_steps=4, init_same_noise=False, eta=0.3, timestep_fraction=0.6,
                              max_train_steps=2, gradient_accumulation_steps=2, data_json_path=str(index))
    alignment.start(args, 0, 1)
    recorded = json.loads((tmp_path / "records" / "index.json").read_text())
    assert recorded["dataset"] == dataset_index.digest(index)


# ------------------------------------------------------------------ compare


@pytest.fixture
def project(tmp_path):
    (tmp_path / "upstream.lock").write_text((REPO / "upstream.lock").read_text())
    return tmp_path


def compare(project, capsys, a: str, b: str) -> tuple[int, str]:
    rc = main(["-C", str(project), "compare", a, b])
    return rc, capsys.readouterr().out


def lines_starting(out: str, prefix: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(prefix)]


def _latents_off(step, rank, t):  # what another prompt's embeddings do with bit-equal noise
    t["latents"][:, 1:] += 0.5


def test_runs_that_read_different_datasets_say_so_and_point_at_the_data(project, tmp_path, capsys):
    one = dataset_index.digest(write_dataset(tmp_path / "one-rank"))
    entries = json.loads((tmp_path / "one-rank" / "videos2caption.json").read_text())
    other = tmp_path / "two-ranks" / "videos2caption.json"
    write_dataset(other.parent)
    other.write_text(json.dumps([entries[0], entries[2], entries[1]], indent=4))  # rank 0's share first
    make_run(project / "runs", "ref", dataset=one)
    b = make_run(project / "runs", "test", dataset=dataset_index.digest(other), perturb=_latents_off)
    rc, out = compare(project, capsys, "ref", "test")
    assert rc == 1
    assert lines_starting(out, "dataset A: ") == [f"dataset A: {tmp_path / 'one-rank' / 'videos2caption.json'}, "
                                                  f"index sha256 {one['sha256'][:12]}, 3 rows, tensor files sha256 "
                                                  f"{one['files_sha256'][:12]} (9 of 9 files)"]  # fmt: skip
    [differs] = lines_starting(out, "dataset: ")
    assert differs.startswith("dataset: DIFFERS: the runs read different datasets: their index files differ "
                              "(3 rows each, other entries or another order)")
    assert "not the device's" in differs
    assert lines_starting(out, "first divergence: latents.1 at step 1")
    assert out.strip().splitlines()[-1].endswith("the runs read different datasets, the likely cause (dataset: above)")
    report = json.loads((b / "compare.json").read_text())
    assert report["datasets"]["same"] is False and report["datasets"]["a"] == one


def test_the_same_index_over_other_tensor_files_differs(project, tmp_path, capsys):
    a = dataset_index.digest(write_dataset(tmp_path / "a"))
    b = dataset_index.digest(write_dataset(tmp_path / "b", fill=b"f"))
    make_run(project / "runs", "ref", dataset=a)
    make_run(project / "runs", "test", dataset=b)
    rc, out = compare(project, capsys, "ref", "test")
    assert rc == 0  # the records agree: the verdict is theirs; the line says the data differ
    [line] = lines_starting(out, "dataset: ")
    assert "the same index, but the tensor files it names differ" in line


def test_runs_that_read_the_same_dataset_say_so(project, tmp_path, capsys):
    digest = dataset_index.digest(write_dataset(tmp_path / "a"))
    make_run(project / "runs", "ref", dataset=digest)
    b = make_run(project / "runs", "test", dataset=dataset_index.digest(write_dataset(tmp_path / "copy")))
    rc, out = compare(project, capsys, "ref", "test")
    assert rc == 0 and lines_starting(out, "dataset: ") == ["dataset: the same in both runs"]
    assert json.loads((b / "compare.json").read_text())["datasets"]["same"] is True


def test_a_run_without_a_digest_is_unknown_not_the_same(project, tmp_path, capsys):
    make_run(project / "runs", "ref")
    make_run(project / "runs", "test", dataset=dataset_index.digest(write_dataset(tmp_path / "a")))
    rc, out = compare(project, capsys, "ref", "test")
    assert rc == 0
    assert lines_starting(out, "dataset A: ") == ["dataset A: not recorded (records made before runs kept their "
                                                  "dataset's digest, or a trainer without a dataset file)"]  # fmt: skip
    assert lines_starting(out, "dataset: ") == ["dataset: unknown whether the runs read the same data: RUN_A recorded "
                                                "no readable dataset digest"]  # fmt: skip
