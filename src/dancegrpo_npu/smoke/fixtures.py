"""The fixtures every smoke shares, and how any fixture directory is built.

``build_reward_fixtures(dest)`` writes, under ``dest`` (``<project>/build/fixtures-reward``)::

    hps_ckpt/tiny-hps-vit.json the open_clip model config (--hps_model)
    hps_ckpt/open_clip_pytorch_model.bin   (--hps_open_clip_ckpt)
    hps_ckpt/HPS_v2.1_compressed.pt        (--hps_ckpt)
    prompts.txt                the prompts every smoke's dataset is encoded from (--prompt_dir)
    fixtures.stamp.json        written last: parameters hash and the sha256 of every file

A family's own fixtures (its tiny pipeline and dataset: ``trainers/<family>/``) are built the
same way (``build_stamped``), or by another dependency set's interpreter (``child_build``).
Everything is built offline from fixed seeds, into a staging directory that is renamed into place
only when complete; a directory whose stamp does not match the current parameters and files is
rebuilt, never trusted.  A lock file keeps two concurrent builds (e.g. two smoke runs) from racing.
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
from typing import Callable

from dancegrpo_npu.engine.lock import sha256_file
from dancegrpo_npu.errors import DancegrpoError
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

# What the reward fixtures hold at their top level.
REWARD_NAMES = ("hps_ckpt", "prompts.txt")

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "DIFFUSERS_OFFLINE": "1"}


@dataclass(frozen=True)
class RewardFixtures:
    hps_model_config: Path  # open_clip model-config JSON of the tiny HPS CLIP
    hps_open_clip_ckpt: Path  # the open_clip weights file upstream's loader reads
    hps_ckpt: Path  # the HPS_v2.1_compressed.pt-shaped file ({'state_dict': ...})
    prompts: Path  # the prompts the datasets are made from


@dataclass(frozen=True)
class WithReward:
    """A family's own fixtures (its tiny pipeline and dataset) with the reward fixtures every smoke
    shares, as a row's fixtures hook may return them."""

    models: object
    reward: RewardFixtures


def reward_fixtures_at(dest: Path) -> RewardFixtures:
    """The paths of the reward fixtures under ``dest`` (built or not)."""
    from dancegrpo_npu.smoke.tiny_models import HPS_MODEL_NAME

    hps = Path(dest) / "hps_ckpt"
    return RewardFixtures(
        hps_model_config=hps / f"{HPS_MODEL_NAME}.json",
        hps_open_clip_ckpt=hps / "open_clip_pytorch_model.bin",
        hps_ckpt=hps / "HPS_v2.1_compressed.pt",
        prompts=Path(dest) / "prompts.txt",
    )


def build_reward_fixtures(dest: Path) -> RewardFixtures:
    """The HPS reward and the prompts at ``dest``, built unless they are complete and current."""
    return reward_fixtures_at(build_stamped(dest, reward_params_sha256(), write_reward_fixtures, REWARD_NAMES))


def reward_params_sha256() -> str:
    """What the reward fixtures depend on: the parameters, this code, the libraries' versions."""
    from dancegrpo_npu.smoke import tiny_models

    return params_sha256({"params": tiny_models.PARAMS, "prompts": PROMPTS},
                         (Path(__file__), Path(tiny_models.__file__)))


def write_reward_fixtures(root: Path) -> None:
    """The HPS reward files and prompts.txt, into the directory ``root``."""
    from dancegrpo_npu.smoke import tiny_models

    ensure_hpsv2_vocab()
    fixtures = reward_fixtures_at(root)
    fixtures.hps_model_config.parent.mkdir(parents=True)
    tiny_models.write_hps_checkpoints(fixtures.hps_model_config, fixtures.hps_open_clip_ckpt, fixtures.hps_ckpt)
    fixtures.prompts.write_text("".join(p + "\n" for p in PROMPTS))


def params_sha256(params: dict, code: tuple[Path, ...]) -> str:
    """What a fixture build depends on: its parameters, its builders' code (hashed whole, so any
    edit rebuilds, in seconds, rather than trusting a directory an older builder wrote), and the
    versions of the libraries that write it."""
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise DancegrpoError(
                f"building the fixtures needs the Python package {name}, which is not installed",
                "run ./scripts/bootstrap.sh, or pip install 'dancegrpo-npu[train]' and hpsv2 as it does",
            ) from None
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in code)).hexdigest()
    data = {"version": FIXTURES_VERSION, **params, "packages": versions, "code": digest}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def build_stamped(dest: Path, params: str, write: Callable[[Path], None], layout: tuple[str, ...]) -> Path:
    """``dest`` (made absolute) holding a complete build stamped ``params``: reused when current,
    else ``write(staging)`` fills an empty staging directory (offline, torch's generator state
    kept from the caller), stamped and swapped in whole.  ``layout``: the names a build holds at
    its top level (anything else there is not ours: refused, never replaced)."""
    dest = Path(os.path.abspath(dest))
    if not is_current(dest, params):
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with _build_lock(dest):
                if not is_current(dest, params):  # another process may have built it meanwhile
                    _check_replaceable(dest, layout)
                    _build_and_swap(dest, params, write)
        except OSError as exc:
            raise DancegrpoError(
                f"cannot build the fixtures in {dest}: {exc}", "check that its directory is writable and has space"
            ) from None
        except ImportError as exc:
            if exc.name in ("tkinter", "_tkinter"):  # hpsv2's factory.py has `from turtle import forward`
                hint = "hpsv2's open_clip imports turtle, which needs Tk: install your Python's Tk (e.g. apt-get install python3-tk)"
            else:
                hint = "run ./scripts/bootstrap.sh --deps-only to install the default dependency set"
            raise DancegrpoError(f"building the fixtures failed to import {exc.name or exc}: {exc}", hint) from None
    return dest


def is_current(dest: Path, params: str) -> bool:
    """True when ``dest`` holds a complete build for these parameters, every file intact."""
    try:
        stamp = json.loads((Path(dest) / STAMP_NAME).read_text())
        if stamp.get("params_sha256") != params or not stamp.get("files"):
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
            "install open_clip_torch (pip install 'dancegrpo-npu[train]')",
        )
    return path


# ---- building -------------------------------------------------------------------------------


def _check_replaceable(dest: Path, layout: tuple[str, ...]) -> None:
    """Refuse to replace anything but an old or broken fixtures directory (never lose a user's files)."""
    if not (dest.exists() or dest.is_symlink()):
        return
    if dest.is_dir() and not dest.is_symlink():
        names = {p.name for p in dest.iterdir()}
        if STAMP_NAME in names or names <= {*layout, STAMP_NAME}:
            return
    raise DancegrpoError(
        f"{dest} exists and is not a fixtures directory (it has no {STAMP_NAME}); not replacing it",
        "remove it, or choose another directory for the fixtures",
    )


def _build_and_swap(dest: Path, params: str, write: Callable[[Path], None]) -> None:
    for stale in dest.parent.glob(f".{dest.name}.build-*"):  # left by a build that died; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    staging = dest.parent / f".{dest.name}.build-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()  # not mkdtemp: the result keeps the umask's permissions, for shared clusters
    try:
        _build_into(staging, write)
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


def _build_into(root: Path, write: Callable[[Path], None]) -> None:
    """Everything but the stamp, into the empty directory ``root``."""
    import torch

    with _offline(), torch.random.fork_rng(devices=[]):  # the seeds set here must not leak into the caller
        write(root)


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

