"""Training search on a layout the user fixed (Megatron-LM layout flags): PP and VPP are pinned by the
layout, so each candidate is predicted exactly on it, cheapest lower bound first, until no remaining
bound can beat the top_k-th plan found. `autoshard.api.solve_with_layout` turns the flags into stages
(Megatron-LM's rules live in `emit.megatron.parse`) and attaches the launch commands."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from autoshard.costmodel.train.step import Stage, TrainConfig, predict_train
from autoshard.errors import InfeasibleError, SpecError
from autoshard.parallel import Recompute
from autoshard.plans.train import Plan, SolverStats
from autoshard.search.train.bounds import quick_lower_bound
from autoshard.search.train.options import SolverOptions
from autoshard.search.train.space import Pins, check_pins, enumerate_train
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import TrainJob
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = ["LayoutFn", "solve_on_layout"]

LayoutFn = Callable[..., tuple[tuple[Stage, ...], int, str | None]]
"""`layout(pp=, vpp=, recompute_num_layers=0)` -> (stages, VPP, note): the layout Megatron-LM builds
from the user's flags (`api.megatron_layout` with the flags bound)."""


def solve_on_layout(
    model: ModelSpec, cluster: ClusterSpec, job: TrainJob, layout: LayoutFn, *, pins: Pins = Pins(),
    options: SolverOptions = SolverOptions(),
) -> list[Plan]:
    """The best plans on the layout `layout` builds, best first, without launch commands or bands:
    status OPTIMAL, or FEASIBLE with the smallest bound left when the time limit stops the search."""
    if cluster.is_heterogeneous:
        raise SpecError("a pinned pipeline layout places every stage on one pool: use a homogeneous cluster, or "
                        "leave the layout to the solver", source="--layout")
    if pins.pp is None:
        raise SpecError("a pipeline layout (--layout, --decoder-first/last-pipeline-num-layers, --account-for-*) "
                        "is written for one PP size: pin it with --pp", source="--pp")
    start = time.perf_counter()
    _, vpp, _ = layout(pp=pins.pp, vpp=pins.vpp or 1)
    pins = dataclasses.replace(pins, vpp=vpp)
    check_pins(model, cluster, job, pins)
    space = enumerate_train(model, cluster, job, pins=pins, options=options.space)
    block = pins.recompute_num_layers or 0
    stages, _, _ = layout(pp=pins.pp, vpp=vpp, recompute_num_layers=block)

    scale = vpp
    ranked = sorted(
        (quick_lower_bound(model, cluster, cfg, scale=scale) / (scale * 1e6), i, cfg)
        for i, cfg in enumerate(space.candidates) if not (block and cfg.recompute is Recompute.FULL)
    )
    found: list[tuple[float, int, TrainConfig, object]] = []
    least: tuple[float, float] | None = None
    exhaustive = True
    bound = 0.0
    k = max(1, options.top_k)
    for lb_s, i, cfg in ranked:
        if len(found) >= k and lb_s > sorted(f[0] for f in found)[k - 1] * 1.01:  # per-layer us rounding
            break  # every later candidate's bound is higher still
        if time.perf_counter() - start > options.time_limit_s:
            exhaustive, bound = False, lb_s
            break
        pred = predict_train(model, cluster, cfg, stages)
        limit = options.memory_fraction * cluster.primary.gpu.hbm_gib * GIB
        if pred.fits and (options.memory_fraction >= 1 or pred.peak_memory_bytes <= limit):
            found.append((pred.step_time_s, i, cfg, pred))
        elif least is None or pred.peak_memory_bytes < least[0]:
            least = (pred.peak_memory_bytes, pred.capacity_bytes)
    if not found:
        if least is None:
            raise InfeasibleError(f"no legal plan for {model.name} on {cluster.num_gpus} GPUs with this layout and "
                                  f"pins ({pins.describe()}): change the pins or the layout")
        raise InfeasibleError(f"no plan with this layout fits: the best needs {least[0] / GIB:.1f} GiB per GPU, has "
                              f"{least[1] / GIB:.1f} GiB; try --recompute full, more GPUs or another layout")
    found.sort(key=lambda item: (item[0], item[1]))
    plans = []
    for step, _, cfg, pred in found[: max(1, options.top_k)]:
        stats = SolverStats(status="OPTIMAL" if exhaustive else "FEASIBLE", wall_s=time.perf_counter() - start,
                            objective=step, bound=found[0][0] if exhaustive else min(bound, found[0][0]),
                            candidates=space.enumerated, candidates_in_model=len(space.candidates),
                            pruned=dict(space.pruned), stop_reason="optimal" if exhaustive else "time_limit")
        plans.append(Plan(model=model, cluster=cluster, config=cfg, stages=stages, prediction=pred, solver=stats))
    return plans
