"""A clean exit: no Gloo worker thread left to interpreter exit; a feature on the seam.

Upstream leaves the default process group to interpreter exit unless sequence parallelism is
on.  With Gloo (CPU runs) a rank could then abort after its last step, now and then:
"terminate called without an active exception" (SIGABRT).  The cause, from the core dump of a
2-rank Gloo script that exits with collectives in flight (same message): a Gloo worker
(c10d::ProcessGroupGloo::runLoop) drops its finished work after the Python side has moved on;
holding the last reference to a tensor Python once owned, it takes the GIL to free it; during
finalization that ends the thread with pthread_exit, and the unwind through ~AsyncWork
(noexcept) calls std::terminate.  Whether a worker is that late is a race.

``destroy_process_group()`` alone, as PyTorch documents, is not enough: it unregisters the
group, but main()'s FSDP modules still hold it, and with it the worker threads, until
finalization.  So at the seam's ``run_end`` (the end of main()) the group is destroyed and
``gc.collect`` registered with atexit: once main() has returned, and before finalization, its
objects are collected, so the group is freed and its workers joined while Python still runs.
Only the normal end of a run gets here: a failing rank is not held up by a collective shutdown.
On NCCL/HCCL the same calls are what PyTorch and torch_npu ask for.
"""

from __future__ import annotations

import atexit
import gc

import torch.distributed as dist

from dancegrpo_port.feature import Feature


class CleanExit(Feature):
    def run_end(self) -> None:
        if dist.is_available() and dist.is_initialized():  # sequence parallelism destroyed it already
            dist.destroy_process_group()
        atexit.register(gc.collect)
