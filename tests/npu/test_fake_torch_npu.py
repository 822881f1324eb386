"""The FAKE torch_npu (tests/fakes) behaves like the real wheels it follows (2.7.1.post10,
2.10.0.post6, 2.7.1.post11, 2.10.0.post7; FAKE_TORCH_NPU_EMULATES) where the port depends on it.

One test per emulated behaviour; each fails when the fake is changed back to what it was
(no entry point, any device order accepted, one is_available() rule for every version, a
profiler that raises, refuses a path it only warns about or checks the relative path, a transfer_to_npu without side effects,
made-up error types).  tests/npu/test_torch_npu_wheel.py checks the same behaviours against
the wheels' sources.  The fake runs in fresh interpreters only: its registration with torch
cannot be undone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from snippet import run_snippet

FAKES = Path(__file__).resolve().parents[1] / "fakes"
pytestmark = pytest.mark.fake_npu

PROBE = r'''
import io, json, os, sys, contextlib
import torch
out = {"autoloaded": "torch_npu" in sys.modules,
       "autoload_env_after": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")}
import importlib.metadata as md
out["entry_points"] = sorted(f"{e.name}={e.value}" for e in md.entry_points(group="torch.backends"))
import torch_npu
counts = {}
for value in (None, "0,1", "2,3", "3,2", "1,1", "0,9", "", "2,3x1"):
    if value is None:
        os.environ.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    else:
        os.environ["ASCEND_RT_VISIBLE_DEVICES"] = value
    counts[str(value)] = [torch.npu.device_count(), torch.npu.is_available()]
out["counts"] = counts
os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "0,1"
try:
    torch.npu.get_device_name(5)
except Exception as e:
    out["bad_index"] = [type(e).__name__, str(e).splitlines()[0]]
os.environ.pop("ASCEND_RT_VISIBLE_DEVICES")

from torch_npu import profiler as p
import shutil, warnings
TOP = os.path.realpath(os.getcwd())
def trace(dir_name):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        handler = p.tensorboard_trace_handler(dir_name, worker_name="rank_0")
        prof = p.profile(activities=[p.ProfilerActivity.CPU, p.ProfilerActivity.NPU], on_trace_ready=handler)
        prof.start(); prof.stop()
    root = __import__("pathlib").Path(TOP)
    found = sorted(str(q.relative_to(root)) for q in root.rglob("*_ascend_pt"))
    for q in root.rglob("*_ascend_pt"):
        shutil.rmtree(q)
    return {"handler": handler is not None, "stdout": buf.getvalue(), "folders": found,
            "warnings": [f"{w.category.__name__}: {w.message}" for w in seen]}
os.makedirs("good", exist_ok=True)
out["good"] = trace("good")
os.makedirs("bad+dir", exist_ok=True)
os.chdir("bad+dir"); os.makedirs("rel", exist_ok=True)
out["relative_under_plus"] = trace("rel")
os.chdir("..")
os.symlink("good", "link")
out["symlink"] = trace("link")
open("a_file", "w").close()
out["file"] = trace("a_file")
try:
    p.profile([p.ProfilerActivity.CPU])
except TypeError as e:
    out["positional"] = "TypeError"

import warnings
def f(x): return x
import torch_npu.contrib.transfer_to_npu
out["filter"] = [f[0] for f in warnings.filters if f[1] is None and f[2] is Warning and f[3] is None]
out["imported"] = sorted(m for m in ("transformers.trainer", "accelerate.state") if m in sys.modules)
import accelerate.state
out["accelerate_wrapped"] = hasattr(accelerate.state.PartialState._prepare_backend, "__wrapped__")
out["jit_noop"] = torch.jit.script(f) is f
out["is_cuda_is_is_npu"] = torch.Tensor.is_cuda is torch.Tensor.is_npu
import torch.distributed as dist
try:
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
except Exception as e:
    out["nccl"] = str(e)
print(json.dumps(out))
'''


def run(code: str, tmp: Path, env: dict | None = None, check: bool = True):
    return run_snippet(code, tmp, [str(FAKES)], {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1", **(env or {})},
                       drop=("DANCEGRPO_", "ASCEND_", "FAKE_TORCH_NPU", "TORCH_DEVICE_BACKEND"), check=check)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    proc = run(PROBE, tmp_path_factory.mktemp("probe"))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_fake_says_it_is_one():
    text = (FAKES / "torch_npu" / "__init__.py").read_text()
    assert text.startswith('"""A FAKE ``torch_npu``') and "NOT Huawei's" in text and "EMULATED" in text
    assert "NOT emulated" in text


def test_import_torch_autoloads_it_through_the_entry_point(probe):
    assert probe["entry_points"] == ["torch_npu=torch_npu:_autoload"]
    assert probe["autoloaded"] is True and probe["autoload_env_after"] == "1"  # restored by _autoload()


def test_visible_devices_must_ascend_else_none(probe):
    assert probe["counts"] == {
        "None": [8, True], "0,1": [2, True], "2,3": [2, True],
        "3,2": [0, False], "1,1": [0, False],  # not strictly ascending: torch_npu sees no NPU
        "0,9": [1, True],  # cut at the first id that is not present
        "": [0, False], "2,3x1": [2, True],  # read up to the first character that is not a digit or comma
    }
    assert probe["bad_index"][0] == "AssertionError" and probe["bad_index"][1] == "Invalid device id"


def test_profiler_writes_real_folder_names(probe):
    good = probe["good"]
    assert good["handler"] and good["stdout"] == "" and good["warnings"] == []
    assert len(good["folders"]) == 1 and re.fullmatch(r"good/rank_0_\d+_\d{17}_ascend_pt", good["folders"][0])


def test_profiler_path_rule_warns_on_the_absolute_real_path_and_writes_the_trace(probe):
    plus = probe["relative_under_plus"]  # "rel" alone passes the rule; its real path has a '+'
    assert plus["handler"] is True and plus["stdout"] == ""
    assert len(plus["folders"]) == 1 and plus["folders"][0].startswith("bad+dir/rel/rank_0_")
    assert plus["warnings"][0].startswith("UserWarning: Invalid input path: /") and \
        plus["warnings"][0].endswith("bad+dir/rel")
    link = probe["symlink"]  # followed, with a warning
    assert link["handler"] is True and link["warnings"][0] == "UserWarning: Invalid input path is a soft chain: link"
    assert len(link["folders"]) == 1 and link["folders"][0].startswith("good/rank_0_")
    assert probe["positional"] == "TypeError"  # profile() takes keywords only


def test_profiler_swallows_what_it_refuses(probe):
    refused = probe["file"]  # a dir_name that is a file: the one refusal left, logged and swallowed
    assert refused["handler"] is False and refused["folders"] == []
    assert re.match(r"\[[\d\- :]+\] \[ERROR\] \[\d+\] profiler.py: Call tensorboard_trace_handler failed. "
                    r"Exception: Invalid input path is a file path", refused["stdout"])


def test_profiler_of_2_10_0_post7_calls_a_symbolic_link_so(tmp_path):
    code = """
        import os, warnings
        from torch_npu import profiler as p
        os.makedirs("good"); os.symlink("good", "link")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            p.tensorboard_trace_handler("link", worker_name="rank_0")
        print(seen[0].message)
    """
    out = run(code, tmp_path, {"FAKE_TORCH_NPU_EMULATES": "2.10.0.post7"})
    assert out.stdout.strip() == "Invalid input path is a symbolic link: link"


def test_transfer_to_npu_side_effects(probe):
    assert "once" in probe["filter"]  # for every warning of the process
    assert probe["imported"] == ["accelerate.state", "transformers.trainer"]
    assert probe["accelerate_wrapped"] is True
    assert probe["jit_noop"] is True and probe["is_cuda_is_is_npu"] is True
    assert "hccl" in probe["nccl"] and "nccl" not in probe["nccl"].replace("hccl", "")


def test_without_cann_import_torch_itself_fails(tmp_path):
    proc = run("import torch", tmp_path, {"FAKE_TORCH_NPU_BROKEN": "1"}, check=False)
    assert proc.returncode != 0
    assert "RuntimeError: Failed to load the backend extension: torch_npu. You can disable extension auto-loading " \
           "with TORCH_DEVICE_BACKEND_AUTOLOAD=0." in proc.stderr
    assert "ImportError: libhccl.so: cannot open shared object file: No such file or directory\n" in proc.stderr
    out = run("import sys, torch; print('torch_npu' in sys.modules)", tmp_path,
              {"FAKE_TORCH_NPU_BROKEN": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out.stdout.strip() == "False"


def test_without_cann_the_import_error_is_the_loaders_own(tmp_path):
    """These wheels import torch_npu._C before the code that would add CANN's advice: the
    ImportError is the dynamic loader's, for the module torch_npu._C, with nothing added."""
    code = """
        import torch
        try:
            import torch_npu
        except ImportError as e:
            print(e.name, "|", str(e))
    """
    out = run(code, tmp_path, {"FAKE_TORCH_NPU_BROKEN": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out.stdout.strip() == "torch_npu._C | libhccl.so: cannot open shared object file: No such file or directory"


def test_cann_package_check_raises_a_bare_exception(tmp_path):
    code = """
        import torch
        try:
            import torch_npu
        except BaseException as e:
            print(type(e).__module__, type(e).__name__, str(e).splitlines()[0])
    """
    out = run(code, tmp_path, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "ASCEND_HOME_PATH": str(tmp_path / "none")})
    assert out.stdout.strip() == f"builtins Exception ASCEND_HOME_PATH : {tmp_path / 'none'} does not exist. " \
                                 "Please run 'source set_env.sh' in the CANN installation path."


def test_a_second_accelerator_is_refused_but_npu_is_not_a_second(tmp_path):
    code = """
        import types, torch
        torch._C._get_accelerator = lambda: types.SimpleNamespace(type="cuda")
        try:
            import torch_npu
        except RuntimeError as e:
            print(str(e).splitlines()[0])
        torch._C._get_accelerator = lambda: types.SimpleNamespace(type="npu")  # torch_npu's own, registered
        import torch_npu
        print("npu accepted", torch_npu.__fake__)
    """
    out = run(code, tmp_path, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    lines = out.stdout.splitlines()
    assert lines[0].startswith("Two accelerators cannot be used at the same time in PyTorch: npu and cuda.")
    assert lines[1] == "npu accepted True"


def test_the_fake_shadows_an_installed_torch_npu(tmp_path):
    """On a 910B node with the real torch_npu installed, the fake's dist-info comes first on the
    path: importlib.metadata keeps the first distribution of a name, so torch loads the fake."""
    site = tmp_path / "site"
    info = site / "torch_npu-2.10.0.post6.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.10.0.post6\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = not_there:_autoload\n")
    proc = run_snippet("import torch, torch_npu; print(torch_npu.__fake__)", tmp_path, [str(FAKES), str(site)],
                       {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}, drop=("ASCEND_", "FAKE_TORCH_NPU"))
    assert proc.stdout.strip() == "True"
    proc = run_snippet("import torch", tmp_path, [str(site), str(FAKES)], {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"},
                       check=False)
    assert "Failed to load the backend extension: torch_npu" in proc.stderr  # the other order: the "real" one


COUNTS = r"""
import json, os, torch, torch_npu
out = {"emulates": torch_npu.__emulates__}
for hal in (None, "1"):
    if hal is None:
        os.environ.pop("PYTORCH_HAL_BASED_NPU_CHECK", None)
    else:
        os.environ["PYTORCH_HAL_BASED_NPU_CHECK"] = hal
    for value in ("0,1", "3,2", "1,1", "0,9", "9", ""):
        os.environ["ASCEND_RT_VISIBLE_DEVICES"] = value
        out[f"{value} hal={hal}"] = [torch.npu.device_count(), torch.npu.is_available()]
print(json.dumps(out))
"""


@pytest.mark.parametrize("emulates", [None, "2.7.1.post10", "2.10.0.post6"])
def test_is_available_is_device_count_above_0(tmp_path, emulates):
    env = {} if emulates is None else {"FAKE_TORCH_NPU_EMULATES": emulates}
    got = json.loads(run(COUNTS, tmp_path, env).stdout.strip().splitlines()[-1])
    assert got.pop("emulates") == (emulates or "2.10.0.post6")
    for hal in ("None", "1"):  # PYTORCH_HAL_BASED_NPU_CHECK means nothing to these versions
        assert {k.rsplit(" ", 1)[0]: v for k, v in got.items() if k.endswith(f"hal={hal}")} == {
            "0,1": [2, True], "3,2": [0, False], "1,1": [0, False], "0,9": [1, True], "9": [0, False], "": [0, False]}


@pytest.mark.parametrize("emulates", ["2.10.0.post7", "2.7.1.post11"])
def test_is_available_of_the_cann_92_wheels_is_the_runtimes_count_unless_hal_based(tmp_path, emulates):
    got = json.loads(run(COUNTS, tmp_path, {"FAKE_TORCH_NPU_EMULATES": emulates}).stdout.strip().splitlines()[-1])
    assert got.pop("emulates") == emulates
    # the runtime's count (assumed: the listed ids that are present, in any order): an NPU is
    # "available" that device_count() does not count
    assert {k.rsplit(" ", 1)[0]: v for k, v in got.items() if k.endswith("hal=None")} == {
        "0,1": [2, True], "3,2": [0, True], "1,1": [0, True], "0,9": [1, True], "9": [0, False], "": [0, False]}
    # PYTORCH_HAL_BASED_NPU_CHECK=1: device_count() > 0, as before
    assert {k.rsplit(" ", 1)[0]: v for k, v in got.items() if k.endswith("hal=1")} == {
        "0,1": [2, True], "3,2": [0, False], "1,1": [0, False], "0,9": [1, True], "9": [0, False], "": [0, False]}


def test_an_unknown_emulated_version_is_refused(tmp_path):
    code = """
        import torch
        try:
            import torch_npu
        except ImportError as e:
            print(e)
    """
    out = run(code, tmp_path, {"FAKE_TORCH_NPU_EMULATES": "2.7.1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out.stdout.strip() == ("fake torch_npu: FAKE_TORCH_NPU_EMULATES='2.7.1' is not one of 2.7.1.post10, "
                                  "2.10.0.post6, 2.7.1.post11, 2.10.0.post7")


@pytest.mark.parametrize("emulates, after", [("2.10.0.post6", "0"), ("2.7.1.post10", "0"), ("2.7.1.post11", "1"),
                                             ("2.10.0.post7", "1")])
def test_import_torch_npu_first_leaves_autoload_as_that_version_does(tmp_path, emulates, after):
    """``import torch_npu`` before torch: 2.7.1.post11 and 2.10.0.post7 restore the switch at the end of
    their import."""
    code = "import os, torch_npu; print(os.environ.get('TORCH_DEVICE_BACKEND_AUTOLOAD'))"
    proc = run_snippet(code, tmp_path, [str(FAKES)], {"FAKE_TORCH_NPU_EMULATES": emulates},
                       drop=("DANCEGRPO_", "ASCEND_", "FAKE_TORCH_NPU", "TORCH_DEVICE_BACKEND"))
    assert proc.stdout.strip() == after


def test_profile_takes_custom_trace_id_callback(tmp_path):
    code = """
        from torch_npu import profiler as p
        prof = p.profile(activities=[p.ProfilerActivity.CPU], custom_trace_id_callback=lambda: "id", use_cuda=None)
        print(type(prof).__name__)
    """
    assert run(code, tmp_path).stdout.strip() == "profile"


def test_transfer_to_npu_wraps_init_process_group_for_cuda_and_nccl(tmp_path):
    """_compose_wrappers(_wrapper_cuda, _wrapper_hccl): backends and CUDA devices become the NPU's."""
    code = """
        import json, torch
        import torch.distributed as dist
        got = []
        dist.init_process_group = lambda *a, **k: got.append([[str(x) for x in a], {n: str(v) for n, v in k.items()}])
        import torch_npu.contrib.transfer_to_npu
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=torch.device("cuda", 1))
        dist.init_process_group(backend="nccl", device_id=2)
        dist.init_process_group(backend="gloo", device_id=torch.device("cpu"))
        print(json.dumps(got))
    """
    got = json.loads(run(code, tmp_path, {"FAKE_TORCH_NPU_LIBRARIES": "skip"}).stdout.strip().splitlines()[-1])
    assert got == [[["cpu:gloo,npu:hccl"], {"device_id": "npu:1"}],
                   [[], {"backend": "hccl", "device_id": "npu:2"}],
                   [[], {"backend": "gloo", "device_id": "cpu"}]]


def test_the_fake_says_what_it_emulates(tmp_path):
    code = "import torch, torch_npu; print(torch_npu.__emulates__, torch_npu.__fake__)"
    assert run(code, tmp_path).stdout.strip() == "2.10.0.post6 True"
    assert run(code, tmp_path, {"FAKE_TORCH_NPU_EMULATES": "2.7.1.post10"}).stdout.strip() == "2.7.1.post10 True"


VARLEN = """
import json, math, torch, torch_npu
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(7, 2, 4, generator=g) for _ in range(3))  # TND: 7 tokens, 2 heads
mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1)

def by_hand(q_ranges, kv_ranges, shift=None):
    # each query segment attends to its key segment; shift: causal from the top-left (0) or the
    # bottom-right (skv - sq) corner
    out = []
    for (qa, qb), (ka, kb) in zip(q_ranges, kv_ranges):
        scores = torch.einsum("qhd,khd->hqk", q[qa:qb], k[ka:kb]) * 0.5
        if shift is not None:
            sq, skv = qb - qa, kb - ka
            later = torch.arange(skv)[None, :] > torch.arange(sq)[:, None] + (shift if shift == 0 else skv - sq)
            scores = scores.masked_fill(later, -math.inf)
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v[ka:kb]))
    return torch.cat(out)

def fa(qq=None, **kw):
    kw = {"scale": 0.5, **kw}
    return torch_npu.npu_fusion_attention(q if qq is None else qq, k, v, 2, "TND", **kw)[0]

def diff(a, b):
    return float((a - b).abs().max())

res = {}
two = [(0, 3), (3, 7)]
res["full"] = diff(fa(actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7]), by_hand(two, two))
res["no_mask_is_full_whatever_the_mode"] = diff(fa(actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7], sparse_mode=3),
                                                by_hand(two, two))
# fewer queries than keys: leftUp (2) and rightDown (3) differ
qs = q[:4]
for mode, shift in ((2, 0), (3, "bottom-right")):
    got = torch_npu.npu_fusion_attention(qs, k, v, 2, "TND", scale=0.5, atten_mask=mask, sparse_mode=mode,
                                         actual_seq_qlen=[2, 4], actual_seq_kvlen=[3, 7])[0]
    want = by_hand([(0, 2), (2, 4)], [(0, 3), (3, 7)], shift)
    res[f"causal {mode}"] = float((got - want.to(got.dtype)).abs().max()) if got.shape == want.shape else str(got.shape)
res["modes differ"] = diff(*(torch_npu.npu_fusion_attention(qs, k, v, 2, "TND", scale=0.5, atten_mask=mask, sparse_mode=m,
                                                            actual_seq_qlen=[2, 4], actual_seq_kvlen=[3, 7])[0]
                              for m in (2, 3)))
refused = {}
for name, call in {
    "no lengths": lambda: fa(),
    "a tensor of lengths": lambda: fa(actual_seq_qlen=torch.tensor([3, 7]), actual_seq_kvlen=[3, 7]),
    "not cumulative": lambda: fa(actual_seq_qlen=[3, 2, 7], actual_seq_kvlen=[3, 2, 7]),
    "batches left out": lambda: fa(actual_seq_qlen=[3, 0], actual_seq_kvlen=[3, 0]),
    "no tokens": lambda: fa(q[:0], actual_seq_qlen=[0], actual_seq_kvlen=[7]),
    "another causal mask": lambda: fa(actual_seq_qlen=[7], actual_seq_kvlen=[7], atten_mask=mask[:7, :7],
                                      sparse_mode=3),
    "a mask in sparse_mode 0": lambda: fa(actual_seq_qlen=[7], actual_seq_kvlen=[7], atten_mask=mask),
    "BSND in sparse_mode 3": lambda: torch_npu.npu_fusion_attention(q[None], k[None], v[None], 2, "BSND",
                                                                    sparse_mode=3),
}.items():
    try:
        call()
        refused[name] = "ran"
    except Exception as e:
        refused[name] = type(e).__name__
res["refused"] = refused
print(json.dumps(res))
"""


def test_fusion_attention_varlen_tnd(tmp_path):
    """Layout TND, as the wheels' docs give it (tests/npu/test_torch_npu_wheel.py reads them): each
    segment of the cumulative actual_seq_qlen attends to its segment of actual_seq_kvlen only;
    sparse_mode 2 / 3 with the compressed 2048x2048 mask are causal from the top-left / the
    bottom-right corner; no mask is the full computation whatever the mode; what the docs leave
    open is refused."""
    got = json.loads(run(VARLEN, tmp_path, {"DANCEGRPO_DEVICE": "npu"}).stdout.strip().splitlines()[-1])
    for key in ("full", "no_mask_is_full_whatever_the_mode", "causal 2", "causal 3"):
        assert got[key] < 1e-6, (key, got[key])
    assert got["modes differ"] > 1e-3
    assert got["refused"] == {
        "no lengths": "RuntimeError", "a tensor of lengths": "TypeError", "not cumulative": "RuntimeError",
        "batches left out": "NotImplementedError", "no tokens": "RuntimeError", "another causal mask": "RuntimeError",
        "a mask in sparse_mode 0": "NotImplementedError", "BSND in sparse_mode 3": "NotImplementedError"}
