"""Lower bounds on a candidate's integer objective over every layout, without solving it.

They drive the best-first search in `prepare.prepare`: a candidate whose bound cannot beat the best plan
found so far is pruned with a certificate, and the bounds of the candidates kept tighten the CP-SAT
model. Every bound here is valid: capacities are over-estimated (cheapest layers, most memory,
continuous recomputation), so thresholds are under-estimated.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import lru_cache

from autoshard.costmodel.train.layer import layer_cost
from autoshard.costmodel.train.memory import layer_param_shards
from autoshard.costmodel.train.step import _p2p_s
from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import ParallelDims
from autoshard.search.train.bounds_joint import joint_tail_bound
from autoshard.search.train.bounds_mixed import LayerClasses, MixedCapacity, layer_classes, mixed_tmax_lower_bound
from autoshard.search.train.bounds_pools import (
    assignment_bounds,
    assignment_capacity,
    hetero_capacity_at,
    hetero_pipeline_bound,
    hetero_tmax_lower_bound,
    pool_rank_limits,
    pools_assignment,
    two_pool_assignment,
)
from autoshard.search.train.bounds_rank import (
    RankRoom,
    joint_search,
    layer_capacity,
    rank_capacity_at,
    rank_room,
    rank_work,
    tail_lower_bound,
    tmax_lower_bound,
    uniform_capacity_at,
    uniform_thresholds,
)
from autoshard.search.train.tables import CandidateTables, layer_tails
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec
from autoshard.units import US_PER_S

__all__ = [
    "bounds", "RankRoom", "rank_room", "layer_capacity", "rank_capacity_at", "tmax_lower_bound",
    "uniform_thresholds", "uniform_capacity_at", "pool_rank_limits", "two_pool_assignment", "pools_assignment", "hetero_capacity_at",
    "hetero_tmax_lower_bound", "joint_search", "quick_lower_bound", "quick_tail_bound", "QuickBounds", "rank_work", "LayerClasses", "layer_classes",
    "MixedCapacity", "mixed_tmax_lower_bound", "hetero_pipeline_bound", "tail_lower_bound",
    "assignment_capacity", "assignment_bounds",
]


def bounds(tab: CandidateTables, *, uniform_recompute: bool = False,
           pool_gpus: Sequence[int] | None = None, cutoff: int | None = None) -> tuple[int, int] | None:
    """(lower bound on the objective, lower bound on the slowest rank's time) over every layout;
    None when no layout fits in memory. With two pools and their GPU counts, the bound accounts for
    how many ranks the faster pool can host. With `cutoff`, a first (valid, weaker) bound above it
    is returned at once: the candidate cannot beat the plan that set the cutoff anyway."""
    cfg = tab.config
    pp, vpp, m = cfg.dims.pp, cfg.dims.vpp, cfg.num_microbatches
    fastest = min(tab.pools, key=lambda p: int(p.time_us[-1]))
    p2p = min([p.p2p_us for p in tab.pools] + list(tab.cross_p2p_us.values()))
    total = int(fastest.time_us[-1]) + 2 * (tab.num_chunks - 1) * p2p
    tail = tail_lower_bound(tab)
    scale = tab.scale
    probe = None
    if cutoff is not None:
        # the ranks' average time and the tail: a few array reads, no capacities
        first = (scale // vpp) * ((m * vpp - 1) * -(-total // pp) + total) + scale * tail
        if first > cutoff:
            return first, -(-total // pp)
        if m * vpp > 1:
            # beyond it the bound passes the cutoff
            probe = ((cutoff - scale * tail) // max(1, scale // vpp) - total) // (m * vpp - 1)
    # decoder layers that differ: each class at its own cost, the minority shared out exactly
    # (first: it is also the sharpest memory check)
    mixed = mixed_tmax_lower_bound(tab, probe=probe, uniform_recompute=uniform_recompute)
    if mixed is None:
        return None
    slowest = -(-total // pp) if mixed is True else max(-(-total // pp), mixed)
    if cutoff is not None:
        first = (scale // vpp) * ((m * vpp - 1) * slowest + total) + scale * tail
        if first > cutoff:
            return first, slowest
    if len(tab.pools) >= 2 and pool_gpus is not None:
        found = hetero_tmax_lower_bound(tab, pool_gpus, probe=probe, uniform_recompute=uniform_recompute)
    else:
        found = tmax_lower_bound(tab, uniform_recompute=uniform_recompute)
    if found is None:
        return None
    tmax = max(slowest, found)
    a, b = (scale // vpp) * (m * vpp - 1), scale
    pipeline_and_tail = a * tmax + b * tail
    if cutoff is not None and (scale // vpp) * total + pipeline_and_tail > cutoff:
        return (scale // vpp) * total + pipeline_and_tail, tmax  # the joint bounds only tighten it
    if len(tab.pools) == 1 and pp > 1:
        pipeline_and_tail = max(pipeline_and_tail, joint_search(tab, tmax, a, b)[0])
        if not tab.uniform_decoders and (cutoff is None or (scale // vpp) * total + pipeline_and_tail <= cutoff):
            # each rank's tail on its own layer counts (dense-first MoE: the MoE ranks set it); with
            # identical decoder layers `joint_search` already prices it, at a third of the cost
            pipeline_and_tail = max(pipeline_and_tail, joint_tail_bound(tab, tmax, a, b))
    lower = (scale // vpp) * total + pipeline_and_tail
    if len(tab.pools) >= 2 and pool_gpus is not None:
        lower = max(lower, hetero_pipeline_bound(tab, pool_gpus, tmax, a, scale // vpp) + b * tail)
    return lower, tmax


@lru_cache(maxsize=64)
def _major_decoder(model: ModelSpec) -> tuple[LayerKind | None, int]:
    """The most numerous decoder kind of a model and its count."""
    counts: dict[LayerKind, int] = {}
    for kind in model.layer_kinds:
        if kind in (LayerKind.DENSE, LayerKind.MOE):
            counts[kind] = counts.get(kind, 0) + 1
    if not counts:
        return None, 0
    major = max(counts, key=lambda k: (counts[k], k.value))
    return major, counts[major]


def quick_lower_bound(model: ModelSpec, cluster: ClusterSpec, cfg: TrainConfig, *, scale: int) -> int:
    """A cheaper, weaker lower bound than `bounds` (no tables, no memory): every rank shares the
    work of the most numerous decoder kind evenly (the other layers counted as free) and the exposed
    tail is zero. One `layer_cost` per pool, so the whole space can be bounded before any table."""
    return _quick_from_parts(cluster, cfg, _quick_parts(model, cluster, cfg), scale)


def _quick_parts(model: ModelSpec, cluster: ClusterSpec, cfg: TrainConfig) -> tuple[list[int], int]:
    """(the most numerous decoder kind's total time per micro-batch on each pool, one send's time):
    what `quick_lower_bound` reads of the cost model."""
    major, count = _major_decoder(model)
    per_pool = [
        round(layer_cost(model, major, pool, cfg, cfg.recompute).time_s * US_PER_S) * count if major else 0
        for pool in cluster.pools
    ]
    p2p = 0
    if cfg.dims.pp > 1 and not cluster.is_heterogeneous:
        p2p = math.ceil(_p2p_s(model, cfg, cluster.primary, cluster.primary, cluster) * US_PER_S)
    return per_pool, p2p


def _quick_from_parts(cluster: ClusterSpec, cfg: TrainConfig, parts: tuple[list[int], int], scale: int) -> int:
    dims = cfg.dims
    pp, vpp, m = dims.pp, dims.vpp, cfg.num_microbatches
    per_pool, p2p = parts
    total = min(per_pool)
    if pp > 1 and not cluster.is_heterogeneous:
        total += 2 * (pp * vpp - 1) * p2p
    tmax = -(-total // pp)
    if cluster.is_heterogeneous:
        # ranks work in parallel at their pool's speed; the fastest pools host as many ranks as fit
        need = dims.tp * dims.cp * dims.dp
        slots = sorted(((t, p.num_gpus // need) for t, p in zip(per_pool, cluster.pools, strict=True)))
        rate, left = 0.0, pp
        for t, n in slots:
            take = min(left, n)
            rate += take / max(t, 1)
            left -= take
        if left > 0:
            return 2**62  # the pools cannot host this many ranks
        tmax = max(tmax, math.floor(1 / rate))
    return (scale // vpp) * ((m * vpp - 1) * tmax + total)


@lru_cache(maxsize=64)
def _kind_counts(model: ModelSpec) -> tuple[tuple[LayerKind, int], ...]:
    counts: dict[LayerKind, int] = {}
    for kind in model.layer_kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return tuple(sorted(counts.items(), key=lambda item: item[0].value))


def quick_tail_bound(model: ModelSpec, cluster: ClusterSpec, cfg: TrainConfig, *, scale: int) -> int:
    """What the slowest rank's tail adds to any layout's objective at least: the ranks' average of
    exposed-at-best data-parallel traffic plus optimizer step (`tables.layer_tails` from each layer's
    parameter shards, each layer at its cheapest pool, rounded down by 1 us below the tables'
    per-layer rounding). No timing of any layer: cheaper than the tables by ~10x, so the best-first
    pass adds it to the cheap bound before building a candidate's tables."""
    counts = _kind_counts(model)
    shards = [layer_param_shards(model, kind, cfg.dims) for kind, _ in counts]
    dense, expert = [sh.dense for sh in shards], [sh.expert for sh in shards]
    cheapest = [math.inf] * len(counts)
    for pool in cluster.pools:
        _, dp_min, opt = layer_tails(cfg, pool, dense, expert)
        cheapest = [min(c, (d + o) * US_PER_S) for c, d, o in zip(cheapest, dp_min, opt, strict=True)]
    total = sum(n * max(0, math.floor(c - 1)) for (_, n), c in zip(counts, cheapest, strict=True))
    return scale * (total // cfg.dims.pp)


class QuickBounds:
    """`quick_lower_bound` for the many candidates of one solve. Candidates that differ only in
    interleaving (VPP) share what it reads of the cost model: a layer's cost does not depend on
    interleaving (`layer_cost` normalizes it out) and neither does a send (`_p2p_s`: sizes from
    TP/CP/micro-batch, links from the TP/CP/DP/EP grid). The key is every other field of the
    configuration and of its degrees, so a field added to either keeps candidates apart."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, *, scale: int) -> None:
        self.model, self.cluster, self.scale = model, cluster, scale
        self.memo: dict[tuple, tuple[list[int], int]] = {}
        self.cfg_fields = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "dims"]
        self.dims_fields = [f.name for f in dataclasses.fields(ParallelDims) if f.name != "vpp"]

    def __call__(self, cfg: TrainConfig) -> int:
        key = (tuple(getattr(cfg, name) for name in self.cfg_fields)
               + tuple(getattr(cfg.dims, name) for name in self.dims_fields))
        parts = self.memo.get(key)
        if parts is None:
            parts = self.memo[key] = _quick_parts(self.model, self.cluster, cfg)
        return _quick_from_parts(self.cluster, cfg, parts, self.scale)
