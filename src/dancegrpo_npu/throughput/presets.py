"""What ``dancegrpo-npu bench`` measures: the presets, the sizes, and their checks.

Plain data and plain Python (no torch), so bad input is refused before anything is
imported or built.  A preset names the models (a shipped config plus overrides) and the
sizes it sets itself; the recipe sizes it leaves out (a full-size preset: all of them) are
upstream's, read from the recipe script its trainer's registry row names in the patched tree
(``run.recipes``, as launch reads it), and without that tree it is refused in one line.  The
tiny presets, the tool's own smoke-size shapes, set every size.  Every explicit size flag
wins over the preset's value.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from dancegrpo_npu import trainers
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
    # a shipped config family with overrides ("flux1-dev", "wan2.1-t2v-1.3b"...: models.SHIPPED),
    # or a smoke's tiny models ("tiny", "tiny-wan"...)
    models: str
    transformer_overrides: dict = field(default_factory=dict)
    hps_overrides: dict = field(default_factory=dict)  # {"vision_layers": n, "text_layers": n}
    # the Sizes fields it sets itself (the row's text tokens and TIMING under the preset's own);
    # the recipe's fields it leaves out are read from the patched tree (``needs_recipe``)
    sizes: dict = field(default_factory=dict)
    trainer: str = ""  # the registry row whose train_one_step it runs (dancegrpo_npu.trainers)
    tiny: str = ""  # the module of the smoke's tiny models it builds (its row's), or ""

    @property
    def needs_recipe(self) -> bool:
        """Whether some of its sizes are upstream's recipe's, read from the patched tree."""
        return any(name not in self.sizes for name in RECIPE_FIELDS)


# How bench times a preset unless it or a flag says otherwise: the bench's own, not upstream's.
TIMING = dict(steps=2, warmup_steps=1)


def presets() -> dict[str, Preset]:
    """Every preset of the registry's trainers (their rows' ``bench``), by name, with the sizes
    it sets itself."""
    found = {}
    for spec in trainers.benched():
        for p in spec.bench.presets:
            found[p.name] = Preset(name=p.name, summary=p.summary, models=p.models,
                                   transformer_overrides=dict(p.transformer_overrides),
                                   hps_overrides=dict(p.hps_overrides),
                                   sizes={"text_tokens": spec.bench.text_tokens, **TIMING, **p.sizes},
                                   trainer=spec.name, tiny=p.tiny)
    return found


PRESETS = presets()
DEFAULT_PRESET = trainers.default_trainer().bench.presets[0].name  # the default trainer's first: full size


def trainer_of(preset: Preset):
    """The registry row of the preset's trainer."""
    return trainers.get(preset.trainer)


# The Sizes fields upstream's recipe scripts hold, and the flag each is read from.
RECIPE_FLAGS = (("height", "--h", int), ("width", "--w", int), ("sampling_steps", "--sampling_steps", int),
                ("generations", "--num_generations", int), ("timestep_fraction", "--timestep_fraction", float),
                ("eta", "--eta", float), ("shift", "--shift", float),
                ("gradient_accumulation_steps", "--gradient_accumulation_steps", int))
RECIPE_FIELDS = tuple(name for name, _, _ in RECIPE_FLAGS)


def recipe_sizes(preset: Preset, tree) -> tuple[dict, object]:
    """(sizes, script) of the upstream recipe the preset's registry row names, read from the
    patched tree ``tree`` as launch reads it (run.recipes); no tree, or none holding that recipe,
    is refused in one line.  A bench step is one prompt, so the accumulation is capped at its
    generations (every sample a micro-batch, as in the trainers' loop)."""
    from pathlib import Path

    from dancegrpo_npu.run.recipes import recipes_for

    spec = trainer_of(preset)
    found = {r.name: r for r in recipes_for(Path(tree), spec.relpath, spec.recipe_glob)} if tree is not None else {}
    if spec.bench.recipe not in found:
        if tree is None or not Path(tree).is_dir():
            where = f"{tree or 'the patched tree'} is missing"
        else:
            where = f"{tree} has {'only ' + ', '.join(found) if found else 'none of them'}"
        own = ", ".join(n for n, p in presets().items() if not p.needs_recipe)
        raise DancegrpoError(
            f"bench: preset {preset.name} runs upstream's recipe {spec.bench.recipe} of {spec.name} "
            f"({spec.recipe_glob}), read from the patched tree, and {where}",
            "run `dancegrpo-npu fetch && dancegrpo-npu apply` in the project first (or pass --workdir DIR of a "
            f"patched tree); the presets {own} set their own sizes")
    recipe = found[spec.bench.recipe]
    values = recipe.values()
    try:
        sizes = {name: kind(values[flag]) for name, flag, kind in RECIPE_FLAGS}
    except (KeyError, TypeError, ValueError) as e:
        raise DancegrpoError(f"bench: {recipe.path} gives no number for {e}",
                             "run `dancegrpo-npu apply` to restore upstream's recipe") from None
    sizes["gradient_accumulation_steps"] = min(sizes["gradient_accumulation_steps"], sizes["generations"])
    return sizes, recipe.path


def depset_of(preset: Preset) -> str:
    """The dependency set the preset's trainer runs with (run.depsets)."""
    return trainer_of(preset).depset


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
    recipe: object = None  # the upstream script (a Path) the sizes the preset leaves out were read from, or None

    def decode_chunk(self, n: int) -> int:
        return self.vae_decode_chunk or n

    def describe(self) -> dict:
        """The preset and sizes, for the fingerprint."""
        return {
            "preset": self.preset.name,
            "models": self.preset.models,
            "trainer_script": trainer_of(self.preset).relpath,
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


def resolve(options: dict, tree=None) -> BenchConfig:
    """The checked configuration from parsed options (``None``: the preset's value).

    ``options`` holds ``preset``, ``sample_batch_sizes`` (text), ``vae_decode_chunk``,
    ``device``, ``dtype`` and one key per :data:`SIZE_FLAGS` field.  ``tree``: the patched tree
    (or a function giving it, asked only for a preset that reads upstream's recipe, once the
    other values are checked).
    """
    name = options.get("preset") or DEFAULT_PRESET
    known = presets()
    if name not in known:
        row = trainers.REGISTRY.get(name)
        if row is not None and row.no_bench:  # a trainer bench cannot run: why, not "unknown"
            raise _bad(f"there is no preset for {row.title} ({name}): {row.no_bench}",
                       f"the presets: {', '.join(known)}; `dancegrpo-npu plan {name}` estimates its memory")
        raise _bad(f"unknown preset {name!r}", f"choose one of: {', '.join(known)}")
    preset = known[name]
    device = options.get("device") or "auto"
    dtype = options.get("dtype") or "auto"
    if device not in DEVICES:
        raise _bad(f"unknown device {device!r}", f"choose one of: {', '.join(DEVICES)}")
    if dtype not in DTYPES:
        raise _bad(f"unknown dtype {dtype!r}", f"choose one of: {', '.join(DTYPES)}")
    text = options.get("sample_batch_sizes")
    batch_sizes = parse_batch_sizes(text) if text is not None else (1,)
    chunk = options.get("vae_decode_chunk")
    if chunk is not None and chunk < 1:
        raise _bad(f"--vae-decode-chunk {chunk} is below 1", "give 1 or more (default: the sample batch size)")
    given = {f: options[f] for _, f in SIZE_FLAGS if options.get(f) is not None}
    recipe, path = {}, None
    if preset.needs_recipe:
        recipe, path = recipe_sizes(preset, tree() if callable(tree) else tree)
    sizes = Sizes(**{**recipe, **preset.sizes, **given})
    check_sizes(sizes)
    check_batch_sizes(sizes, batch_sizes)
    return BenchConfig(preset, sizes, batch_sizes, chunk, device, dtype, bool(options.get("record")), path)


def check_batch_sizes(sizes: Sizes, batch_sizes) -> None:
    for n in batch_sizes:
        if sizes.generations % n:
            raise _bad(
                f"--sample-batch-sizes: {n} does not divide the {sizes.generations} generations of a prompt",
                f"use divisors of {sizes.generations}: {', '.join(str(d) for d in divisors(sizes.generations))}")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
