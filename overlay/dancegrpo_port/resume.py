"""The Resume feature on the seam: saves and loads the training state (see ``checkpoints``).

``hooks.checkpoint_save(step, transformer=, optimizer=, lr_scheduler=, ema=, sampler=)`` after a
step, ``hooks.checkpoint_load(init_steps, transformer=, optimizer=, lr_scheduler=, ema=,
sampler=)`` at upstream's resume point.  The data position: the trainers take one batch of
--train_batch_size a step, and a sampler given to checkpoint_load starts its next pass after the
batches the run had used (its order repeats each pass: upstream never sets another epoch).  A
trainer that skips them itself (the LoRA trainer does) gives no sampler.

The generators are restored at the first ``rollout_begin`` after a resume: after the trainer's
data skipping and the first ``next(loader)`` of the step (a DataLoader iterator draws its seed
from torch's generator when it is made, which the uninterrupted run did in its first step), and
before the step's first draw; where a resume starts a pass over the data at its first batch (a
trainer of several passes), at ``data_pass_begin``, before that pass's iterator draws its seed, as
the run resumed did after its checkpoint.  With --dataloader_num_workers > 0 and a dataset that draws (--cfg
> 0) the workers' generators are not restored: their seed comes from that first draw.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from dancegrpo_port import checkpoints as files
from dancegrpo_port.feature import Feature
from dancegrpo_port.checkpoints import CheckpointProblem

RANK_FILE = "rank_{rank}.pt"


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def rng_state(port_generator, device) -> dict:
    """Every generator a step may draw from, on this rank."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    np = _numpy()
    if np is not None:
        state["numpy"] = np.random.get_state()
    if port_generator is not None:
        state["port"] = port_generator.get_state()
    kind = getattr(device, "type", "cpu")
    if kind != "cpu":
        state["device"] = getattr(torch, kind).get_rng_state(device)
    return state


def set_rng_state(state: dict, port_generator, device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np = _numpy()
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])
    if port_generator is not None:
        port_generator.set_state(state["port"])
    kind = getattr(device, "type", "cpu")
    if kind != "cpu" and "device" in state:
        getattr(torch, kind).set_rng_state(state["device"], device)


def _options(strict: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # LoRA: the frozen base weights are the pretrained ones, loaded again at start
    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def _empty_shards_are_not_meta() -> None:
    """torch 2.7.1's ``get_state_dict`` asks each value ``is_meta``, and FSDP1's ShardedTensor
    answers with ``local_tensor().is_meta``, which raises ("Only single local shard is
    supported") on a rank that holds no shard of a small parameter: a 2-rank Wan save stopped
    there (measured; torch 2.10 no longer asks).  A sharded tensor is on the meta device when its
    local shards are, and one without local shards is not; registered through torch's own hook
    for overriding a sharded op (``custom_sharded_op_impl``), the same answer on every torch."""
    from torch.distributed._shard.sharded_tensor import custom_sharded_op_impl

    @custom_sharded_op_impl(torch.Tensor.is_meta.__get__)
    def is_meta(types, args=(), kwargs=None, pg=None):
        return any(shard.tensor.is_meta for shard in args[0].local_shards())


def _sharded_state(transformer, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _empty_shards_are_not_meta()
    model, optim = get_state_dict(transformer, optimizer, options=_options())
    return {"model": model, "optimizer": optim}


def _bytes(tree) -> int:
    """This rank's bytes of a state dict: a sharded tensor counts its local shards (FSDP1's
    ShardedTensor, which has none on a rank whose share of a small parameter is empty; its
    local_tensor() refuses that), a DTensor its local part."""
    if hasattr(tree, "local_shards"):
        return sum(s.tensor.numel() * s.tensor.element_size() for s in tree.local_shards())
    if isinstance(tree, torch.Tensor):
        local = getattr(tree, "_local_tensor", None)
        if isinstance(local, torch.Tensor):
            tree = local
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_bytes(v) for v in tree)
    return 0


def _sampler_state(sampler) -> dict:
    return {name: getattr(sampler, name, None) for name in ("epoch", "seed", "num_replicas", "rank", "shuffle")}


def skip_batches(sampler, batches: int, batch_size: int) -> None:
    """Make ``sampler``'s next pass start after ``batches`` batches (of a pass that repeats, as
    upstream's loader wrapper goes through the same order again and again)."""
    per_pass = len(sampler) // batch_size  # the trainers' DataLoader drops the last partial batch
    skip = (batches % per_pass) * batch_size if per_pass else 0
    if not skip:
        return
    base = type(sampler)

    class Resumed(base):
        def __iter__(self):
            indices = super().__iter__()
            for _ in range(skip):
                next(indices, None)
            self.__class__ = base  # one pass only
            yield from indices

    Resumed.__name__ = Resumed.__qualname__ = f"Resumed{base.__name__}"
    sampler.__class__ = Resumed


class Resume(Feature):
    def __init__(self, args, rank: int, world_size: int, device, port_generator=None, on_resume=None):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.port_generator = port_generator  # --rng cpu's generator (None: upstream's draws)
        self.on_resume = on_resume  # the seam: every feature's ``resumed(step)``
        self.root = Path(args.output_dir or ".") / files.CHECKPOINT_DIR
        self.every = getattr(args, "checkpointing_steps", None) or 0
        self.last = getattr(args, "max_train_steps", None)
        self.keep = getattr(args, "checkpoints_total_limit", None)
        self.source = getattr(args, "resume_from_checkpoint", None)
        self.batch_size = getattr(args, "train_batch_size", 1) or 1
        self.identity = files.run_identity(args, world_size)
        self.pending_rng = None  # restored at the first step_begin after a resume

    # -------------------------------------------------------------- saving

    def _due(self, step: int) -> bool:
        return step == self.last or (self.every > 0 and step % self.every == 0)

    def checkpoint_save(self, step: int, transformer=None, optimizer=None, lr_scheduler=None, ema=None,
                        sampler=None, **_) -> None:
        if transformer is None or optimizer is None or not self._due(step):
            return
        final = self.root / files.checkpoint_name(step)
        tmp = self.root / (files.TMP_PREFIX + final.name)
        sharded = _sharded_state(transformer, optimizer)
        mine = {"step": step, "rng": rng_state(self.port_generator, self.device),
                "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
                "sampler": _sampler_state(sampler), "batches": step,
                "ema": getattr(ema, "ema_state_dict_rank0", None) if self.rank == 0 else None}
        needed = self._all_ranks_sum(_bytes(sharded) + _bytes(mine.get("ema")) + (1 << 20))
        problem = None
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            problem = files.space_problem(self.root, needed)
            if problem is None:
                if tmp.exists():  # a save that was stopped
                    shutil.rmtree(tmp)
                tmp.mkdir()
        if self._rank0_says(problem):
            self._stop(f"checkpoint of step {step} not written: {problem}; the run stops, "
                       f"{files.latest(self.root) or 'no earlier checkpoint'} is as it was")
        import torch.distributed.checkpoint as dcp

        dcp.save(sharded, checkpoint_id=str(tmp))
        files.inject_fault(step, "shards", self.root, self.rank)  # a test's: shards written, the rest not
        torch.save(mine, tmp / RANK_FILE.format(rank=self.rank))
        self._barrier()
        if self.rank == 0:
            files.write_manifest(tmp, {"step": step, **self.identity})
            files.publish(tmp, final)
            files.prune(self.root, self.keep)
        self._barrier()
        files.inject_fault(step, "saved", self.root, self.rank)

    # -------------------------------------------------------------- loading

    def checkpoint_load(self, init_steps: int, transformer=None, optimizer=None, lr_scheduler=None, ema=None,
                        sampler=None, **_) -> int:
        if not self.source:
            return init_steps
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if self.rank == 0 else None
        if self.source == "latest":
            path = files.latest(self.root, say)
            if path is None:
                if say:
                    say(f"--resume_from_checkpoint latest: no complete checkpoint in {self.root}; "
                        f"starting at step {init_steps + 1}")
                self._resumed(init_steps)
                return init_steps
        else:
            path = Path(self.source)
        try:
            manifest = files.read_manifest(path)
            problem = files.fit_problem(manifest, self.identity)
            if problem:
                raise CheckpointProblem(problem)
            if not (path / RANK_FILE.format(rank=self.rank)).is_file():
                raise CheckpointProblem(f"{path.name} has no {RANK_FILE.format(rank=self.rank)}")
        except CheckpointProblem as exc:
            self._refuse(f"--resume_from_checkpoint {path}: {exc}")
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = _sharded_state(transformer, optimizer)
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(transformer, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=_options(strict=False))
        mine = torch.load(path / RANK_FILE.format(rank=self.rank), map_location="cpu", weights_only=False)
        if lr_scheduler is not None and mine["lr_scheduler"] is not None:
            lr_scheduler.load_state_dict(mine["lr_scheduler"])
        if ema is not None and self.rank == 0 and mine.get("ema") is not None:
            for key, value in mine["ema"].items():
                ema.ema_state_dict_rank0[key].copy_(value)
        if sampler is not None:
            skip_batches(sampler, mine["batches"], self.batch_size)
        self.pending_rng = mine["rng"]
        step = int(mine["step"])
        if say:
            say(f"resumed from {path} (step {step})")
        self._resumed(step)
        return step

    def rollout_begin(self, *_) -> None:
        if self.pending_rng is not None:  # after the step's data, before its first draw
            set_rng_state(self.pending_rng, self.port_generator, self.device)
            self.pending_rng = None

    def data_pass_begin(self) -> None:
        self.rollout_begin()  # a pass the resume starts afresh: before its iterator's seed draw

    # -------------------------------------------------------------- ranks

    def _resumed(self, step: int) -> None:
        if self.on_resume is not None:
            self.on_resume(step)
        self._barrier()

    def _barrier(self) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def _collective_device(self):
        if dist.is_available() and dist.is_initialized() and dist.get_backend() != "gloo":
            return self.device
        return torch.device("cpu")

    def _all_ranks_sum(self, value: int) -> int:
        if not (dist.is_available() and dist.is_initialized()):
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self._collective_device())
        dist.all_reduce(t)
        return int(t.item())

    def _rank0_says(self, problem: str | None) -> bool:
        """Whether rank 0 found a problem (every rank learns it)."""
        if not (dist.is_available() and dist.is_initialized()):
            return problem is not None
        t = torch.tensor([1 if problem else 0], dtype=torch.int64, device=self._collective_device())
        dist.broadcast(t, src=0)
        return bool(t.item())

    def _refuse(self, line: str) -> None:
        print(f"{os.path.basename(sys.argv[0])}: error: {line}", file=sys.stderr, flush=True)
        sys.exit(2)

    def _stop(self, line: str) -> None:
        if self.rank == 0:
            print(f"{os.path.basename(sys.argv[0])}: error: {line}", file=sys.stderr, flush=True)
        sys.exit(1)
