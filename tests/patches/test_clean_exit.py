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

A probe (a ``sitecustomize`` put on the ranks' PYTHONPATH) samples the process's thread names
from /proc while the run goes and lists them again at exit.  That it saw Gloo's threads during
the run is checked too: a torch that stopped naming them would otherwise pass unseen."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from patched_tree_runner import launch_preprocessing

pytest.importorskip("torch")
pytest.importorskip("diffusers")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.upstream,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the probe reads thread names from /proc (Linux)"),
]

# torch names the threads of a Gloo process group: its work queue's runners and the TCP event loop
GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")

PROBE = textwrap.dedent('''\
    """Test probe (tests/patches/test_clean_exit.py): the thread names of a rank, during the run
    and in its last atexit handler, into $EXIT_PROBE_DIR/rank<RANK>.json."""
    import atexit, json, os, threading

    def _names():
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as f:
                    names.append(f.read().strip())
            except OSError:  # the thread ended meanwhile
                pass
        return sorted(names)

    if os.environ.get("RANK") is not None and os.environ.get("EXIT_PROBE_DIR"):
        _seen, _stop = set(), threading.Event()

        def _sample():
            while not _stop.wait(0.05):
                _seen.update(_names())

        _sampler = threading.Thread(target=_sample, name="exit-probe", daemon=True)
        _sampler.start()

        @atexit.register  # registered first, so called last: after every other handler
        def _at_exit():
            _stop.set()
            _sampler.join()
            path = os.path.join(os.environ["EXIT_PROBE_DIR"], f"rank{os.environ['RANK']}.json")
            with open(path, "w") as f:
                json.dump({"seen": sorted(_seen), "at_exit": _names()}, f)
    ''')


def _probe_env(tmp_path: Path) -> tuple[Path, tuple[tuple[str, str], ...]]:
    site, out = tmp_path / "probe", tmp_path / "threads"
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(PROBE)
    return out, (("PYTHONPATH", str(site)), ("EXIT_PROBE_DIR", str(out)))


def _assert_no_gloo_thread_at_exit(out: Path, nproc: int) -> None:
    reports = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    assert sorted(reports) == [f"rank{r}" for r in range(nproc)], f"probe reports: {sorted(reports)}"
    for rank, report in reports.items():
        seen = [name for name in GLOO_THREADS if name in report["seen"]]
        assert seen, f"{rank}: the probe saw no Gloo thread during the run ({report['seen']}): it cannot see them"
        left = [name for name in report["at_exit"] if name in GLOO_THREADS]
        assert not left, f"{rank}: Gloo threads still alive when Python finalizes: {left} (all: {report['at_exit']})"


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.extended)], ids=["full", "lora"])
def test_no_trainer_rank_leaves_a_gloo_thread_to_interpreter_exit(patched_tree, tmp_path, lora):
    from dancegrpo_npu.smoke import runner as smoke

    out, env = _probe_env(tmp_path)
    smoke.run_smoke(patched_tree.project, smoke.SmokeOptions(nproc=2, lora=lora, device="cpu", env=env))
    _assert_no_gloo_thread_at_exit(out, 2)


def test_no_preprocessing_rank_leaves_a_gloo_thread_to_interpreter_exit(patched_tree, tmp_path):
    out, env = _probe_env(tmp_path)
    launch_preprocessing(patched_tree.project, tmp_path / "rl_embeddings", "preprocess-exit", env)
    _assert_no_gloo_thread_at_exit(out, 2)
