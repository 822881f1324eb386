"""What a resume checkpoint costs: seconds per checkpoint and bytes per rank, against upstream's save.

    PYTHONPATH=src python bench/checkpoint_cost.py [-C PROJECT] [--nproc 2] [--threads 1] [--repeats 3]
                                                   [--presets flux-tiny,flux-cpu]

Needs the patched tree (``dancegrpo-npu fetch && dancegrpo-npu apply``).  For each preset (the
bench's TRAINER-SIZE: ``flux-tiny``, the smoke's models; ``flux-cpu``: FLUX.1-dev width, 1 double
+ 1 single block), in
one run: ``--nproc`` CPU ranks (gloo) hold the transformer under FSDP, as the trainer does, with
AdamW's state made by one update, and save, ``--repeats`` times each, alternating:

- the port's resume checkpoint: ``dancegrpo_port.resume.Resume.checkpoint_save`` (sharded
  ``torch.distributed.checkpoint`` of weights + optimizer, each rank's generators, the manifest,
  the rename);
- upstream's save: ``fastvideo.utils.checkpoint.save_checkpoint`` (the weights only, gathered to
  rank 0 as a full state dict, written there as safetensors).

Printed: seconds per checkpoint (median over the repeats, of the slowest rank) and the bytes each
rank wrote.  ``--threads`` sets torch's threads in each rank (default 1: a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def worker(rank: int, world: int, port: int, preset_name: str, tree: str, out: str, repeats: int, threads: int):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), DANCEGRPO_DEVICE="cpu")
    sys.path[:0] = [tree, str(ROOT / "src")]
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from dancegrpo_npu.throughput.models import build_transformer, model_configs
    from dancegrpo_npu.throughput.presets import PRESETS
    from dancegrpo_port.resume import Resume
    from fastvideo.utils.checkpoint import save_checkpoint
    from fastvideo.utils.fsdp_util import get_dit_fsdp_kwargs

    torch.manual_seed(0)
    transformer = build_transformer(model_configs(PRESETS[preset_name])[0])
    fsdp_kwargs, _ = get_dit_fsdp_kwargs(transformer, "full", False, False, "fp32")  # the trainer's FSDP
    transformer = FSDP(transformer, **fsdp_kwargs)
    optimizer = torch.optim.AdamW(transformer.parameters(), lr=1e-5)
    for p in transformer.parameters():  # one update: AdamW's moments exist, as after a real step
        p.grad = torch.zeros_like(p)
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    root = Path(out)
    args = SimpleNamespace(output_dir=str(root / "port"), checkpointing_steps=1, max_train_steps=None,
                           checkpoints_total_limit=1, resume_from_checkpoint=None, num_generations=4, h=64, w=64,
                           t=1, sampling_steps=4, train_batch_size=1)
    resume = Resume(args, rank, world, torch.device("cpu"))
    times = {"port": [], "upstream": []}
    for step in range(1, repeats + 1):
        for what in ("port", "upstream"):
            dist.barrier()
            start = time.perf_counter()
            if what == "port":
                resume.checkpoint_save(step, transformer=transformer, optimizer=optimizer, lr_scheduler=scheduler)
            else:
                save_checkpoint(transformer, rank, str(root / "upstream"), step, 0)
            dist.barrier()
            times[what].append(time.perf_counter() - start)
    if rank == 0:
        port_dir = root / "port" / "resume" / f"step-{repeats:06d}"
        manifest = json.loads((port_dir / "manifest.json").read_text())
        per_rank = [sum(size for name, size in manifest["files"].items()
                        if name in (f"__{r}_0.distcp", f"rank_{r}.pt")) for r in range(world)]
        per_rank[0] += manifest["files"].get(".metadata", 0) + (port_dir / "manifest.json").stat().st_size
        upstream_dir = root / "upstream" / f"checkpoint-{repeats}-0"
        upstream = sum(p.stat().st_size for p in upstream_dir.iterdir())
        params = sum(p.numel() for p in transformer.parameters())  # this rank's shard (FSDP's flat parameters)
        result = {"preset": preset_name, "world_size": world, "threads": threads, "repeats": repeats,
                  "parameters_rank0_shard": params,
                  "port_s": statistics.median(times["port"]), "upstream_s": statistics.median(times["upstream"]),
                  "port_bytes_per_rank": per_rank, "upstream_bytes_per_rank": [upstream] + [0] * (world - 1)}
        (root / "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def measure(preset: str, tree: Path, nproc: int, repeats: int, threads: int) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(nproc, port, preset, str(tree), tmp, repeats, threads), nprocs=nproc, join=True)
        return json.loads((Path(tmp) / "result.json").read_text())


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-C", dest="project", default=str(ROOT))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--presets", default="flux-tiny,flux-cpu")
    args = parser.parse_args(argv)
    tree = Path(args.project) / "build" / "DanceGRPO"
    if not (tree / "dancegrpo_port" / "resume.py").is_file():
        print(f"checkpoint_cost: no patched tree with the resume overlay at {tree}; run `dancegrpo-npu apply`",
              file=sys.stderr)
        return 2
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    print(f"{'preset':<10}  {'ranks':>5}  {'port s':>8}  {'upstream s':>10}  port bytes/rank  upstream bytes/rank")
    for preset in args.presets.split(","):
        r = measure(preset, tree, args.nproc, args.repeats, args.threads)
        print(f"{preset:<10}  {r['world_size']:>5}  {r['port_s']:>8.3f}  {r['upstream_s']:>10.3f}  "
              f"{' / '.join(mib(b) for b in r['port_bytes_per_rank']):<15}  "
              f"{' / '.join(mib(b) for b in r['upstream_bytes_per_rank'])}", flush=True)
    print(f"(median of {args.repeats} saves, the slowest rank; {args.threads} thread(s) a rank; the port's holds "
          "weights + AdamW state + generators, upstream's the weights only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
