"""The fixtures' builds (smoke.fixtures), on the FLUX fixtures (trainers.flux.fixtures): layout, reuse,
rebuild, determinism, hpsv2 vocabulary, the dataset vs upstream; the shared reward fixtures alone.

One build per test session (fixture ``built``, shared with test_tiny_models), seconds on two cores;
the rebuild tests build a second time and compare hashes with the first build.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_fixtures import built  # noqa: F401  (a fixture)

from dancegrpo_npu.smoke import fixtures as fx
from dancegrpo_npu.trainers.flux import fixtures as flux
from dancegrpo_npu.errors import DancegrpoError

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
DATASET_MODULE = "fastvideo/dataset/latent_flux_rl_datasets.py"


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def upstream_dataset_tree(upstream_source, tmp_path_factory) -> Path:
    """Upstream's own (unpatched: caption-list.patch changes it) dataset module at the locked commit."""
    from dancegrpo_npu.engine.lock import load_lock

    lock = load_lock(ROOT / "upstream.lock")
    source = upstream_source
    if source.endswith((".tar.gz", ".tgz")):
        pytest.skip(f"upstream unavailable: this test clones git sources only, DANCEGRPO_SOURCE is {source}")
    dest = tmp_path_factory.mktemp("upstream") / "DanceGRPO"
    try:
        subprocess.run(["git", "clone", "-q", "--no-checkout", source, str(dest)], check=True, capture_output=True, timeout=120)
        subprocess.run(
            ["git", "-C", str(dest), "checkout", "-q", lock.commit, "--", DATASET_MODULE],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"upstream unavailable: cannot clone {source} at {lock.commit[:12]}: {exc} {detail.decode(errors='replace')[:200]}")
    return dest


# ---- build, reuse, rebuild ------------------------------------------------------------------


def test_layout_matches_the_contract(built):
    assert built.model_dir.name == "pipeline" and (built.model_dir / "model_index.json").is_file()
    for sub in ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler"):
        assert (built.model_dir / sub).is_dir(), sub
    for path in (built.hps_model_config, built.hps_open_clip_ckpt, built.hps_ckpt, built.data_json, built.prompts):
        assert path.is_file(), path
    assert built.hps_model_name == "tiny-hps-vit"
    assert built.prompts.read_text().splitlines() == list(fx.PROMPTS)
    assert not list(built.root.parent.glob(".fixtures.build-*")), "staging directory left behind"
    stamp = json.loads((built.root / fx.STAMP_NAME).read_text())
    assert set(stamp["files"]) == set(tree_hashes(built.root)) - {fx.STAMP_NAME}


def test_the_reward_fixtures_alone_are_the_ones_every_smoke_shares(built, tmp_path):
    """The HPS reward and the prompts, built without a trainer's pipeline, are the very files the
    FLUX fixtures hold: every trainer's smoke scores with the same reward."""
    reward = fx.build_reward_fixtures(tmp_path / "fixtures-reward")
    assert sorted(p.name for p in reward.hps_model_config.parents[1].iterdir()) == ["fixtures.stamp.json", "hps_ckpt",
                                                                                      "prompts.txt"]
    for path in ("hps_model_config", "hps_open_clip_ckpt", "hps_ckpt", "prompts"):
        assert getattr(reward, path).read_bytes() == getattr(built, path).read_bytes(), path
    assert fx.is_current(tmp_path / "fixtures-reward", fx.reward_params_sha256())


def test_reused_when_present(built, monkeypatch):
    before = (built.root / fx.STAMP_NAME).stat().st_mtime_ns
    monkeypatch.setattr(fx, "_build_into", lambda root, write: pytest.fail("rebuilt a complete, current fixture dir"))
    assert flux.build_fixtures(built.root) == built
    assert (built.root / fx.STAMP_NAME).stat().st_mtime_ns == before


@pytest.mark.parametrize("damage", ["no stamp", "file deleted", "file changed", "other parameters"])
def test_incomplete_or_stale_dir_is_not_current(built, tmp_path, damage):
    copy = tmp_path / "fixtures"
    shutil.copytree(built.root, copy)
    assert fx.is_current(copy, flux.params_sha256())
    if damage == "no stamp":
        (copy / fx.STAMP_NAME).unlink()
    elif damage == "file deleted":
        (copy / "pipeline" / "vae" / "config.json").unlink()
    elif damage == "file changed":
        with open(copy / "rl_embeddings" / "prompt_embed" / "0.pt", "r+b") as handle:
            handle.seek(100)
            handle.write(b"\0\0\0\0")
    else:
        stamp = json.loads((copy / fx.STAMP_NAME).read_text())
        stamp["params_sha256"] = "0" * 64
        (copy / fx.STAMP_NAME).write_text(json.dumps(stamp))
    assert not fx.is_current(copy, flux.params_sha256())


def test_half_built_dir_is_rebuilt_identically(built, tmp_path):
    """A broken dir is replaced by a fresh build: the second build of the session, same bytes."""
    dest = tmp_path / "fixtures"
    shutil.copytree(built.root, dest)
    (dest / fx.STAMP_NAME).unlink()
    (dest / "hps_ckpt" / "HPS_v2.1_compressed.pt").write_bytes(b"truncated")
    shutil.rmtree(dest / "rl_embeddings")
    torch.manual_seed(12345)
    rng, env = torch.random.get_rng_state(), dict(os.environ)
    flux.build_fixtures(dest)
    assert torch.equal(torch.random.get_rng_state(), rng), "the build's seeds leaked into the caller"
    assert dict(os.environ) == env
    assert fx.is_current(dest, flux.params_sha256())
    assert tree_hashes(dest) == tree_hashes(built.root), "two builds differ: the fixtures are not deterministic"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fixtures.lock", "fixtures"]


def test_dir_with_a_broken_stamp_is_replaced_whole(built, tmp_path, monkeypatch):
    dest = tmp_path / "fixtures"
    shutil.copytree(built.root, dest)
    (dest / fx.STAMP_NAME).write_text("{")
    (dest / "stray-file").write_text("left by an older layout")
    fake_build = lambda root, write: shutil.copytree(built.root, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns(fx.STAMP_NAME))
    monkeypatch.setattr(fx, "_build_into", fake_build)
    flux.build_fixtures(dest)
    assert fx.is_current(dest, flux.params_sha256()) and not (dest / "stray-file").exists()


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_something_else_at_dest_is_never_replaced(tmp_path, monkeypatch, kind):
    dest = tmp_path / "important"
    if kind == "directory":
        dest.mkdir()
        (dest / "notes.txt").write_text("mine")
    else:
        dest.write_text("mine")
    monkeypatch.setattr(fx, "_build_into", lambda root, write: pytest.fail("built although dest is not ours"))
    with pytest.raises(DancegrpoError, match="not a fixtures directory"):
        flux.build_fixtures(dest)
    assert (dest / "notes.txt" if kind == "directory" else dest).read_text() == "mine"


def test_failed_build_leaves_old_dir_and_no_staging(built, tmp_path, monkeypatch):
    dest = tmp_path / "fixtures"
    shutil.copytree(built.root, dest)
    (dest / fx.STAMP_NAME).unlink()
    before = tree_hashes(dest)
    (tmp_path / ".fixtures.build-crashed").mkdir()  # a staging dir of a build that died

    def half_build(root, write):
        (root / "pipeline").mkdir()
        (root / "pipeline" / "model_index.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(fx, "_build_into", half_build)
    with pytest.raises(KeyboardInterrupt):
        flux.build_fixtures(dest)
    assert tree_hashes(dest) == before
    assert not fx.is_current(dest, flux.params_sha256())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fixtures.lock", "fixtures"]


def test_missing_package_is_a_clear_error(monkeypatch, tmp_path):
    real = fx.importlib.metadata.version

    def version(name):
        if name == "hpsv2":
            raise fx.importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(fx.importlib.metadata, "version", version)
    with pytest.raises(DancegrpoError, match="hpsv2") as info:
        flux.build_fixtures(tmp_path / "fixtures")
    assert "bootstrap" in info.value.hint
    assert not (tmp_path / "fixtures").exists()


@pytest.mark.parametrize("missing", ["_tkinter", "diffusers"])
def test_broken_import_during_build_is_a_clear_error(tmp_path, monkeypatch, missing):
    def build(root, write):
        raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)

    monkeypatch.setattr(fx, "_build_into", build)
    with pytest.raises(DancegrpoError, match=f"failed to import {missing}") as info:
        flux.build_fixtures(tmp_path / "fixtures")
    assert ("python3-tk" if missing == "_tkinter" else "bootstrap") in info.value.hint
    assert not (tmp_path / "fixtures").exists()


def test_unwritable_dest_is_a_clear_error(tmp_path):
    if os.geteuid() == 0:
        blocker = tmp_path / "a-file"  # root ignores permissions: put the dest under a file instead
        blocker.write_text("")
        dest = blocker / "fixtures"
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        dest = tmp_path / "ro" / "fixtures"
    with pytest.raises(DancegrpoError, match="cannot build the fixtures in") as info:
        flux.build_fixtures(dest)
    assert "writable" in info.value.hint


def test_module_imports_without_torch():
    code = ("import sys, dancegrpo_npu.smoke.fixtures, dancegrpo_npu.smoke.tiny_models, dancegrpo_npu.trainers.flux.fixtures, "
            "dancegrpo_npu.trainers.flux.tiny_models; sys.exit('torch' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(Path(fx.__file__).parents[2]))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


# ---- hpsv2's missing vocabulary -------------------------------------------------------------


def _fake_hpsv2(monkeypatch, tmp_path) -> Path:
    package = tmp_path / "site" / "hpsv2"
    (package / "src" / "open_clip").mkdir(parents=True)
    real_find_spec = fx.importlib.util.find_spec

    def find_spec(name, *args):
        if name == "hpsv2":
            spec = importlib.machinery.ModuleSpec("hpsv2", None, is_package=True)
            spec.submodule_search_locations = [str(package)]
            return spec
        return real_find_spec(name, *args)

    monkeypatch.setattr(fx.importlib.util, "find_spec", find_spec)
    return package / "src" / "open_clip" / fx.BPE_NAME


def test_hpsv2_vocab_is_copied_checked_and_idempotent(monkeypatch, tmp_path):
    target = _fake_hpsv2(monkeypatch, tmp_path)
    assert fx.ensure_hpsv2_vocab() == target
    assert hashlib.sha256(target.read_bytes()).hexdigest() == fx.BPE_SHA256
    stat = target.stat()
    assert fx.ensure_hpsv2_vocab() == target and target.stat().st_mtime_ns == stat.st_mtime_ns
    target.write_bytes(b"not the vocabulary")
    fx.ensure_hpsv2_vocab()
    assert hashlib.sha256(target.read_bytes()).hexdigest() == fx.BPE_SHA256
    assert sorted(p.name for p in target.parent.iterdir()) == [fx.BPE_NAME]


def test_installed_hpsv2_imports_with_its_vocab():
    fx.ensure_hpsv2_vocab()
    from hpsv2.src.open_clip import tokenize

    ids = tokenize(["a cat"])
    assert ids.shape == (1, 77) and ids[0, 0] == 49406 and 49407 in ids[0].tolist()


# ---- the RL-embeddings dataset ---------------------------------------------------------------


def test_dataset_layout_is_preprocessings(built):
    out = built.data_json.parent
    entries = json.loads(built.data_json.read_text())
    assert [e["caption"] for e in entries] == list(fx.PROMPTS)
    for i, entry in enumerate(entries):
        assert entry == {"prompt_embed_path": f"{i}.pt", "text_ids": f"{i}.pt", "pooled_prompt_embeds_path": f"{i}.pt", "caption": fx.PROMPTS[i]}
        embeds = torch.load(out / "prompt_embed" / f"{i}.pt", weights_only=True)
        pooled = torch.load(out / "pooled_prompt_embeds" / f"{i}.pt", weights_only=True)
        text_ids = torch.load(out / "text_ids" / f"{i}.pt", weights_only=True)
        assert (embeds.shape, pooled.shape, text_ids.shape) == ((512, 16), (16,), (3,))
        assert embeds.dtype == pooled.dtype == text_ids.dtype == torch.bfloat16
        assert torch.isfinite(embeds.float()).all() and torch.isfinite(pooled.float()).all()
    first = torch.load(out / "prompt_embed" / "0.pt", weights_only=True)
    assert not torch.equal(first, torch.load(out / "prompt_embed" / "1.pt", weights_only=True))


def test_upstream_dataset_module_imports_only_the_stdlib_and_torch(upstream_dataset_tree):
    """What importing it runs (its ``__main__`` demo also imports pdb, which is not run)."""
    body = ast.parse((upstream_dataset_tree / DATASET_MODULE).read_text()).body
    imported = {alias.name.split(".")[0] for node in body if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in body if isinstance(node, ast.ImportFrom)}
    assert "torch" in imported
    assert imported <= {"torch", "json", "os", "random"}, imported


def test_dataset_reads_through_upstreams_latent_dataset(built, upstream_dataset_tree):
    import importlib.util

    spec = importlib.util.spec_from_file_location("upstream_latent_flux_rl_datasets", upstream_dataset_tree / DATASET_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dataset = module.LatentDataset(str(built.data_json), 1, 0.0)  # the trainer's num_latent_t, cfg defaults
    assert len(dataset) == len(fx.PROMPTS)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, shuffle=False, collate_fn=module.latent_collate_function)
    batches = list(loader)
    assert len(batches) == len(fx.PROMPTS) // 2
    prompt_embeds, pooled, text_ids, captions = batches[0]
    assert prompt_embeds.shape == (2, 512, 16) and pooled.shape == (2, 16) and text_ids.shape == (2, 3)
    assert prompt_embeds.dtype == pooled.dtype == text_ids.dtype == torch.bfloat16
    assert list(captions) == list(fx.PROMPTS[:2])
    # the tool's own read-back through the tree (build_fixtures(dest, tree))
    assert flux.build_fixtures(built.root, tree=upstream_dataset_tree) == built


def test_tree_without_the_dataset_module_is_a_clear_error(built, tmp_path):
    with pytest.raises(DancegrpoError, match="latent_flux_rl_datasets.py") as info:
        flux.build_fixtures(built.root, tree=tmp_path)
    assert "fetch" in info.value.hint


def test_concurrent_builds_build_once(built, tmp_path, monkeypatch):
    """Two smoke runs starting together: the lock makes the second reuse the first's build."""
    import threading
    import time

    calls = []

    def slow_build(root, write):
        calls.append(root)
        time.sleep(0.3)
        shutil.copytree(built.root, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns(fx.STAMP_NAME))

    monkeypatch.setattr(fx, "_build_into", slow_build)
    dest = tmp_path / "fixtures"
    results = []
    threads = [threading.Thread(target=lambda: results.append(flux.build_fixtures(dest))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(results) == 2 and results[0] == results[1]
    assert fx.is_current(dest, flux.params_sha256())
