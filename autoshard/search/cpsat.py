"""CP-SAT plumbing shared by the training and the serving entries: one solver configured the same
way (workers, seed, gap limit, log to stderr), its time limit carved out of the command's Deadline,
and one reading of what CP-SAT returned (a solution or not, and why the search stopped short of a
proof). The models themselves are built in `search.train.build` and `search.serve.model`."""

from __future__ import annotations

import sys

from ortools.sat.python import cp_model

from autoshard.search.deadline import Deadline

__all__ = ["new_solver", "time_left", "has_solution", "is_optimal", "is_infeasible", "stop_reason", "value_of"]

MIN_SOLVE_S = 0.01
"""The least time CP-SAT is given: with no time left it only loads the model (the caller then falls
back on what it found before)."""


def new_solver(*, num_workers: int, seed: int, relative_gap: float = 0.0, log: bool = False) -> cp_model.CpSolver:
    """A CP-SAT solver with `num_workers` portfolio workers (0: CP-SAT's own choice), a fixed seed
    (results are deterministic for a fixed seed and worker count whenever the solve proves
    optimality), a relative gap limit, and with `log` its search log on stderr (stdout may hold the
    one --json object)."""
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.num_workers = num_workers
    params.random_seed = seed
    params.relative_gap_limit = relative_gap
    params.log_search_progress = log
    if log:
        params.log_to_stdout = False
        solver.log_callback = lambda line: print(line, file=sys.stderr)
    return solver


def time_left(deadline: Deadline, reserve_s: float) -> float:
    """Seconds CP-SAT may run: what `deadline` leaves once `reserve_s` is kept back for decoding and
    re-checking the plan, never less than MIN_SOLVE_S."""
    return max(MIN_SOLVE_S, deadline.remaining() - reserve_s)


def has_solution(status: int) -> bool:
    """Whether CP-SAT returned a solution (OPTIMAL or FEASIBLE)."""
    return status in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def is_optimal(status: int) -> bool:
    """Whether CP-SAT proved its solution optimal (within its gap limit)."""
    return status == cp_model.OPTIMAL


def is_infeasible(status: int) -> bool:
    """Whether CP-SAT proved that its model has no solution."""
    return status == cp_model.INFEASIBLE


def stop_reason(optimal: bool, cp_status: int, *, time_cut: bool = False, open_in_model: bool = False,
                relative_gap: float = 0.0) -> str:
    """Why a search stopped short of a proof (the plan JSON's `stop_reason`): "optimal" when proven;
    "time_limit" when CP-SAT stopped before proving its model (FEASIBLE or UNKNOWN: only its time
    limit, the rest of the command's deadline, does that) or a phase before it ran out of time
    (`time_cut`); "gap_limit" when the model's bound is still open under a positive relative gap
    limit; else "model_cap" (candidates left out of the model by its size cap). The training search
    also reports "relaxed" (search.train.solve: its tables relax the EP all-to-all overlap's step)."""
    if optimal:
        return "optimal"
    if cp_status != cp_model.OPTIMAL or time_cut:
        return "time_limit"
    if open_in_model and relative_gap > 0:
        return "gap_limit"
    return "model_cap"


def value_of(solver: cp_model.CpSolver, var: cp_model.IntVar | int) -> int:
    """A variable's value in the solution (a constant stands for itself)."""
    return var if isinstance(var, int) else solver.value(var)
