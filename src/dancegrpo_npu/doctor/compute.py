"""doctor's compute checks: a matmul on each device, an all_reduce across the local devices.

On NPU: HCCL across the visible NPUs; on CUDA: NCCL across the GPUs; on CPU: gloo across two
processes.  The all_reduce ranks are separate Python processes started like torchrun's
workers, so a hang is caught by a timeout and a crash by its exit code.
"""

from __future__ import annotations

import os
import subprocess
import sys

from dancegrpo_npu.doctor.checks import FAIL, PASS, SKIP, Check, DoctorOptions, Facts
from dancegrpo_npu.host.network import free_port

# One rank of the all_reduce check, run as `python -c ALLREDUCE_WORKER BACKEND KIND` with
# RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set.  Self-contained: the child imports only torch
# (and torch_npu on NPU), as the training scripts do.
ALLREDUCE_WORKER = r"""
import os, sys
backend, kind = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
import torch
import torch.distributed as dist
if kind == "npu":
    import torch_npu  # noqa: F401
    torch.npu.set_device(rank)
    device = torch.device("npu", rank)
elif kind == "cuda":
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
else:
    device = torch.device("cpu")
dist.init_process_group(backend, rank=rank, world_size=world)
t = torch.full((1024,), float(rank + 1), device=device)
dist.all_reduce(t)
want = world * (world + 1) / 2
ok = bool((t.cpu() == want).all().item())
dist.destroy_process_group()
print("ALLREDUCE_OK" if ok else f"ALLREDUCE_WRONG {t[0].item()} != {want}", flush=True)
sys.exit(0 if ok else 1)
"""


MATMUL_N = 256


def reference_product(torch, a, b):
    """``a @ b`` without a matrix-multiply kernel: float64 elementwise products summed, a
    block of rows at a time (16 MB each).  On CPU the device's matmul is the CPU's own, so
    comparing it with ``a @ b`` would compare the kernel with itself."""
    a64, b64 = a.double(), b.double()
    rows = [(a64[i : i + 32, :, None] * b64[None, :, :]).sum(dim=1) for i in range(0, a64.shape[0], 32)]
    return torch.cat(rows)


def check_matmul(facts: Facts) -> Check:
    torch = facts.torch
    if torch is None or facts.count == 0:
        return Check("matmul", SKIP, "no device to run on (see devices)")
    a = torch.randn(MATMUL_N, MATMUL_N, generator=torch.Generator().manual_seed(0))
    b = torch.randn(MATMUL_N, MATMUL_N, generator=torch.Generator().manual_seed(1))
    expected = reference_product(torch, a, b)
    done = []
    for i in range(facts.count):
        device = "cpu" if facts.kind == "cpu" else f"{facts.kind}:{i}"
        try:
            got = (a.to(device) @ b.to(device)).cpu().double()
        except Exception as e:  # noqa: BLE001
            return Check("matmul", FAIL, f"matmul on {device} failed: {type(e).__name__}: {e}", _device_fix(facts.kind))
        err = (got - expected).abs().max().item()
        if not err < 1e-2:  # TF32/HF32 matmuls differ from float64 in the 3rd digit, not more
            return Check("matmul", FAIL, f"matmul on {device} is off by {err:.3g}", _device_fix(facts.kind))
        done.append(device)
    return Check(
        "matmul",
        PASS,
        f"{MATMUL_N}x{MATMUL_N} float32 on {', '.join(done)} agrees with a float64 sum of products on the CPU",
    )


def _device_fix(kind: str) -> str:
    return {
        "npu": "check `npu-smi info` for the device's health; match torch/torch_npu/CANN (docs/ascend-910b.md, Versions)",
        "cuda": "check nvidia-smi and the CUDA driver",
    }.get(kind, "reinstall torch")


def check_all_reduce(facts: Facts, opts: DoctorOptions) -> Check:
    if facts.torch is None or facts.count == 0:
        return Check("all_reduce", SKIP, "no device to run on (see devices)")
    backend = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[facts.kind]
    world = facts.count if facts.kind != "cpu" else 2
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **opts.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", ALLREDUCE_WORKER, backend, facts.kind],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs, timed_out = [], False
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=opts.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            for p in procs:
                p.kill()
            out, _ = proc.communicate()
        outputs.append((proc.returncode, out or ""))
    fix = {
        "hccl": "check HCCL_CONNECT_TIMEOUT, HCCL_SOCKET_IFNAME/HCCL_IF_IP, `npu-smi info` and the hccn network tool",
        "nccl": "check NCCL_SOCKET_IFNAME and nvidia-smi topo -m",
        "gloo": "check that 127.0.0.1 is reachable",
    }[backend]
    if timed_out:
        return Check(
            "all_reduce",
            FAIL,
            f"{backend} all_reduce over {world} process(es) did not finish in {opts.timeout:.0f} s",
            fix,
        )
    for rank, (rc, out) in enumerate(outputs):
        if rc != 0 or "ALLREDUCE_OK" not in out:
            last = [ln for ln in out.strip().splitlines() if ln.strip()][-1:] or [f"exit {rc}"]
            return Check("all_reduce", FAIL, f"{backend} all_reduce, rank {rank}: {last[0]}", fix)
    return Check(
        "all_reduce", PASS, f"{backend} all_reduce across {world} local process(es) ({facts.kind}) gave the right sum"
    )
