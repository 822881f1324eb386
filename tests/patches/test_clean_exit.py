"""The clean exit (the seam's in the trainers, preprocess-destroy-process-group.patch in the
preprocessing): no rank leaves a Gloo worker thread to interpreter exit.

Why it matters (docs/port.md, section 8; docs/troubleshooting.md): a Gloo worker that drops
the last reference to a tensor Python once owned has to take the GIL; while the interpreter
finalizes, that ends the thread with pthread_exit, the unwind meets a noexcept destructor
(``c10d::ProcessGroupGloo::AsyncWork``) and the rank aborts with "terminate called without an
active exception".  Whether a worker is that late is a race, so a test of the abort itself
would pass most of the time with or without the patch.  What the patch guarantees is checked
instead, and it holds every time: when Python is about to finalize (its last ``atexit``
handler), the process has no Gloo thread left, so no worker can be that late.

A probe (a ``sitecustomize`` put on the ranks' PYTHONPATH, shared_runs.EXIT_PROBE) samples the process's thread names
from /proc while the run goes and lists them again at exit.  That it saw Gloo's threads during
the run is checked too: a torch that stopped naming them would otherwise pass unseen.

The runs are shared (tests/shared_runs.py): the preprocessing run is test_preprocess.py's, made
once with the probe on its ranks (it writes beside the run, in <run>/exit-probe/, and changes
nothing the run computes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from patched_tree_runner import shared_preprocessing
from shared_runs import EXIT_PROBE_REPORTS, flux_fixtures, probe_env
from smoke_runs import passed

pytest.importorskip("torch")
pytest.importorskip("diffusers")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.upstream,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the probe reads thread names from /proc (Linux)"),
]

# torch names the threads of a Gloo process group: its work queue's runners and the TCP event loop
GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")


def _assert_no_gloo_thread_at_exit(run_dir: Path, nproc: int) -> None:
    out = run_dir / EXIT_PROBE_REPORTS
    reports = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    assert sorted(reports) == [f"rank{r}" for r in range(nproc)], f"probe reports: {sorted(reports)}"
    for rank, report in reports.items():
        seen = [name for name in GLOO_THREADS if name in report["seen"]]
        assert seen, f"{rank}: the probe saw no Gloo thread during the run ({report['seen']}): it cannot see them"
        left = [name for name in report["at_exit"] if name in GLOO_THREADS]
        assert not left, f"{rank}: Gloo threads still alive when Python finalizes: {left} (all: {report['at_exit']})"


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.extended)], ids=["full", "lora"])
def test_no_trainer_rank_leaves_a_gloo_thread_to_interpreter_exit(patched_tree, shared_runs, lora):
    from dancegrpo_npu.smoke import runner as smoke

    flux_fixtures(shared_runs, patched_tree.project)
    result = shared_runs.smoke(patched_tree.project, smoke.SmokeOptions(nproc=2, lora=lora, device="cpu",
                                                                        env=probe_env(shared_runs)))
    _assert_no_gloo_thread_at_exit(passed(result).run_dir, 2)


def test_no_preprocessing_rank_leaves_a_gloo_thread_to_interpreter_exit(patched_tree, shared_runs):
    record, _, _ = shared_preprocessing(shared_runs, patched_tree.project)
    _assert_no_gloo_thread_at_exit(record.run_dir, 2)
