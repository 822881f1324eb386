"""host.cpus: the threads a job's processes get from the usable cores (an explicit
OMP_NUM_THREADS wins)."""

from __future__ import annotations

import os

import pytest

from dancegrpo_npu.host.cpus import cpu_threads


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)


def test_usable_cores_shared_by_the_processes(eight_cores):
    assert cpu_threads(1, {})[0] == 8 and cpu_threads(2, {})[0] == 4 and cpu_threads(16, {})[0] == 1
    assert cpu_threads(1, {}, busy=6.2) == (2, "8 usable core(s) less 6.2 busy (load average) / 1 process(es); "
                                               "OMP_NUM_THREADS wins")
    assert cpu_threads(1, {}, busy=11.0)[0] == 1


def test_an_explicit_omp_num_threads_wins(eight_cores):
    assert cpu_threads(2, {"OMP_NUM_THREADS": "3"}, busy=7) == (3, "OMP_NUM_THREADS=3, yours")
    assert cpu_threads(2, {"OMP_NUM_THREADS": "junk"})[0] == 4  # not a number: not an explicit count
