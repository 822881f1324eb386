"""The tool's packages import each other without a cycle (module- and function-level imports,
read from the source), and cli.py is argument parsing and error reporting only."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dancegrpo_npu"


def package_imports() -> dict[str, set[str]]:
    """{package or top-level module: the others it imports}."""
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        me = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dancegrpo_npu"):
                names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "dancegrpo_npu" else [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("dancegrpo_npu.")]
            for name in names:
                parts = name.split(".")
                if len(parts) > 1 and parts[1] != me:
                    edges.setdefault(me, set()).add(parts[1])
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def module_imports() -> dict[str, set[str]]:
    """{module: the modules of the tool it imports}, by dotted name below dancegrpo_npu."""
    modules = {".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        me = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dancegrpo_npu."):
                target = node.module.removeprefix("dancegrpo_npu.")
                names = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.removeprefix("dancegrpo_npu.") for a in node.names if a.name.startswith("dancegrpo_npu.")]
            else:
                continue
            edges.setdefault(me, set()).update(n for n in names if n in modules and n != me)
    return edges


def test_no_import_cycle_between_packages():
    assert cycles(package_imports()) == []


def test_no_import_cycle_between_modules():
    assert cycles(module_imports()) == []


def test_the_families_sit_above_the_machinery():
    """The families (trainers/) use the machinery that reads the registry (smoke, run); the
    registry finds them by walking the package, and nothing below imports one: an import of a
    family by the registry or the machinery would close a cycle."""
    edges = package_imports()
    assert {"registry", "smoke"} <= edges["trainers"]
    assert not any("trainers" in edges.get(node, ()) for node in edges if node != "trainers")
    for importer in ("registry", "smoke", "engine"):
        planted = {**edges, importer: edges.get(importer, set()) | {"trainers"}}
        assert any("trainers" in cycle for cycle in cycles(planted)), importer


def test_the_cycle_finder_finds_one():
    assert cycles({"align": {"run"}, "run": {"align", "engine"}, "engine": set()}) == [["align", "run"]]
