"""overlay/dancegrpo_port/alignment_msprobe.py with the real MindStudio Probe (the msprobe extra,
which scripts/bootstrap.sh installs): its dumps of the --record_modules calls, and msprobe's own
``compare`` reading two of them.  The trainers are run with it by tests/align/test_compare_trainers.py
(test_msprobe_compare_of_two_runs_finds_a_planted_vae_fault).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys

import pytest
from conftest import require_msprobe
from overlay_runner import OVERLAY  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from dancegrpo_port import alignment  # noqa: E402  (overlay/ is on sys.path)
from dancegrpo_port import alignment_msprobe as msprobe_dump  # noqa: E402


def test_what_is_refused_in_one_line(monkeypatch):
    assert msprobe_dump.problem(None, record_modules=False) is None
    assert "is not one of statistics, tensor" in msprobe_dump.problem("L1", record_modules=True)
    assert "needs --record_modules" in msprobe_dump.problem("statistics", record_modules=False)
    monkeypatch.setattr(msprobe_dump.importlib.util, "find_spec", lambda name: None)
    assert "pip install mindstudio-probe" in msprobe_dump.problem("statistics", record_modules=True)


def test_the_trainers_argument_check_reads_the_environment(monkeypatch, tmp_path):
    args = argparse.Namespace(rng="device", seed=1, record=True, record_steps=None, record_modules=False,
                              replay=None)
    monkeypatch.setenv(msprobe_dump.ENV, "statistics")
    assert "needs --record_modules" in alignment.argument_problem(args)
    args.record_modules = True
    assert alignment.argument_problem(args) is None
    monkeypatch.setenv(msprobe_dump.ENV, "everything")
    assert "is not one of" in alignment.argument_problem(args)


# Built and called in a process of its own (msprobe keeps one debugger per process, as in a trainer
# rank), the way the trainer does: one captured transformer forward, one more that is not
# captured, then one captured VAE decode.
DUMP = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from dancegrpo_port.alignment_msprobe import MsprobeDump

class Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj_in = torch.nn.Linear(4, 8)
        self.block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
        self.proj_out = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.proj_out(self.block(self.proj_in(x)))

torch.manual_seed(0)
transformer, vae = Transformer(), torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.SiLU())
x, image = torch.randn(3, 4), torch.randn(1, 1, 6, 6)
dump = MsprobeDump(sys.argv[2], sys.argv[3], 0)
with torch.no_grad():
    transformer.block[0].weight.mul_(float(sys.argv[5]))
    with dump.capture("transformer", transformer):
        out = transformer(x)
    transformer(x)  # after the capture: not dumped
    with dump.capture("vae", vae):
        vae(image)
torch.save(out, sys.argv[4])
"""


def _dump(tmp_path, name, scale_block=1.0):
    require_msprobe()
    root, out = tmp_path / name, tmp_path / f"{name}.pt"
    proc = subprocess.run([sys.executable, "-c", DUMP, str(OVERLAY), "statistics", str(root), str(out),
                           str(scale_block)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, torch.load(out)


def _dump_json(root, step):
    found = sorted((root / step).rglob("dump.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())["data"]


def test_each_call_is_one_msprobe_step_with_the_values_it_saw(tmp_path):
    root, out = _dump(tmp_path, "a")
    index = json.loads((root / "index.json").read_text())
    assert index["steps"] == {"transformer": "step0", "vae": "step1"} and index["level"] == "L0"
    transformer = _dump_json(root, "step0")
    assert "Module.proj_out.Linear.forward.0" in transformer
    assert not any("Conv2d" in k for k in transformer)
    assert not any(k.endswith("forward.1") for k in transformer)  # the call after the capture is not dumped
    stats = transformer["Module.proj_out.Linear.forward.0"]["output"][0]
    assert stats["shape"] == [3, 4]
    assert stats["Max"] == pytest.approx(out.max().item()) and stats["Norm"] == pytest.approx(out.norm().item())
    vae = _dump_json(root, "step1")
    assert vae and all(".Conv2d." in k or ".SiLU." in k for k in vae)  # the VAE call only
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step")) == ["step0", "step1"]


def test_msprobe_compare_reads_two_runs_dumps_and_finds_the_changed_module(tmp_path):
    golden, _ = _dump(tmp_path, "golden")
    target, _ = _dump(tmp_path, "target", scale_block=1.5)
    out_dir = tmp_path / "compare"
    tp, gp = (sorted((r / "step0").rglob("dump.json"))[0] for r in (target, golden))
    proc = subprocess.run([sys.executable, "-m", "msprobe.msprobe", "compare", "-tp", str(tp), "-gp", str(gp),
                           "-o", str(out_dir)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (result,) = out_dir.glob("compare_result_*.csv")
    rows = {r["NPU Name"]: r for r in csv.DictReader(result.open())}
    changed = {name for name, r in rows.items() if r["NormRelativeErr"] not in ("0", "0.0", "0%")}
    # the scaled weight, and everything downstream of it; nothing upstream of it
    assert "Module.block.0.Linear.forward.0.parameters.weight" in changed
    assert "Module.proj_out.Linear.forward.0.output.0" in changed
    assert "Module.proj_in.Linear.forward.0.output.0" not in changed
    assert "Module.proj_in.Linear.forward.0.output.0" in rows
