"""The search package's shape (#15): shared CP-SAT helpers read CP-SAT's statuses one way for both
entries, no search module over 400 lines, search imports nothing above it but the launch-command
code still in search/serve/solve.py, and the entry points stay importable where they were."""

from __future__ import annotations

import ast
import importlib
import time
from pathlib import Path

import pytest
from ortools.sat.python import cp_model

from autoshard.search.cpsat import has_solution, is_infeasible, is_optimal, new_solver, stop_reason, time_left
from autoshard.search.deadline import Deadline

SEARCH = Path(__file__).resolve().parents[2] / "autoshard" / "search"


@pytest.mark.parametrize(
    ("optimal", "status", "kwargs", "expected"),
    [
        (True, cp_model.OPTIMAL, {}, "optimal"),
        (False, cp_model.FEASIBLE, {}, "time_limit"),  # CP-SAT stopped before its proof: its time limit
        (False, cp_model.UNKNOWN, {}, "time_limit"),
        (False, cp_model.OPTIMAL, {"time_cut": True}, "time_limit"),  # a phase before CP-SAT ran out
        (False, cp_model.OPTIMAL, {"open_in_model": True, "relative_gap": 0.01}, "gap_limit"),
        (False, cp_model.OPTIMAL, {"open_in_model": True, "relative_gap": 0.0}, "model_cap"),
        (False, cp_model.OPTIMAL, {}, "model_cap"),  # proven in the model; candidates left out of it
    ],
)
def test_stop_reason_table(optimal: bool, status: int, kwargs: dict, expected: str) -> None:
    assert stop_reason(optimal, status, **kwargs) == expected


def test_status_reading_and_time_left() -> None:
    assert has_solution(cp_model.OPTIMAL) and has_solution(cp_model.FEASIBLE)
    assert not has_solution(cp_model.INFEASIBLE) and not has_solution(cp_model.UNKNOWN)
    assert is_optimal(cp_model.OPTIMAL) and not is_optimal(cp_model.FEASIBLE)
    assert is_infeasible(cp_model.INFEASIBLE) and not is_infeasible(cp_model.UNKNOWN)
    spent = Deadline(1.0, start=time.monotonic() - 5.0)
    assert time_left(spent, 0.3) == 0.01  # no time left: CP-SAT only loads the model
    fresh = Deadline(10.0)
    assert 9.0 < time_left(fresh, 0.3) <= 9.7


def test_new_solver_settings_and_a_tiny_model() -> None:
    solver = new_solver(num_workers=3, seed=7, relative_gap=0.05)
    p = solver.parameters
    assert (p.num_workers, p.random_seed, p.relative_gap_limit, p.log_search_progress) == (3, 7, 0.05, False)
    m = cp_model.CpModel()
    x = m.new_int_var(0, 10, "x")
    y = m.new_int_var(0, 10, "y")
    m.add(x + 2 * y <= 13)
    m.maximize(3 * x + 4 * y)
    one = new_solver(num_workers=1, seed=0)
    assert is_optimal(one.solve(m))
    best = max(3 * a + 4 * b for a in range(11) for b in range(11) if a + 2 * b <= 13)  # brute force
    assert one.objective_value == best == 35


def _modules() -> list[Path]:
    return sorted(p for p in SEARCH.rglob("*.py"))


def test_no_search_module_over_400_lines() -> None:
    long = {p.relative_to(SEARCH).as_posix(): n for p in _modules() if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


# the launch-command code still in search/serve/solve.py (moving up to api.py, #15)
_LAUNCH_CODE = {("serve/solve.py", m) for m in ("autoshard.emit.pd", "autoshard.emit.vllm", "autoshard.emit.sglang",
                                                  "autoshard.emit.serve_parse")}
_ABOVE = ("autoshard.emit", "autoshard.report", "autoshard.study", "autoshard.api", "autoshard.serve_api", "autoshard.cli")


def test_search_imports_nothing_above_it() -> None:
    found = set()
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith(_ABOVE):
                    found.add((path.relative_to(SEARCH).as_posix(), name))
    assert found - _LAUNCH_CODE == set()


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("autoshard.search.train.solve", ["solve_train", "SolverOptions", "prepare", "Prepared", "DEFAULT_MEMORY_FRACTION"]),
        ("autoshard.search.train.bounds", ["bounds", "quick_lower_bound", "tmax_lower_bound", "mixed_tmax_lower_bound",
                                           "assignment_bounds", "pool_rank_limits", "joint_search", "rank_room"]),
        ("autoshard.search.train.space", ["Pins", "SpaceOptions", "enumerate_train", "expert_grid_hint"]),
        ("autoshard.search.serve.solve", ["solve_serve", "evaluate_serve", "evaluate_vllm", "model_for_path",
                                          "enumerate_serve", "tabulate", "TIE_SCALE", "Engine", "Row"]),
        ("autoshard.search.serve.front", ["serve_front"]),
        ("autoshard.api", ["solve_with_layout", "expert_grid_hint"]),
    ],
)
def test_entry_points_stay_where_they_were(module: str, names: list[str]) -> None:
    mod = importlib.import_module(module)
    assert [n for n in names if not hasattr(mod, n)] == []
