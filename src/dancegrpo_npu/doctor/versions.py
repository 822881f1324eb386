"""The versions this series is written for, and Ascend's torch_npu / torch / CANN table.

docs/ascend-910b.md's version table mirrors these; ``doctor`` checks against them.
"""

from __future__ import annotations

import re

MIN_PYTHON = (3, 10)

# What this series is written for.  NPU: MindSpeed-MM's known-good set for FLUX DanceGRPO, as its
# FLUX DanceGRPO example pins it (torch 2.7.1 + torch_npu 2.7.1, CANN 8.2.RC1, Python 3.10).  Not run here:
# no machine of this project has an NPU.
KNOWN_GOOD = {"python": "3.10", "torch": "2.7.1", "torch_npu": "2.7.1", "cann": "8.2.RC1"}

# torch_npu wheel -> (torch, CANN): rows of Ascend's published compatibility table
# (Ascend/pytorch README, "Ascend Auxiliary Software"; gitcode.com/Ascend/pytorch), the
# releases from CANN 8.2.RC1 on.  doctor checks torch == torch_npu's torch exactly and notes
# a CANN that is not the table's.
TORCH_NPU_TABLE: tuple[tuple[str, str, str], ...] = (
    ("2.1.0.post13", "2.1.0", "8.2.RC1"),
    ("2.5.1.post1", "2.5.1", "8.2.RC1"),
    ("2.6.0", "2.6.0", "8.2.RC1"),
    ("2.1.0.post17", "2.1.0", "8.3.RC1"),
    ("2.6.0.post3", "2.6.0", "8.3.RC1"),
    ("2.7.1", "2.7.1", "8.3.RC1"),
    ("2.8.0", "2.8.0", "8.3.RC1"),
    ("2.6.0.post5", "2.6.0", "8.5.0"),
    ("2.7.1.post2", "2.7.1", "8.5.0"),
    ("2.8.0.post2", "2.8.0", "8.5.0"),
    ("2.9.0", "2.9.0", "8.5.0"),
)


def base_version(version: str) -> str:
    """'2.7.1+cpu' -> '2.7.1'; '2.7.1.post2' -> '2.7.1'; '2.7.1rc1' -> '2.7.1'."""
    m = re.match(r"(\d+\.\d+\.\d+)", version)
    return m.group(1) if m else version


def table_row(torch_npu_version: str) -> tuple[str, str, str] | None:
    """The table's row for this torch_npu wheel (local suffix ignored), if it has one."""
    wheel = torch_npu_version.split("+")[0]
    for row in TORCH_NPU_TABLE:
        if row[0] == wheel:
            return row
    return None
