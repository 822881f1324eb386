"""The registry in substance: outside ``trainers/``, the tool's code knows no trainer.

In ``src/dancegrpo_npu/`` outside ``trainers/``, no file (its path, its code, its strings and
its comments) holds:
- the name of a trainer or of a family of the registry, as a word, a quoted name, a part of an
  identifier (``flux_dir``, ``_wan_block``, ``QwenEmbeddings``) or of a file name;
- a model class of upstream's trainers (``FluxTransformer2DModel``, ``WanTransformer3DModel``,
  ``UNet2DConditionModel``...), or a model repository's name (``FLUX.1-dev``, ``Wan2.1``...).
Generic architecture kinds (a UNet, a joint or a cross-attention transformer) are allowed: rows
name them.  The words come from the registry itself (every row's name and its family's folder),
plus the model names upstream's trainers are known by, so a new trainer's name is checked as
soon as it has a row.
"""

from __future__ import annotations

import re
from pathlib import Path

from dancegrpo_npu import registry
SRC = Path(__file__).resolve().parents[2] / "src" / "dancegrpo_npu"

# Model names upstream's trainers are known by that are not a row's or a family's name.
MODEL_WORDS = ("qwen", "hunyuanvideo", "skyreels")
# Upstream's model classes and repositories whose names hold no such word once split.
MODEL_NAMES = re.compile(r"UNet2DConditionModel|StableDiffusion|stable[-_ ]diffusion", re.IGNORECASE)
# A word's parts: camelCase humps and runs of capitals (FluxTransformer -> Flux, Transformer).
_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")


# The parts of row names that say what a script does, not which model it is for.
GENERIC_PARTS = ("lora", "edit", "i2v", "preprocess")


def forbidden_words() -> set[str]:
    """Every family's folder name, the parts of every row's name but the generic ones
    (flux-lora: flux; preprocess-wan: wan; skyreels-i2v: skyreels), and MODEL_WORDS."""
    words = set(MODEL_WORDS)
    for family in registry.FAMILIES:
        words.add(family.__name__.rsplit(".", 1)[-1])
    for name in registry.names():
        words.update(part for part in name.split("-") if part not in GENERIC_PARTS)
    return words


def words_in(text: str) -> set[str]:
    """Each alphabetic run of ``text`` (so ``flux_dir`` gives flux, ``Wan2.1`` gives Wan), whole
    and split at its camelCase humps, lower-cased."""
    found = set()
    for run in re.findall(r"[A-Za-z]+", text):
        found.add(run.lower())
        found.update(part.lower() for part in _PARTS.findall(run))
    return found


def trainer_knowledge(root: Path) -> dict[str, list[str]]:
    """{file under ``root`` outside trainers/: the forbidden names it holds}."""
    words = forbidden_words()
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if (relative.startswith("trainers/") or not path.is_file() or "__pycache__" in relative
                or path.suffix not in (".py", ".json", ".txt", ".md", ".sh")):
            continue
        text = path.read_text(encoding="utf-8")
        names = (words_in(relative) | words_in(text)) & words
        names |= {m.group(0) for m in MODEL_NAMES.finditer(text)}
        if names:
            found[relative] = sorted(names)
    return found


def test_outside_the_registry_no_file_names_a_trainer_a_family_or_an_upstream_model():
    assert trainer_knowledge(SRC) == {}


def test_the_words_are_the_registrys():
    words = forbidden_words()
    assert {"flux", "wan", "qwenimage", "sd", "hunyuan", "skyreels", "qwen"} <= words
    assert not {"lora", "i2v", "edit", "preprocess"} & words


def test_the_check_finds_a_class_name_and_a_bare_trainer_name_planted_in_plan(tmp_path):
    root = tmp_path / "dancegrpo_npu"
    (root / "plan").mkdir(parents=True)
    # a module of plan's own: a generic function, then each planted line (a new file, so that
    # this test says what the check finds whatever else the tree holds; the test above asks the
    # tree for none)
    module = root / "plan" / "estimate.py"
    original = 'def kind(config: dict) -> str:\n    """The architecture kind a row names."""\n    return config["kind"]\n'

    def planted(text: str, name: str = "plan/estimate.py") -> set[str]:
        module.write_text(original + text)
        return set(trainer_knowledge(root).get(name, ()))

    assert planted("") == set()
    assert planted('\n\ndef cross(cfg):\n    return cfg["_class_name"] == "WanTransformer3DModel"\n') == {"wan"}
    assert planted("\n\ndef kind(name):\n    return 'unet' if name == sd else 'transformer'\n") == {"sd"}
    assert planted('\nUNET = "UNet2DConditionModel"\n') == {"UNet2DConditionModel"}
    assert planted("\n# FLUX.1-dev's VAE downsamples 8x\n") == {"flux"}
    (root / "plan" / "hunyuan_shapes.py").write_text("SHAPES = {}\n")
    assert planted("", "plan/hunyuan_shapes.py") == {"hunyuan"}


def test_words_are_split_as_identifiers_are_written():
    assert {"flux", "dir"} <= words_in("flux_dir")
    assert "qwen" in words_in("QwenImageTransformer2DModel")
    assert "wan" in words_in("Wan2.1-T2V-1.3B")
    assert "wan" not in words_in("wandb wanted WANDB_MODE")
    assert "sd" not in words_in("SDPA sdpa")
