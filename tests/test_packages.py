"""The tool's packages import each other without a cycle (module- and function-level imports,
read from the source), and cli.py is argument parsing and error reporting only."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dancegrpo_npu"


def node_of(parts: tuple[str, ...] | list[str]) -> str:
    """The package a module (its dotted parts below dancegrpo_npu) belongs to: its top-level
    package, or, under trainers/, its family's folder (``trainers.flux``).  A family is a plug-in:
    the registry finds it by walking the package, never by an import, and its hooks use the
    machinery that reads the registry (smoke, run), so it is a package of its own, above both."""
    parts = list(parts)
    if parts[0] == "trainers" and len(parts) > 2 and (PACKAGE / "trainers" / parts[1]).is_dir():
        return f"trainers.{parts[1]}"
    return parts[0]


def package_imports() -> dict[str, set[str]]:
    """{package, family folder or top-level module: the others it imports}."""
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        me = node_of(rel.with_suffix("").parts) if len(rel.parts) > 1 else rel.stem
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dancegrpo_npu"):
                names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "dancegrpo_npu" else [node.module]
                if node.module.startswith("dancegrpo_npu.trainers"):  # from dancegrpo_npu.trainers import flux
                    names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("dancegrpo_npu.")]
            for name in names:
                parts = name.split(".")[1:]
                if parts and node_of(parts + ["module"]) != me:
                    edges.setdefault(me, set()).add(node_of(parts + ["module"]))
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


def test_a_family_folder_is_a_package_of_its_own():
    """A family's hooks import the machinery that reads the registry; the registry's own modules
    import no family, so no cycle: a family module imported by the registry or by the machinery
    would be one."""
    edges = package_imports()
    families = sorted(node for node in edges if node.startswith("trainers."))
    assert "trainers.flux" in families and "smoke" in edges["trainers.flux"]
    assert not any(node in edges.get("trainers", ()) for node in families)
    planted = {**edges, "smoke": edges["smoke"] | {"trainers.flux"}}  # the machinery importing a family
    assert any("trainers.flux" in cycle for cycle in cycles(planted))


def test_the_cycle_finder_finds_one():
    assert cycles({"align": {"run"}, "run": {"align", "engine"}, "engine": set()}) == [["align", "run"]]
