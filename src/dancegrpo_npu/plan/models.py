"""The shapes the memory plan knows: shipped in each family's folder, or the bench's built configs.

The models are the registry's trainers with a ``plan`` (dancegrpo_npu.registry): its entry of
its family's plan.json holds the shapes, and its ``architecture`` the kind plan counts it as and
the counts that kind leaves to the model.  A model's denoiser (and VAE) config is in the entry,
or names a config file beside it (``denoiser_file``, which the bench builds too).  Its recipe sizes (resolution,
frames, generations, sampling steps, ranks, checkpointing) are upstream's: read from its launch
script in the patched tree by :mod:`dancegrpo_npu.run.recipes`, the reader ``launch`` uses, and
never copied into the tool; without the tree the plan is refused in one line naming what to run.
The entry keeps what the scripts lack: the prompt embedding's length.  Where the script keeps
its sizes in an absl / ml_collections configuration (``--config FILE:NAME``),
the entry names each size's key there, and plan loads that configuration from the tree as absl
would (``get_config(NAME)`` of the file), the sizes still read, not copied.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from dancegrpo_npu import registry
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.plan.memory import Model, Recipe


@lru_cache(maxsize=None)
def _shipped(shapes: Path) -> dict:
    """A family's shapes (its plan.json), less the comment."""
    return {k: v for k, v in json.loads(shapes.read_text()).items() if not k.startswith("_")}


def names() -> list[str]:
    """The trainers plan knows: the registry's rows with model shapes."""
    return [spec.name for spec in registry.planned()]


def entry(name: str) -> dict:
    """The shipped shapes of trainer ``name``, with ``same_as`` resolved (an entry that shares
    another's shapes names it)."""
    plan = plan_of(name)
    family = _shipped(plan.shapes)
    data = family[plan.entry]
    if "same_as" in data:
        data = {**family[data["same_as"]], **data}
    return data


def plan_of(name: str):
    """The registry row's ``plan`` (registry.Plan); a trainer without one is refused in one line."""
    spec = registry.get(name, "model")
    if spec.plan is None:
        raise registry.unknown(name, "model", names(), "plan")
    return spec.plan


def config_file(name: str, key: str) -> Path | None:
    """The config file beside its family's shapes that the entry names (``denoiser_file``,
    ``vae_file``), or None."""
    data = entry(name)
    return plan_of(name).shapes.with_name(data[f"{key}_file"]) if f"{key}_file" in data else None


def _config(name: str, data: dict, key: str) -> dict:
    path = config_file(name, key)
    return json.loads(path.read_text()) if path is not None else data[key]


def model_of(name: str) -> Model:
    data = entry(name)
    vae = dict(data["vae"])
    if "vae_file" in data:  # a VAE whose widths multiply a base: its channels from its config
        cfg = _config(name, data, "vae")
        vae.update(first_channels=cfg["base_dim"], widest_channels=cfg["base_dim"] * max(cfg["dim_mult"]))
    config = data["recipe"].get("config", {})
    denoiser = {**_config(name, data, "denoiser"), **data.get("denoiser_overrides", {})}
    return Model(name, name, denoiser, vae, data.get("hps"), architecture=plan_of(name).architecture,
                 reference_image_tokens=data.get("reference_image_tokens", False),
                 parallel=data.get("parallel", "fsdp"), text_encoder=data.get("text_encoder"),
                 checkpointing=data.get("checkpointing", True),
                 config_fields=tuple(config.get("fields", {}).items()), config_flag=config.get("flag", ""),
                 counted=data.get("counted"), reward=data.get("reward"), first_frame=data.get("first_frame"))


def load(name: str, tree: Path | None) -> tuple[Model, Recipe, int, str]:
    """(model, upstream's recipe sizes, its world size, its script): the sizes read from the
    script in ``tree``, the patched tree (``read_recipe``; no tree is refused in one line)."""
    recipe, world_size = read_recipe(name, tree)
    return model_of(name), recipe, world_size, entry(name)["recipe"]["script"]


def _argparse_default(source: str, flag: str) -> str | None:
    """The default of ``parser.add_argument("FLAG", ..., default=X)`` in a trainer's source."""
    m = re.search(rf'add_argument\(\s*"{re.escape(flag)}"[^)]*?default\s*=\s*([^,)\s]+)', source)
    return m.group(1) if m else None


def read_recipe(name: str, tree: Path | None) -> tuple[Recipe, int]:
    """The recipe sizes of upstream's script for ``name`` in the patched tree, as launch reads
    it (run.recipes), with the trainer's own defaults for the flags the script leaves out."""
    from dancegrpo_npu.run import recipes

    r = entry(name)["recipe"]
    path = (tree / r["script"]) if tree is not None else None
    if path is None or not path.is_file():
        raise DancegrpoError(
            f"plan: {name}'s recipe sizes are upstream's, read from {r['script']} in the patched tree, "
            f"and {path or 'there is no patched tree'} is missing",
            "run `dancegrpo-npu fetch && dancegrpo-npu apply` in the project first (or pass --workdir DIR of a patched tree)",
        )
    script = recipes.parse_recipe(path, "")
    values = script.values()
    if "config" in r:
        return _recipe_from_config(name, tree, path, values, r), script.world_size
    try:
        source = (tree / script.trainer).read_text()
    except OSError as e:
        raise DancegrpoError(f"plan: {tree / script.trainer} cannot be read ({e.strerror or e})",
                             "run `dancegrpo-npu apply` to restore the patched tree") from None

    def value(flag: str, kind):
        text = values.get(flag) if flag in values else _argparse_default(source, flag)
        try:
            return kind(text)
        except (TypeError, ValueError):
            raise DancegrpoError(f"plan: {flag} {text!r} in {path} (or its trainer's default) is not a number",
                                 "pass the size to plan yourself, e.g. --height 512") from None

    checkpointing = value("--selective_checkpointing", float) if "--gradient_checkpointing" in values else 0.0
    # --cfg_infer > 1 runs the prompt and the negative prompt in one transformer call
    has_guidance = "--cfg_infer" in values or _argparse_default(source, "--cfg_infer") is not None
    guidance_batch = 2 if has_guidance and value("--cfg_infer", float) > 1 else 1
    recipe = Recipe(height=value("--h", int), width=value("--w", int), frames=value("--t", int),
                    generations=value("--num_generations", int), sampling_steps=value("--sampling_steps", int),
                    text_tokens=r["text_tokens"], selective_checkpointing=checkpointing,
                    guidance_batch=guidance_batch, ema="--use_ema" in values)
    return recipe, script.world_size


def from_bench(name: str, configs, counts, trainer: str | None = None) -> Model:
    """A bench preset's models (its transformer config, its VAE and HPS configs and their
    parameter counts from meta-device builds) as the plan sees them, counted as the row's
    ``architecture`` says; ``trainer``: the registry row it trains with (None: the default trainer)."""
    transformer_cfg, vae_cfg, hps_cfg = configs
    vision = hps_cfg["vision_cfg"]
    vae = {"parameters": counts.vae, "first_channels": vae_cfg["block_out_channels"][0],
           "widest_channels": max(vae_cfg["block_out_channels"]), "tile": vae_cfg.get("sample_size", 1024)}
    hps = {"parameters": counts.hps, "image_size": vision["image_size"], "patch_size": vision["patch_size"],
           "width": vision["width"], "head_width": vision.get("head_width", 64)}
    spec = registry.get(trainer) if trainer else registry.default_trainer()
    return Model(name, spec.name, {"_class_name": spec.bench.classes[0], **transformer_cfg}, vae, hps,
                 architecture=spec.plan.architecture)


def _recipe_from_config(name: str, tree: Path, path: Path, values: dict, r: dict) -> Recipe:
    """The sizes of an absl / ml_collections configuration the script names (``--config
    FILE:NAME``), loaded from the tree as absl's config_flags loads it: the file as a module,
    then its ``get_config(NAME)``."""
    import importlib.util

    flag, fields = r["config"]["flag"], r["config"]["fields"]
    spec_text = values.get(flag)
    if not spec_text:
        raise DancegrpoError(f"plan: {path} passes no {flag} FILE:NAME, where {name}'s recipe sizes are",
                             "run `dancegrpo-npu apply` to restore the patched tree")
    file, _, config_name = spec_text.partition(":")
    config_path = tree / file
    what = f"{config_path}{':' + config_name if config_name else ''}"
    try:
        import ml_collections  # noqa: F401  (the configuration's own import; its absence is said here)

        spec = importlib.util.spec_from_file_location(f"_plan_config_{config_path.stem}", config_path)
        if spec is None or not config_path.is_file():
            raise FileNotFoundError(config_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = module.get_config(config_name) if config_name else module.get_config()
    except ImportError as e:
        raise DancegrpoError(f"plan: reading {name}'s configuration {what} needs {e.name or 'a module'} ({e})",
                             "install ml_collections in the tool's environment (pip install ml-collections)") from None
    except Exception as e:  # the configuration is upstream's code: whatever it raises is one line
        raise DancegrpoError(f"plan: {name}'s recipe sizes are in {what}, which cannot be loaded "
                             f"({type(e).__name__}: {e})",
                             "run `dancegrpo-npu fetch && dancegrpo-npu apply` to restore the patched tree") from None

    def value(key: str, kind):
        node = config
        try:
            for part in fields[key].split("."):
                node = node[part]
            return kind(node)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise DancegrpoError(f"plan: {what} has no usable {fields[key]} ({name}'s {key})",
                                 "run `dancegrpo-npu apply` to restore the patched tree") from None

    model = model_of(name)
    # no size in the configuration: upstream's pipeline draws the denoiser's sample size times the VAE's 8
    side = model.transformer["sample_size"] * 8
    h = values.get("--h") or side
    w = values.get("--w") or side
    guidance = value("guidance_scale", float) > 1
    try:
        height, width = int(h), int(w)
    except ValueError:
        raise DancegrpoError(f"plan: --h/--w {h!r}/{w!r} in {path} is not a number",
                             "pass the size to plan yourself, e.g. --height 512") from None
    return Recipe(height=height, width=width, generations=value("generations", int),
                  sampling_steps=value("sampling_steps", int), text_tokens=r["text_tokens"],
                  selective_checkpointing=0.0, sample_batch_size=value("sample_batch_size", int),
                  guidance_batch=2 if guidance else 1, prompts=value("prompts", int),
                  train_batch_size=value("train_batch_size", int), accumulation=value("accumulation", int),
                  train_guidance_batch=2 if value("train_cfg", bool) else 1)
