"""compare against the real patched trainers (slow): records of the FLUX trainer launched as the
smoke launches it, on the tiny fixtures (the clean run is test_alignment_patches.py's, shared:
tests/shared_runs.py).

- (two ``--rng cpu --record`` runs at 1 and 2 ranks, and a ``--replay``, compared with exit 0:
  tests/patches/test_alignment_patches.py, on its runs)
- numeric faults planted in a COPY of the patched tree (a phase-shifted RoPE table, a scaled
  attention output, a changed norm weight, a changed VAE weight) are caught with
  ``--record-modules``: compare exits 1 and ``first divergence:`` names the planted module;
- faults of 2% in the same places pass msprobe's rule in every module: the module is named
  because its error stands out (align/modules.py), not the rewards it moves.

They need the trainer side of the alignment contract (patches adding --rng/--record/--replay to
the Flux trainers); without those in the series they are skipped, saying so.  The planted trees
are not lock + series + overlay by design: the tests replace only launch's verdict on them.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT_ROOT, require_msprobe
from shared_runs import flux_fixtures, flux_spec, private_copy

from dancegrpo_npu.run.align_flags import AlignOptions
from dancegrpo_npu.cli import main
from dancegrpo_npu.project import find_project

pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("safetensors")

pytestmark = [pytest.mark.slow, pytest.mark.upstream]


def _alignment_in_series() -> bool:
    trainer_side = ("--rng", "--record_modules", "--replay")
    text = "".join(p.read_text(errors="replace") for p in (PROJECT_ROOT / "patches").glob("*.patch"))
    text += "".join(p.read_text(errors="replace") for p in (PROJECT_ROOT / "overlay").rglob("*.py"))
    return all(f'"{flag}"' in text for flag in trainer_side)


needs_trainer_side = pytest.mark.skipif(
    not _alignment_in_series(),
    reason="the trainer side of the alignment contract (--rng/--record/--replay patches) is not in this series",
)


RECORD_MODULES = ("--rng", "cpu", "--record", "--record_modules")


def recorded_run(shared_runs, project, msprobe: str | None = None) -> Path:
    """A 1-rank --rng cpu run recording its module outputs (with msprobe's dumps of them too when
    ``msprobe`` names a task): its directory.  A planted fault may make the tiny reward score a
    step's samples alike; the run is still a record to compare (no smoke check is made of it)."""
    spec = flux_spec(flux_fixtures(shared_runs, project), *RECORD_MODULES) if msprobe is None else \
        flux_spec(flux_fixtures(shared_runs, project), align=AlignOptions(rng="cpu", msprobe=msprobe))
    record = shared_runs.launch(project, spec)
    assert record.returncode == 0, (record.run_dir / "logs" / "console.log").read_text()[-3000:]
    return record.run_dir


def compare(project, capsys, a: Path, b: Path, *more) -> tuple[int, str]:
    rc = main(["-C", str(project.root), "compare", str(a), str(b), *more])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.out + out.err


def first_divergence(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("first divergence:"))


# ------------------------------------------------------------------ planted faults

ROPE = "dancegrpo_port/models/flux_rope.py"
TRAINER = "fastvideo/train_grpo_flux.py"
AFTER_ROPE = "    install_float32_rope(transformer)\n"
AFTER_VAE = '        subfolder="vae",\n        torch_dtype = torch.bfloat16,\n    ).to(device)\n'
SCALED_ATTENTION = '''
    class _PlantedScale:  # PLANTED FAULT (dancegrpo-npu test): attention output of block 0 scaled by -1.5
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
            out = self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
            return tuple(x * -1.5 for x in out) if isinstance(out, tuple) else out * -1.5

    transformer.transformer_blocks[0].attn.processor = _PlantedScale(transformer.transformer_blocks[0].attn.processor)
'''

# name -> ([(file, anchor, replacement)], what `first divergence:` must name)
FAULTS = {
    "rope": (
        [(ROPE, "angles = pos[:, axes] * inv_freq ", "angles = pos[:, axes] * inv_freq + 0.5 ")],  # 0.5 rad phase
        "transformer/pos_embed",
    ),
    "attention": ([(TRAINER, AFTER_ROPE, AFTER_ROPE + SCALED_ATTENTION)], "transformer/transformer_blocks.0.attn"),
    "norm": (
        [(TRAINER, AFTER_ROPE, AFTER_ROPE + "    transformer.transformer_blocks[0].attn.norm_q.weight.data.neg_()  # PLANTED\n")],
        "transformer/transformer_blocks.0.attn.norm_q",
    ),
    "vae": (
        [(TRAINER, AFTER_VAE, AFTER_VAE + "    vae.decoder.conv_in.weight.data.neg_()  # PLANTED FAULT\n")],
        "vae/decoder.conv_in",
    ),
}  # fmt: skip


# The same places, faults of about 2%: msprobe's rule passes every module (cosine ~0.999, the
# errors scale with the outputs); the runs are not aligned (the rewards move), and the module
# where the error stands out (align/modules.py) must be the one named.
SCALED_2PCT = SCALED_ATTENTION.replace("-1.5", "1.02")
SMALL_FAULTS = {
    "rope": ([(ROPE, "angles = pos[:, axes] * inv_freq ", "angles = pos[:, axes] * (inv_freq * 1.02) ")], FAULTS["rope"][1]),
    "attention": ([(TRAINER, AFTER_ROPE, AFTER_ROPE + SCALED_2PCT)], FAULTS["attention"][1]),
    "norm": (
        [(TRAINER, AFTER_ROPE, AFTER_ROPE + "    transformer.transformer_blocks[0].attn.norm_q.weight.data.mul_(1.02)  # PLANTED\n")],
        FAULTS["norm"][1],
    ),
    "vae": ([(TRAINER, AFTER_VAE, AFTER_VAE + "    vae.decoder.conv_in.weight.data.mul_(1.02)  # PLANTED FAULT\n")], FAULTS["vae"][1]),
}  # fmt: skip


@pytest.fixture(scope="module")
def clean_modules_run(patched_tree, shared_runs):
    return recorded_run(shared_runs, patched_tree.project)


def planted_project(patched_tree, tmp_path: Path, edits, monkeypatch):
    """The patched tree copied, with the edits made; launch trusts it (only its verdict is replaced)."""
    from dancegrpo_npu.engine import treecheck

    copy = tmp_path / "planted" / "DanceGRPO"
    shutil.copytree(patched_tree.tree, copy, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    for rel, anchor, replacement in edits:
        path = copy / rel
        text = path.read_text()
        assert text.count(anchor) == 1, f"the anchor for the planted fault is not (once) in {rel}: {anchor!r}"
        path.write_text(text.replace(anchor, replacement))
    monkeypatch.setattr(treecheck, "tree_state", lambda project, script=None: {"state": "verified", "detail": "planted"})
    return find_project(patched_tree.project.root, workdir=copy)


@needs_trainer_side
@pytest.mark.parametrize("fault", ["rope"])  # msprobe's own rule names it; every place at 2%: below
def test_planted_fault_is_named(patched_tree, shared_runs, clean_modules_run, tmp_path, monkeypatch, capsys, fault):
    edits, module = FAULTS[fault]
    project = planted_project(patched_tree, tmp_path, edits, monkeypatch)
    faulty = private_copy(recorded_run(shared_runs, project), tmp_path / "faulty")  # compare writes into it
    rc, out = compare(patched_tree.project, capsys, clean_modules_run, faulty)
    assert rc == 1, out
    line = first_divergence(out)
    named = line.split()[2]
    assert re.fullmatch(re.escape(module) + r"(\.\d+)*", named), line  # the module, or an item of its output
    assert "(module output, step 1, rank 0)" in line


@needs_trainer_side
@pytest.mark.extended  # each place at 2%: beyond CI, which keeps the planted RoPE fault (above)
@pytest.mark.parametrize("fault", list(SMALL_FAULTS))
def test_a_2pct_fault_is_named_where_it_stands_out(patched_tree, shared_runs, clean_modules_run, tmp_path, monkeypatch,
                                                   capsys, fault):
    edits, module = SMALL_FAULTS[fault]
    faulty = private_copy(recorded_run(shared_runs, planted_project(patched_tree, tmp_path, edits, monkeypatch)),
                          tmp_path / "faulty")  # compare writes into it
    rc, out = compare(patched_tree.project, capsys, clean_modules_run, faulty)
    assert rc == 1, out
    line = first_divergence(out)
    assert re.fullmatch(re.escape(module) + r"(\.\d+)*", line.split()[2]), out  # the module, or an item of its output
    assert "the first module whose error stands out (judged so as the runs are not aligned; msprobe's rule passes it" in line, line


def _msprobe_dump(run_dir: Path, call: str) -> Path:
    root = run_dir / "records" / "msprobe"
    step = json.loads((root / "index.json").read_text())["steps"][call]
    (found,) = (root / step).rglob("dump.json")
    return found


@needs_trainer_side
@pytest.mark.extended  # CI keeps msprobe compare of two runs in tests/overlay/test_alignment_msprobe.py
def test_msprobe_compare_of_two_runs_finds_a_planted_vae_fault(patched_tree, shared_runs, tmp_path, monkeypatch):
    """--msprobe: msprobe's own dumps of the --record-modules calls, which msprobe's own compare reads."""
    require_msprobe()
    edits, _ = FAULTS["vae"]
    clean_msprobe_run = recorded_run(shared_runs, patched_tree.project, msprobe="statistics")
    faulty = recorded_run(shared_runs, planted_project(patched_tree, tmp_path, edits, monkeypatch), msprobe="statistics")
    for run in (clean_msprobe_run, faulty):
        index = json.loads((run / "records" / "msprobe" / "index.json").read_text())
        assert index["steps"] == {"transformer": "step0", "vae": "step1", "reward": "step2"}, index

    def changed(call: str) -> set[str]:
        out = tmp_path / f"msprobe-{call}"
        proc = subprocess.run([sys.executable, "-m", "msprobe.msprobe", "compare", "-tp", str(_msprobe_dump(faulty, call)),
                               "-gp", str(_msprobe_dump(clean_msprobe_run, call)), "-o", str(out)],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        (result,) = out.glob("compare_result_*.csv")
        rows = list(csv.DictReader(result.open()))
        assert rows
        errors = ("MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr")
        return {r["NPU Name"] for r in rows if any(r[e] not in ("0", "0.0", "0%") for e in errors)}

    assert changed("transformer") == set()  # same noise, same weights: the transformer's call is the same
    vae = changed("vae")
    assert any("decoder.conv_in" in name and "parameters.weight" in name for name in vae), sorted(vae)[:10]
    assert not any("decoder.conv_in" not in name and "parameters" in name for name in vae), sorted(vae)[:10]
