"""Settle the candidates that could still beat the best plan one CP-SAT model at a time, before the
joint model: lowest bound first, each alone with the objective capped one below the best plan found.

One candidate alone is a small model CP-SAT closes in a fraction of a second; several in one model
(one of them selected) are much harder, because the bound of a model that may pick any of them is
their weakest. DeepSeek-V3 on 16,384 H200s (the bundled job): five candidates left after the bounds,
each proven alone in 0.04-0.12 s of one core, together not within 24 s. A candidate whose capped
model is infeasible cannot beat the best plan (its bound becomes that plan's objective); one that
solves gives its optimum as the new best plan, with a layout re-checked by `int_objective`. The
joint model that follows then holds only what is still open (with one plan wanted: usually the best
candidate alone, at its own bound)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from autoshard.search.cpsat import new_solver, time_left, value_of
from autoshard.search.deadline import Deadline
from autoshard.search.train.build import build_model
from autoshard.search.train.options import SolverOptions
from autoshard.search.train.prepare import Prepared
from autoshard.search.train.tables import Layout, int_objective

__all__ = ["Settled", "settle"]

_MIN_LEFT_S = 0.05
"""Seconds a settling solve needs left beyond the re-check reserve to be worth starting."""


@dataclass(slots=True)
class Settled:
    """What the settling pass did: candidates solved alone, CP-SAT's conflicts and branches."""

    solved: int = 0
    conflicts: int = 0
    branches: int = 0


def settle(prep: Prepared, keep: list[int], *, pool_gpus: list[int], uniform_recompute: bool,
           options: SolverOptions, recompute_num_layers: int | None, deadline: Deadline,
           reserve_s: float) -> Settled:
    """Solve the kept candidates alone, lowest bound first, while their bound is below the best plan
    found and time is left; updates `prep` in place (bounds raised, incumbents replaced by the
    candidates' optima). Only with one plan wanted and no gap limit (otherwise nothing happens)."""
    done = Settled()
    if options.top_k != 1 or options.relative_gap > 0:
        return done
    for i in sorted(keep, key=lambda i: (prep.lower_bounds[i], i)):
        found = [prep.incumbents[j][0] for j in keep if prep.incumbents[j] is not None]
        if not found:
            return done  # nothing to cap with: the joint model searches for a first plan
        best = min(found)
        inc = prep.incumbents[i]
        if prep.lower_bounds[i] >= best or (inc is not None and inc[0] <= prep.lower_bounds[i]):
            continue  # cannot beat the best plan, or already proven at its own bound
        if deadline.remaining() < reserve_s + _MIN_LEFT_S:
            return done
        tab = prep.tables[i]
        built = build_model(
            [tab], pool_gpus=pool_gpus, uniform_recompute=uniform_recompute or recompute_num_layers is not None,
            per_stage_recompute=options.space.per_stage_recompute, hint_index=0 if inc else None,
            hint=inc[1] if inc else None, even_layout_only=options.space.even_layout_only,
            lower_bounds=[prep.lower_bounds[i]], tmax_lower_bounds=[prep.tmax_bounds[i]],
            fixed_pools=[prep.fixed_pools[i]],
        )
        cand = built.candidates[0]
        if recompute_num_layers is not None:
            for r in cand.recompute:
                if not isinstance(r, int):
                    built.model.add(r == recompute_num_layers)
        built.model.add(cand.objective <= best - 1)
        solver = new_solver(num_workers=max(1, options.num_workers), seed=options.seed, log=options.log)
        solver.parameters.max_time_in_seconds = time_left(deadline, reserve_s)
        status = solver.solve(built.model)
        done.conflicts += solver.num_conflicts
        done.branches += solver.num_branches
        if status == cp_model.INFEASIBLE:
            prep.lower_bounds[i] = max(prep.lower_bounds[i], best)  # proven: it cannot beat the best plan
            done.solved += 1
            continue
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            pp = tab.config.dims.pp
            pools = [value_of(solver, q) for q in cand.rank_pools]
            layout = Layout(bounds=tuple(value_of(solver, b) for b in cand.bounds),
                            recompute=tuple(value_of(solver, r) for r in cand.recompute),
                            pools=tuple(pools[k % pp] for k in range(tab.num_chunks)))
            objective, fits = int_objective(tab, layout)
            if fits and objective <= solver.objective_value:
                prep.incumbents[i] = (objective, layout)
                if status == cp_model.OPTIMAL:
                    prep.lower_bounds[i] = max(prep.lower_bounds[i], objective)
                    done.solved += 1
                    continue
        # stopped by the clock: what CP-SAT proved of the capped model still holds below the best plan
        if solver.best_objective_bound > 0:
            proven = min(best, math.ceil(solver.best_objective_bound - 1e-6))
            prep.lower_bounds[i] = max(prep.lower_bounds[i], proven)
        return done
    return done
