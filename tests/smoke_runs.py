"""What the smoke tests of the diffusers-0.35 trainers share: a run's result read back (the set's
interpreter is depset_035's)."""

from __future__ import annotations

import json

from dancegrpo_npu.errors import DancegrpoError


def passed(result):
    if isinstance(result, DancegrpoError):
        raise AssertionError(f"the smoke failed: {result.message} ({result.hint})")
    return result


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_a_cut_run_resumes_exactly(project, ref, cut_options, capsys) -> None:
    """A smoke run of ``cut_options`` (3 steps or more, killed once checkpoint 2 is complete)
    resumed with `launch --resume` ends as the uninterrupted run ``ref``: steps 1..N once each,
    `compare` exit 0 with no divergence, every record tensor bit-equal.  ``ref`` is read, never
    changed (it may be a shared run: tests/shared_runs.py); compare writes into the cut run."""
    import pytest

    from dancegrpo_npu.cli import main
    from dancegrpo_npu.smoke import runner as smoke

    before = set(project.runs_dir.iterdir()) if project.runs_dir.is_dir() else set()  # shared runs go elsewhere
    with pytest.raises(DancegrpoError, match="training run failed"):
        smoke.run_smoke(project, cut_options)
    (cut,) = set(project.runs_dir.iterdir()) - before
    assert [m["step"] for m in metrics(cut)] == [1, 2]
    capsys.readouterr()
    assert main(["-C", str(project.root), "launch", "--resume", cut.name]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert_resumed_as_uninterrupted(project, ref.run_dir, cut, capsys, steps=cut_options.steps)


def assert_resumed_as_uninterrupted(project, ref, cut, capsys, steps) -> None:
    """Run ``cut``, stopped and resumed, ends as the uninterrupted run ``ref``: steps 1..steps once
    each, `compare` exit 0 with no divergence, every record tensor bit-equal."""
    import torch
    from safetensors.torch import load_file

    from dancegrpo_npu.cli import main

    assert [m["step"] for m in metrics(cut)] == list(range(1, steps + 1))
    assert json.loads((cut / "records" / "index.json").read_text())["steps"] == list(range(1, steps + 1))
    assert main(["-C", str(project.root), "compare", str(ref), str(cut)]) == 0
    assert "first divergence: none" in capsys.readouterr().out
    files = sorted(p.relative_to(ref) for p in (ref / "records").rglob("*.safetensors"))
    assert files and files == sorted(p.relative_to(cut) for p in (cut / "records").rglob("*.safetensors"))
    for name in files:
        a, b = load_file(ref / name), load_file(cut / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
