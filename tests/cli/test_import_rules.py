"""The import rules of the API / CLI / cost-study layers (#15), read from the code's own import graph:
the command line goes through the API only, the cost studies never reach up into the API or the CLI,
the solver never builds launch commands, the API's siblings do not import the API back, and no module
of these layers passes 400 lines. Every `import` counts, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "autoshard"
API = ("autoshard.api", "autoshard.api_serve", "autoshard.api_study", "autoshard.api_train")


def _module(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every autoshard module (or name in one) the file imports, relative imports resolved."""
    module = _module(path, root).split(".")
    package = module if path.name == "__init__.py" else module[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m == "autoshard" or m.startswith("autoshard.")}


def _files(*areas: str) -> list[Path]:
    out: list[Path] = []
    for area in areas:
        target = ROOT / area
        out += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return out


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_graph_reader_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    (tmp_path / "autoshard" / "pkg").mkdir(parents=True)
    mod = tmp_path / "autoshard" / "pkg" / "mod.py"
    mod.write_text("import json\n\n\ndef f():\n    from ..api import solve\n    import autoshard.cli\n")
    assert _imports(mod, tmp_path / "autoshard") == {"autoshard.api", "autoshard.api.solve", "autoshard.cli"}
    assert "autoshard.study.run" in _imports(ROOT / "study" / "front.py")  # imported inside a function


@pytest.mark.parametrize("path", _files("cli"), ids=lambda p: p.name)
def test_the_cli_imports_only_the_api_report_and_errors(path: Path) -> None:
    # `autoshard.api` itself, not its siblings (autoshard.api_serve, ...): api.py is the one surface it sees
    bad = sorted(m for m in _imports(path) if m not in ("autoshard", "autoshard.__version__")
                 and not _under(m, "autoshard.api", "autoshard.report", "autoshard.errors", "autoshard.cli"))
    assert not bad, f"{path.name} imports {bad}: go through autoshard.api (re-export what the CLI needs there)"


@pytest.mark.parametrize("path", _files("study"), ids=lambda p: p.name)
def test_cost_studies_import_neither_the_api_nor_the_cli(path: Path) -> None:
    bad = sorted(m for m in _imports(path) if _under(m, "autoshard.cli", *API))
    assert not bad, f"{path.name} imports {bad}: a study uses search, plans, costmodel, specs and report"


@pytest.mark.parametrize("path", _files("search"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_solver_builds_no_launch_command(path: Path) -> None:
    bad = sorted(m for m in _imports(path) if _under(m, "autoshard.emit", "autoshard.report"))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: launch commands are attached in autoshard.api_serve"


@pytest.mark.parametrize("name", ["api_serve.py", "api_study.py", "api_train.py"])
def test_the_api_siblings_do_not_import_the_api(name: str) -> None:
    bad = sorted(m for m in _imports(ROOT / name) if _under(m, "autoshard.api", "autoshard.cli"))
    assert not bad, f"{name} imports {bad}: autoshard.api re-exports it, so it must not import autoshard.api"


def test_no_import_cycle_among_the_cost_study_modules() -> None:
    graph = {_module(p): {m for m in _imports(p) if _under(m, "autoshard.study")} for p in _files("study")}
    graph = {m: {d for d in deps if d in graph and d != m and not d.startswith(m + ".")} for m, deps in graph.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(d == goal or (d not in seen and not seen.add(d) and reaches(d, goal, seen)) for d in graph[start])

    cyclic = sorted(m for m in graph if reaches(m, m, set()))
    assert not cyclic, f"import cycle through {cyclic}"


@pytest.mark.parametrize("path", _files("cli", "study", "api.py", "api_serve.py", "api_study.py", "api_train.py"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_of_these_layers_passes_400_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 400, f"{path.relative_to(ROOT)}: split it by concern"
