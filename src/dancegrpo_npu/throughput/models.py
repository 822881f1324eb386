"""The bench's three models, with random weights, and whether they fit before they are built.

- the transformer and the VAE: the diffusers classes the trainer's registry row names
  (``bench.classes``) from the configs its preset names: the model's ``transformer/config.json``
  and ``vae/config.json`` shipped in the trainer's family folder (or its plan shapes' config),
  with the preset's overrides, or, for the tiny presets, the smoke's tiny configurations (the
  module the preset names);
- the HPSv2 reward: hpsv2's open_clip ``CLIP`` from its bundled ``ViT-H-14`` config, built by
  ``create_model`` as the trainer builds it (``precision='amp'``: float32 weights, autocast).

A trainer of another dependency set than the tool's runs in that set's interpreter
(``bench.run_in_depset``).

Nothing is downloaded and nothing is materialised twice: the parameter counts come from a
build on the meta device; the real build runs under ``torch.device(target)`` with the
default dtype set to the weights' dtype, so each parameter is allocated and initialised
once, on the target device, in its final dtype.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu import registry
from dancegrpo_npu.errors import DancegrpoError

HPS_BASE_MODEL = "ViT-H-14"  # hpsv2's bundled open_clip config (upstream's --hps_model default)
GiB = 1024**3


def shipped_config(path: Path) -> dict:
    """A model config shipped with the package (a family's file), without diffusers' ``_`` keys."""
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def model_configs(preset) -> tuple[dict, dict, dict]:
    """(transformer, vae, hps) configs for a preset, overrides applied."""
    if preset.tiny:  # the smoke's tiny models, named by the preset's registry row
        import importlib

        from dancegrpo_npu.smoke import tiny_models

        smoke = importlib.import_module(preset.tiny)
        transformer, vae, hps = smoke.TRANSFORMER_CONFIG, smoke.VAE_CONFIG, tiny_models.HPS_MODEL_CONFIG
        return copy.deepcopy(transformer), copy.deepcopy(vae), copy.deepcopy(hps)
    if preset.transformer is None:  # the memory plan's config of the model
        from dancegrpo_npu.plan.models import model_of

        shipped = {k: v for k, v in model_of(preset.trainer).transformer.items() if not k.startswith("_")}
    else:
        shipped = shipped_config(preset.transformer)
    transformer = {**shipped, **preset.transformer_overrides}
    vae = shipped_config(preset.vae)
    hps = hpsv2_model_config(HPS_BASE_MODEL)
    if "vision_layers" in preset.hps_overrides:
        hps["vision_cfg"]["layers"] = preset.hps_overrides["vision_layers"]
    if "text_layers" in preset.hps_overrides:
        hps["text_cfg"]["layers"] = preset.hps_overrides["text_layers"]
    return transformer, vae, hps


def hpsv2_model_config(name: str) -> dict:
    open_clip = hpsv2_open_clip()
    config = open_clip.factory.get_model_config(name)
    if config is None:
        raise DancegrpoError(f"bench: hpsv2's open_clip has no model config {name!r}", "reinstall hpsv2 (see the README)")
    return copy.deepcopy(config)


def hpsv2_open_clip():
    """hpsv2's bundled open_clip; its tokenizer reads CLIP's vocabulary at import, which the
    hpsv2 wheel lacks: the smoke's fixtures put it there (idempotent)."""
    from dancegrpo_npu.smoke.fixtures import ensure_hpsv2_vocab

    ensure_hpsv2_vocab()
    with warnings.catch_warnings():  # timm's FutureWarning about hpsv2's old import path
        warnings.simplefilter("ignore", FutureWarning)
        import hpsv2.src.open_clip as open_clip
        import hpsv2.src.open_clip.factory  # noqa: F401  (the attribute used above)

    return open_clip


# ---- building -------------------------------------------------------------------------------


@contextlib.contextmanager
def materialising(device, dtype):
    """New parameters go straight to ``device`` in ``dtype`` (one allocation, one init each)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def bench_of(trainer: str | None):
    """The bench facts of the registry row ``trainer`` (None: the default trainer)."""
    return (registry.get(trainer) if trainer else registry.default_trainer()).bench


def diffusers_class(trainer: str | None, which: int):
    import diffusers

    return getattr(diffusers, bench_of(trainer).classes[which])


def build_transformer(config: dict, trainer: str | None = None):
    return diffusers_class(trainer, 0).from_config(config)


def build_vae(config: dict, trainer: str | None = None):
    return diffusers_class(trainer, 1).from_config(config)


HPS_NAME = "dancegrpo-bench-hps"  # the name ``config`` is registered under in hpsv2's open_clip


def build_hps(config: dict, device, precision: str):
    """hpsv2's ``create_model_and_transforms`` on a registered copy of ``config``, as the trainer
    calls it: (model, preprocess_val), the image transform the trainer's reward applies.

    It builds on the default device and then moves the model to ``device``: call it under
    ``torch.device(device)`` (``materialising``) so that the build happens there.
    """
    open_clip = hpsv2_open_clip()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{HPS_NAME}.json"
        path.write_text(json.dumps(config))
        open_clip.factory.add_model_config(path)  # read now; the registry keeps the dict
    model, _preprocess_train, preprocess_val = open_clip.create_model_and_transforms(
        HPS_NAME, None, precision=precision, device=device, output_dict=True)
    return model, preprocess_val


def hps_tokenizer():
    """The tokenizer the trainer's reward uses (``get_tokenizer`` of the HPS model)."""
    return hpsv2_open_clip().get_tokenizer(HPS_NAME)


@dataclass(frozen=True)
class ParamCounts:
    transformer: int
    vae: int
    hps: int


def count_parameters(configs, trainer: str | None = None) -> ParamCounts:
    """Parameter counts from builds on the meta device (no memory, no init)."""
    import torch

    transformer_cfg, vae_cfg, hps_cfg = configs
    with torch.device("meta"):
        built = (build_transformer(transformer_cfg, trainer), build_vae(vae_cfg, trainer),
                 build_hps(hps_cfg, "meta", "fp32")[0])
    return ParamCounts(*(sum(p.numel() for p in m.parameters()) for m in built))


@dataclass(frozen=True)
class Models:
    transformer: object
    vae: object
    hps: object
    hps_config: dict
    hps_preprocess: object  # hpsv2's preprocess_val
    hps_tokenizer: object


def build_models(trainer, configs, device, dtype, family: str | None = None) -> Models:
    """The three models on ``device``: transformer and VAE in ``dtype``, HPS as the trainer loads it.

    The transformer gets what the trainer's main does to it (the row's ``bench``): what it calls
    before building (``before_build``), its own preparation (``trainer_prepare``: a trainer's
    float32 RoPE; another's module installs its own at import) and activation
    checkpointing of every block (``--gradient_checkpointing``: ``apply_fsdp_checkpointing`` with
    ``--selective_checkpointing 1``) of the row's ``checkpointed_blocks``, else the model's
    no-split modules.
    """
    import torch
    from fastvideo.utils.load import get_no_split_modules

    bench = bench_of(family)
    transformer_cfg, vae_cfg, hps_cfg = configs
    for ref in bench.before_build:
        registry.load(ref)()
    with materialising(device, dtype):
        transformer = build_transformer(transformer_cfg, family)
        vae = build_vae(vae_cfg, family)
    if bench.trainer_prepare:
        getattr(trainer, bench.trainer_prepare)(transformer)
    if bench.checkpointed_blocks:
        blocks = (registry.load(bench.checkpointed_blocks),)
    else:
        blocks = get_no_split_modules(transformer)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints "--> applying ... checkpointing"
        trainer.apply_fsdp_checkpointing(transformer, blocks, 1.0)
    vae.requires_grad_(False)
    vae.enable_tiling()  # as sample_reference_model does (a no-op below the VAE's sample_size)
    with materialising(device, torch.float32):
        hps, preprocess = build_hps(hps_cfg, device, "amp" if dtype == torch.bfloat16 else "fp32")
    hps.requires_grad_(False).eval()
    return Models(transformer, vae, hps, hps_cfg, preprocess, hps_tokenizer())


# ---- will it fit? ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int  # every model's weights, plus the transformer's gradients and AdamW moments
    activations: int  # a rough upper bound on the largest phase's live activations

    @property
    def total(self) -> int:
        return self.weights + self.activations


@dataclass(frozen=True)
class Shape:
    """What the estimate reads of a trainer's configs."""

    hidden: int
    heads: int
    blocks: int
    tokens: int  # the tokens a block's attention sees
    image_tokens: int
    cfg_batch: int  # samples a transformer call runs per sample: 2 with a recipe's CFG (cross-attention trainers)
    vae_first: int  # the VAE decoder's channels at full resolution, and its widest
    vae_widest: int


def model_shape(configs, sizes, family: str | None = None) -> Shape:
    transformer_cfg, vae_cfg, _hps = configs
    hidden = transformer_cfg["num_attention_heads"] * transformer_cfg["attention_head_dim"]
    image_tokens = (sizes.height // 16) * (sizes.width // 16)  # 8x VAE, 2x2 patches; a video: one frame
    # an AutoencoderKL names its widths; a video VAE multiplies a base
    widths = vae_cfg.get("block_out_channels") or [vae_cfg["base_dim"] * m for m in vae_cfg["dim_mult"]]
    blocks = transformer_cfg["num_layers"] + transformer_cfg.get("num_single_layers", 0)
    spec = registry.get(family) if family else registry.default_trainer()
    if spec.plan.architecture.kind == "cross-transformer":  # self-attention over the video's tokens, cross-attention to the text
        return Shape(hidden, transformer_cfg["num_attention_heads"], blocks,
                     max(image_tokens, sizes.text_tokens), image_tokens, 2, widths[0], max(widths))
    return Shape(hidden, transformer_cfg["num_attention_heads"], blocks,  # joint attention: image and text
                 image_tokens + sizes.text_tokens, image_tokens, 1, widths[0], max(widths))


def estimate_memory(counts: ParamCounts, configs, sizes, batch_sizes, decode_chunk, weight_bytes: int,
                    family: str | None = None) -> MemoryEstimate:
    """What the bench needs at its largest, before anything is built.

    Weights: the transformer's weights, gradients and AdamW's two moments, all in the weights'
    dtype (4 copies), the VAE in that dtype, HPS in float32.  Activations: the largest of the
    four phases, each bounded from the sizes: ~24 hidden-sized tensors per token live in a
    block, plus one attention-score matrix per head should the attention backend
    materialise it; training (batch 1, 2 with CFG) keeps each checkpointed block's inputs.
    """
    _transformer_cfg, _vae_cfg, hps_cfg = configs
    act = weight_bytes
    shape = model_shape(configs, sizes, family)
    hidden, heads, tokens, image_tokens = shape.hidden, shape.heads, shape.tokens, shape.image_tokens
    n = max(batch_sizes)

    def block(batch: int) -> int:
        return batch * shape.cfg_batch * (tokens * hidden * act * 24 + heads * tokens * tokens * 4)

    trajectory = sizes.generations * (sizes.sampling_steps + 1) * image_tokens * 64 * 4
    rollout = block(n) + trajectory
    train = shape.cfg_batch * shape.blocks * tokens * hidden * act * 2 + 2 * block(1) + trajectory
    chunk = max(decode_chunk(b) for b in batch_sizes)
    latent_pixels = (sizes.height // 8) * (sizes.width // 8)
    decode = chunk * (sizes.height * sizes.width * shape.vae_first * act * 8
                      + latent_pixels * shape.vae_widest * act * 8 + latent_pixels**2 * 4)  # fmt: skip
    vision = hps_cfg["vision_cfg"]
    patches = (vision["image_size"] // vision["patch_size"]) ** 2 + 1
    reward = n * (patches * vision["width"] * 4 * 24 + (vision["width"] // vision.get("head_width", 64)) * patches**2 * 4)
    weights = counts.transformer * weight_bytes * 4 + counts.vae * weight_bytes + counts.hps * 4
    return MemoryEstimate(weights=weights, activations=max(rollout, train, decode, reward))


def available_memory(kind: str) -> tuple[int | None, str]:
    """(free bytes, what they are): free device memory, or the host's MemAvailable on the CPU."""
    if kind != "cpu":
        import torch

        free, _total = getattr(torch, kind).mem_get_info()
        return int(free), f"free {kind} memory"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "available RAM"
    except (OSError, ValueError, IndexError):
        pass
    return None, "available RAM (unknown here)"


# Room left for what the estimate does not count (the runtime, the allocator's slack).
HEADROOM = 1.1


def smaller_preset(preset: str) -> str | None:
    """``--size SIZE`` of the trainer's next smaller preset (``preset``: TRAINER-SIZE), or None
    for its smallest."""
    from dancegrpo_npu.throughput.presets import PRESETS, SIZES

    found = PRESETS[preset]
    sizes = [p.size for p in registry.get(found.trainer).bench.presets]
    smaller = [s for s in SIZES[:SIZES.index(found.size)] if s in sizes]
    return f"--size {smaller[-1]}" if smaller else None


def check_fits(estimate: MemoryEstimate, available: int | None, what: str, preset: str, kind: str) -> None:
    """Refuse (exit 2) a bench that would not fit, saying what to do instead."""
    if available is None or estimate.total * HEADROOM <= available:
        return
    smaller = smaller_preset(preset)
    if estimate.weights * HEADROOM > available:  # no size flag helps: the models themselves do not fit
        hint = "use " + (f"{smaller} (fewer blocks) or " if smaller else "") + "a device with more memory (--device)"
    else:
        hint = ("use " + (f"{smaller}, or " if smaller else "")
                + "smaller --height/--width, --generations, --sample-batch-sizes or --vae-decode-chunk")
    raise DancegrpoError(
        f"bench: {preset} needs about {estimate.total / GiB:.1f} GiB on {kind} "
        f"({estimate.weights / GiB:.1f} GiB of weights, gradients and AdamW moments, "
        f"~{estimate.activations / GiB:.1f} GiB of activations) but only {available / GiB:.1f} GiB is {what}",
        hint,
        exit_code=2,
    )
