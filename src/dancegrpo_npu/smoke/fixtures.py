"""The embedded default's inputs: a tiny FLUX pipeline, an HPSv2-shaped reward, a dataset.

``build_fixtures(dest)`` writes, under ``dest`` (default ``<project>/build/fixtures``)::

    flux/                      FluxPipeline.from_pretrained() reads it (model_index.json,
                               transformer/ vae/ text_encoder/ text_encoder_2/
                               tokenizer/ tokenizer_2/ scheduler/)
    hps_ckpt/tiny-hps-vit.json the open_clip model config (--hps_model)
    hps_ckpt/open_clip_pytorch_model.bin   (--hps_open_clip_ckpt)
    hps_ckpt/HPS_v2.1_compressed.pt        (--hps_ckpt)
    rl_embeddings/             what preprocess_flux_embedding.py writes: prompt_embed/<i>.pt,
                               pooled_prompt_embeds/<i>.pt, text_ids/<i>.pt, videos2caption.json
    prompts.txt                the prompts the dataset was encoded from (--prompt_dir)
    fixtures.stamp.json        written last: parameters hash and the sha256 of every file

Everything is built offline from fixed seeds, into a staging directory that is
renamed into place only when complete; a directory whose stamp does not match
the current parameters and files is rebuilt, never trusted.  A lock file keeps
two concurrent builds (e.g. two smoke runs) from racing.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.lock import sha256_file
from dancegrpo_npu.files import write_atomic

FIXTURES_VERSION = 1
STAMP_NAME = "fixtures.stamp.json"

# The dataset's captions; preprocessing reads them from prompts.txt, one a line.
PROMPTS = (
    "a photo of a cat sitting on a red chair",
    "an astronaut riding a horse on the moon, oil painting",
    "a bowl of fresh fruit on a wooden table in soft morning light",
    "a watercolor landscape with mountains and a lake at sunrise",
    "a lighthouse on a rocky coast during a storm",
    "a robot reading a newspaper in a busy train station",
    "a field of sunflowers under a blue sky",
    "a small house in a snowy forest at night",
)

# The packages whose versions decide what gets written (a change rebuilds).
VERSIONED_PACKAGES = ("torch", "diffusers", "transformers", "tokenizers", "sentencepiece", "safetensors", "hpsv2", "open_clip_torch")

# OpenAI CLIP's BPE vocabulary, as open_clip_torch ships it.
BPE_NAME = "bpe_simple_vocab_16e6.txt.gz"
BPE_SHA256 = "924691ac288e54409236115652ad4aa250f48203de50a9e4722a6ecd48d6804a"

# What a fixtures directory holds at its top level (anything else there is not ours).
LAYOUT_NAMES = ("pipeline", "hps_ckpt", "rl_embeddings", "prompts.txt", STAMP_NAME)

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "DIFFUSERS_OFFLINE": "1"}


@dataclass(frozen=True)
class Fixtures:
    model_dir: Path  # tiny FLUX.1-dev-shaped pipeline directory
    hps_model_config: Path  # open_clip model-config JSON of the tiny HPS CLIP
    hps_open_clip_ckpt: Path  # the open_clip weights file upstream's loader reads
    hps_ckpt: Path  # the HPS_v2.1_compressed.pt-shaped file ({'state_dict': ...})
    data_json: Path  # videos2caption.json of an RL-embeddings dataset
    prompts: Path  # the prompts the dataset was made from

    @property
    def root(self) -> Path:
        return self.model_dir.parent

    @property
    def hps_model_name(self) -> str:
        """The name hpsv2's open_clip knows the config by once it is added."""
        return self.hps_model_config.stem


def fixtures_at(dest: Path) -> Fixtures:
    """The paths of the fixtures under ``dest`` (built or not)."""
    from dancegrpo_npu.smoke.tiny_models import HPS_MODEL_NAME

    dest = Path(dest)
    hps = dest / "hps_ckpt"
    return Fixtures(
        model_dir=dest / "pipeline",
        hps_model_config=hps / f"{HPS_MODEL_NAME}.json",
        hps_open_clip_ckpt=hps / "open_clip_pytorch_model.bin",
        hps_ckpt=hps / "HPS_v2.1_compressed.pt",
        data_json=dest / "rl_embeddings" / "videos2caption.json",
        prompts=dest / "prompts.txt",
    )


def build_fixtures(dest: Path, tree: Path | None = None) -> Fixtures:
    """Build the fixtures at ``dest``, or reuse them when they are complete and current.

    With ``tree`` (a patched upstream tree), the dataset is also read back through
    that tree's own ``LatentDataset`` before it is returned.
    """
    dest = Path(os.path.abspath(dest))
    params = params_sha256()
    if not is_current(dest, params):
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with _build_lock(dest):
                if not is_current(dest, params):  # another process may have built it meanwhile
                    _check_replaceable(dest)
                    _build_and_swap(dest, params)
        except OSError as exc:
            raise DancegrpoError(
                f"cannot build the fixtures in {dest}: {exc}", "check that its directory is writable and has space"
            ) from None
        except ImportError as exc:
            if exc.name in ("tkinter", "_tkinter"):  # hpsv2's factory.py has `from turtle import forward`
                hint = "hpsv2's open_clip imports turtle, which needs Tk: install your Python's Tk (e.g. apt-get install python3-tk)"
            else:
                hint = "run ./scripts/bootstrap.sh --deps-only to install the Flux stack"
            raise DancegrpoError(f"building the fixtures failed to import {exc.name or exc}: {exc}", hint) from None
    fixtures = fixtures_at(dest)
    if tree is not None:
        check_dataset_with_tree(fixtures, Path(tree))
    return fixtures


def params_sha256() -> str:
    """What the fixtures depend on: our parameters, our builder code, the libraries' versions.

    The builder code is hashed whole, so any edit to it rebuilds (seconds) rather
    than trusting a directory an older builder wrote.
    """
    from dancegrpo_npu.smoke import tiny_models

    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise DancegrpoError(
                f"building the fixtures needs the Python package {name}, which is not installed",
                "run ./scripts/bootstrap.sh, or pip install 'dancegrpo-npu[flux]' and hpsv2 as it does",
            ) from None
    code = hashlib.sha256(Path(__file__).read_bytes() + Path(tiny_models.__file__).read_bytes()).hexdigest()
    data = {"version": FIXTURES_VERSION, "params": tiny_models.PARAMS, "prompts": PROMPTS, "packages": versions, "code": code}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def is_current(dest: Path, params: str | None = None) -> bool:
    """True when ``dest`` holds a complete build for these parameters, every file intact."""
    try:
        stamp = json.loads((Path(dest) / STAMP_NAME).read_text())
        if stamp.get("params_sha256") != (params or params_sha256()) or not stamp.get("files"):
            return False
        return all(sha256_file(Path(dest) / rel) == digest for rel, digest in stamp["files"].items())
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def ensure_hpsv2_vocab() -> Path:
    """Put CLIP's BPE vocabulary where hpsv2's open_clip looks for it; return that path.

    The hpsv2 1.2.0 wheel leaves out ``bpe_simple_vocab_16e6.txt.gz``, so
    ``import hpsv2.src.open_clip`` fails.  The file is OpenAI CLIP's vocabulary,
    which open_clip_torch ships; it is copied (checked by sha256) next to hpsv2's
    tokenizer.  Idempotent: a present, correct file is left alone.
    """
    hps_spec = importlib.util.find_spec("hpsv2")
    if hps_spec is None:
        raise DancegrpoError(
            "the HPSv2 reward needs the Python package hpsv2, which is not installed",
            "run ./scripts/bootstrap.sh (it installs hpsv2==1.2.0 without its pins)",
        )
    target = Path(next(iter(hps_spec.submodule_search_locations))) / "src" / "open_clip" / BPE_NAME
    if target.is_file() and sha256_file(target) == BPE_SHA256:
        return target
    source = clip_bpe_path()
    try:
        write_atomic(target, source.read_bytes())
    except OSError as exc:
        raise DancegrpoError(
            f"cannot write hpsv2's missing vocabulary {target}: {exc.strerror}",
            f"copy {source} there by hand (as the user who installed hpsv2)",
        ) from None
    return target


def clip_bpe_path() -> Path:
    """open_clip_torch's copy of CLIP's BPE vocabulary (checked)."""
    spec = importlib.util.find_spec("open_clip")
    path = Path(next(iter(spec.submodule_search_locations))) / BPE_NAME if spec else None
    if path is None or not path.is_file() or sha256_file(path) != BPE_SHA256:
        raise DancegrpoError(
            f"CLIP's BPE vocabulary ({BPE_NAME}) was not found in open_clip_torch",
            "install open_clip_torch (pip install 'dancegrpo-npu[flux]')",
        )
    return path


def write_rl_embeddings(model_dir: Path, prompts: list[str], out_dir: Path) -> None:
    """The RL-embeddings dataset, written as upstream's preprocess_flux_embedding.py writes it.

    Same pipeline load (bfloat16), same ``encode_prompt(prompt=, prompt_2=)``
    call on a batch of one, same ``torch.save`` of the ``[idx]`` views, same
    names (``<i>.pt``) and JSON entries; in file order rather than shuffled.
    """
    import torch
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(model_dir), torch_dtype=torch.bfloat16)
    for sub in ("prompt_embed", "text_ids", "pooled_prompt_embeds"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    entries = []
    with torch.inference_mode():
        for i, caption in enumerate(prompts):
            captions, idx, name = [caption], 0, f"{i}.pt"
            prompt_embeds, pooled_prompt_embeds, text_ids = pipe.encode_prompt(prompt=captions, prompt_2=captions)
            torch.save(prompt_embeds[idx], out_dir / "prompt_embed" / name)
            torch.save(pooled_prompt_embeds[idx], out_dir / "pooled_prompt_embeds" / name)
            torch.save(text_ids[idx], out_dir / "text_ids" / name)
            entries.append({"prompt_embed_path": name, "text_ids": name, "pooled_prompt_embeds_path": name, "caption": captions[idx]})
    (out_dir / "videos2caption.json").write_text(json.dumps(entries, indent=4))


def check_dataset_with_tree(fixtures: Fixtures, tree: Path) -> None:
    """Read the dataset back through ``tree``'s own LatentDataset and collate function."""
    module_path = tree / "fastvideo" / "dataset" / "latent_flux_rl_datasets.py"
    if not module_path.is_file():
        raise DancegrpoError(f"{tree} has no {module_path.relative_to(tree)}", "run `dancegrpo-npu fetch` and `apply` first")
    import torch

    spec = importlib.util.spec_from_file_location("_dancegrpo_latent_flux_rl_datasets", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports only torch, json, os, random
    dataset = module.LatentDataset(str(fixtures.data_json), 1, 0.0)
    batch = module.latent_collate_function([dataset[i] for i in range(min(2, len(dataset)))])
    prompt_embeds, pooled, text_ids, captions = batch
    from dancegrpo_npu.smoke.tiny_models import CLIP_TEXT_CONFIG, T5_CONFIG, T5_MAX_LENGTH

    n = len(captions)
    expected = ((n, T5_MAX_LENGTH, T5_CONFIG["d_model"]), (n, CLIP_TEXT_CONFIG["hidden_size"]), (n, 3))
    got = (tuple(prompt_embeds.shape), tuple(pooled.shape), tuple(text_ids.shape))
    if got != expected or not all(torch.isfinite(t.float()).all() for t in batch[:3]):
        raise DancegrpoError(
            f"{tree}'s LatentDataset reads {fixtures.data_json} as shapes {got}, expected {expected} (all finite)",
            f"delete {fixtures.root} to rebuild the fixtures",
        )


# ---- building -------------------------------------------------------------------------------


def _check_replaceable(dest: Path) -> None:
    """Refuse to replace anything but an old or broken fixtures directory (never lose a user's files)."""
    if not (dest.exists() or dest.is_symlink()):
        return
    if dest.is_dir() and not dest.is_symlink():
        names = {p.name for p in dest.iterdir()}
        if STAMP_NAME in names or names <= set(LAYOUT_NAMES):
            return
    raise DancegrpoError(
        f"{dest} exists and is not a fixtures directory (it has no {STAMP_NAME}); not replacing it",
        "remove it, or choose another directory for the fixtures",
    )


def _build_and_swap(dest: Path, params: str) -> None:
    for stale in dest.parent.glob(f".{dest.name}.build-*"):  # left by a build that died; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    staging = dest.parent / f".{dest.name}.build-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()  # not mkdtemp: the result keeps the umask's permissions, for shared clusters
    try:
        _build_into(staging)
        files = {
            p.relative_to(staging).as_posix(): sha256_file(p) for p in sorted(staging.rglob("*")) if p.is_file()
        }
        stamp = {"version": FIXTURES_VERSION, "params_sha256": params, "files": files}
        (staging / STAMP_NAME).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        old = None
        if dest.exists() or dest.is_symlink():
            old = dest.parent / f"{staging.name}-old"
            os.replace(dest, old)
        os.replace(staging, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() and not old.is_symlink() else old.unlink()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _build_into(root: Path) -> None:
    """Everything but the stamp, into the empty directory ``root``."""
    import torch

    from dancegrpo_npu.smoke import tiny_models

    ensure_hpsv2_vocab()
    bpe = clip_bpe_path()
    with _offline(), torch.random.fork_rng(devices=[]):  # the seeds set here must not leak into the caller
        _write_all(fixtures_at(root), bpe, tiny_models)


def _write_all(fixtures: Fixtures, bpe: Path, tiny_models) -> None:
    root = fixtures.root
    scratch = root / ".scratch"
    pipe = tiny_models.build_flux_pipeline(bpe, scratch)
    pipe.save_pretrained(str(fixtures.model_dir))
    del pipe
    fixtures.hps_model_config.parent.mkdir(parents=True)
    tiny_models.write_hps_checkpoints(fixtures.hps_model_config, fixtures.hps_open_clip_ckpt, fixtures.hps_ckpt)
    fixtures.prompts.write_text("".join(p + "\n" for p in PROMPTS))
    prompts = fixtures.prompts.read_text().splitlines()
    write_rl_embeddings(fixtures.model_dir, prompts, fixtures.data_json.parent)
    shutil.rmtree(scratch)


@contextlib.contextmanager
def _offline():
    """Nothing is downloaded: a stray hub lookup fails at once instead of waiting on a network."""
    saved = {key: os.environ.get(key) for key in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _build_lock(dest: Path):
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no concurrent smoke runs to guard
        yield
        return
    with open(dest.parent / f".{dest.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

