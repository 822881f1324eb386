"""The one error type of the tool: what went wrong, and what to do about it."""

from __future__ import annotations


# What an interrupted command says (Ctrl-C): every verb finishes or rolls back on its next run.
INTERRUPTED = "interrupted; re-run the same command to finish or roll back"


class DancegrpoError(Exception):
    """A failure the user can act on.

    ``message`` says what is wrong, ``hint`` what to do.  The CLI prints both on
    one line of stderr and exits with ``exit_code``; no traceback is shown, since
    these are answers to bad input or a bad environment, not bugs.
    """

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 1):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def one_line(self) -> str:
        text = self.message.rstrip(".")
        if self.hint:
            text += f"; {self.hint}"
        return " ".join(text.split())


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a training run, carrying what to say instead of INTERRUPTED: the run, its
    last complete checkpoint and the command that continues it (``run.resume.continuation``)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
