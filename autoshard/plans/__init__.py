"""Plans: what the solver returns, training (`Plan`) and serving (`ServePlan`), with the solve status,
the solver certificate and the `autoshard.plan/v1` JSON envelope they share (`autoshard.plans.base`)."""

from autoshard.plans.base import SCHEMA, PlanBase, SolverStats, SolveStatus
from autoshard.plans.serve import Disaggregation, Role, ServePlan
from autoshard.plans.train import Plan

__all__ = ["SCHEMA", "Disaggregation", "Plan", "PlanBase", "Role", "ServePlan", "SolveStatus", "SolverStats"]
