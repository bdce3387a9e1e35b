"""Plans: what the solver returns, training (`Plan`) and serving (`ServePlan`), with the solve status,
the solver certificate and the `autoshard.plan/v1` JSON envelope they share (`autoshard.plans.base`).

A new JSON field goes where its block is written: a training plan's `plan`/`predicted` blocks in
train.py, a serving plan's in serve.py (a disaggregated plan's roles in disagg.py), a field of the
envelope both kinds share in base.py. The schema is extended, never renamed.
"""

from autoshard.plans.base import SCHEMA, PlanBase, SolverStats, SolveStatus
from autoshard.plans.disagg import Disaggregation, Role
from autoshard.plans.serve import ServePlan
from autoshard.plans.train import Plan

__all__ = ["SCHEMA", "Disaggregation", "Plan", "PlanBase", "Role", "ServePlan", "SolveStatus", "SolverStats"]
