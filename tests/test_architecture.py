"""The package's shape, checked from its own import graph (issue #15).

Layers, lowest first: a module imports only its own layer or lower ones, so a change to the physics
never needs the solver, the solver never builds launch commands, and the CLI is a thin shell over the
public API. Every import counts, also the ones inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import autoshard

PACKAGE = Path(autoshard.__file__).parent
LAYERS = ("errors", "units", "specs", "parallel", "costmodel", "plans", "search", "emit", "report", "study",
          "api", "cli")
MAX_LINES = 400
RE_EXPORTERS = ("autoshard.api",)
"""Plain modules that may hand on names defined elsewhere (besides every package `__init__`): the public API."""
PENDING: set[tuple[str, str, str]] = set()
"""Forwarded imports known and left to their owner: (importer, module imported from, name)."""


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the autoshard modules (and "ortools") it imports, read from the source."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("autoshard",) + path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for mod, path in names.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        wanted: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                wanted.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                for alias in node.names:  # `from package import module` needs the module, not the package
                    wanted.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base)
        graph[mod] = {"ortools" if w.split(".")[0] == "ortools" else w for w in wanted
                      if (w in names and w != mod) or w.split(".")[0] == "ortools"}
    return graph


def _modules(root: Path) -> dict[str, Path]:
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name,) + path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _defined(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level other than by importing them (defs, classes, assignments,
    also under a top-level if/try)."""
    found: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):
            todo.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            todo.extend(stmt for h in getattr(node, "handlers", []) for stmt in h.body)
    return found


def forwarded_imports(root: Path = PACKAGE) -> list[tuple[str, str, str]]:
    """(importer, module, name) for every `from module import name` inside the package (also relative
    and inside functions) where `module` is a plain module -- not a package `__init__`, not one of
    RE_EXPORTERS -- that does not define `name` itself: it only passes on a name it imported (or
    forwards by a module `__getattr__`), and a reader following the import lands in the wrong file."""
    modules = _modules(root)
    trees = {mod: ast.parse(path.read_text(), filename=str(path)) for mod, path in modules.items()}
    defined: dict[str, set[str]] = {}
    found = []
    for mod, path in modules.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(trees[mod]):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            if base not in modules or modules[base].name == "__init__.py" or base in RE_EXPORTERS:
                continue
            if base not in defined:
                defined[base] = _defined(trees[base])
            found.extend((mod, base, alias.name) for alias in node.names if alias.name not in defined[base])
    return sorted(found)


def area(module: str) -> str:
    """The layer a module belongs to: its top-level package or module under autoshard; the API's
    siblings (api_serve, api_study, api_train) are the API."""
    parts = module.split(".")
    if len(parts) < 2:
        return ""
    return "api" if parts[1].startswith("api_") else parts[1]


def layer(module: str) -> int | None:
    name = area(module)
    return LAYERS.index(name) if name in LAYERS else None


def rule_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for mod, deps in sorted(graph.items()):
        mine_area = area(mod)
        for dep in sorted(deps):
            dep_area = area(dep) if dep.startswith("autoshard.") else dep
            if dep == "ortools":
                if mine_area != "search":
                    found.append(f"{mod} imports ortools: only autoshard.search may")
                continue
            if mine_area == "search" and dep_area in ("emit", "report"):
                found.append(f"{mod} imports {dep}: the solver builds no commands and renders nothing")
            if mine_area == "costmodel" and dep_area not in ("costmodel", "specs", "parallel", "errors", "units"):
                found.append(f"{mod} imports {dep}: the cost model imports nothing above it")
            if mine_area == "cli" and dep_area not in ("cli", "api", "report", "errors") and dep != "autoshard":
                found.append(f"{mod} imports {dep}: the CLI imports only the API, report and errors")
            if mine_area == "study" and dep_area in ("api", "cli"):
                found.append(f"{mod} imports {dep}: cost studies sit below the API")
            if mod != "autoshard.api" and mine_area == "api" and dep == "autoshard.api":
                found.append(f"{mod} imports {dep}: the API's siblings never import the API back")
            mine, theirs = layer(mod), layer(dep)
            if mine is not None and theirs is not None and theirs > mine:
                found.append(f"{mod} imports {dep}: {LAYERS[mine]} sits below {LAYERS[theirs]}")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan). A package that re-exports its
    submodules counts: a submodule importing its own package back is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_imports_go_one_way() -> None:
    assert rule_violations(import_graph()) == []


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_names_are_imported_from_the_module_that_defines_them() -> None:
    assert [f"{mod} imports {name} from {base}" for mod, base, name in forwarded_imports()
            if (mod, base, name) not in PENDING] == []


def test_no_module_over_400_lines() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_graph_is_read_from_the_source() -> None:
    graph = import_graph()
    assert "ortools" in graph["autoshard.search.train.build"]
    assert "autoshard.search.train.solve" in graph["autoshard.api"] or any(
        dep.startswith("autoshard.search") for dep in graph["autoshard.api"])
    assert all(mod.startswith("autoshard") for mod in graph)


def test_the_rules_catch_what_they_forbid() -> None:
    bad = {
        "autoshard.search.serve.solve": {"autoshard.emit.vllm", "ortools"},
        "autoshard.costmodel.comm": {"autoshard.plans.train"},
        "autoshard.cli": {"autoshard.search.train.solve", "autoshard.api"},
        "autoshard.report.terminal": {"ortools"},
        "autoshard.specs.model": {"autoshard.study.run"},
        "autoshard.emit.vllm": {"autoshard.plans.serve"},
    }
    found = rule_violations(bad)
    assert any("solver builds no commands" in f for f in found)
    assert any("cost model imports nothing above" in f for f in found)
    assert any("CLI imports only" in f and "search" in f for f in found)
    assert any(f.startswith("autoshard.report.terminal imports ortools") for f in found)
    assert any("specs sits below study" in f for f in found)
    assert not any(f.startswith("autoshard.emit.vllm") for f in found)
    assert not any("autoshard.cli imports autoshard.api" in f for f in found)


def test_cycles_are_found() -> None:
    graph = {"autoshard.a": {"autoshard.b"}, "autoshard.b": {"autoshard.c"}, "autoshard.c": {"autoshard.a"},
             "autoshard.d": {"autoshard.d.x"}, "autoshard.d.x": {"autoshard.a"},
             "autoshard.e": {"autoshard.e.y"}, "autoshard.e.y": {"autoshard.e"}}
    assert cycles(graph) == [["autoshard.a", "autoshard.b", "autoshard.c"], ["autoshard.e", "autoshard.e.y"]]


def test_the_graph_reader_sees_lazy_relative_and_submodule_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "autoshard"
    (pkg / "search").mkdir(parents=True)
    (pkg / "emit").mkdir()
    for path in ("__init__.py", "search/__init__.py", "emit/__init__.py", "emit/vllm.py"):
        (pkg / path).write_text("")
    (pkg / "search" / "solve.py").write_text(
        "def f():\n    from ..emit import vllm\n    import ortools.sat.python.cp_model\n")
    graph = import_graph(pkg)
    assert graph["autoshard.search.solve"] == {"autoshard.emit.vllm", "ortools"}
    assert any("solver builds no commands" in f for f in rule_violations(graph))


def test_forwarded_imports_are_caught(tmp_path: Path) -> None:
    pkg = tmp_path / "autoshard"
    (pkg / "costmodel").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "api.py": "from autoshard.costmodel.flops import Gemm\n",
        "costmodel/__init__.py": "from autoshard.costmodel.flops import Gemm\n",
        "costmodel/flops.py": "import math\nclass Gemm: ...\nPEAK = 1\nif math.pi:\n    def late(): ...\n",
        "costmodel/compute.py": ("from autoshard.costmodel.flops import PEAK, Gemm\n"
                                 "def __getattr__(name):\n    return Gemm\n"
                                 "def gemm_time_s(): ...\n"),
        "costmodel/step.py": ("from autoshard.costmodel.compute import Gemm, gemm_time_s\n"
                              "from autoshard.costmodel.flops import PEAK, late\n"
                              "def f():\n    from .compute import PEAK as P\n    from . import compute\n"),
        "costmodel/memory.py": "from autoshard.costmodel.compute import Lazy\n",
        "search.py": ("from autoshard.api import Gemm\nfrom autoshard.costmodel import Gemm as G\n"
                      "from autoshard.costmodel.step import gemm_time_s\nimport autoshard.costmodel.compute\n"),
    }
    for path, text in files.items():
        (pkg / path).write_text(text)
    assert forwarded_imports(pkg) == [
        ("autoshard.costmodel.memory", "autoshard.costmodel.compute", "Lazy"),   # forwarded by __getattr__
        ("autoshard.costmodel.step", "autoshard.costmodel.compute", "Gemm"),
        ("autoshard.costmodel.step", "autoshard.costmodel.compute", "PEAK"),    # relative, inside a function
        ("autoshard.search", "autoshard.costmodel.step", "gemm_time_s"),        # passed on twice
    ]
