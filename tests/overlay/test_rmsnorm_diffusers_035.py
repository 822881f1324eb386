"""RMSNorm routed by the run's device with diffusers 0.35 itself (not a simulated module global).

diffusers >= 0.35's ``RMSNorm.forward`` calls ``torch_npu.npu_rms_norm`` whenever torch_npu
imports; Qwen-Image's qk-norms are RMSNorms.  Under the diffusers-0.35 dependency set and the
fake torch_npu (which refuses a kernel call off the NPU, as the real kernel cannot take CPU
tensors): on a CPU run ``choose_diffusers_kernels`` sends RMSNorm down its plain path; on an
NPU run diffusers' choice stands.  Skipped with the reason when the set is not installed.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from overlay_runner import FAKES, OVERLAY

CODE = """
    import json, torch, torch_npu
    from dancegrpo_port import device
    device.activate()
    import diffusers
    from diffusers.models.normalization import RMSNorm
    norm = RMSNorm(8, eps=1e-6)
    x = torch.randn(2, 8)
    try:
        norm(x)
        before = "ran"
    except RuntimeError as e:
        before = str(e).split(":")[1].strip().split()[0]
    changed = device.choose_diffusers_kernels()
    out = norm(x)
    print(json.dumps({"diffusers": diffusers.__version__[:4], "before": before, "changed": changed,
                      "finite": bool(torch.isfinite(out).all()),
                      "npu_rms_norm": sum(c[0] == "npu_rms_norm" for c in torch_npu.calls)}))
"""


@pytest.mark.fake_npu
def test_rmsnorm_follows_the_run_device_with_diffusers_035(tmp_path):
    import os

    from depset_035 import diffusers_035_python

    python = diffusers_035_python()
    script = tmp_path / "snippet.py"
    script.write_text(textwrap.dedent(CODE))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DANCEGRPO_", "ASCEND_RT_VISIBLE_DEVICES", "FAKE_TORCH_NPU"))}
    base.update(PYTHONPATH=f"{OVERLAY}{os.pathsep}{FAKES}", OMP_NUM_THREADS="1", TORCH_DEVICE_BACKEND_AUTOLOAD="1",
                FAKE_TORCH_NPU_LIBRARIES="skip")
    got = {}
    for kind in ("cpu", "npu"):
        proc = subprocess.run([python, str(script)], env={**base, "DANCEGRPO_DEVICE": kind}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got[kind] = json.loads(proc.stdout.splitlines()[-1])
    assert got["cpu"]["diffusers"] == "0.35"
    assert {k: got["cpu"][k] for k in ("before", "finite", "npu_rms_norm")} == {"before": "npu_rms_norm", "finite": True, "npu_rms_norm": 0}
    assert "diffusers.models.normalization" in got["cpu"]["changed"]
    # on the NPU only GEGLU's form is chosen (DANCEGRPO_NPU_GELU=exact): RMSNorm keeps diffusers' kernel
    assert {k: got["npu"][k] for k in ("before", "changed", "npu_rms_norm")} == {
        "before": "ran", "changed": ["diffusers.models.activations"], "npu_rms_norm": 2}
