"""overlay/dancegrpo_port/contract.py: the vocabulary that the trainers and the tool share.

It is defined once: the tool reads the overlay's file (dancegrpo_npu.contract), the trainers
import it in the tree, and no module on either side defines one of its names again.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "overlay"
CONTRACT = OVERLAY / "dancegrpo_port" / "contract.py"
sys.path.insert(0, str(OVERLAY))

from dancegrpo_port import contract  # noqa: E402

import dancegrpo_npu.contract as tool_contract  # noqa: E402
from dancegrpo_npu.contract import parse_step_spec  # noqa: E402
from dancegrpo_npu.errors import DancegrpoError  # noqa: E402


def _defined_names(path: Path) -> set[str]:
    """Names bound at module level by assignment, def or class (imports do not count)."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


SHARED = {name for name in _defined_names(CONTRACT) if not name.startswith("_")}


def test_the_tool_reads_the_overlays_file():
    assert tool_contract.CONTRACT_FILE == CONTRACT
    for name in SHARED:
        mine, theirs = getattr(tool_contract, name), getattr(contract, name)
        if callable(theirs):  # two loads of one file: the same code, not the same object
            assert mine.__code__.co_filename == theirs.__code__.co_filename == str(CONTRACT), name
        else:
            assert mine == theirs, name


def test_the_contract_imports_only_the_standard_library():
    imported = set()
    for node in ast.walk(ast.parse(CONTRACT.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


@pytest.mark.parametrize("side", ["src/dancegrpo_npu", "overlay/dancegrpo_port"])
def test_no_shared_name_is_defined_again(side):
    again = {}
    for path in sorted((ROOT / side).rglob("*.py")):
        if path == CONTRACT or path == ROOT / "src/dancegrpo_npu/contract.py":
            continue
        both = _defined_names(path) & SHARED
        if both:
            again[str(path.relative_to(ROOT))] = sorted(both)
    assert not again, f"defined in the contract and again here: {again}"


@pytest.mark.parametrize("text, steps", [
    ("3", {3}), ("2-4", {2, 3, 4}), ("1,5", {1, 5}), (" 1, 3-4 ", {1, 3, 4}), ("4-4", {4}), ("2,2", {2}),
    ("1 - 3", {1, 2, 3}), ("all", None), (" ALL ", None), (None, None),
])
def test_the_step_syntax(text, steps):
    assert contract.parse_steps(text) == (None if steps is None else frozenset(steps))


@pytest.mark.parametrize("text", ["", "0", "4-2", "a", "1;2", "1,", "-3", "2-", "1.5", "3-x", "٣"])
def test_bad_step_lists_are_refused_with_the_syntax(text):
    with pytest.raises(ValueError, match=r"--x .*: .*give a step N, a range A-B, a comma list"):
        contract.parse_steps(text, "--x")


@pytest.mark.parametrize("text", ["1 - 3", "all", "2,5-6", "0", "x"])
def test_the_tool_takes_what_the_trainer_takes(text):
    """launch --profile / --record-steps and compare --steps check the text before the trainer
    does: they must accept exactly what it accepts, and mean the same steps."""
    try:
        trainer = contract.parse_steps(text)
    except ValueError:
        trainer = "refused"
    try:
        tool = parse_step_spec(text, "--steps")
        tool = None if tool is None else frozenset(tool)
    except DancegrpoError:
        tool = "refused"
    assert tool == trainer


def test_format_steps_reads_back():
    assert contract.format_steps([5, 1, 2, 3, 9, 10]) == "1-3,5,9-10" and contract.format_steps([]) == ""
    assert contract.parse_steps(contract.format_steps({1, 2, 3, 7})) == {1, 2, 3, 7}
