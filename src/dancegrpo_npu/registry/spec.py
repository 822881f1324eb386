"""What the tool knows of one trainer (or preprocessing script): a registry row.

Rows are keyword-built, frozen data: launch, smoke, bench, plan, doctor and runs read the
fields, and a field that names code (``Smoke.fixtures``, ``Smoke.checkpoint``...) names it as
``"module:function"`` (``registry.load``), so that this package imports none of the packages
that read it.  Checks and input kinds are named by the strings ``run.inputs`` defines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass(frozen=True, kw_only=True)
class Input:
    """A flag naming something that must exist before the run starts."""

    flag: str
    kind: str  # run.inputs.KINDS: what the path must be ("models", "pipeline", "model", "file"...)
    what: str  # in messages: what it is, and where upstream expects it
    models: tuple[str, ...] = ()  # "models", "pipeline": the subfolders each holding one model (config, weights)
    folders: tuple[str, ...] = ()  # "pipeline": the subfolders that must not be empty (tokenizers, processors)
    # The model's own weights (the directory upstream's README downloads): ``doctor --weights
    # DIR`` stands for every such input of the trainer it checks.
    weights: bool = False


@dataclass(frozen=True, kw_only=True)
class ImageSizes:
    """What the trainer's --h / --w must be multiples of: the VAE's spatial downsampling times
    the latent patch the denoiser takes, else the run stops inside the model after every rank
    has loaded it (launch refuses it before start: run.inputs.image_sizes_problem)."""

    vae_scale: int  # the VAE's spatial downsampling
    patch: int = 1  # the denoiser's latent patch (2: 2x2 latents packed into a token; 1: a UNet takes any latent size)
    why: str  # the model's rule, in the refusal

    @property
    def multiple(self) -> int:
        return self.vae_scale * self.patch


@dataclass(frozen=True, kw_only=True)
class Smoke:
    """How ``dancegrpo-npu smoke`` runs the trainer on tiny models: the row's hooks, which the one
    pipeline (``smoke.runner``) calls in turn - fixtures, arguments, then (after the launch and its
    metrics) the checkpoint check.  Each names a function of the family's folder as ``"module:function"``."""

    title: str  # the smoke's first line: "full <model> GRPO"
    # (project, options, spec) -> built: the tiny models, the reward and the dataset (built once, reused)
    fixtures: str
    # (project, built, options, spec) -> the trainer's arguments: upstream's recipe shrunk (the user's follow)
    arguments: str
    # (run_dir, built, options, spec, args) -> smoke.checks.CheckpointCheck: the last checkpoint loads and moved
    checkpoint: str
    # (options, spec) -> why the trainer cannot run the smoke's options (one line), or None
    check_options: str = ""
    # (check) -> why some trainable tensors cannot move (the model's own reason), or None
    unchanged_note: str = ""
    run_name: str = ""  # the run directory's suffix; "": smoke-<name>
    label: str = ""  # the trainer in messages
    # Trainers that count their loop from 0 and save as they reach a pass's step S
    # (smoke.trained): --max_train_steps is a pass's steps less ``loop_below``; ``passes``
    # passes over the prompts.
    loop_below: int = 0
    passes: int = 1
    # at more than one rank, every rank's --weights_digest is checked equal after training
    equal_weights: bool = True
    model_class: str = ""  # the diffusers class the checkpoint loads back with
    loader: str = ""  # what loads the checkpoint back, in --help, where it is not model_class
    sampling_steps: int = 4  # the smoke's sampling steps (its first line says them)
    reward: str = "HPSv2"  # the smoke's reward model (its first line says it)
    # per-trainer values the family's smoke functions read (``param``)
    params: tuple[tuple[str, object], ...] = ()

    def param(self, name: str):
        return dict(self.params)[name]


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """The trained model as plan and bench count it: a kind they know (plan.memory.KINDS) and the
    counts that kind leaves to the model, each a function of plan's model (``plan.memory.Model``:
    its diffusers config as ``transformer``, and the shapes the family ships)."""

    # "joint-transformer": blocks over the image and text tokens in one sequence; "cross-transformer":
    # blocks over the image (video) tokens, cross-attending to the text; "unet": a conditional UNet of
    # diffusers' down and up blocks, which plan counts layer by layer from its config
    kind: str
    block_parameters: Callable | None = None  # (model) -> the parameters of each block (a transformer)
    root_parameters: Callable | None = None  # (model) -> the parameters outside the blocks (a transformer)
    latent_per_token: Callable | None = None  # (model) -> latent values a token carries (None: in_channels)
    lora_parameters: Callable | None = None  # (model, rank) -> LoRA's on upstream's targets (None: q, k, v, out a block)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What ``plan`` estimates the trainer's memory from: shapes shipped in its family's folder."""

    shapes: Path  # the family's JSON of shapes (its plan.json)
    entry: str  # the trainer's entry there
    architecture: Architecture


@dataclass(frozen=True, kw_only=True)
class BenchPreset:
    """One ``bench --size`` of the trainer: the models it builds and the sizes it sets itself.  The
    recipe sizes it leaves out are upstream's, read from the row's recipe in the patched tree (a
    full-size preset sets none of them); a preset of the tool's own tiny models sets them all (no
    tree needed)."""

    size: str  # throughput.presets.SIZES: "tiny", "cpu" or "full"
    summary: str
    # the transformer's and the VAE's diffusers configs: files of the family's folder (None: the
    # row's plan shapes' denoiser config, its VAE none), or the smoke's tiny ones (``tiny``)
    transformer: Path | None = None
    vae: Path | None = None
    # "module" holding the smoke's tiny TRANSFORMER_CONFIG and VAE_CONFIG, for tiny models
    tiny: str = ""
    transformer_overrides: dict = field(default_factory=dict)
    hps_overrides: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)  # throughput.presets.Sizes fields


@dataclass(frozen=True, kw_only=True)
class Bench:
    """What ``bench --trainer NAME --size SIZE`` runs: at each of its presets' sizes, the trainer's
    ``train_one_step`` on models bench builds from configs, in process (``classes``, ``prompt``,
    ``train``...); or, where ``short_run`` says why not, a short run of the trainer on its smoke's
    tiny models, timed by the seam's phases (metrics.jsonl).  A size it has no preset for is
    refused with its reason in ``no_sizes``."""

    presets: tuple[BenchPreset, ...]
    no_sizes: tuple[tuple[str, str], ...] = ()  # (size, why bench has no preset at it)
    # why the trainer is timed by a short run, not in process ("": in process); bench says it
    short_run: str = ""
    sample_batch_flag: bool = True  # a short run: the trainer takes --sample_batch_size (N > 1 is refused without)
    # -- in process --
    classes: tuple[str, str] = ("", "")  # diffusers' (transformer, VAE) classes
    # Upstream's recipe (run.recipes' name of it) whose sizes the presets run where they set none
    # of their own: read from its script in the patched tree, never copied here
    # (tests/trainers/test_registry_recipes.py).
    recipe: str = ""
    text_tokens: int = 0  # the prompt embedding's length, which the scripts do not hold
    prompt: Callable | None = None  # (transformer config, sizes, device, dtype, caption) -> one prompt as the loader yields it
    train: Callable | None = None  # (train_one_step, args, device, models, optimizer, scheduler, prompt, max grad norm) -> (loss, grad norm)
    extra_args: tuple[tuple[str, object], ...] = ()  # what train_one_step needs beyond the shared flags
    before_build: tuple[str, ...] = ()  # "module:function"s the trainer's main calls before building models
    trainer_prepare: str = ""  # the trainer module's function its main applies to the transformer
    # "module:attr" of the blocks activation checkpointing wraps; "": the model's no-split modules
    checkpointed_blocks: str = ""
    run_dirs: tuple[str, ...] = ()  # directories the trainer's main makes in the run directory

    def preset(self, size: str) -> BenchPreset | None:
        return next((p for p in self.presets if p.size == size), None)


@dataclass(frozen=True, kw_only=True)
class TrainerSpec:
    """One script ``launch`` runs: a GRPO trainer or a preprocessing script."""

    name: str  # what the user types: launch NAME, smoke --trainer NAME
    relpath: str  # the stock script in the patched tree
    help: str  # one line in --help lists
    title: str  # the model, in messages (the weights' name)
    defaults: tuple[tuple[str, str | None], ...] = ()  # after the recipe's arguments, if it has recipes
    path_flags: tuple[str, ...] = ()
    required_inputs: tuple[Input, ...] = ()
    # Whether the script's --output_dir is the run's own output (a trainer's checkpoints) or a
    # product later runs read (preprocessing's embeddings).
    output_in_run_dir: bool
    recipe_glob: str | None = None  # upstream's launch scripts holding its recipes (run.recipes)
    depset: str = "diffusers-0.32"  # the dependency set it runs with (run.depsets)
    argument_checks: tuple[str, ...] = ()  # run.inputs.ARGUMENT_CHECKS' names
    image_sizes: ImageSizes | None = None  # what --h / --w must be multiples of (None: the script takes none)
    dataset: str | None = None  # the model whose RL-embeddings dataset it writes or reads (run.datasets)
    preprocess: str | None = None  # the preprocessing script that makes that dataset
    default: bool = False  # the trainer smoke runs when none is named
    # Whether the seam's alignment (--rng, --record, --replay) and --profile features are in it.
    aligns: bool = False
    smoke: Smoke | None = None
    bench: Bench | None = None  # every trainer's: what ``bench --trainer NAME --size SIZE`` runs
    plan: Plan | None = None  # the memory plan's shapes and architecture (plan, bench, doctor's disk check)
    offload_flag: str | None = None  # the trainer's FSDP CPU offload argument, or None
    lora: str | None = None  # its LoRA variant's row name, or None
    lora_args: str = ""  # the LoRA variant's arguments ({rank}, {alpha})
    no_lora: str = ""  # why it has no LoRA variant
    # Flags another reader in the script takes, with their ``FLAG.KEY=VALUE`` forms (absl's
    # --config of an ml_collections program): passed through, not checked by its argparse parser.
    foreign_flags: tuple[str, ...] = ()
    # The overlay's check of the port's flags against the absl configuration a foreign flag makes
    # ("module:function" in the patched tree, (args, config) -> one line or None): launch loads the
    # configuration as the script's absl does and runs it before start (run.absl_config).
    config_check: str = ""
    # A configuration to name in the refusals of a bad --config (upstream's recipe's).
    config_example: str = ""
    # The overlay's function the script's main gives the port's flags the configuration's values
    # with ("module:function", (args, config)): a flag not given is its key's (upstream's recipe
    # sets --seed, --num_generations and --sampling_steps there), as a replay is checked against.
    config_settle: str = ""
    # What the script always does whatever its flags say, as the values a replay must match
    # (run.upstream_args.REPLAY_ARGUMENTS' names): a trainer that always shares its initial latents says so here.
    fixed_values: tuple[tuple[str, object], ...] = ()
    # The script's own flags for those values under another name: (its flag, the name), as the
    # overlay's settle function for that trainer reads it (--use_same_noise for init_same_noise).
    renamed_values: tuple[tuple[str, str], ...] = ()
    # The model's block doctor's numerics check runs on NPU 0 and on the CPU: "module:function"
    # (torch, generator) -> (its name, run(device) -> tensor); "": the trainer names none.
    numerics_block: str = ""
    # Why the recipe's batch is a rank's and is not rescaled at another world size ("": it is
    # rescaled to keep the prompts a step and the effective batch: run.recipes.scale).
    per_rank_batch: str = ""

    @property
    def is_trainer(self) -> bool:
        """A GRPO trainer (its outputs are the run's own), not a preprocessing script."""
        return self.output_in_run_dir
