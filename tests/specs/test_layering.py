"""Import rules of the input specs and the plans (#15), read from the source's import graph: `specs/`
imports nothing above itself (errors, units), `plans/` nothing above the cost model, neither has an
import cycle inside (the Hugging Face importer does not import the loader that dispatches to it), and
no module in either is over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "autoshard"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: frozenset[str] = frozenset()) -> set[str]:
    """The autoshard names a file imports, relative imports resolved. `from package import name` counts
    as an import of the submodule `package.name` when that is one of `modules`, else of `package`."""
    package = _module(path).split(".") if path.name == "__init__.py" else _module(path).split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return {name for name in out if name == "autoshard" or name.startswith("autoshard.")}


def _graph(area: str) -> dict[str, set[str]]:
    """Module -> the modules of the same area it imports. A package's `__init__` importing its own
    submodule is an edge like any other (that is how the loader <-> HF importer cycle closed)."""
    files = sorted((ROOT / area).rglob("*.py"))
    modules = {_module(p): p for p in files}
    names = frozenset(modules)
    return {mod: {d for d in _imports(path, names) if d in modules and d != mod} for mod, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(u: str) -> None:
        index[u] = low[u] = len(index)
        stack.append(u)
        on.add(u)
        for w in graph[u]:
            if w not in index:
                visit(w)
                low[u] = min(low[u], low[w])
            elif w in on:
                low[u] = min(low[u], index[w])
        if low[u] == index[u]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == u:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for u in graph:
        if u not in index:
            visit(u)
    return found


ALLOWED = {
    "specs": ("errors", "units", "specs"),
    "plans": ("errors", "units", "specs", "parallel", "costmodel", "plans"),
}


@pytest.mark.parametrize("area", sorted(ALLOWED))
def test_imports_go_down_only(area):
    allowed = tuple(f"autoshard.{a}" for a in ALLOWED[area])
    bad = [
        f"{_module(p)} imports {name}"
        for p in sorted((ROOT / area).rglob("*.py"))
        for name in sorted(_imports(p))
        if name != "autoshard" and not any(name == a or name.startswith(a + ".") for a in allowed)
    ]
    assert bad == []


@pytest.mark.parametrize("area", sorted(ALLOWED))
def test_no_import_cycle(area):
    assert _cycles(_graph(area)) == []


def test_the_hf_importer_does_not_import_the_loader():
    graph = _graph("specs")
    importer = {m for m in graph if m.startswith("autoshard.specs.hf")}
    assert len(importer) >= 5  # the entry point, the field reader and the family modules
    assert all("autoshard.specs.loader" not in graph[m] for m in importer)
    assert "autoshard.specs.hf" in graph["autoshard.specs.loader"]  # the loader dispatches to it


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("area", sorted(ALLOWED))
def test_no_module_over_400_lines(area):
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / area).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}
