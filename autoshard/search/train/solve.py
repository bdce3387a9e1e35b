"""Solve orchestration: enumerate, tabulate, prune by bounds, build one CP-SAT model, solve,
decode, re-check in floats, and return the best plans with their certificate."""

from __future__ import annotations

import dataclasses

from ortools.sat.python import cp_model

from autoshard.costmodel.train.step import predict_train
from autoshard.errors import SolverError
from autoshard.plans.base import SolverStats
from autoshard.plans.train import Plan
from autoshard.search.cpsat import has_solution, new_solver, stop_reason, time_left
from autoshard.search.deadline import Deadline
from autoshard.search.train.build import build_model
from autoshard.search.train.options import DEFAULT_MEMORY_FRACTION, SolverOptions
from autoshard.search.train.prepare import Prepared, prepare
from autoshard.search.train.result import decode, infeasible, layout_stages
from autoshard.search.train.settle import settle
from autoshard.search.train.space import Pins, check_pins
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import TrainJob
from autoshard.specs.model import ModelSpec
from autoshard.units import US_PER_S

__all__ = ["solve_train", "SolverOptions"]


_PREPARE_SHARE = 0.85
"""Share of the time limit for enumeration, bounds and incumbents; CP-SAT gets the rest (and all
that the preparation leaves unused). With the joint bounds CP-SAT mostly confirms what the bounds
already proved: in the 168-solve stratified sweep at a 10 s limit (examples/benchmark_solver.py
--latin), 23 of 40 unproven solves had stopped preparing at 0.7 of the limit and left CP-SAT's 3 s
unused; with the joint bounds CP-SAT took 1.3-1.8 s of one core on the long solves profiled
(DeepSeek-V3 on 1,024 H100s, Llama 3.1 70B on mixed-3pool)."""
_FIRST_PLAN_GRACE_S = 0.8
"""How far past the limit the search may run while it has found no plan at all (the issue's bound
on overshooting the limit is 2 s)."""
_RECHECK_RESERVE_S = 0.3
"""Wall time kept back from CP-SAT for decoding and the float re-check of the plan."""


def _stop_reason(optimal: bool, cp_status: int, open_in_model: bool, prep: Prepared, options: SolverOptions) -> str:
    """Why the search stopped short of a proof, from what it recorded: CP-SAT stopped before proving
    its model (FEASIBLE or UNKNOWN: only its time limit, the rest of the command's deadline, does
    that), candidates left out because a phase ran out of time, CP-SAT's own gap limit, or else
    candidates left out of the model by its size cap."""
    return stop_reason(optimal, cp_status, time_cut=any(k.startswith("time limit") for k in prep.pruned),
                       open_in_model=open_in_model, relative_gap=options.relative_gap)


def _select(prep: Prepared, options: SolverOptions, among: list[int] | None = None) -> list[int]:
    """Candidates for the CP-SAT model (of `among`, default all): those whose lower bound beats the
    top_k-th best incumbent, lowest bound first, at most max_candidates_in_model of them. With one
    plan wanted, a bound equal to the best plan's objective cannot beat it either: only the holder
    of that plan stays."""
    among = list(range(len(prep.tables))) if among is None else among
    found = sorted(inc[0] for i in among if (inc := prep.incumbents[i]) is not None)
    k = max(1, options.top_k)
    ub = found[k - 1] if len(found) >= k else None
    holder = min((i for i in among if prep.incumbents[i] and prep.incumbents[i][0] == ub), default=None)
    order = sorted(among, key=lambda i: (prep.lower_bounds[i], i))
    keep = []
    for i in order:
        if ub is not None and prep.lower_bounds[i] > ub and (prep.incumbents[i] is None or prep.incumbents[i][0] > ub):
            prep.pruned["bound: cannot beat the best plan found"] += 1
            continue
        if k == 1 and ub is not None and prep.lower_bounds[i] >= ub and i != holder:
            prep.pruned["bound: cannot beat the best plan found"] += 1
            continue
        keep.append(i)
    # candidates with their pools fixed are light (no pool variables): twice as many fit the model
    cap = options.max_candidates_in_model * (2 if any(f is not None for f in prep.fixed_pools) else 1)
    if len(keep) > cap:
        best = min((i for i in keep if prep.incumbents[i]), key=lambda i: prep.incumbents[i][0], default=None)
        head = keep[:cap]
        if best is not None and best not in head:
            head[-1] = best  # the incumbent always stays in the model
        left = [i for i in keep if i not in head]
        left_bound = min(prep.lower_bounds[i] for i in left)
        prep.excluded_bound = left_bound if prep.excluded_bound is None else min(prep.excluded_bound, left_bound)
        prep.pruned["model size cap (bound still certified)"] += len(left)
        keep = head
    return keep


def solve_train(
    model: ModelSpec, cluster: ClusterSpec, job: TrainJob, *, pins: Pins = Pins(), options: SolverOptions = SolverOptions()
) -> list[Plan]:
    """The best `options.top_k` distinct training plans, best first.

    The whole solve honours `options.time_limit_s` (counted from `options.started_at` when given):
    enumeration and bounds get most of it, CP-SAT what is left; past the limit the best plan found so
    far comes back as FEASIBLE with the bound proven so far."""
    deadline = Deadline(options.time_limit_s, start=options.started_at)
    check_pins(model, cluster, job, pins)
    # past the limit the search only goes on while it has no plan at all, and never past the grace
    grace = Deadline(options.time_limit_s + _FIRST_PLAN_GRACE_S, start=deadline.start)
    prep = prepare(model, cluster, job, pins=pins, options=options, deadline=deadline.part(_PREPARE_SHARE),
                   hard_deadline=grace)
    if not prep.tables:
        # cut short by the clock (the preparation's share or the whole limit): the candidates left were
        # never looked at, so "nothing fits" would be a guess -- say the time ran out instead
        if (deadline.expired() or prep.excluded_bound is not None
                or any(reason.startswith("time limit") for reason in prep.pruned)):
            raise SolverError(f"no plan found within the {options.time_limit_s:g} s time limit ({prep.enumerated} "
                              "candidates enumerated): raise --time-limit or pin some knobs")
        raise infeasible(model, cluster, job, prep, pins)
    if all(inc is None for inc in prep.incumbents) and deadline.remaining() <= _RECHECK_RESERVE_S:
        # the grace is spent and no plan exists: building a model CP-SAT gets no time to search would
        # only push the overrun past the limit + 2 s
        raise SolverError(f"no plan found within the {options.time_limit_s:g} s time limit ({len(prep.tables)} "
                          "candidates bounded, none with a layout found yet): raise --time-limit or pin some knobs")
    keep = _select(prep, options)
    # one candidate at a time first (small models close fast), then the joint model on what is open
    settled = settle(prep, keep, pool_gpus=[p.num_gpus for p in cluster.pools],
                     uniform_recompute=options.space.uniform_recompute, options=options,
                     recompute_num_layers=pins.recompute_num_layers, deadline=deadline, reserve_s=_RECHECK_RESERVE_S)
    if settled.solved:
        keep = _select(prep, options, among=keep)
    tables = [prep.tables[i] for i in keep]
    best_inc = min(((prep.incumbents[i][0], j) for j, i in enumerate(keep) if prep.incumbents[i]), default=None)
    hint_index = best_inc[1] if best_inc else None
    hint = prep.incumbents[keep[hint_index]][1] if best_inc else None
    built = build_model(
        tables, pool_gpus=[p.num_gpus for p in cluster.pools],
        uniform_recompute=options.space.uniform_recompute or pins.recompute_num_layers is not None,
        per_stage_recompute=options.space.per_stage_recompute, hint_index=hint_index, hint=hint,
        even_layout_only=options.space.even_layout_only,
        lower_bounds=[prep.lower_bounds[i] for i in keep], tmax_lower_bounds=[prep.tmax_bounds[i] for i in keep],
        fixed_pools=[prep.fixed_pools[i] for i in keep],
    )
    if pins.recompute_num_layers is not None:
        for cand in built.candidates:
            for r in cand.recompute:
                if not isinstance(r, int):
                    built.model.add(r == pins.recompute_num_layers)
    solver = new_solver(num_workers=max(1, options.num_workers), seed=options.seed,
                        relative_gap=options.relative_gap, log=options.log)
    scale_s = prep.scale * US_PER_S
    plans: list[Plan] = []
    returned: set[int] = set()
    for _ in range(max(1, options.top_k)):
        # keep a moment for decoding and the float re-check; with no time left, CP-SAT only loads the
        # model and the best incumbent below stands in
        solver.parameters.max_time_in_seconds = time_left(deadline, _RECHECK_RESERVE_S)
        status = cp_status = solver.solve(built.model)
        if status == cp_model.INFEASIBLE:
            if plans:
                break
            if prep.excluded_bound == 0:
                raise SolverError(f"no plan found within the {options.time_limit_s:g} s time limit: raise "
                                  "--time-limit or pin some knobs")
            raise infeasible(model, cluster, job, prep, pins)
        in_model = [prep.lower_bounds[i] for j, i in enumerate(keep) if j not in returned]
        better = None
        if has_solution(status) and cp_status != cp_model.OPTIMAL:
            # stopped by the clock: an incumbent the bounds search built may still beat what CP-SAT
            # found (it did not always complete the hint); the better plan comes back
            better = min(((prep.incumbents[i][0], j) for j, i in enumerate(keep)
                          if j not in returned and prep.incumbents[i] is not None
                          and prep.incumbents[i][0] < solver.objective_value), default=None)
        if has_solution(status) and better is None:
            index = next(i for i, c in enumerate(built.candidates) if solver.value(c.selected))
            cfg, stages = decode(built, solver, index)
            objective, solver_bound = solver.objective_value, solver.best_objective_bound
        elif better is not None:
            objective, index = better
            cfg, stages = layout_stages(tables[index], prep.incumbents[keep[index]][1])
            solver_bound = solver.best_objective_bound
            status = cp_model.FEASIBLE
        else:
            # CP-SAT ran out of time before completing a solution: fall back on the best incumbent
            # the bounds search built (a real, memory-checked layout), with the proven bound.
            found = [(prep.incumbents[i][0], j) for j, i in enumerate(keep)
                     if j not in returned and prep.incumbents[i] is not None]
            if not found:
                if plans:
                    break
                raise SolverError(f"CP-SAT found no plan within {options.time_limit_s:.0f} s (status "
                                  f"{solver.status_name(status)}); raise --time-limit or pin some knobs")
            objective, index = min(found)
            cfg, stages = layout_stages(tables[index], prep.incumbents[keep[index]][1])
            solver_bound = min(in_model)
            status = cp_model.FEASIBLE
        # CP-SAT's bound, never weaker than the bounds proven before the model was built (the model
        # holds only candidates whose bound is at least the smallest one still in it)
        bound = max(solver_bound, min(in_model, default=solver_bound))
        if prep.excluded_bound is not None:
            bound = min(bound, prep.excluded_bound)
        bound = min(bound, objective)
        optimal = status == cp_model.OPTIMAL and bound >= objective - 1e-6
        stats = SolverStats(
            status="OPTIMAL" if optimal else "FEASIBLE",
            stop_reason=_stop_reason(optimal, cp_status, solver_bound < objective - 1e-6, prep, options),
            gap_limit=options.relative_gap,
            wall_s=deadline.elapsed(),
            objective=objective / scale_s,
            bound=bound / scale_s,
            conflicts=solver.num_conflicts + settled.conflicts,
            branches=solver.num_branches + settled.branches,
            candidates=prep.enumerated,
            candidates_in_model=len(tables),
            pruned=dict(prep.pruned),
        )
        prediction = predict_train(model, cluster, cfg, stages)
        if cfg.moe_a2a_overlap and prediction.step_time_s > stats.objective + 1e-9:
            # the tables count the overlap's EP traffic as hidden on every micro-batch, a relaxation of the
            # step the cost model prices (warm-up forwards and unequal chunks pair fewer layers): the
            # plan is reported at its step, proven within the gap to the relaxed bound
            stats = dataclasses.replace(stats, status="FEASIBLE", objective=prediction.step_time_s,
                                        stop_reason="relaxed" if stats.stop_reason == "optimal" else stats.stop_reason)
        plans.append(Plan(model=model, cluster=cluster, config=cfg, stages=stages, prediction=prediction, solver=stats))
        built.model.add(built.candidates[index].selected == 0)
        returned.add(index)
        if len(plans) >= len(tables):
            break
    if any(p.config.moe_a2a_overlap for p in plans):  # ranked by the relaxed objective: list them by their step
        plans.sort(key=lambda p: p.prediction.step_time_s)
    return plans
