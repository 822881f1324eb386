"""What ``dancegrpo-npu bench`` measures: the presets, the sizes, and their checks.

Plain data and plain Python (no torch), so bad input is refused before anything is
imported or built.  A preset names the models (a shipped config plus overrides) and the
GRPO recipe's sizes; every explicit size flag wins over the preset's value.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from dancegrpo_npu.contract import DEVICE_CHOICES as DEVICES
from dancegrpo_npu.errors import DancegrpoError

DTYPES = ("auto", "bf16", "fp32")


@dataclass(frozen=True)
class Sizes:
    """The GRPO recipe one bench step runs (upstream's flag names in the comments)."""

    height: int  # --h
    width: int  # --w
    sampling_steps: int  # --sampling_steps
    generations: int  # --num_generations (G: the samples of one prompt, one GRPO step)
    timestep_fraction: float  # --timestep_fraction
    eta: float  # --eta
    shift: float  # --shift
    text_tokens: int  # the T5 prompt-embedding length (FluxPipeline's max_sequence_length)
    gradient_accumulation_steps: int  # --gradient_accumulation_steps (samples per optimizer step)
    steps: int  # timed GRPO steps
    warmup_steps: int  # untimed GRPO steps before them

    @property
    def train_timesteps(self) -> int:
        """Timesteps trained per sample: the trainer's ``int(len(timesteps) * fraction)``,
        where the last of the ``sampling_steps`` timesteps is dropped (``[:, :-1]``)."""
        return int((self.sampling_steps - 1) * self.timestep_fraction)


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    # "flux1-dev" / "wan2.1-t2v-1.3b" (the shipped configs, with overrides), "tiny" / "tiny-wan"
    # (the smokes' tiny models).
    models: str
    transformer_overrides: dict = field(default_factory=dict)
    hps_overrides: dict = field(default_factory=dict)  # {"vision_layers": n, "text_layers": n}
    sizes: Sizes = None  # type: ignore[assignment]
    trainer: str = "flux"  # the trainer whose train_one_step it runs (``TRAINERS``)


# Upstream's recipe: scripts/finetune/finetune_flux_grpo.sh (720x720, 16 sampling steps,
# 12 generations, timestep fraction 0.6, eta 0.3, shift 3, accumulation 4) and
# FluxPipeline's 512 T5 tokens.
UPSTREAM = Sizes(
    height=720, width=720, sampling_steps=16, generations=12, timestep_fraction=0.6, eta=0.3, shift=3.0,
    text_tokens=512, gradient_accumulation_steps=4, steps=2, warmup_steps=1,
)  # fmt: skip

PRESETS = {
    "full": Preset(
        name="full",
        summary="FLUX.1-dev at full size (19 + 38 blocks), its VAE, a ViT-H-14 HPS; upstream's recipe",
        models="flux1-dev",
        sizes=UPSTREAM,
    ),
    # Full width, few blocks: what one block of FLUX.1-dev costs, on a machine without
    # 100 GB.  Sized for a 2-core, 24 GiB CPU: a full-width block is ~1 GFLOP per token
    # per forward (fp32 there: ~20 GFLOPS), so the token count decides the time: 128x128
    # images (64 image tokens) and 64 text tokens; one timed step after the warm-up.
    "cpu": Preset(
        name="cpu",
        summary="FLUX.1-dev width with 1 double + 1 single block, the full VAE, ViT-H-14 width with 1 + 1 layers",
        models="flux1-dev",
        transformer_overrides={"num_layers": 1, "num_single_layers": 1},
        hps_overrides={"vision_layers": 1, "text_layers": 1},
        sizes=replace(UPSTREAM, height=128, width=128, sampling_steps=4, generations=4, text_tokens=64, steps=1),
    ),
    # The smoke's tiny models (dancegrpo_npu.smoke.tiny_models) and sizes: seconds, for tests.
    "tiny": Preset(
        name="tiny",
        summary="the smoke's tiny models (2 heads x 16, 1 + 1 blocks; tiny VAE and HPS) at 64x64",
        models="tiny",
        sizes=replace(UPSTREAM, height=64, width=64, sampling_steps=4, generations=4, gradient_accumulation_steps=2),
    ),
}

# Upstream's Wan2.1 recipe: scripts/finetune/finetune_wan_2_1_grpo.sh (512x512, one frame, 20
# sampling steps, 12 generations, timestep fraction 0.6, eta 0.3, shift 3, CFG 5.0 in rollout and
# training) and WanPipeline.encode_prompt's 226 UMT5 tokens (what preprocessing saves).  The
# script accumulates 24 samples: its 2 prompts x 12 generations a rank, one optimizer step per
# GRPO step; a bench step is one prompt, so 12 keeps one optimizer step per step.
WAN_UPSTREAM = replace(
    UPSTREAM, height=512, width=512, sampling_steps=20, text_tokens=226, gradient_accumulation_steps=12,
)  # fmt: skip

PRESETS.update({
    "wan": Preset(
        name="wan",
        summary="Wan2.1-T2V-1.3B at full size (30 blocks), its VAE, a ViT-H-14 HPS; upstream's Wan recipe",
        models="wan2.1-t2v-1.3b",
        sizes=WAN_UPSTREAM,
        trainer="wan",
    ),
    # Full width, one block, as the FLUX cpu preset: 128x128 (64 image tokens), 4 steps, G = 4.
    "wan-cpu": Preset(
        name="wan-cpu",
        summary="Wan2.1-T2V-1.3B width with 1 block, the full Wan VAE, ViT-H-14 width with 1 + 1 layers",
        models="wan2.1-t2v-1.3b",
        transformer_overrides={"num_layers": 1},
        hps_overrides={"vision_layers": 1, "text_layers": 1},
        sizes=replace(WAN_UPSTREAM, height=128, width=128, sampling_steps=4, generations=4,
                      gradient_accumulation_steps=4, steps=1),
        trainer="wan",
    ),
    # The Wan smoke's tiny models (dancegrpo_npu.smoke.wan_fixtures): seconds, for tests.
    "tiny-wan": Preset(
        name="tiny-wan",
        summary="the Wan smoke's tiny models (2 heads x 12, 1 block; tiny Wan VAE and HPS) at 64x64",
        models="tiny-wan",
        sizes=replace(WAN_UPSTREAM, height=64, width=64, sampling_steps=4, generations=4, gradient_accumulation_steps=2),
        trainer="wan",
    ),
})

# Upstream's Qwen-Image recipe: scripts/finetune/finetune_qwenimage_grpo.sh (720x720, 20 sampling
# steps, 12 generations, timestep fraction 0.6, eta 0.3, shift 3, accumulation 12 over its 2
# prompts a rank), 256 text tokens as the memory plan's recipe (plan/models.json); a bench step
# is one prompt, so accumulation 12 is one optimizer step a step.
QWENIMAGE_UPSTREAM = replace(UPSTREAM, sampling_steps=20, text_tokens=256, gradient_accumulation_steps=12)

PRESETS.update({
    "qwenimage": Preset(
        name="qwenimage",
        summary="Qwen-Image at full size (60 blocks, 20e9 parameters), its VAE, a ViT-H-14 HPS; upstream's recipe",
        models="qwen-image",
        sizes=QWENIMAGE_UPSTREAM,
        trainer="qwenimage",
    ),
    # The Qwen-Image smoke's tiny models (dancegrpo_npu.smoke.qwen_fixtures): seconds, for tests.
    "tiny-qwenimage": Preset(
        name="tiny-qwenimage",
        summary="the Qwen-Image smoke's tiny models (2 heads x 16, 2 blocks; tiny Qwen VAE and HPS) at 64x64",
        models="tiny-qwenimage",
        sizes=replace(QWENIMAGE_UPSTREAM, height=64, width=64, sampling_steps=4, generations=4, text_tokens=16,
                      gradient_accumulation_steps=2),
        trainer="qwenimage",
    ),
})


@dataclass(frozen=True)
class BenchTrainer:
    """A trainer the bench runs: its script in the patched tree and what its ``train_one_step``
    needs beyond the shared GRPO flags."""

    name: str  # launch's script name (run.upstream_args.SCRIPTS): its dependency set comes from there
    relpath: str
    extra_args: tuple[tuple[str, object], ...] = ()


TRAINERS = {
    "flux": BenchTrainer("flux", "fastvideo/train_grpo_flux.py"),
    # CFG 5.0 as upstream's recipe; the reward from the decoded frame (the port's default)
    "wan": BenchTrainer("wan", "fastvideo/train_grpo_wan_2_1.py", (("cfg_infer", 5.0), ("reward_from_mp4", False))),
    # the HPSv2 reward, as the recipe (not HPSv3), no EMA
    "qwenimage": BenchTrainer("qwenimage", "fastvideo/train_grpo_qwenimage.py", (("use_hpsv3", False),)),
}


def depset_of(preset: Preset) -> str:
    """The dependency set the preset's trainer runs with (run.depsets)."""
    from dancegrpo_npu.run.upstream_args import script_info

    return script_info(TRAINERS[preset.trainer].name).depset


# The flags that override a preset's sizes: (flag, Sizes field).
SIZE_FLAGS = (
    ("--height", "height"),
    ("--width", "width"),
    ("--sampling-steps", "sampling_steps"),
    ("--generations", "generations"),
    ("--timestep-fraction", "timestep_fraction"),
    ("--eta", "eta"),
    ("--shift", "shift"),
    ("--text-tokens", "text_tokens"),
    ("--gradient-accumulation-steps", "gradient_accumulation_steps"),
    ("--steps", "steps"),
    ("--warmup-steps", "warmup_steps"),
)


@dataclass(frozen=True)
class BenchConfig:
    preset: Preset
    sizes: Sizes
    sample_batch_sizes: tuple[int, ...]
    vae_decode_chunk: int | None  # None: N, the sample batch size
    device: str
    dtype: str
    record: bool = False  # the timed steps' stages into <run>/records/, as launch --record writes them

    def decode_chunk(self, n: int) -> int:
        return self.vae_decode_chunk or n

    def describe(self) -> dict:
        """The preset and sizes, for the fingerprint."""
        return {
            "preset": self.preset.name,
            "models": self.preset.models,
            "trainer_script": TRAINERS[self.preset.trainer].relpath,
            "transformer_overrides": dict(self.preset.transformer_overrides),
            "hps_overrides": dict(self.preset.hps_overrides),
            **asdict(self.sizes),
            "train_timesteps": self.sizes.train_timesteps,
            "sample_batch_sizes": list(self.sample_batch_sizes),
            "vae_decode_chunk": self.vae_decode_chunk or "N",
            "gradient_checkpointing": True,
            "record": self.record,
        }


def _bad(message: str, hint: str) -> DancegrpoError:
    return DancegrpoError(f"bench: {message}", hint, exit_code=2)


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``"1,4,12"`` -> (1, 4, 12); each value once, in the order given."""
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise _bad(f"--sample-batch-sizes {text!r}: {part!r} is not a whole number", "give e.g. 1,4,12") from None
        if value < 1:
            raise _bad(f"--sample-batch-sizes: {value} samples per transformer call is fewer than 1", "give counts of 1 or more, e.g. 1,4,12")
        if value not in values:
            values.append(value)
    return tuple(values)


def check_sizes(sizes: Sizes) -> None:
    positive = ("height", "width", "sampling_steps", "generations", "text_tokens", "gradient_accumulation_steps", "steps")
    for flag, name in SIZE_FLAGS:
        value = getattr(sizes, name)
        if name in positive and value < 1:
            raise _bad(f"{flag} {value} is below 1", f"give {flag} 1 or more")
    if sizes.warmup_steps < 0:
        raise _bad(f"--warmup-steps {sizes.warmup_steps} is negative", "give 0 or more")
    for flag, value in (("--height", sizes.height), ("--width", sizes.width)):
        if value % 16:
            # the VAE's 8x and the 2x2 latent packing (pack_latents) need multiples of 16
            raise _bad(f"{flag} {value} is not a multiple of 16", f"use e.g. {max(16, value // 16 * 16)}")
    if sizes.sampling_steps < 2:
        raise _bad(f"--sampling-steps {sizes.sampling_steps}: GRPO trains on the steps but the last, so it needs 2 or more", "give --sampling-steps 2 or more")
    if not 0 < sizes.timestep_fraction <= 1:
        raise _bad(f"--timestep-fraction {sizes.timestep_fraction} is not in (0, 1]", "upstream uses 0.6")
    if sizes.train_timesteps < 1:
        raise _bad(
            f"--timestep-fraction {sizes.timestep_fraction} of {sizes.sampling_steps - 1} timesteps trains none",
            "raise --timestep-fraction or --sampling-steps")
    if sizes.eta <= 0:
        raise _bad(f"--eta {sizes.eta}: the GRPO sampler needs noise (eta > 0)", "upstream uses 0.3")
    if sizes.generations % sizes.gradient_accumulation_steps:
        raise _bad(
            f"--generations {sizes.generations} is not a multiple of --gradient-accumulation-steps "
            f"{sizes.gradient_accumulation_steps}: the last samples would never reach the optimizer",
            "change one of them")


def resolve(options: dict) -> BenchConfig:
    """The checked configuration from parsed options (``None``: the preset's value).

    ``options`` holds ``preset``, ``sample_batch_sizes`` (text), ``vae_decode_chunk``,
    ``device``, ``dtype`` and one key per :data:`SIZE_FLAGS` field.
    """
    name = options.get("preset") or "full"
    if name not in PRESETS:
        raise _bad(f"unknown preset {name!r}", f"choose one of: {', '.join(PRESETS)}")
    preset = PRESETS[name]
    given = {f: options[f] for _, f in SIZE_FLAGS if options.get(f) is not None}
    sizes = replace(preset.sizes, **given)
    check_sizes(sizes)
    text = options.get("sample_batch_sizes")
    batch_sizes = parse_batch_sizes(text) if text is not None else (1,)
    for n in batch_sizes:
        if sizes.generations % n:
            raise _bad(
                f"--sample-batch-sizes: {n} does not divide the {sizes.generations} generations of a prompt",
                f"use divisors of {sizes.generations}: {', '.join(str(d) for d in divisors(sizes.generations))}")
    chunk = options.get("vae_decode_chunk")
    if chunk is not None and chunk < 1:
        raise _bad(f"--vae-decode-chunk {chunk} is below 1", "give 1 or more (default: the sample batch size)")
    device = options.get("device") or "auto"
    dtype = options.get("dtype") or "auto"
    if device not in DEVICES:
        raise _bad(f"unknown device {device!r}", f"choose one of: {', '.join(DEVICES)}")
    if dtype not in DTYPES:
        raise _bad(f"unknown dtype {dtype!r}", f"choose one of: {', '.join(DTYPES)}")
    return BenchConfig(preset, sizes, batch_sizes, chunk, device, dtype, bool(options.get("record")))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
