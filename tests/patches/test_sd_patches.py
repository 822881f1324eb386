"""The Stable Diffusion trainer's own patches on the patched tree: its configuration loads where
``imp`` is gone (Python 3.12), and DDIM's per-step noise comes from the seam's source, upstream's
draw when the seam gives none."""

from __future__ import annotations

import json
import subprocess

import pytest
from patched_tree_runner import run_in_tree  # noqa: F401  (fixture)

pytestmark = pytest.mark.upstream
pytest.importorskip("torch")

NO_IMP = r"""
import importlib.util, json, sys
sys.modules["imp"] = None  # Python 3.12 has no imp: `import imp` raises ImportError
path = sys.argv[1]
spec = importlib.util.spec_from_file_location("dgx", path)
module = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(module)
    config = module.get_config("hpsv2")
    print(json.dumps({"loaded": True, "reward_fn": config.reward_fn, "generations": config.num_generations}))
except ImportError as exc:
    print(json.dumps({"loaded": False, "error": str(exc)}))
"""


def test_the_sd_configuration_loads_without_imp(run_in_tree, patched_tree, tmp_path):
    pytest.importorskip("ml_collections")
    patched = patched_tree.tree / "fastvideo/config_sd/dgx.py"
    got = json.loads(run_in_tree(NO_IMP, args=(str(patched),)).stdout.strip().splitlines()[-1])
    assert got == {"loaded": True, "reward_fn": "hpsv2", "generations": 16}
    # upstream's own file, beside its base.py, does not load there: what the patch is for
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    for name in ("dgx.py", "base.py"):
        text = subprocess.run(["git", "-C", str(patched_tree.tree), "show", f"HEAD:fastvideo/config_sd/{name}"],
                              capture_output=True, text=True, check=True).stdout
        (upstream / name).write_text(text)
    got = json.loads(run_in_tree(NO_IMP, args=(str(upstream / "dgx.py"),)).stdout.strip().splitlines()[-1])
    assert got["loaded"] is False and "imp" in got["error"]


DDIM = r"""
import json, torch
from diffusers import DDIMScheduler
from fastvideo.models.stable_diffusion.ddim_with_logprob import ddim_step_with_logprob
scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1,
                          clip_sample=False, set_alpha_to_one=False)
scheduler.set_timesteps(6)
torch.manual_seed(0)
sample, output = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
t = scheduler.timesteps[2]
noise = torch.randn(2, 4, 8, 8)
given, log_prob = ddim_step_with_logprob(scheduler, output, t, sample, eta=1.0, variance_noise=noise)
recomputed, _ = ddim_step_with_logprob(scheduler, output, t, sample, eta=1.0, prev_sample=given)
mean, _ = ddim_step_with_logprob(scheduler, output, t, sample, eta=1.0, variance_noise=torch.zeros_like(noise))
torch.manual_seed(1); drawn, _ = ddim_step_with_logprob(scheduler, output, t, sample, eta=1.0)
torch.manual_seed(1); upstream_draw = torch.randn(2, 4, 8, 8)
one, _ = ddim_step_with_logprob(scheduler, output, t, sample, eta=1.0, variance_noise=torch.ones_like(noise))
std = one - mean  # the step's std_dev_t, everywhere
print(json.dumps({"noise_given": bool(torch.allclose(given, mean + std * noise, atol=1e-5)),
                  "recomputed": bool(torch.equal(recomputed, given)),
                  "drawn_is_upstreams": bool(torch.allclose(drawn, mean + std * upstream_draw, atol=1e-5))}))
"""


def test_ddim_takes_the_seams_noise_and_draws_upstreams_without_it(run_in_tree):
    got = json.loads(run_in_tree(DDIM).stdout.strip().splitlines()[-1])
    assert got == {"noise_given": True, "recomputed": True, "drawn_is_upstreams": True}
