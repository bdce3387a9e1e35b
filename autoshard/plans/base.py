"""What every plan shares, training or serving: the solve status, the solver's certificate (objective,
proven bound, gap, why the search stopped) and the `autoshard.plan/v1` JSON envelope around the
kind-specific `plan` and `predicted` blocks. `autoshard.plans.train.Plan` and
`autoshard.plans.serve.ServePlan` are its two kinds."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.model import ModelSpec

__all__ = ["SCHEMA", "SolveStatus", "SolverStats", "PlanBase"]

SCHEMA = "autoshard.plan/v1"


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"  # proven best within the relative gap limit (0 by default)
    FEASIBLE = "feasible"  # best found when the time limit hit; see the gap
    EVALUATED = "evaluated"  # a user-given plan, predicted without search


@dataclass(frozen=True, slots=True)
class SolverStats:
    status: str
    """CP-SAT's status name (OPTIMAL, FEASIBLE) or "EVALUATED"."""
    wall_s: float
    objective: float
    """The solver's objective in its own unit: training, the predicted step time in seconds of the
    integer model; serving, output tokens/s per GPU (or GPUs, when sustaining a request rate)."""
    bound: float
    """Best bound on that objective proven by the solver (lower for minimization, upper for maximization)."""
    conflicts: int = 0
    branches: int = 0
    candidates: int = 0
    """Candidates examined: training, degree tuples enumerated; serving, engines dropped before pricing
    plus the rows priced (an engine at one concurrency, a prefill or decode instance), i.e. the rows in
    the model plus every count in `pruned`."""
    candidates_in_model: int = 0
    """Candidates left for CP-SAT after pruning (training: degree tuples; serving: rows)."""
    pruned: dict[str, int] = field(default_factory=dict)
    """Why candidates were discarded, with counts."""
    stop_reason: str = ""
    """Why the search stopped, from what it recorded (never from the wall time): "optimal" (the bound
    meets the objective), "time_limit" (the command's time limit ran out before the bound closed),
    "gap_limit" (CP-SAT stopped within `gap_limit`), "model_cap" (CP-SAT proved its model optimal, but
    candidates left out of the model by its size cap keep a lower bound below the plan), "evaluated"
    (no search); "" where the caller recorded none."""
    gap_limit: float = 0.0
    """The relative gap limit the solve ran with (0: prove optimality or run out of time)."""

    @property
    def gap(self) -> float:
        return abs(self.objective - self.bound) / max(1e-12, abs(self.objective))

    def to_json(self) -> dict[str, Any]:
        """The `solver` block of the plan JSON."""
        return {
            "status": self.status, "wall_s": self.wall_s, "objective": self.objective, "bound": self.bound,
            "gap": self.gap, "conflicts": self.conflicts, "branches": self.branches, "candidates": self.candidates,
            "candidates_in_model": self.candidates_in_model, "pruned": dict(self.pruned),
            "stop_reason": self.stop_reason, "gap_limit": self.gap_limit,
        }


class PlanBase:
    """The shared half of a plan. Subclasses are frozen dataclasses with the fields annotated here and
    write their own `plan` and `predicted` blocks; the JSON envelope, key order included, is this one."""

    __slots__ = ()

    model: ModelSpec
    cluster: ClusterSpec
    solver: SolverStats
    mode: str
    launch: dict[str, str]
    num_gpus: int  # a property of each kind

    def status(self) -> SolveStatus:
        if self.solver.status == "OPTIMAL":
            return SolveStatus.OPTIMAL
        if self.solver.status == "EVALUATED":
            return SolveStatus.EVALUATED
        return SolveStatus.FEASIBLE

    def _json_status(self) -> str:
        """The JSON's `status`: "optimal" when proven, else "feasible"."""
        return "optimal" if self.status() is SolveStatus.OPTIMAL else "feasible"

    def _plan_json(self) -> dict[str, Any]:
        """The `plan` block: degrees, settings and the stage layout of this kind."""
        raise NotImplementedError(f"{type(self).__name__} writes its own plan block")

    def _predicted_json(self) -> dict[str, Any]:
        """The `predicted` block: speed, memory and band of this kind."""
        raise NotImplementedError(f"{type(self).__name__} writes its own predicted block")

    def _extra_json(self) -> dict[str, Any]:
        """Keys of this kind between `launch` and `solver` (none by default)."""
        return {}

    def _solver_json(self) -> dict[str, Any]:
        return self.solver.to_json()

    def to_json(self) -> dict[str, Any]:
        """The plan as one `autoshard.plan/v1` object (ARCHITECTURE.md)."""
        return {
            "schema": SCHEMA,
            "status": self._json_status(),
            "mode": self.mode,
            "model": self.model.name,
            "cluster": self.cluster.name,
            "num_gpus": self.num_gpus,
            "plan": self._plan_json(),
            "predicted": self._predicted_json(),
            "launch": dict(self.launch),
            **self._extra_json(),
            "solver": self._solver_json(),
        }
