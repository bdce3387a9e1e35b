"""The search package's shared CP-SAT helpers (#15) read CP-SAT's statuses one way for both entries,
and the entry points stay importable where they were. (Import direction and module size:
tests/test_architecture.py.)"""

from __future__ import annotations

import importlib
import time

import pytest
from ortools.sat.python import cp_model

from autoshard.search.cpsat import has_solution, is_infeasible, is_optimal, new_solver, stop_reason, time_left
from autoshard.search.deadline import Deadline


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


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("autoshard.search.train.solve", ["solve_train", "SolverOptions"]),
        ("autoshard.search.train.options", ["SolverOptions", "DEFAULT_MEMORY_FRACTION"]),
        ("autoshard.search.train.prepare", ["prepare", "Prepared"]),
        ("autoshard.search.train.bounds", ["bounds", "quick_lower_bound", "tmax_lower_bound", "mixed_tmax_lower_bound",
                                           "assignment_bounds", "pool_rank_limits", "joint_search", "rank_room"]),
        ("autoshard.search.train.space", ["Pins", "SpaceOptions", "enumerate_train", "expert_grid_hint"]),
        ("autoshard.search.serve.solve", ["solve_serve", "evaluate_serve", "model_for_path"]),
        ("autoshard.search.serve.space", ["enumerate_serve", "tabulate", "TIE_SCALE", "Engine", "Row"]),
        ("autoshard.search.serve.front", ["serve_front"]),
        ("autoshard.api", ["solve_with_layout", "expert_grid_hint", "evaluate_vllm", "solve_serve"]),
    ],
)
def test_entry_points_stay_where_they_were(module: str, names: list[str]) -> None:
    mod = importlib.import_module(module)
    assert [n for n in names if not hasattr(mod, n)] == []
