"""The bench's recipe sizes are upstream's: each trainer's full-size preset runs the sizes of the
recipe its registry row names, as run.recipes reads it from the patched tree, and the registry
holds no copy of them (only what the scripts lack: the prompt embedding's length).  A trainer
timed by a short run runs its smoke's sizes and has no full-size preset."""

from __future__ import annotations

import pytest

from dancegrpo_npu import registry
from dancegrpo_npu.run.recipes import recipes_for
from dancegrpo_npu.throughput import presets


def recipe_sizes(values: dict) -> dict:
    """What a bench step of one prompt takes from a recipe: its accumulation capped at the
    prompt's generations (every sample a micro-batch)."""
    generations = int(values["--num_generations"])
    return dict(height=int(values["--h"]), width=int(values["--w"]), sampling_steps=int(values["--sampling_steps"]),
                generations=generations, timestep_fraction=float(values["--timestep_fraction"]),
                eta=float(values["--eta"]), shift=float(values["--shift"]),
                gradient_accumulation_steps=min(int(values["--gradient_accumulation_steps"]), generations))


FULL_SIZE = [spec.name for spec in registry.benched() if spec.bench.preset("full")]


def test_only_a_short_run_lacks_a_full_size_preset():
    assert FULL_SIZE and all(bool(spec.bench.short_run) == (spec.name not in FULL_SIZE) for spec in registry.benched())


@pytest.mark.parametrize("name", FULL_SIZE)
def test_the_registry_holds_no_copy_of_upstreams_sizes(name):
    """A full-size preset sets none of the recipe's sizes; the row keeps the text tokens alone."""
    bench = registry.get(name).bench
    assert not hasattr(bench, "sizes")
    full = presets.PRESETS[f"{name}-full"]
    assert full.needs_recipe and not set(full.sizes) & set(presets.RECIPE_FIELDS)
    assert full.sizes == {"text_tokens": bench.text_tokens, **presets.TIMING}


@pytest.mark.upstream
@pytest.mark.parametrize("name", FULL_SIZE)
def test_each_full_size_preset_runs_its_upstream_recipe(patched_tree, name):
    spec = registry.get(name)
    recipes = {r.name: r for r in recipes_for(patched_tree.tree, spec.relpath, spec.recipe_glob)}
    want = recipe_sizes(recipes[spec.bench.recipe].values())
    config = presets.resolve({"trainer": name, "size": "full"}, patched_tree.tree)
    assert {k: getattr(config.sizes, k) for k in want} == want
    assert config.recipe == recipes[spec.bench.recipe].path


@pytest.mark.upstream
def test_bench_runs_the_recipe_the_tree_holds_under_the_presets_and_the_flags(patched_tree, tmp_path):
    """An upstream whose script changes a size changes what bench runs; a preset's own size and a
    flag win over the recipe's."""
    import shutil

    spec = registry.default_trainer()
    full, smaller = {"trainer": spec.name, "size": "full"}, {"trainer": spec.name, "size": "cpu"}
    recipe = {r.name: r for r in recipes_for(patched_tree.tree, spec.relpath, spec.recipe_glob)}[spec.bench.recipe]
    tree = tmp_path / "tree"
    script = tree / recipe.path.relative_to(patched_tree.tree)
    script.parent.mkdir(parents=True)
    shutil.copy(recipe.path, script)
    (tree / recipe.trainer).parent.mkdir(parents=True)
    (tree / recipe.trainer).write_text("")
    text = script.read_text()
    assert "--sampling_steps 16" in text and "--eta 0.3" in text
    script.write_text(text.replace("--sampling_steps 16", "--sampling_steps 24").replace("--eta 0.3", "--eta 0.5"))
    config = presets.resolve(full, tree)
    assert (config.sizes.sampling_steps, config.sizes.eta) == (24, 0.5)
    assert presets.resolve({**full, "sampling_steps": 8}, tree).sizes.sampling_steps == 8  # a flag wins
    own = presets.resolve(smaller, tree)  # and so does a preset's own size
    assert (own.sizes.sampling_steps, own.sizes.eta) == (4, 0.5)
