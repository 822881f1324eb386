"""What ``dancegrpo-npu bench`` measures: the presets, the sizes, and their checks.

Plain data and plain Python (no torch), so bad input is refused before anything is
imported or built.  A preset is a trainer's bench at one size (``--trainer NAME --size
tiny|cpu|full``: its registry row's ``bench.presets``); a size the row has none at is refused
with the row's reason.  An in-process preset names the models (config files of the trainer's
family, plus overrides) and the sizes it sets itself; the recipe sizes it leaves out (a
full-size preset: all of them) are upstream's, read from the recipe script its row names in the
patched tree (``run.recipes``, as launch reads it), and without that tree it is refused in one
line.  The tiny presets, the tool's own smoke-size shapes, set every size.  Every explicit size
flag wins over the preset's value.  A short run (a row's ``bench.short_run``) runs the smoke's
own sizes: it takes only --generations, --steps and --warmup-steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from dancegrpo_npu import registry
from dancegrpo_npu.contract import DEVICE_CHOICES as DEVICES
from dancegrpo_npu.contract import sde_window_problem
from dancegrpo_npu.errors import DancegrpoError

DTYPES = ("auto", "bf16", "fp32")
# bench's sizes, smallest first: the smoke's tiny models, one full-width block, the full model
SIZES = ("tiny", "cpu", "full")
DEFAULT_SIZE = "full"


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
    text_tokens: int  # the prompt-embedding length (the row's bench.text_tokens: its pipeline's max_sequence_length)
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
    trainer: str  # the registry row whose trainer it runs (dancegrpo_npu.registry)
    size: str  # one of SIZES
    summary: str
    # the transformer's and the VAE's configs: files of the trainer's family (None: the row's plan
    # shapes' config), or the smoke's tiny models (``tiny``)
    transformer: Path | None = None
    vae: Path | None = None
    transformer_overrides: dict = field(default_factory=dict)
    hps_overrides: dict = field(default_factory=dict)  # {"vision_layers": n, "text_layers": n}
    # the Sizes fields it sets itself (the row's text tokens and TIMING under the preset's own);
    # the recipe's fields it leaves out are read from the patched tree (``needs_recipe``)
    sizes: dict = field(default_factory=dict)
    tiny: str = ""  # the module of the smoke's tiny models it builds (its row's), or ""
    short_run: str = ""  # why the trainer is timed by a short run of its smoke ("": in process)

    @property
    def name(self) -> str:
        """The run directory's and the messages' name: TRAINER-SIZE."""
        return f"{self.trainer}-{self.size}"

    @property
    def needs_recipe(self) -> bool:
        """Whether some of its sizes are upstream's recipe's, read from the patched tree."""
        return not self.short_run and any(name not in self.sizes for name in RECIPE_FIELDS)


# How bench times a preset unless it or a flag says otherwise: the bench's own, not upstream's.
TIMING = dict(steps=2, warmup_steps=1)


def presets() -> dict[str, Preset]:
    """Every preset of the registry's trainers (their rows' ``bench``), by name (TRAINER-SIZE),
    with the sizes it sets itself."""
    found = {}
    for spec in registry.benched():
        for p in spec.bench.presets:
            own = {"text_tokens": spec.bench.text_tokens} if not spec.bench.short_run else {}
            preset = Preset(trainer=spec.name, size=p.size, summary=p.summary, transformer=p.transformer, vae=p.vae,
                            transformer_overrides=dict(p.transformer_overrides), hps_overrides=dict(p.hps_overrides),
                            sizes={**own, **TIMING, **p.sizes}, tiny=p.tiny, short_run=spec.bench.short_run)
            found[preset.name] = preset
    return found


PRESETS = presets()
DEFAULT_TRAINER = registry.default_trainer().name


def preset_of(trainer: str, size: str) -> Preset:
    """The bench of ``trainer`` at ``size``; an unknown trainer or size, or a size the row has no
    preset at (its reason), refused in one line (exit 2)."""
    spec = registry.REGISTRY.get(trainer)
    if spec is None or spec.bench is None:
        raise registry.unknown(trainer, "trainer", [s.name for s in registry.benched()], "bench")
    if size not in SIZES:
        raise _bad(f"unknown size {size!r}", f"choose one of: {', '.join(SIZES)}")
    found = spec.bench.preset(size)
    if found is None:
        why = dict(spec.bench.no_sizes).get(size, "its row has no preset at it")
        have = ", ".join(p.size for p in spec.bench.presets)
        raise _bad(f"{trainer} has no {size} size: {why}", f"give --size {have}" if have else "")
    return presets()[f"{trainer}-{size}"]


def trainer_of(preset: Preset):
    """The registry row of the preset's trainer."""
    return registry.get(preset.trainer)


# The Sizes fields upstream's recipe scripts hold, and the flag each is read from.
RECIPE_FLAGS = (("height", "--h", int), ("width", "--w", int), ("sampling_steps", "--sampling_steps", int),
                ("generations", "--num_generations", int), ("timestep_fraction", "--timestep_fraction", float),
                ("eta", "--eta", float), ("shift", "--shift", float),
                ("gradient_accumulation_steps", "--gradient_accumulation_steps", int))
RECIPE_FIELDS = tuple(name for name, _, _ in RECIPE_FLAGS)


def recipe_sizes(preset: Preset, tree) -> tuple[dict, Path]:
    """(sizes, script) of the upstream recipe the preset's registry row names, read from the
    patched tree ``tree`` as launch reads it (run.recipes); no tree, or none holding that recipe,
    is refused in one line.  A bench step is one prompt, so the accumulation is capped at its
    generations (every sample a micro-batch, as in the trainers' loop)."""
    from dancegrpo_npu.run.recipes import recipes_for

    spec = trainer_of(preset)
    tree = Path(tree) if tree is not None else None
    found = {r.name: r for r in recipes_for(tree, spec.relpath, spec.recipe_glob)} if tree is not None else {}
    if spec.bench.recipe not in found:
        if tree is None or not tree.is_dir():
            where = f"{tree or 'the patched tree'} is missing"
        else:
            where = f"{tree} has {'only ' + ', '.join(found) if found else 'none of them'}"
        raise DancegrpoError(
            f"bench: {spec.name} at size {preset.size} runs upstream's recipe {spec.bench.recipe} "
            f"({spec.recipe_glob}), read from the patched tree, and {where}",
            "run `dancegrpo-npu fetch && dancegrpo-npu apply` in the project first (or pass --workdir DIR of a "
            "patched tree); --size tiny sets its own sizes")
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
class ShortRun:
    """A short run's sizes: the smoke's, with these."""

    generations: int
    steps: int  # timed steps (each sample batch size its own run)
    warmup_steps: int  # steps before them, untimed


@dataclass(frozen=True)
class BenchConfig:
    preset: Preset
    sizes: Sizes | None  # None: a short run (``short``)
    sample_batch_sizes: tuple[int, ...]
    vae_decode_chunk: int | None  # None: N, the sample batch size
    device: str
    dtype: str
    record: bool = False  # the timed steps' stages into <run>/records/, as launch --record writes them
    recipe: Path | None = None  # the upstream script the sizes the preset leaves out were read from, or None
    short: ShortRun | None = None  # a short run's sizes (the row's ``bench.short_run``)
    sde_window_size: int = 0  # W > 0: each N measured again with an SDE window of W steps, beside upstream's

    def decode_chunk(self, n: int) -> int:
        return self.vae_decode_chunk or n

    def describe(self) -> dict:
        """The preset and sizes, for the fingerprint."""
        return {
            "preset": self.preset.name,
            "row": self.preset.trainer,  # the registry row; "trainer" is its script and what was timed
            "size": self.preset.size,
            "short_run": self.preset.short_run or None,
            "trainer_script": trainer_of(self.preset).relpath,
            "transformer_overrides": dict(self.preset.transformer_overrides),
            "hps_overrides": dict(self.preset.hps_overrides),
            **(asdict(self.sizes) if self.sizes is not None else asdict(self.short)),
            **({"train_timesteps": self.sizes.train_timesteps} if self.sizes is not None else {}),
            "sample_batch_sizes": list(self.sample_batch_sizes),
            **({"vae_decode_chunk": self.vae_decode_chunk or "N", "gradient_checkpointing": True}
               if self.sizes is not None else {}),
            "record": self.record,
            "sde_window_size": self.sde_window_size,
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


# What a short run takes of the size flags (it runs the smoke's own sizes): Sizes fields.
SHORT_RUN_FIELDS = ("generations", "steps", "warmup_steps")
# The smoke's generations, unless --generations says otherwise (smoke.runner.GENERATIONS is 2: a
# group of 4 gives the sample batch sizes 1, 2 and 4 to compare).
SHORT_RUN_GENERATIONS = 4


def resolve(options: dict, tree=None) -> BenchConfig:
    """The checked configuration from parsed options (``None``: the preset's value).

    ``options`` holds ``trainer``, ``size``, ``sample_batch_sizes`` (text), ``vae_decode_chunk``,
    ``device``, ``dtype`` and one key per :data:`SIZE_FLAGS` field.  ``tree``: the patched tree
    (or a function giving it, asked only for a preset that reads upstream's recipe, once the
    other values are checked).
    """
    preset = preset_of(options.get("trainer") or DEFAULT_TRAINER, options.get("size") or DEFAULT_SIZE)
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
    window = options.get("sde_window_size") or 0
    if preset.short_run:
        if window:
            raise _bad(f"--sde-window-size {window}: {trainer_of(preset).name} is timed by a short run of its smoke "
                       f"({preset.short_run}), not by its train_one_step beside an SDE window's",
                       "leave --sde-window-size out")
        return _short_run_config(preset, given, batch_sizes, chunk, device, dtype, bool(options.get("record")))
    recipe, path = {}, None
    if preset.needs_recipe:
        recipe, path = recipe_sizes(preset, tree() if callable(tree) else tree)
    sizes = Sizes(**{**recipe, **preset.sizes, **given})
    check_sizes(sizes)
    check_batch_sizes(sizes, batch_sizes)
    check_window(sizes, window, bool(options.get("record")))
    return BenchConfig(preset, sizes, batch_sizes, chunk, device, dtype, bool(options.get("record")), path,
                       sde_window_size=window)


def check_window(sizes: Sizes, window: int, record: bool) -> None:
    """--sde-window-size W as the trainer checks it (the contract's check, the window starting at
    step 0); a run's records hold one window setting, and the bench measures two."""
    if sde_window_problem({"sde_window_size": window, "sampling_steps": sizes.sampling_steps}):
        raise _bad(f"--sde-window-size {window}: a window holds 1 to {sizes.sampling_steps - 1} of the trainable "
                   f"steps of --sampling-steps {sizes.sampling_steps} (upstream never trains the last)",
                   f"give a size from 1 to {sizes.sampling_steps - 1}, or leave it out (no window)")
    if window and record:
        raise _bad("--record with --sde-window-size: a run's records hold one SDE window setting, and the bench "
                   "measures two (without and with the window)", "record a bench without --sde-window-size, or "
                   "launch with --record and --sde_window_size")


def _short_run_config(preset: Preset, given: dict, batch_sizes, chunk, device: str, dtype: str,
                      record: bool) -> BenchConfig:
    """A short run's configuration: the smoke's sizes, with --generations, --steps, --warmup-steps."""
    spec = trainer_of(preset)
    others = [flag for flag, name in SIZE_FLAGS if name in given and name not in SHORT_RUN_FIELDS]
    if others or chunk is not None or dtype != "auto":
        said = others + (["--vae-decode-chunk"] if chunk is not None else []) + (["--dtype"] if dtype != "auto" else [])
        raise _bad(f"{', '.join(said)}: {spec.name} is timed by a short run of its smoke ({preset.short_run}), "
                   "which runs the smoke's own sizes and precision",
                   "give only --generations, --steps, --warmup-steps and --sample-batch-sizes")
    if batch_sizes != (1,) and not spec.bench.sample_batch_flag:
        raise _bad(f"--sample-batch-sizes {','.join(map(str, batch_sizes))}: {spec.name}'s trainer takes no "
                   "--sample_batch_size (its sample batch is its own)", "give --sample-batch-sizes 1")
    sizes = {"generations": SHORT_RUN_GENERATIONS, **TIMING, **preset.sizes, **given}
    if sizes["generations"] < 2:
        raise _bad(f"--generations {sizes['generations']} is below 2", "a GRPO group needs 2 or more")
    for flag, name in (("--steps", "steps"), ("--warmup-steps", "warmup_steps")):
        if sizes[name] < (1 if name == "steps" else 0):
            raise _bad(f"{flag} {sizes[name]} is below {1 if name == 'steps' else 0}", f"give {flag} 1 or more")
    for n in batch_sizes:
        if sizes["generations"] % n:
            raise _bad(f"--sample-batch-sizes: {n} does not divide the {sizes['generations']} generations of a prompt",
                       f"use divisors of {sizes['generations']}: "
                       f"{', '.join(str(d) for d in divisors(sizes['generations']))}")
    return BenchConfig(preset, None, batch_sizes, None, device, dtype, record, None,
                       ShortRun(sizes["generations"], sizes["steps"], sizes["warmup_steps"]))


def check_batch_sizes(sizes: Sizes, batch_sizes) -> None:
    for n in batch_sizes:
        if sizes.generations % n:
            raise _bad(
                f"--sample-batch-sizes: {n} does not divide the {sizes.generations} generations of a prompt",
                f"use divisors of {sizes.generations}: {', '.join(str(d) for d in divisors(sizes.generations))}")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
