"""The process group on the chosen device's backend (hccl on the NPU, nccl on CUDA, gloo on the
CPU), the collectives the trainers make, and what FSDP may ask of the device.

Upstream hard-codes ``dist.init_process_group("nccl")`` and FSDP's CPU offload and
``sync_module_states``; on the CPU (gloo) the offload has nothing to offload from and
``sync_module_states`` is refused, so ranks are synchronised by hand here.
"""

from __future__ import annotations

import os

import torch

from dancegrpo_port.device.choice import accelerator, set_local_device


def dist_backend() -> str:
    """hccl on the NPU, nccl on CUDA (upstream's), gloo on the CPU."""
    return accelerator().dist_backend


def start_distributed(local_rank: int) -> torch.device:
    """The trainers' start, in upstream's order: the process group (upstream's
    ``dist.init_process_group("nccl")``) on this device's backend, then ``local_rank``'s device
    made current (upstream's ``torch.cuda.set_device``) and returned as a torch.device."""
    import torch.distributed as dist

    store = _restart_store(dist)
    if store is None:
        dist.init_process_group(dist_backend())
    else:
        dist.init_process_group(dist_backend(), store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    return set_local_device(local_rank)


def _restart_store(dist, environ=None):
    """A worker torchrun restarted (--max-restarts) on its static rendezvous: torchrun hands every
    attempt the same store, so an attempt's rank could read the address an earlier attempt's
    rank 0 left there (gloo: "connectFullMesh failed ... Connection refused") before this
    attempt's rank 0 writes its own.  The attempt's keys get a prefix of their own; None at the
    first attempt, or outside torchrun's agent store: init_process_group's own store then."""
    environ = os.environ if environ is None else environ
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt in ("", "0") or environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), int(environ["WORLD_SIZE"]),
                          is_master=False)
    return dist.PrefixStore(f"dancegrpo-restart-{attempt}", store)


def fsdp_cpu_offload_supported() -> bool:
    """FSDP's CPUOffload needs an accelerator to offload from."""
    return accelerator().kind != "cpu"


def fsdp_sync_module_states_supported() -> bool:
    """FSDP's sync_module_states broadcasts over the device's collective backend;
    with gloo on the CPU it is refused, so ranks are synchronised by hand."""
    return accelerator().kind != "cpu"


def full_state_dict_cpu_offload() -> bool:
    """Whether full (gathered) state dicts may be offloaded to the CPU.

    On the CPU they already are: FSDP's offload path then frees the sharded
    storage it just gathered and, with two or more ranks, fails with
    ``storage of size 0``.
    """
    return accelerator().kind != "cpu"


def broadcast_module_states(module: torch.nn.Module, src: int = 0) -> None:
    """What FSDP's ``sync_module_states=True`` does: every rank takes rank
    ``src``'s parameters and buffers (e.g. freshly initialised LoRA weights)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=src)


_AVG_REFUSED = "Cannot use ReduceOp.AVG with Gloo"


def all_reduce_mean(tensor: torch.Tensor) -> None:
    """``dist.all_reduce(tensor, op=ReduceOp.AVG)``, as upstream averages the logged loss, on
    every backend: torch 2.7.1's gloo refuses AVG (measured: "Cannot use ReduceOp.AVG with
    Gloo"; torch 2.10's takes it), so a CPU run of MindSpeed-MM's torch line stopped at its
    first step.  There the mean is the sum divided by the world size; where AVG is taken it is
    used unchanged.  gloo refuses before any rank sends, so every rank takes the same path."""
    import torch.distributed as dist

    try:
        dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
    except RuntimeError as e:
        if _AVG_REFUSED not in str(e):
            raise
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor.div_(dist.get_world_size())
