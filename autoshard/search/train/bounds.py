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
from operator import attrgetter

from autoshard.costmodel.train.layer import fp8_weight_cast_s, layer_cost
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
from autoshard.units import GIB, US_PER_S

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


NO_RANKS = 2**62
"""`quick_lower_bound` of a candidate whose ranks the pools cannot host (too few GPUs)."""
NO_MEMORY = 2**62 + 1
"""`quick_lower_bound` of a candidate whose model states fit no assignment of its ranks to pools."""


def quick_lower_bound(model: ModelSpec, cluster: ClusterSpec, cfg: TrainConfig, *, scale: int,
                      memory_fraction: float | None = None) -> int:
    """A cheaper, weaker lower bound than `bounds` (no tables): every rank shares the work of the
    most numerous decoder kind evenly (the other layers counted as free) and the exposed tail is
    zero. One `layer_cost` per pool, so the whole space can be bounded before any table.

    On a heterogeneous cluster with `memory_fraction` (the solver's cap on each GPU's peak), a rank
    on a pool holds no more of the decoder layers than its GPUs' memory takes of their model states
    (activations, overheads and fragmentation counted as free): a slow pool with little memory
    cannot relieve the fast one, and a candidate whose states fit no assignment of its ranks to
    pools comes back as NO_MEMORY."""
    return _quick_from_parts(cluster, cfg, _quick_parts(model, cluster, cfg, memory_fraction), scale)


def _major_reads(model: ModelSpec, cluster: ClusterSpec, cfg: TrainConfig) -> tuple[list[int], list[float]]:
    """The most numerous decoder kind's total time per micro-batch (us) and model states (bytes) on
    each pool: all `quick_lower_bound` reads of the layer costs."""
    major, count = _major_decoder(model)
    costs = [layer_cost(model, major, pool, cfg, cfg.recompute) if major else None for pool in cluster.pools]
    # the EP all-to-all overlap's traffic counted as hidden on every micro-batch: what no step can beat
    return ([round((c.time_s - c.ep_overlap_s) * US_PER_S) * count if c is not None else 0 for c in costs],
            [c.state_bytes * count if c is not None else 0.0 for c in costs])


def _quick_parts(model: ModelSpec, cluster: ClusterSpec, cfg: TrainConfig, memory_fraction: float | None = None,
                 reads: tuple[list[int], list[float]] | None = None) -> tuple[list[int], int, tuple[int, int] | int | None]:
    """(the most numerous decoder kind's total time per micro-batch on each pool, the cheapest send,
    on a heterogeneous cluster the (path time, slowest rank) floors or NO_RANKS / NO_MEMORY): what
    `quick_lower_bound` reads of the cost model, nothing of it depends on interleaving. `reads`,
    `_major_reads` already known (`QuickBounds`), saves the layer costs."""
    major, count = _major_decoder(model)
    per_pool, majors = reads if reads is not None else _major_reads(model, cluster, cfg)
    p2p = 0
    if cfg.dims.pp > 1:
        # on several pools a boundary sends within a pool or across two: the cheapest of them (as
        # `bounds` takes it from the tables)
        p2p = min(math.ceil(_p2p_s(model, cfg, a, b, cluster) * US_PER_S)
                  for a in cluster.pools for b in cluster.pools)
    hetero = None
    if cluster.is_heterogeneous:
        need = cfg.dims.tp * cfg.dims.cp * cfg.dims.dp
        limits = [min(p.num_gpus // need, cfg.dims.pp) for p in cluster.pools]
        fracs = [math.inf] * len(per_pool)
        if memory_fraction is not None and major is not None:
            usable = [memory_fraction * p.gpu.hbm_gib * GIB - p.gpu.efficiency.reserved_memory_gib * GIB
                      for p in cluster.pools]
            if _top_sum(usable, limits, cfg.dims.pp) < min(majors):
                return per_pool, p2p, NO_MEMORY
            fracs = [max(0.0, u) / m if m > 0 else math.inf for u, m in zip(usable, majors, strict=True)]
        hetero = _hetero_floors(per_pool, fracs, limits, cfg.dims.pp)
        if not isinstance(hetero, int):
            # for the chunks' floor (`_chunk_floors`): the pools fastest first, and how many decoder
            # layers of another kind could stand in for the major kind's in a rank's chunks
            pools = sorted(zip([max(t, 1) for t in per_pool], fracs, limits, strict=True))
            hetero = (*hetero, pools, count, _decoder_count(model) - count)
    return per_pool, p2p, hetero


def _decoder_count(model: ModelSpec) -> int:
    return sum(n for kind, n in _kind_counts(model) if kind in (LayerKind.DENSE, LayerKind.MOE))


def _chunk_floors(hetero: tuple, pp: int, vpp: int) -> tuple[int, int] | int:
    """(path time, slowest rank) floors from the chunks' minimum: every chunk holds a layer, so each
    rank holds at least vpp - 1 decoder layers (vpp on all but the first and last), of which at most
    the model's other decoder layers are not of the major kind. Every one of the pp ranks, on
    whatever pool, takes that share lo of the major layers: the slowest rank is at least lo x the
    pp-th fastest pool that has memory for it, and the path at least lo x the pp fastest such ranks
    plus the rest of the layers on the fastest ranks their memory allows (NO_MEMORY: too few ranks
    hold the share)."""
    _, _, pools, count, others = hetero
    lo = max(0, vpp - (2 if pp == 1 else 1) - others) / count if count else 0.0  # one rank: both ends
    if lo <= 0:
        return 0, 0
    base, ranks, slowest = 0.0, pp, 0
    room, left = 0.0, 1.0 - pp * lo
    for t, f, n in pools:
        if f < lo:
            continue
        take = min(ranks, n)
        if take:
            base += take * lo * t
            ranks -= take
            slowest = t
        extra = min(left, n * (f - lo))  # any rank with room may take more (a relaxation)
        room += extra * t
        left -= extra
    if ranks > 0 or left > 1e-12:
        return NO_MEMORY
    return max(0, math.floor(base + room) - 1), max(0, math.floor(lo * slowest) - 1)


def _top_sum(values: Sequence[float], limits: Sequence[int], pp: int) -> float:
    """Largest sum of `pp` values, at most limits[q] of them equal to values[q] (-inf: too few)."""
    total, left = 0.0, pp
    for v, n in sorted(zip(values, limits, strict=True), reverse=True):
        take = min(left, n)
        total += take * v
        left -= take
    return total if left == 0 else -math.inf


def _hetero_floors(per_pool: Sequence[int], fracs: Sequence[float], limits: Sequence[int],
                   pp: int) -> tuple[int, int] | int:
    """(path time, slowest rank) floors, microseconds, when each of the `pp` ranks runs on a pool
    (at most limits[q] on pool q) and takes a share x <= fracs[q] of the major decoder layers, which
    cost per_pool[q] in all there: the path is the sum of the shares' times (fastest pools filled
    first), the slowest rank at least the smallest T at which the best ranks' min(T / t, frac)
    shares reach the whole. NO_RANKS / NO_MEMORY when no assignment takes every layer."""
    if sum(limits) < pp:
        return NO_RANKS
    times = [max(t, 1) for t in per_pool]

    def share(t_cap: float) -> float:
        return _top_sum([min(t_cap / t, f) for t, f in zip(times, fracs, strict=True)], limits, pp)

    if share(math.inf) < 1:
        return NO_MEMORY
    path, left, ranks = 0.0, 1.0, pp
    for t, f, n in sorted(zip(times, fracs, limits, strict=True)):
        take = min(left, min(ranks, n) * f)
        path += take * t
        left -= take
        ranks -= min(ranks, n)
        if left <= 0:
            break
    # share() is piecewise linear between the points frac_q x t_p (where a share caps or two cross):
    # find the first point that reaches 1 and interpolate back into its segment
    points = sorted({f * t for f in fracs for t in times if f < math.inf})
    lo_t, lo_s = 0.0, 0.0
    for point in [*points, None]:
        hi_t = point if point is not None else 2 * max([lo_t, *times])
        hi_s = share(hi_t)
        if hi_s >= 1 or point is None:
            slope = (hi_s - lo_s) / (hi_t - lo_t) if hi_t > lo_t else math.inf
            tmax = lo_t + (1 - lo_s) / slope if slope > 0 else hi_t
            break
        lo_t, lo_s = hi_t, hi_s
    # 1 us below the float figures: rounding never lifts them past the exact optimum
    return max(0, math.floor(path) - 1), max(0, math.floor(tmax) - 1)


def _quick_from_parts(cluster: ClusterSpec, cfg: TrainConfig, parts: tuple, scale: int) -> int:
    dims = cfg.dims
    pp, vpp, m = dims.pp, dims.vpp, cfg.num_microbatches
    per_pool, p2p, hetero = parts
    total = min(per_pool)
    if cluster.is_heterogeneous:
        # ranks work in parallel at their pool's speed; the fastest pools host as many ranks as fit
        # (and as their memory holds)
        if isinstance(hetero, int):
            return hetero
        chunks = _chunk_floors(hetero, pp, vpp)
        if isinstance(chunks, int):
            return chunks
        total = max(total, hetero[0], chunks[0])
    total += 2 * (pp * vpp - 1) * p2p
    tmax = -(-total // pp)
    if cluster.is_heterogeneous:
        tmax = max(tmax, hetero[1], chunks[1])
    return (scale // vpp) * ((m * vpp - 1) * tmax + total)


@lru_cache(maxsize=64)
def _kind_counts(model: ModelSpec) -> tuple[tuple[LayerKind, int], ...]:
    counts: dict[LayerKind, int] = {}
    for kind in model.layer_kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return tuple(sorted(counts.items(), key=lambda item: item[0].value))


def quick_tail_bound(model: ModelSpec, cluster: ClusterSpec, cfg: TrainConfig, *, scale: int) -> int:
    """What the slowest rank's tail adds to any layout's objective at least: the ranks' average of
    exposed-at-best data-parallel traffic plus optimizer step and FP8 weight casts (`tables.layer_tails`
    from each layer's parameter shards, each layer at its cheapest pool, rounded down by 1 us below the tables'
    per-layer rounding). No timing of any layer: cheaper than the tables by ~10x, so the best-first
    pass adds it to the cheap bound before building a candidate's tables."""
    counts = _kind_counts(model)
    shards = [layer_param_shards(model, kind, cfg.dims) for kind, _ in counts]
    dense, expert = [sh.dense for sh in shards], [sh.expert for sh in shards]
    cheapest = [math.inf] * len(counts)
    for pool in cluster.pools:
        cast = [fp8_weight_cast_s(kind, d + e, pool, cfg) for (kind, _), d, e in zip(counts, dense, expert, strict=True)]
        _, dp_min, opt = layer_tails(cfg, pool, dense, expert, cast)
        cheapest = [min(c, (d + o) * US_PER_S) for c, d, o in zip(cheapest, dp_min, opt, strict=True)]
    total = sum(n * max(0, math.floor(c - 1)) for (_, n), c in zip(counts, cheapest, strict=True))
    return scale * (total // cfg.dims.pp)


class QuickBounds:
    """`quick_lower_bound` for the many candidates of one solve. Candidates that differ only in
    interleaving (VPP) share what it reads of the cost model: a layer's cost does not depend on
    interleaving (`layer_cost` normalizes it out) and neither does a send (`_p2p_s`: sizes from
    TP/CP/micro-batch, links from the TP/CP/DP/EP grid). The key is every other field of the
    configuration and of its degrees, so a field added to either keeps candidates apart.

    On one pool the decoder layer's time is shared more widely (`_time_key`): it reads neither the
    data-parallel degree nor the batch (links of the TP, CP and EP groups, strides inside them), nor
    the ZeRO stage or optimizer (model states only), nor the pipeline depth beyond "more than one
    stage" (`layer_cost`'s own key). Qwen3-235B on 4,096 GB200: 46,026 candidates' reads -> 7,407.
    Its model states, which the heterogeneous bound reads too, are shared across what they do not
    read (`_state_key`: micro-batch, sequence, recompute, kernels, dispatcher; `_with_modules`
    changes only time and activations). Qwen3-30B on mixed-3pool: 15,816 reads -> 2,256 + 609 keys."""

    _TIME_FREE = frozenset({"global_batch_size", "zero_stage", "optimizer", "optimizer_moments_bf16",
                            "overlap_grad_reduce"})
    _STATE_FREE = frozenset({"micro_batch_size", "global_batch_size", "seq_len", "recompute", "sequence_parallel",
                             "overlap_grad_reduce", "tp_comm_overlap", "flash_attention", "moe_dispatcher",
                             "recompute_modules", "cross_entropy", "compiled_loss"})

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, *, scale: int,
                 memory_fraction: float | None = None) -> None:
        self.model, self.cluster, self.scale = model, cluster, scale
        self.memory_fraction = memory_fraction
        self.memo: dict[tuple, tuple] = {}
        self.tails: dict[tuple, int] = {}
        self.cfg_fields = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "dims"]
        self.dims_fields = [f.name for f in dataclasses.fields(ParallelDims) if f.name != "vpp"]
        self._cfg_key, self._dims_key = attrgetter(*self.cfg_fields), attrgetter(*self.dims_fields)
        self.times: dict[tuple, list[int]] = {}
        self.states: dict[tuple, list[float]] = {}
        self._need_states = cluster.is_heterogeneous and memory_fraction is not None
        self._time_cfg_key = attrgetter(*[f for f in self.cfg_fields if f not in self._TIME_FREE])
        self._time_dims_key = attrgetter(*[f for f in self.dims_fields if f not in ("dp", "pp")])
        self._state_cfg_key = attrgetter(*[f for f in self.cfg_fields if f not in self._STATE_FREE])
        self._state_dims_key = attrgetter(*[f for f in self.dims_fields if f != "pp"])

    def _time_key(self, cfg: TrainConfig) -> tuple:
        return self._time_cfg_key(cfg), self._time_dims_key(cfg.dims), min(cfg.dims.pp, 2)

    def _state_key(self, cfg: TrainConfig) -> tuple:
        return self._state_cfg_key(cfg), self._state_dims_key(cfg.dims), min(cfg.dims.pp, 2)

    def _reads(self, cfg: TrainConfig) -> tuple[list[int], list[float]]:
        """`_major_reads`, from the shared times and states when both are known."""
        tkey, skey = self._time_key(cfg), self._state_key(cfg)
        times = self.times.get(tkey)
        states = self.states.get(skey) if self._need_states else []  # states bound pools' layers only
        if times is None or states is None:
            times, states = _major_reads(self.model, self.cluster, cfg)
            self.times.setdefault(tkey, times)
            if self._need_states:
                self.states.setdefault(skey, states)
        return times, states

    def _key(self, cfg: TrainConfig) -> tuple:
        return self._cfg_key(cfg), self._dims_key(cfg.dims)

    def tail(self, cfg: TrainConfig) -> int:
        """`quick_tail_bound`, shared the same way: parameter shards, data-parallel traffic and the
        optimizer step do not depend on interleaving either (`tables.layer_tails` prices the floor
        on the whole traffic; only the exposed share above it reads VPP)."""
        key = self._key(cfg)
        found = self.tails.get(key)
        if found is None:
            found = self.tails[key] = quick_tail_bound(self.model, self.cluster, cfg, scale=self.scale)
        return found

    def __call__(self, cfg: TrainConfig) -> int:
        key = self._key(cfg)
        parts = self.memo.get(key)
        if parts is None:
            parts = self.memo[key] = _quick_parts(self.model, self.cluster, cfg, self.memory_fraction, self._reads(cfg))
        return _quick_from_parts(self.cluster, cfg, parts, self.scale)
