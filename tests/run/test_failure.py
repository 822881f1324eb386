"""Why a failed run failed: the exception line, not the progress bar printed after it."""

from __future__ import annotations

import json

import pytest

from dancegrpo_npu.run.failure import error_line, failure_detail, rendered_lines

# What rank 0's stderr.log holds when train_one_step raises (recorded from a real smoke run
# with a planted `raise`, shortened): tqdm's sampling bar redrawn with \r and a cursor-up
# escape, the traceback with torch.distributed's "[rank0]: " prefixes, then the "Steps" bar
# that tqdm closes at interpreter exit - after the traceback.
STDERR_WITH_TQDM = (
    "\rSampling Progress:   0%|          | 0/4 [00:00<?, ?it/s]\x1b[A"
    "\rSampling Progress: 100%|##########| 4/4 [00:00<00:00, 42.55it/s]\n"
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "fastvideo/train_grpo_flux.py", line 867, in main\n'
    "[rank0]:     loss, grad_norm, reward_mean = train_one_step(\n"
    "[rank0]:                                    ^^^^^^^^^^^^^^^\n"
    '[rank0]:   File "fastvideo/train_grpo_flux.py", line 612, in train_one_step\n'
    '[rank0]:     raise RuntimeError("planted failure")\n'
    "[rank0]: RuntimeError: planted failure\n"
    "\rSteps:   0%|          | 0/100000 [00:01<?, ?it/s]\n"
)


def test_rendered_lines_show_what_a_terminal_shows():
    lines = rendered_lines(STDERR_WITH_TQDM)
    assert lines[0] == "Sampling Progress: 100%|##########| 4/4 [00:00<00:00, 42.55it/s]"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "Steps:   0%|          | 0/100000 [00:01<?, ?it/s]"


def test_the_exception_line_is_reported_not_the_progress_bar():
    assert error_line(rendered_lines(STDERR_WITH_TQDM)) == "RuntimeError: planted failure"


def test_the_last_of_chained_tracebacks_wins():
    text = (
        "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\nKeyError: 'x'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File \"a.py\", line 3, in g\nValueError: bad value\n"
        "Steps:   0%|          | 0/10\n"
    )
    assert error_line(rendered_lines(text)) == "ValueError: bad value"


def test_without_a_traceback():
    # argparse's parser.error, as the seam refuses partial accumulation
    usage = "usage: train_grpo_flux.py [-h]\ntrain_grpo_flux.py: error: 3 samples per step is not a multiple\n"
    assert error_line(rendered_lines(usage)) == "train_grpo_flux.py: error: 3 samples per step is not a multiple"
    assert error_line(rendered_lines("loading\nsomething odd happened\nSteps:  0%|    | 0/10\n")) == "something odd happened"
    assert error_line([]) == ""


def test_failure_detail_records_the_error(tmp_path):
    rank0 = tmp_path / "logs" / "torchrun" / "none_x" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    (rank0 / "stdout.log").write_text("reward 0.1\n")
    (rank0 / "stderr.log").write_text(STDERR_WITH_TQDM)
    detail = failure_detail(tmp_path)
    assert detail["log"] == "logs/torchrun/none_x/attempt_0/0/stderr.log"
    assert detail["error"] == "RuntimeError: planted failure"
    assert detail["tail"][-2:] == ["RuntimeError: planted failure", "Steps:   0%|          | 0/100000 [00:01<?, ?it/s]"]
    json.dumps(detail)  # it goes into summary.json


def test_failure_detail_takes_a_ranks_argparse_refusal(tmp_path):
    """A trainer that refuses its arguments exits 2 with argparse's usage and one error line, no
    traceback: that line is the failure, not torchrun's "exited with code 2"."""
    rank0 = tmp_path / "logs" / "torchrun" / "none_x" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    (rank0 / "stderr.log").write_text("usage: train_grpo_flux.py [-h] --data_json_path X\n"
                                      "train_grpo_flux.py: error: unrecognized arguments: --hps_model m.json\n")
    (tmp_path / "logs" / "console.log").write_text(TORCHRUN_CONSOLE.format(code=2, traceback="<N/A>"))
    detail = failure_detail(tmp_path)
    assert detail["log"].endswith("/0/stderr.log")
    assert detail["error"] == "train_grpo_flux.py: error: unrecognized arguments: --hps_model m.json"


def test_failure_detail_falls_back_to_the_console(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "console.log").write_text("[default0]:[rank0]: Traceback (most recent call last):\n"
                                                   "[default0]:[rank0]:   File \"x.py\", line 1\n"
                                                   "[default0]:[rank0]: OSError: disk full\n")
    detail = failure_detail(tmp_path)
    assert (detail["log"], detail["error"]) == ("logs/console.log", "OSError: disk full")


TORCHRUN_CONSOLE = """\
[default0]:Steps:   0%|          | 0/2 [00:00<?, ?it/s]
W1201 09:23:29.544000 25178 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 25182 closing signal SIGTERM
E1201 09:23:29.729000 25178 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: {code}) local_rank: 0 (pid: 25181) of binary: /venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 386, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train_grpo_flux.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_09:23:29
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 25182)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 25182
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_09:23:29
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : {code} (pid: 25181)
  error_file: <N/A>
  traceback : {traceback}
============================================================
"""


@pytest.mark.parametrize("code, traceback, error", [
    ("-9", "Signal 9 (SIGKILL) received by PID 25181",
     "rank 0 was killed by signal 9 (SIGKILL) (out of memory? the kernel's OOM killer sends it; check free memory and dmesg)"),
    ("-11", "Signal 11 (SIGSEGV) received by PID 25181", "rank 0 was killed by signal 11 (SIGSEGV)"),
    ("3", "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
     "rank 0 exited with code 3 and left no traceback"),
])
def test_a_rank_that_died_without_a_traceback_is_named_not_torchruns_wrapper(tmp_path, code, traceback, error):
    """torchrun's ChildFailedError says only that a rank failed; its Root Cause entry says which and how
    (the smoke used to report "ChildFailedError:" for a rank killed by the OOM killer)."""
    rank0 = tmp_path / "logs" / "torchrun" / "none_x" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    (rank0 / "stderr.log").write_text("Steps:   0%|          | 0/2 [00:00<?, ?it/s]\n")  # killed: no traceback
    (tmp_path / "logs" / "console.log").write_text(TORCHRUN_CONSOLE.format(code=code, traceback=traceback))
    detail = failure_detail(tmp_path)
    assert (detail["log"], detail["error"]) == ("logs/console.log", error)


# What rank 0 says when rank 1 stopped under it while it waited in a collective (recorded from a
# 2-rank smoke whose rank 1's reward raised, shortened).
PEER_GONE = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "fastvideo/train_grpo_hunyuan.py", line 361, in train_one_step\n'
    "[rank0]:     gathered_vq_reward = gather_tensor(samples[\"vq_rewards\"])\n"
    "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
    "[127.0.0.1]:58034. This is typically caused by a remote worker crashing.\n"
)
CAUSE = (
    "[rank1]: Traceback (most recent call last):\n"
    '[rank1]:   File "fastvideo/train_grpo_hunyuan.py", line 280, in sample_reference_model\n'
    "[rank1]: dancegrpo_port.videoalign.RewardError: VideoAlign reward failed on sample 0 of rank 1: RuntimeError: boom\n"
)


def test_the_rank_that_stopped_first_is_the_cause_not_the_rank_it_left_waiting(tmp_path):
    for rank, text in (("0", PEER_GONE), ("1", CAUSE)):
        d = tmp_path / "logs" / "torchrun" / "none_x" / "attempt_0" / rank
        d.mkdir(parents=True)
        (d / "stderr.log").write_text(text)
    detail = failure_detail(tmp_path)
    assert detail["log"] == "logs/torchrun/none_x/attempt_0/1/stderr.log"
    assert detail["error"].startswith("dancegrpo_port.videoalign.RewardError: VideoAlign reward failed on sample 0")
    (tmp_path / "logs" / "torchrun" / "none_x" / "attempt_0" / "1" / "stderr.log").write_text("")
    assert "Connection closed by peer" in failure_detail(tmp_path)["error"]  # alone, it is what there is


def _rank_stderr(run_dir, text, rank="0"):
    d = run_dir / "logs" / "torchrun" / "none_x" / "attempt_0" / rank
    d.mkdir(parents=True, exist_ok=True)
    (d / "stderr.log").write_text(text)


# absl's refusal of its flags (the SD trainer's app.run): no traceback, exit 1.
ABSL_REFUSAL = ("FATAL Flags parsing error: The flag 'config' is defined twice. First from fastvideo/train_grpo_sd.py, "
                "Second from dancegrpo_port/sd.py.  Description from first occurrence: Training configuration.\n"
                "Pass --helpshort or --helpfull to see help on flags.\n")


def test_an_absl_flags_error_is_reported_with_its_message_not_as_no_traceback(tmp_path):
    _rank_stderr(tmp_path, ABSL_REFUSAL)
    (tmp_path / "logs" / "console.log").write_text(TORCHRUN_CONSOLE.format(
        code=1, traceback="To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"))
    detail = failure_detail(tmp_path)
    assert detail["log"].endswith("/0/stderr.log")
    assert detail["error"].startswith("FATAL Flags parsing error: The flag 'config' is defined twice")
    assert detail["refusal"] is True


def test_a_ranks_exit_with_a_message_is_the_failure_not_torchruns_report(tmp_path):
    """SystemExit("...") prints its message and exits 1 with no traceback: torchrun's Root Cause says
    only "exitcode 1"; the rank's message is what went wrong."""
    _rank_stderr(tmp_path, "W1201 09:23:29.5 some log line\nSteps:   0%|          | 0/2\n"
                           "the prompts file holds 3 prompts, fewer than the 8 ranks\n"
                           "/x/warnings.py:1: UserWarning: something late\n")
    (tmp_path / "logs" / "console.log").write_text(TORCHRUN_CONSOLE.format(
        code=1, traceback="To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"))
    detail = failure_detail(tmp_path)
    assert detail["error"] == "the prompts file holds 3 prompts, fewer than the 8 ranks"
    assert detail["refusal"] is True and detail["log"].endswith("/0/stderr.log")


def test_a_killed_rank_is_still_named_by_its_signal(tmp_path):
    _rank_stderr(tmp_path, "loading the transformer\n")
    (tmp_path / "logs" / "console.log").write_text(TORCHRUN_CONSOLE.format(
        code=-9, traceback="Signal 9 (SIGKILL) received by PID 25181"))
    detail = failure_detail(tmp_path)
    assert detail["error"].startswith("rank 0 was killed by signal 9") and detail["refusal"] is False


def test_a_refusal_is_the_last_line_a_failed_run_prints():
    from dancegrpo_npu.run.runner import closing_lines

    refusal = "train_grpo_sd.py: error: --max_train_steps 5 must be a positive multiple of the 2 optimizer updates"
    summary = {"continue_with": {"line": "run X failed; no checkpoint yet: launch it again"},
               "failure": {"error": refusal, "refusal": True}}
    assert closing_lines(summary) == ["dancegrpo-npu: run X failed; no checkpoint yet: launch it again",
                                      f"dancegrpo-npu: {refusal}"]
    traceback = {**summary, "failure": {"error": "RuntimeError: boom", "refusal": False}}
    assert closing_lines(traceback) == ["dancegrpo-npu: run X failed; no checkpoint yet: launch it again"]


def test_an_interrupted_run_says_the_exit_the_shell_gets(tmp_path):
    from dancegrpo_npu.run.runner import _one_line

    line = _one_line(tmp_path, {"status": "interrupted", "returncode": 1, "wall_time_s": 3.0, "steps": 0})
    assert "interrupted (exit 130)" in line
