"""Why a run failed, read from its logs: the failing rank's last lines and its exception.

The logs are what a terminal was sent, not what it showed.  Progress bars (tqdm) redraw
themselves with carriage returns and cursor-movement escapes, and close at interpreter exit -
after the traceback - so the last line of a failed rank's stderr.log is usually a progress
bar like ``Steps:   0%|          | 0/100000``, and the exception is above it.  The lines are
therefore rendered as a terminal would show them, and the error reported is the exception
line of the last traceback (``RuntimeError: ...``), not the last line.
"""

from __future__ import annotations

import re
from pathlib import Path

FAILURE_TAIL_LINES = 25

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# torch.distributed prefixes every line of an uncaught exception with "[rank0]: ", and
# torchrun's --tee prefixes the console copy with "[default0]:".
_PREFIX = re.compile(r"^(?:\[[\w-]+\]:\s?)+")
_TRACEBACK = "Traceback (most recent call last):"
# argparse's parser.error ("train_grpo_<model>.py: error: ..."), which the overlay's refusals use too,
# and absl's refusal of its flags ("FATAL Flags parsing error: ..."): a rank's own one-line refusal.
_REFUSAL = re.compile(r"^(?:\S+: error: |FATAL Flags parsing error: )")
# Those, and an exception line printed without its traceback ("torch.OutOfMemoryError: ...").
_ERROR_LINE = re.compile(r"^(?:\S+: error: |FATAL Flags parsing error: |[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b)")
# What a rank prints that is not its message: warnings and log lines ("W1201 09:23:29.5 ...").
_NOT_A_MESSAGE = re.compile(r"^(?:[WIE]\d{4} |.*Warning\b|warnings\.warn)")
_PROGRESS_BAR = re.compile(r"\d+%\|")


def rank_logs(run_dir: Path) -> list[Path]:
    """torchrun's per-rank files: logs/torchrun/<run id>/attempt_<n>/<local rank>/std{out,err}.log."""
    root = run_dir / "logs" / "torchrun"
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*.log") if p.is_file())


def rendered_lines(text: str) -> list[str]:
    """``text`` as a terminal shows it: a carriage return starts the line over (the last
    non-empty redraw wins), escape sequences are dropped, and so are the rank prefixes."""
    lines = []
    for raw in text.split("\n"):
        parts = [p for p in _ANSI.sub("", raw).split("\r") if p.strip()]
        lines.append(_PREFIX.sub("", parts[-1].rstrip()) if parts else "")
    if lines and lines[-1] == "":
        lines.pop()  # the text's final newline
    return lines


def error_line(lines: list[str]) -> str:
    """The line that says what went wrong: the exception of the last traceback; else the
    last argparse error or bare exception line; else the last line that is not a progress
    bar; "" when there is none."""
    starts = [i for i, line in enumerate(lines) if _TRACEBACK in line]
    if starts:
        # After "Traceback (...):" come indented frames (and 3.11's ^^^^ markers); the first
        # line that is not indented is "SomeError: message".
        for line in lines[starts[-1] + 1 :]:
            if line.strip() and not line[0].isspace():
                return line.strip()
    for line in reversed(lines):
        if _ERROR_LINE.match(line.strip()):
            return line.strip()
    for line in reversed(lines):
        if line.strip() and not _PROGRESS_BAR.search(line):
            return line.strip()
    return ""


_ROOT_CAUSE = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s*(rank|exitcode|traceback)\s*:\s*(.*?)\s*$")
_SIGNAL = re.compile(r"^Signal (\d+) \((\w+)\)")


def root_cause(lines: list[str]) -> str | None:
    """torchrun's "Root Cause" entry, when a rank died without a traceback of its own (killed by
    a signal, or exited with a code): which rank, and how.  SIGKILL is named as what it usually
    is on a training host, the kernel's out-of-memory killer."""
    starts = [i for i, line in enumerate(lines) if _ROOT_CAUSE in line]
    if not starts:
        return None
    fields: dict[str, str] = {}
    for line in lines[starts[-1] + 1 : starts[-1] + 12]:
        m = _FIELD.match(line)
        if m:
            fields.setdefault(m.group(1), m.group(2))
    rank = fields.get("rank", "?").split()[0]
    signal = _SIGNAL.match(fields.get("traceback", ""))
    if signal:
        number, name = signal.groups()
        why = " (out of memory? the kernel's OOM killer sends it; check free memory and dmesg)" if number == "9" else ""
        return f"rank {rank} was killed by signal {number} ({name}){why}"
    code = fields.get("exitcode", "").split()
    if code:
        return f"rank {rank} exited with code {code[0]} and left no traceback"
    return None


def _read(path: Path) -> list[str] | None:
    try:  # bytes: read_text's universal newlines would turn each \r into a line of its own
        return rendered_lines(path.read_bytes().decode("utf-8", errors="replace"))
    except OSError:
        return None


# What a rank says when it stopped because another rank died under it, in a collective: gloo's
# and NCCL's/HCCL's words for a peer that went away.  Not the run's cause when another rank says more.
_PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker|Broken pipe|"
                        r"DistBackendError|NCCL communicator was aborted|HCCL.*(?:timeout|abort)", re.IGNORECASE)


def refusal(error: str) -> bool:
    """Whether ``error`` is a rank's own one-line refusal (argparse's, the overlay's, absl's), which
    is what the user must read last, not torchrun's report of the exit."""
    return bool(_REFUSAL.match(error))


def _last_message(lines: list[str]) -> str:
    """The last line a rank printed that is a message (SystemExit("...") prints it last): not a
    progress bar, a warning or a log line, not indented (a traceback's frame); "" when none."""
    for line in reversed(lines):
        text = line.strip()
        if text and not line[0].isspace() and not _PROGRESS_BAR.search(text) and not _NOT_A_MESSAGE.match(text):
            return text
    return ""


def failure_detail(run_dir: Path) -> dict:
    """Where a failed run says why: the first rank stderr with a traceback (a rank whose error is
    only that a peer went away yields to one that says more: the rank that stopped first, whose
    exit closed the collective the others waited in), else the console; where torchrun's report
    says only that a rank exited with a code, what that rank printed last (a SystemExit's message).

    {"log": the file, relative to the run, "tail": its last lines as a terminal shows them,
    "error": the exception line (see ``error_line``), "refusal": whether it is the rank's own
    one-line refusal (``refusal``)}.
    """
    found, quiet = [], {}
    for path in rank_logs(run_dir):
        if path.name != "stderr.log":
            continue
        lines = _read(path) or []
        # a traceback, an exception line, or the trainer's argparse or absl refusal ("x.py: error: ...")
        if any(_TRACEBACK in line or "Error" in line or _ERROR_LINE.match(line.strip()) for line in lines):
            found.append({"log": str(path.relative_to(run_dir)), "tail": lines[-FAILURE_TAIL_LINES:],
                          "error": error_line(lines)})
        elif _last_message(lines):
            quiet[path.parent.name] = (path, lines)  # by local rank
    if found:
        detail = next((f for f in found if not _PEER_GONE.search(f["error"])), found[0])
        return {**detail, "refusal": refusal(detail["error"])}
    lines = _read(run_dir / "logs" / "console.log") or []
    error = error_line(lines)
    if "ChildFailedError" in error:  # torchrun's own exception says only that a rank failed
        exited = _exited_rank(lines)
        if exited in quiet:  # it exited with a message of its own (SystemExit("...")), no traceback
            path, rank_lines = quiet[exited]
            message = _last_message(rank_lines)
            return {"log": str(path.relative_to(run_dir)), "tail": rank_lines[-FAILURE_TAIL_LINES:],
                    "error": message, "refusal": True}
        error = root_cause(lines) or error
    return {"log": "logs/console.log", "tail": lines[-FAILURE_TAIL_LINES:], "error": error, "refusal": refusal(error)}


_LOCAL_RANK = re.compile(r"\(local_rank:\s*(\d+)\)")


def _exited_rank(lines: list[str]) -> str | None:
    """The local rank of torchrun's Root Cause when it exited with a code (not a signal), else None."""
    starts = [i for i, line in enumerate(lines) if _ROOT_CAUSE in line]
    if not starts:
        return None
    entry = lines[starts[-1] + 1 : starts[-1] + 12]
    if any(_SIGNAL.match(m.group(2)) for m in (_FIELD.match(line) for line in entry) if m and m.group(1) == "traceback"):
        return None
    local = next((m.group(1) for m in map(_LOCAL_RANK.search, entry) if m), None)
    return local
