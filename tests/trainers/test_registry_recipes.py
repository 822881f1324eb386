"""The bench's recipe sizes are upstream's: each trainer's full-size preset runs the sizes of the
recipe its registry row names, as run.recipes reads it from the patched tree."""

from __future__ import annotations

import pytest

from dancegrpo_npu import trainers
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


@pytest.mark.upstream
@pytest.mark.parametrize("name", [spec.name for spec in trainers.benched()])
def test_each_full_size_preset_runs_its_upstream_recipe(patched_tree, name):
    spec = trainers.get(name)
    recipes = {r.name: r for r in recipes_for(patched_tree.tree, spec.relpath, spec.recipe_glob)}
    want = recipe_sizes(recipes[spec.bench.recipe].values())
    assert {k: spec.bench.sizes[k] for k in want} == want
    full = presets.presets()[spec.bench.presets[0].name]
    assert {k: getattr(full.sizes, k) for k in want} == want


@pytest.mark.upstream
def test_bench_runs_the_recipe_the_tree_holds_and_says_where_the_copy_differs(patched_tree, monkeypatch):
    from dataclasses import replace

    spec = trainers.default_trainer()
    stale = replace(spec, bench=replace(spec.bench, sizes={**spec.bench.sizes, "sampling_steps": 99, "eta": 0.5}))
    monkeypatch.setitem(trainers.REGISTRY, spec.name, stale)
    full = spec.bench.presets[0].name
    config, path, differ = presets.with_recipe(presets.resolve({"preset": full}), patched_tree.tree)
    assert path.is_file() and differ == {"sampling_steps": (99, 16), "eta": (0.5, 0.3)}
    assert (config.sizes.sampling_steps, config.sizes.eta) == (16, 0.3)
    typed = presets.resolve({"preset": full, "sampling_steps": 8})  # a flag wins over the recipe
    assert presets.with_recipe(typed, patched_tree.tree)[0].sizes.sampling_steps == 8
    smaller = presets.resolve({"preset": spec.bench.presets[1].name})  # and so does a preset's own size
    assert presets.with_recipe(smaller, patched_tree.tree)[0].sizes.sampling_steps == 4
