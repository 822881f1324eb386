"""overlay/dancegrpo_port/device/: DANCEGRPO_DEVICE / DANCEGRPO_NPU_STRICT (contract 2), through the
package's public face as the patches call it; what it does not export, from its concern modules."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from overlay_runner import run_python  # noqa: F401  (puts overlay/ on sys.path; run_python is a fixture)

torch = pytest.importorskip("torch")

from dancegrpo_port.contract import DEVICE_ENV, STRICT_ENV  # noqa: E402  (overlay/ is on sys.path, see overlay_runner)
from dancegrpo_port.device import DeviceSelectionError  # noqa: E402
from dancegrpo_port.device import choice  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value, kind", [(None, "auto"), ("", "auto"), ("CPU", "cpu"), (" npu ", "npu"), ("cuda", "cuda")])
def test_requested_kind(value, kind):
    env = {} if value is None else {DEVICE_ENV: value}
    assert choice.requested_kind(env) == kind


def test_unknown_device_is_refused_with_the_choices():
    with pytest.raises(DeviceSelectionError, match=r"DANCEGRPO_DEVICE='gpu' is not one of auto, cpu, cuda, npu"):
        choice.requested_kind({DEVICE_ENV: "gpu"})


@pytest.mark.parametrize("value, strict", [("1", True), ("true", True), ("ON", True), ("0", False), ("", False), (None, False)])
def test_strict_requested(value, strict):
    env = {} if value is None else {STRICT_ENV: value}
    assert choice.strict_requested(env) is strict


def test_backends_and_autocast_types():
    assert [choice.Accelerator(k, False).dist_backend for k in ("npu", "cuda", "cpu")] == ["hccl", "nccl", "gloo"]
    assert choice.Accelerator("npu", False).autocast_device_type == "npu"


def test_cpu_is_always_possible_and_auto_falls_back_without_torch_npu():
    assert choice.resolve_kind("cpu") == "cpu"
    if choice._import_torch_npu() is not None:
        pytest.skip("a torch_npu is installed here")
    assert choice.resolve_kind("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def test_npu_without_torch_npu_says_what_to_install():
    if choice._import_torch_npu() is not None:
        pytest.skip("a torch_npu is installed here")
    with pytest.raises(DeviceSelectionError, match="torch_npu is not installed"):
        choice.resolve_kind("npu")


def test_cuda_without_cuda_is_an_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(DeviceSelectionError, match="torch.cuda.is_available"):
        choice.resolve_kind("cuda")


def test_cpu_run(run_python):
    out = run_python(
        """
        import json, torch
        from dancegrpo_port import device
        acc = device.activate()
        x = torch.randn(4, 4)
        with device.autocast(torch.bfloat16):
            y = x @ x
        print(json.dumps({"kind": acc.kind, "strict": acc.strict, "backend": device.dist_backend(),
                          "dev": str(device.set_local_device(3)), "cur": str(device.current_device()),
                          "autocast_dtype": str(y.dtype), "same": device.activate() is acc,
                          "offload": [device.fsdp_cpu_offload_supported(), device.fsdp_sync_module_states_supported(),
                                      device.full_state_dict_cpu_offload()]}))
        """,
        env={"DANCEGRPO_DEVICE": "cpu"},
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"kind": "cpu", "strict": False, "backend": "gloo", "dev": "cpu", "cur": "cpu",
                   "autocast_dtype": "torch.bfloat16", "same": True, "offload": [False, False, False]}


def test_start_distributed_starts_the_group_on_the_backend_then_returns_the_device(run_python):
    """The trainers' start (upstream's init_process_group("nccl"), set_device, current_device): on a
    CPU run a gloo group, and the CPU as a torch.device."""
    out = run_python(
        """
        import json, os
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1")
        from dancegrpo_port import device
        device.activate()
        import torch.distributed as dist
        got = device.start_distributed(0)
        print(json.dumps({"device": str(got), "type": type(got).__name__, "backend": dist.get_backend(),
                          "world": dist.get_world_size()}))
        dist.destroy_process_group()
        """,
        env={"DANCEGRPO_DEVICE": "cpu"},
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"device": "cpu", "type": "device", "backend": "gloo", "world": 1}


def test_strict_env_switches_strict_mode_on_for_the_process(run_python, tmp_path):
    out = run_python(
        """
        import torch
        from dancegrpo_port import device
        from dancegrpo_port.strict_mode import StrictModeError
        weight = torch.ones(3, dtype=torch.float64, requires_grad=True)  # before strict mode
        assert device.activate().strict
        def caught(run):
            try:
                run()
            except StrictModeError as e:
                print("caught:", e)
        class Doubles(torch.nn.Module):
            def forward(self, x):
                return x.double()
        caught(lambda: Doubles()(torch.ones(2)))
        caught(lambda: torch.arange(3, dtype=torch.float64))  # outside modules: the GRPO math is there
        caught(lambda: (weight.float() * 2).sum().backward())  # float32 forward, float64 backward
        """,
        env={"DANCEGRPO_DEVICE": "cpu", "DANCEGRPO_NPU_STRICT": "1"},
    )
    caught = [line.split("; the Ascend")[0] for line in out.stdout.splitlines()]
    assert caught == [
        "caught: strict mode: aten._to_copy.default made a torch.float64 tensor on cpu in Doubles (Doubles)",
        "caught: strict mode: aten.arange.default made a torch.float64 tensor on cpu outside modules: "
        f"{tmp_path / 'snippet.py'}:16 (<lambda>)",
        "caught: strict mode: aten._to_copy.default made a torch.float64 tensor on cpu in backward of ToCopyBackward0",
    ]


def test_bad_device_env_fails_activation(run_python):
    proc = run_python("from dancegrpo_port import device; device.activate()", env={"DANCEGRPO_DEVICE": "tpu"}, check=False)
    assert proc.returncode != 0 and "DANCEGRPO_DEVICE='tpu' is not one of" in proc.stderr


def test_broadcast_module_states_gives_every_rank_rank0s_weights(run_python, tmp_path):
    out = run_python(
        f"""
        import torch, torch.distributed as dist, torch.multiprocessing as mp
        from dancegrpo_port import device

        def work(rank):
            dist.init_process_group("gloo", init_method="file://{tmp_path}/rendezvous", rank=rank, world_size=2)
            torch.manual_seed(100 + rank)  # as the LoRA trainer seeds: seed + rank
            m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
            m[1].running_mean.fill_(rank)
            device.broadcast_module_states(m)
            flat = torch.cat([t.flatten() for t in list(m.parameters()) + list(m.buffers())])
            gathered = [torch.zeros_like(flat) for _ in range(2)]
            dist.all_gather(gathered, flat)
            torch.manual_seed(100)
            want = torch.nn.Linear(3, 4)
            if rank == 0:
                print("equal", torch.equal(gathered[0], gathered[1]), torch.equal(m[0].weight, want.weight),
                      float(m[1].running_mean.sum()))
            dist.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(work, nprocs=2)
        """,
        env={"DANCEGRPO_DEVICE": "cpu"},
    )
    assert "equal True True 0.0" in out.stdout


@pytest.mark.parametrize("refuse_avg", [False, True], ids=["avg-taken", "avg-refused"])
def test_all_reduce_mean_is_the_mean_whether_or_not_gloo_takes_avg(run_python, tmp_path, refuse_avg):
    """On 2 gloo ranks: the mean of 1.0 and 4.0.  ``avg-refused`` makes gloo refuse AVG as torch
    2.7.1's does (its message, raised before any rank sends); the suite's torch takes AVG."""
    out = run_python(
        f"""
        import torch, torch.distributed as dist, torch.multiprocessing as mp
        from dancegrpo_port import device

        def work(rank):
            dist.init_process_group("gloo", init_method="file://{tmp_path}/rendezvous", rank=rank, world_size=2)
            real, ops = dist.all_reduce, []
            def all_reduce(tensor, op=dist.ReduceOp.SUM, **kw):
                ops.append(str(op))
                if {refuse_avg} and op == dist.ReduceOp.AVG:
                    raise RuntimeError("Cannot use ReduceOp.AVG with Gloo")
                return real(tensor, op=op, **kw)
            dist.all_reduce = all_reduce
            value = torch.tensor([1.0 if rank == 0 else 4.0])
            device.all_reduce_mean(value)
            mine = [value.item(), [o.split(".")[-1] for o in ops]]
            everyone = [None, None]
            dist.all_gather_object(everyone, mine)
            if rank == 0:  # one line: the ranks' own prints would interleave
                print("ranks", everyone)
            dist.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(work, nprocs=2)
        """,
        env={"DANCEGRPO_DEVICE": "cpu"},
    )
    ops = ["AVG", "SUM"] if refuse_avg else ["AVG"]
    assert f"ranks [[2.5, {ops}], [2.5, {ops}]]" in out.stdout, out.stdout


# what `from dancegrpo_port import device` imports: the package, its concern modules and the contract
DEVICE_MODULES = ["dancegrpo_port", "dancegrpo_port.contract", "dancegrpo_port.device", "dancegrpo_port.device.choice",
                  "dancegrpo_port.device.distributed", "dancegrpo_port.device.kernels", "dancegrpo_port.device.matmul",
                  "dancegrpo_port.device.mixed_precision"]


@pytest.mark.fake_npu
def test_auto_picks_the_npu_and_imports_transfer_to_npu_first(run_python):
    out = run_python(
        """
        import json, torch
        from dancegrpo_port import device
        acc = device.activate()
        import torch_npu
        assert torch_npu.__fake__
        print(json.dumps({"kind": acc.kind, "backend": device.dist_backend(), "dev": str(device.set_local_device(1)),
                          "cur": str(device.current_device()), "autocast": acc.autocast_device_type,
                          "transfer": torch_npu.transfer_state,
                          "offload": [device.fsdp_cpu_offload_supported(), device.full_state_dict_cpu_offload()]}))
        """,
        fake_npu=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # transfer_to_npu came before CUDA and before anything but the device package itself
    assert got.pop("transfer") == {"cuda_initialized": False,
                                   "already_imported": DEVICE_MODULES}
    assert got == {"kind": "npu", "backend": "hccl", "dev": "npu:1", "cur": "npu:1", "autocast": "npu",
                   "offload": [True, True]}


@pytest.mark.fake_npu
def test_npu_requested_but_none_visible(run_python):
    proc = run_python("from dancegrpo_port import device; device.activate()", fake_npu=True, check=False,
                      env={"DANCEGRPO_DEVICE": "npu", "FAKE_TORCH_NPU_DEVICES": "0"})
    assert proc.returncode != 0 and "DANCEGRPO_DEVICE=npu but torch_npu sees no NPU" in proc.stderr


# 2.10.0.post7's is_available() is the CANN runtime's count: True for "3,2", where device_count() is 0
EMULATED = ["2.10.0.post6", "2.10.0.post7"]


@pytest.mark.fake_npu
@pytest.mark.parametrize("emulates", EMULATED)
def test_auto_with_torch_npu_but_no_npu_visible_refuses_instead_of_training_on_the_cpu(run_python, emulates):
    # "3,2": torch_npu's device_count() is 0 for a list that does not ascend
    proc = run_python("from dancegrpo_port import device; device.activate()", fake_npu=True, check=False,
                      env={"ASCEND_RT_VISIBLE_DEVICES": "3,2", "FAKE_TORCH_NPU_EMULATES": emulates})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("dancegrpo_port.device.choice.DeviceSelectionError: DANCEGRPO_DEVICE=auto: torch_npu is "
                           "installed but sees no NPU (ASCEND_RT_VISIBLE_DEVICES '3,2'); check ASCEND_RT_VISIBLE_DEVICES")
    assert "`npu-smi info`" in last


@pytest.mark.fake_npu
@pytest.mark.parametrize("emulates", EMULATED)
def test_npu_requested_with_a_descending_list_is_refused_before_set_device(run_python, emulates):
    code = """
        import torch
        from dancegrpo_port import device
        print("is_available", torch.npu.is_available(), "device_count", torch.npu.device_count(), flush=True)
        device.activate()
    """
    proc = run_python(code, fake_npu=True, check=False, env={
        "DANCEGRPO_DEVICE": "npu", "ASCEND_RT_VISIBLE_DEVICES": "3,2", "FAKE_TORCH_NPU_EMULATES": emulates})
    assert proc.stdout.split() == ["is_available", str(emulates == "2.10.0.post7"), "device_count", "0"]
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "dancegrpo_port.device.choice.DeviceSelectionError: DANCEGRPO_DEVICE=npu but torch_npu sees no NPU")


@pytest.mark.fake_npu
def test_cpu_requested_on_an_npu_host_skips_transfer_to_npu(run_python):
    """torch imports torch_npu inside `import torch` on an Ascend host (its entry point), whatever
    DANCEGRPO_DEVICE says; a CPU run leaves transfer_to_npu out, and TORCH_DEVICE_BACKEND_AUTOLOAD=0
    keeps torch_npu out too."""
    code = """
        import sys
        from dancegrpo_port import device
        print(device.activate().kind, "torch_npu" in sys.modules, "torch_npu.contrib.transfer_to_npu" in sys.modules)
    """
    out = run_python(code, fake_npu=True, env={"DANCEGRPO_DEVICE": "cpu"})
    assert out.stdout.split() == ["cpu", "True", "False"]
    out = run_python(code, fake_npu=True, env={"DANCEGRPO_DEVICE": "cpu", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out.stdout.split() == ["cpu", "False", "False"]


@pytest.mark.fake_npu
def test_without_cann_the_device_module_says_what_to_source_in_one_line(run_python):
    for env in ({}, {"DANCEGRPO_DEVICE": "cpu"}):  # autoload: even a CPU run cannot import torch
        proc = run_python("from dancegrpo_port import device", fake_npu=True, check=False,
                          env={"FAKE_TORCH_NPU_BROKEN": "1", **env})
        assert proc.returncode != 0
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("dancegrpo_port.device.choice.DeviceSelectionError: import torch failed loading torch_npu "
                               "(ImportError: libhccl.so: cannot open shared object file")
        assert "source CANN's set_env.sh" in last and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in last
    code = """
        from dancegrpo_port import device
        print(device.activate().kind, flush=True)
        import diffusers.models.activations  # imports torch_npu where it is installed, whatever torch did
    """
    proc = run_python(code, fake_npu=True, check=False,
                      env={"FAKE_TORCH_NPU_BROKEN": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "DANCEGRPO_DEVICE": "cpu"})
    assert proc.stdout.strip() == "cpu"  # autoload off: torch and the device module start ...
    assert proc.returncode != 0 and "ImportError: libhccl.so" in proc.stderr  # ... diffusers does not


@pytest.mark.fake_npu
@pytest.mark.parametrize("env, error", [
    ({"FAKE_TORCH_NPU_BROKEN": "1"}, "(ImportError: libhccl.so: cannot open shared object file"),
    ({"ASCEND_HOME_PATH": "/nonexistent/Ascend"}, "(Exception: ASCEND_HOME_PATH : /nonexistent/Ascend does not exist."),
])
def test_a_broken_torch_npu_is_reported_not_ignored(run_python, env, error):
    """With autoload off the device module imports torch_npu itself; an ImportError and the bare
    Exception of CANN's package check are both one DeviceSelectionError."""
    proc = run_python("from dancegrpo_port import device; device.activate()", fake_npu=True, check=False,
                      env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **env})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dancegrpo_port.device.choice.DeviceSelectionError: torch_npu is installed but does not import {error}")
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in last


@pytest.mark.fake_npu
def test_the_reward_gelu_is_exact_on_the_npu_unless_switched_back(run_python):
    code = """
        import json, torch, torch_npu
        from dancegrpo_port import device
        acc = device.activate()
        x = torch.linspace(-4, 4, 9)
        exact = torch.nn.GELU()(x)
        tanh = torch.nn.GELU(approximate="tanh")(x)
        print(json.dumps({"gelu": acc.gelu, "calls": [c[1] for c in torch_npu.calls if c[0] == "npu_gelu"],
                          "exact": torch.allclose(exact, torch.nn.functional.gelu(x))}))
    """
    got = json.loads(run_python(code, fake_npu=True, env={"DANCEGRPO_DEVICE": "npu"}).stdout.splitlines()[-1])
    assert got == {"gelu": "torch_npu.npu_gelu", "calls": [{"approximate": "none"}, {"approximate": "tanh"}],
                   "exact": True}
    got = json.loads(run_python(code, fake_npu=True, env={"DANCEGRPO_DEVICE": "npu", "DANCEGRPO_NPU_GELU": "upstream"})
                     .stdout.splitlines()[-1])
    assert got == {"gelu": "torch", "calls": [], "exact": True}
    got = json.loads(run_python(code, fake_npu=True, env={"DANCEGRPO_DEVICE": "cpu"}).stdout.splitlines()[-1])
    assert got["gelu"] == "torch" and got["calls"] == []
    proc = run_python(code, fake_npu=True, check=False, env={"DANCEGRPO_DEVICE": "npu", "DANCEGRPO_NPU_GELU": "tanh"})
    assert "DANCEGRPO_NPU_GELU='tanh' is not one of exact, upstream" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.fake_npu
def test_diffusers_kernels_chosen_by_import_follow_the_run_device(run_python):
    """diffusers' GEGLU calls torch_npu.npu_geglu whenever torch_npu is installed (the fake refuses
    a kernel call off the NPU, as the real kernel cannot take CPU tensors); off the NPU the device
    module makes it take its plain path, on the NPU diffusers' choice stands."""
    code = """
        import json, sys, torch, torch_npu
        from dancegrpo_port import device
        device.activate()
        from diffusers.models.activations import GEGLU
        geglu = GEGLU(8, 4)
        x = torch.randn(2, 8)
        try:
            geglu(x)
            before = "ran"
        except RuntimeError as e:
            before = str(e).split(":")[1].strip().split()[0]
        import diffusers.models.normalization as normalization
        from diffusers.utils import is_torch_npu_available
        normalization.is_torch_npu_available = is_torch_npu_available  # as diffusers >= 0.35 imports it (RMSNorm)
        changed = device.choose_diffusers_kernels()
        out = geglu(x)
        print(json.dumps({"before": before, "changed": changed, "finite": bool(torch.isfinite(out).all()),
                          "npu_geglu": sum(c[0] == "npu_geglu" for c in torch_npu.calls)}))
    """
    got = json.loads(run_python(code, fake_npu=True, env={"DANCEGRPO_DEVICE": "cpu"}).stdout.splitlines()[-1])
    assert got == {"before": "npu_geglu", "changed": ["diffusers.models.activations", "diffusers.models.normalization"],
                   "finite": True, "npu_geglu": 0}
    got = json.loads(run_python(code, fake_npu=True, env={"DANCEGRPO_DEVICE": "npu"}).stdout.splitlines()[-1])
    assert got == {"before": "ran", "changed": ["diffusers.models.activations"], "finite": True, "npu_geglu": 2}
    got = json.loads(run_python(code, fake_npu=True, env={"DANCEGRPO_DEVICE": "npu", "DANCEGRPO_NPU_GELU": "upstream"})
                     .stdout.splitlines()[-1])
    assert got == {"before": "ran", "changed": [], "finite": True, "npu_geglu": 2}


GEGLU_RUN = """
    import json, torch
    from dancegrpo_port import device
    acc = device.activate()
    from diffusers.models.activations import GEGLU
    torch.manual_seed(0)
    geglu = GEGLU(16, 64)
    x = 3 * torch.randn(8, 16)  # gates over about [-5, 5]: where the two forms differ most, and beyond
    changed = device.choose_diffusers_kernels()
    with torch.no_grad():
        out = geglu(x)
        hidden, gate = geglu.proj(x).chunk(2, dim=-1)
        tanh = hidden * torch.nn.functional.gelu(gate, approximate="tanh")
    import sys
    calls = [c[1] for c in sys.modules["torch_npu"].calls if c[0] == "npu_geglu"] if "torch_npu" in sys.modules else []
    print(json.dumps({"geglu": acc.geglu, "changed": changed, "calls": calls, "out": out.tolist(),
                      "tanh": tanh.tolist(), "gate_range": [gate.min().item(), gate.max().item()]}))
"""


@pytest.mark.fake_npu
def test_geglu_on_the_npu_is_the_cpus_exact_form_unless_switched_back(run_python):
    """diffusers' GEGLU calls npu_geglu with approximate=1 (tanh; 0 is erf) on the NPU and gates
    with the exact (erf) GELU elsewhere.  An NPU run (the fake) computes what a CPU run computes,
    through npu_geglu(approximate=0); DANCEGRPO_NPU_GELU=upstream keeps diffusers' tanh kernel."""
    def run(env):
        return json.loads(run_python(GEGLU_RUN, fake_npu=True, env=env).stdout.splitlines()[-1])

    def largest_difference(a, b):
        return (torch.tensor(a) - torch.tensor(b)).abs().max().item()

    cpu = run({"DANCEGRPO_DEVICE": "cpu"})
    assert cpu["geglu"] == "diffusers" and cpu["calls"] == []  # diffusers' plain path: erf
    assert cpu["gate_range"][0] < -4 and cpu["gate_range"][1] > 4
    exact = run({"DANCEGRPO_DEVICE": "npu"})
    assert exact["geglu"] == "torch_npu.npu_geglu(approximate=0)" and exact["changed"] == ["diffusers.models.activations"]
    assert exact["calls"] == [{"dim": -1, "approximate": 0}]
    assert largest_difference(exact["out"], cpu["out"]) <= 1e-6
    upstream = run({"DANCEGRPO_DEVICE": "npu", "DANCEGRPO_NPU_GELU": "upstream"})
    assert upstream["geglu"] == "diffusers" and upstream["changed"] == []
    assert upstream["calls"] == [{"dim": -1, "approximate": 1}]
    assert largest_difference(upstream["out"], upstream["tanh"]) <= 1e-6
    # the two forms differ far beyond float32 noise on these inputs, so the checks above can tell them apart
    assert largest_difference(upstream["out"], cpu["out"]) > 1e-4


def _names_called_from(text: str) -> set[str]:
    """What ``text`` (Python, or the lines a patch adds) takes from ``dancegrpo_port.device``:
    ``from dancegrpo_port.device import A, B as C`` (one line or parenthesised), a tool row's
    ``"dancegrpo_port.device:NAME"``, and ``ALIAS.NAME`` after ``from dancegrpo_port import device
    [as ALIAS]`` or ``import dancegrpo_port.device as ALIAS``."""
    names = set()
    for group in re.findall(r"from dancegrpo_port\.device import (\([^)]*\)|[^\n#]+)", text):
        names |= {part.split(" as ")[0].strip() for part in group.strip("()").split(",")}
    names |= set(re.findall(r"dancegrpo_port\.device:(\w+)", text))
    aliases = re.findall(r"from dancegrpo_port import device(?: as (\w+))?|import dancegrpo_port\.device as (\w+)", text)
    for alias in {a or b or "device" for a, b in aliases}:
        names |= set(re.findall(rf"\b{alias}\.(\w+)", text))
    return {n for n in names if n}


def test_the_public_face_is_exactly_what_the_patches_the_overlay_and_the_tool_call():
    """``dancegrpo_port.device`` re-exports what the series' patches, the other overlay modules and
    the tool (its bench and trainer rows, in the patched tree) take from it, and nothing more: the
    rest lives in the concern modules and is imported from them."""
    from dancegrpo_port import device

    package = ROOT / "overlay" / "dancegrpo_port" / "device"
    called = set()
    for patch in (ROOT / "patches").glob("*.patch"):
        called |= _names_called_from("\n".join(line[1:] for line in patch.read_text().splitlines()
                                               if line.startswith("+") and not line.startswith("+++")))
    for path in [*(ROOT / "overlay" / "dancegrpo_port").rglob("*.py"), *(ROOT / "src").rglob("*.py")]:
        if package not in path.parents:
            called |= _names_called_from(path.read_text())
    assert {"activate", "allow_tf32", "autocast", "choose_diffusers_kernels", "DeviceSelectionError"} <= called
    assert called == set(device.__all__), (sorted(called - set(device.__all__)), sorted(set(device.__all__) - called))
    assert all(hasattr(device, name) for name in device.__all__)
