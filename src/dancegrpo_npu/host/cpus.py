"""The CPU cores this process may use, and how many threads each of a job's processes gets."""

from __future__ import annotations

import os


def cpu_threads(nproc: int, environ: dict[str, str], busy: float = 0.0) -> tuple[int, str]:
    """Threads per process for work on the CPU, and where the number comes from.

    An explicit OMP_NUM_THREADS wins.  Else the usable cores (this process's affinity), less
    ``busy`` cores other processes keep busy (bench passes the load average; smoke passes
    none, so that its ranks' thread count, and with it their sums, do not vary from run to
    run), shared by ``nproc`` processes: more threads than free cores make OpenMP's threads
    spin against each other, many times slower (a tiny bench 30x on a loaded 2-core host).
    """
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given), f"OMP_NUM_THREADS={given}, yours"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    free = max(1, usable - round(busy))
    load = f" less {busy:.1f} busy (load average)" if busy else ""
    return max(1, free // nproc), f"{usable} usable core(s){load} / {nproc} process(es); OMP_NUM_THREADS wins"
