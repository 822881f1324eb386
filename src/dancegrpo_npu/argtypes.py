"""Argument types for numbers a verb takes: finite, and on the right side of zero.

``float("nan")`` and ``float("inf")`` parse, and a negative size or timeout parses too; each
would end later in a traceback or a check that means nothing.  argparse turns the
``ArgumentTypeError`` into the tool's one-line usage error (exit 2).
"""

from __future__ import annotations

import argparse
import math


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive(text: str) -> float:
    """A finite number above 0 (a timeout, a memory size)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def non_negative(text: str) -> float:
    """A finite number of 0 or more (a reserve, a free-space floor)."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value
