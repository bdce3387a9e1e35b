"""Integer tables the solver chooses from, one set per candidate: prefix sums over the model's
layers (per pool) of time, memory, parameters and data-parallel traffic, plus per-rank constants.

Every quantity of a contiguous stage [a, b) is `prefix[b] - prefix[a]`, so the solver only picks
boundaries. Times are microseconds and memory MiB (units.py). The same tables drive the brute-force
checker in the tests and the integer objective reported by the solver.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoshard.costmodel.comm import Collective, collective_time_s, group_links
from autoshard.costmodel.efficiency import training_pool
from autoshard.costmodel.train.layer import layer_cost
from autoshard.costmodel.train.memory import in_flight_microbatches, static_bytes
from autoshard.costmodel.train.pipeline import lopsided
from autoshard.costmodel.train.step import (
    _dp_time_s,
    _p2p_s,
    dp_exposed_share,
    optimizer_bytes_per_param,
    optimizer_hbm_bps,
)
from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import Recompute
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB, MIB, US_PER_S

__all__ = ["PoolTables", "CandidateTables", "build_tables", "Layout", "int_objective", "even_layout", "layer_tails"]


@dataclass(frozen=True, slots=True)
class PoolTables:
    """Prefix sums (length n+1) over the layers for one pool."""

    time_us: np.ndarray
    state_mib: np.ndarray
    act_mib: np.ndarray
    dp_full_us: np.ndarray
    dp_min_us: np.ndarray
    window_us: np.ndarray
    opt_us: np.ndarray
    recompute_extra_us: int
    """Extra time of fully recomputing one more decoder layer (largest over decoder kinds)."""
    recompute_saving_mib: int
    """Activation memory saved per fully recomputed decoder layer (smallest over kinds)."""
    working_mib: int
    """Transient working set while recomputing a layer (largest over kinds)."""
    capacity_mib: int
    """HBM left for allocations after the reserved overhead, minus a rounding margin. Memory entries
    are charged MiB: dynamic bytes (activations, working sets, ZeRO-3 transients, dynamic states)
    times 1 + fragmentation, static model states at 1 (costmodel.train.memory.static_bytes)."""
    p2p_us: int
    max_layer_us: int
    decoder_unit: tuple[int, int, int]
    """(time us, state MiB, activation MiB) of the cheapest decoder layer."""


@dataclass(frozen=True, slots=True)
class CandidateTables:
    config: TrainConfig
    pools: tuple[PoolTables, ...]
    decoders: np.ndarray
    """Prefix count of decoder layers."""
    cross_p2p_us: dict[tuple[int, int], int]
    """One send across a boundary between two different pools."""
    in_flight_chunks: tuple[int, ...]
    """Per pipeline rank: in-flight micro-batch chunks (in_flight x vpp, an integer)."""
    dp_latency_us: int
    zero3_extra_mib: int
    base_full: bool
    scale: int
    uniform: bool = False
    """Objective multiplier (lcm of the VPPs in the model) keeping every coefficient integral."""
    dp_min_latency_us: int = 0
    """The DP collectives' latency in the exposed floor `dp_min` (the cost model's (1 - overlap) x the
    whole DP time, latency included; all of it without --overlap-grad-reduce)."""

    @property
    def chunk_decoders(self) -> tuple[int, int] | None:
        """With the EP all-to-all overlap, the decoder layers a chunk may hold: within one of an even split. The
        tables count every layer's traffic as hidden on every micro-batch, while Megatron overlaps only
        min(layers) of each forward chunk and the backward chunk beside it (costmodel.train.a2a_overlap.
        rank_hidden_s): near-even chunks keep that relaxation tight, where a layout of 1-layer and 40-layer
        chunks would win the tables and lose the step. None: any split."""
        if not self.config.moe_a2a_overlap:
            return None
        n, s = int(self.decoders[-1]), self.num_chunks
        return max(0, n // s - 1), -(-n // s) + 1

    def chunks_allowed(self, counts: Sequence[int]) -> bool:
        """Whether a layout with `counts` decoder layers per chunk is one the solver may choose: near-even
        chunks under the A2A overlap (`chunk_decoders`), and with interleaving each rank's chunks within
        pipeline.RANK_CHUNK_SPREAD layer of each other, where the schedule's closed form holds."""
        if self.chunk_decoders is not None and not all(self.chunk_decoders[0] <= c <= self.chunk_decoders[1]
                                                       for c in counts):
            return False
        return not lopsided(counts, pp=self.config.dims.pp, vpp=self.config.dims.vpp)

    @property
    def block_recompute(self) -> bool:
        """Whether a chunk may fully recompute some of its layers (Megatron --recompute-num-layers): not on
        top of full or selective recompute (one --recompute-granularity), nor under the EP all-to-all
        overlap (Megatron refuses any recompute method with it)."""
        return not self.base_full and self.config.recompute is not Recompute.SELECTIVE and not self.config.moe_a2a_overlap

    @property
    def num_layers(self) -> int:
        return len(self.decoders) - 1

    def signature(self) -> bytes:
        """Everything the solver sees of this candidate: equal signatures mean interchangeable plans."""
        dims = self.config.dims
        parts = [repr((dims.pp, dims.vpp, self.config.num_microbatches, self.in_flight_chunks, self.dp_latency_us,
                       self.dp_min_latency_us, self.zero3_extra_mib, self.base_full, sorted(self.cross_p2p_us.items()))).encode()]
        for p in self.pools:
            parts.append(repr((p.recompute_extra_us, p.recompute_saving_mib, p.working_mib, p.capacity_mib,
                               p.p2p_us)).encode())
            for arr in (p.time_us, p.state_mib, p.act_mib, p.dp_full_us, p.dp_min_us, p.window_us, p.opt_us):
                parts.append(arr.tobytes())
        return b"|".join(parts)

    @property
    def uniform_decoders(self) -> bool:
        """Embedding, then identical decoder layers, then output: every interior prefix value is
        linear in the boundary, so the solver needs no lookup tables."""
        return self.uniform

    @property
    def num_chunks(self) -> int:
        return self.config.dims.pp * self.config.dims.vpp


def _kind_index(model: ModelSpec) -> tuple[list[LayerKind], np.ndarray]:
    uniq = sorted(set(model.layer_kinds), key=lambda k: k.value)
    return uniq, np.array([uniq.index(k) for k in model.layer_kinds], dtype=np.int64)


def _per_layer_prefix(per_kind: Sequence[float], idx: np.ndarray, scale: float) -> np.ndarray:
    """Prefix sums over the layers of per-kind values, rounded per layer (identical layers give
    identical integers, so the solver can treat a run of them linearly)."""
    rounded = np.round(np.asarray(per_kind, dtype=np.float64) * scale).astype(np.int64)
    out = np.zeros(len(idx) + 1, dtype=np.int64)
    out[1:] = np.cumsum(rounded[idx])
    return out


def _per_layer_prefixes(per_kind: Sequence[Sequence[float]], idx: np.ndarray,
                        scales: Sequence[float]) -> list[np.ndarray]:
    """`_per_layer_prefix` of several per-kind rows at once (one array operation, the same integers)."""
    rounded = np.round(np.asarray(per_kind, dtype=np.float64) * np.asarray(scales, dtype=np.float64)[:, None])
    out = np.zeros((len(per_kind), len(idx) + 1), dtype=np.int64)
    out[:, 1:] = np.cumsum(rounded.astype(np.int64)[:, idx], axis=1)
    return list(out)


def build_tables(model: ModelSpec, cluster: ClusterSpec, cfg: TrainConfig, *, scale: int = 1,
                 memory_fraction: float = 1.0) -> CandidateTables:
    """Integer tables of one candidate. `memory_fraction` caps each GPU's predicted peak (overheads
    included) at that fraction of its HBM, for plans that keep extra headroom."""
    kinds = model.layer_kinds
    uniq, idx = _kind_index(model)
    decoder_kinds = [k for k in uniq if k in (LayerKind.DENSE, LayerKind.MOE)]
    dims = cfg.dims
    m = cfg.num_microbatches
    base_full = cfg.recompute is Recompute.FULL
    pools: list[PoolTables] = []
    largest_params = 0.0
    for pool in cluster.pools:
        gpu = pool.gpu
        eff = gpu.efficiency
        base = [layer_cost(model, k, pool, cfg, cfg.recompute) for k in uniq]
        dense = [c.dense_params for c in base]
        expert = [c.expert_params for c in base]
        largest_params = max(largest_params, max(d + e for d, e in zip(dense, expert, strict=True)))
        # DP traffic is linear in parameters (latency aside): price each layer's share. `dp_full`
        # and `win` carry the exposed share (1/VPP with interleaving, costmodel.train.step), so
        # every reader of max(dp_min, dp_full - win) prices the tail as the cost model does; dp_min,
        # the floor at full overlap, stays on the whole traffic (bounds read it as it is).
        share = dp_exposed_share(cfg)
        win = [share * c.fwd_bwd_compute_s * (m if cfg.zero_stage == 3 else 1) for c in base]
        dp_lin, dp_min, opt = layer_tails(cfg, pool, dense, expert, [c.weight_cast_s for c in base])
        dp_full = [share * x for x in dp_lin]
        extra_us, saving, working = 0, 0, 0
        frag = 1 + eff.fragmentation  # charged on dynamic bytes only, as costmodel.train.memory.overhead_bytes
        if base_full:
            working = max(layer_cost(model, k, pool, cfg, Recompute.FULL).full_activation_bytes
                          - layer_cost(model, k, pool, cfg, Recompute.FULL).activation_bytes for k in decoder_kinds)
            working = math.ceil(frag * working / MIB)
        else:
            extras, savings, works = [], [], []
            for k in decoder_kinds:
                full = layer_cost(model, k, pool, cfg, Recompute.FULL)
                part = layer_cost(model, k, pool, cfg, cfg.recompute)
                extras.append(full.time_s - part.time_s)
                savings.append(part.activation_bytes - full.activation_bytes)
                works.append(full.full_activation_bytes - full.activation_bytes)
            extra_us = math.ceil(max(extras) * US_PER_S)
            saving = max(0, math.floor(frag * min(savings) / MIB))
            working = math.ceil(frag * max(works) / MIB)
        usable = memory_fraction * gpu.hbm_gib * GIB - eff.reserved_memory_gib * GIB
        margin = len(kinds) + 8  # prefix rounding, at most 1 MiB per layer term
        p2p = math.ceil(_p2p_s(model, cfg, pool, pool, cluster) * US_PER_S) if dims.pp > 1 else 0
        dec = [uniq.index(k) for k in decoder_kinds]
        static = [static_bytes(cfg.framework, weights=c.weights_bytes, grads=c.grads_bytes, optimizer=c.optimizer_bytes)
                  for c in base]
        state_mib = [(s + frag * (c.state_bytes - s)) / MIB for s, c in zip(static, base, strict=True)]
        act_mib = [frag * c.activation_bytes / MIB for c in base]
        # EP all-to-all overlap: each layer with its traffic counted as hidden on every micro-batch, more
        # than any rank's paired forwards hide (costmodel.train.a2a_overlap.rank_hidden_s): the tables' objective
        # is then a relaxation of the step, every bound below it (the solver reports the step: solve.py)
        times = [c.time_s - c.ep_overlap_s for c in base]
        time_us, state, act, full_us, min_us, window_us, opt_us = _per_layer_prefixes(
            [times, state_mib, act_mib, dp_full, dp_min, win, opt], idx,
            [US_PER_S, 1, 1, US_PER_S, US_PER_S, US_PER_S, US_PER_S])
        pools.append(PoolTables(
            time_us=time_us,
            state_mib=state,
            act_mib=act,
            dp_full_us=full_us,
            dp_min_us=min_us,
            window_us=window_us,
            opt_us=opt_us,
            recompute_extra_us=extra_us,
            recompute_saving_mib=saving,
            working_mib=working,
            capacity_mib=max(0, math.floor(usable / MIB) - margin),
            p2p_us=p2p,
            max_layer_us=math.ceil(max(c.time_s for c in base) * US_PER_S),
            decoder_unit=(
                min(round(times[i] * US_PER_S) for i in dec),
                min(round(state_mib[i]) for i in dec),
                min(round(act_mib[i]) for i in dec),
            ),
        ))
    cross: dict[tuple[int, int], int] = {}
    if dims.pp > 1 and cluster.is_heterogeneous:
        for a, pa in enumerate(cluster.pools):
            for b, pb in enumerate(cluster.pools):
                if a != b:
                    cross[(a, b)] = math.ceil(_p2p_s(model, cfg, pa, pb, cluster) * US_PER_S)
    decoders = _per_layer_prefix([1.0 if k in decoder_kinds else 0.0 for k in uniq], idx, 1)
    chunks = tuple(
        round(in_flight_microbatches(rank=r, pp=dims.pp, vpp=dims.vpp, num_microbatches=m,
                                     a2a_overlap=cfg.moe_a2a_overlap) * dims.vpp)
        for r in range(dims.pp)
    )
    # ZeRO-3's transients (costmodel.train.step): two gathered BF16 layers and one layer's FP32 gradients
    frag = 1 + max(p.gpu.efficiency.fragmentation for p in cluster.pools)
    zero3 = math.ceil(frag * (2 * 2 + 4) * largest_params / MIB) if cfg.zero_stage == 3 else 0
    experts = model.moe is not None
    return CandidateTables(
        config=cfg, pools=tuple(pools), decoders=decoders, cross_p2p_us=cross, in_flight_chunks=chunks,
        dp_latency_us=math.ceil(dp_exposed_share(cfg) * _dp_latency_s(cfg, cluster, experts) * US_PER_S),
        dp_min_latency_us=math.ceil(_dp_min_latency_s(cfg, cluster, experts) * US_PER_S),
        zero3_extra_mib=zero3,
        base_full=base_full, scale=scale,
        uniform=len({k for k in kinds[1:-1]}) == 1 and kinds[0] is LayerKind.EMBEDDING and kinds[-1] is LayerKind.OUTPUT,
    )


def layer_tails(cfg: TrainConfig, pool, dense: Sequence[float], expert: Sequence[float],
                cast: Sequence[float] | None = None) -> tuple[list[float], list[float], list[float]]:
    """Per layer with `dense` / `expert` parameters per GPU: (data-parallel traffic in seconds, the
    part of it that stays exposed at best, optimizer step in seconds), latency aside (a per-rank
    constant). DP traffic is linear in parameters: each layer is priced at its share. `cast`: each
    layer's once-per-step FP8 weight cast (LayerCost.weight_cast_s), which the schedule's fill
    charges PP times (costmodel.train.step.predict_train); it joins the optimizer step's column."""
    dims, eff = cfg.dims, pool.gpu.efficiency
    dp_full = _dp_linear(cfg, pool, dense, expert)
    dp_min = [(1 - eff.dp_overlap) * x if cfg.overlap_grad_reduce else x for x in dp_full]
    shard = dims.dp * dims.cp if cfg.zero_stage >= 1 else 1
    eshard = dims.expert_dp if cfg.zero_stage >= 1 else 1
    per_param = optimizer_bytes_per_param(cfg.optimizer, cfg.framework) / optimizer_hbm_bps(pool.gpu)
    opt = [(d / shard + e / eshard) * per_param for d, e in zip(dense, expert, strict=True)]
    if cast is not None:
        opt = [o + dims.pp * c for o, c in zip(opt, cast, strict=True)]
    return dp_full, dp_min, opt


def _dp_linear(cfg: TrainConfig, pool, dense: Sequence[float], expert: Sequence[float]) -> list[float]:
    """Per-layer bandwidth part of the DP traffic (the latency part is a per-rank constant)."""
    base = _dp_time_s(cfg, pool, 0.0, 0.0)
    ref_d = max(sum(dense), 1.0)
    ref_e = max(sum(expert), 1.0)
    per_dense = (_dp_time_s(cfg, pool, ref_d, 0.0) - base - _dp_latency_one(cfg, pool, dense=True)) / ref_d
    per_expert = (_dp_time_s(cfg, pool, 0.0, ref_e) - base - _dp_latency_one(cfg, pool, dense=False)) / ref_e
    return [d * per_dense + e * per_expert for d, e in zip(dense, expert, strict=True)]


def _dp_latency_one(cfg: TrainConfig, pool, *, dense: bool) -> float:
    dims = cfg.dims
    links = group_links(training_pool(pool), dims)
    ranks, link = (dims.dp * dims.cp, links.dp) if dense else (dims.expert_dp, links.edp)
    if ranks <= 1:
        return 0.0
    if cfg.zero_stage == 0:
        return collective_time_s(Collective.ALL_REDUCE, 1e-30, ranks, link)
    gathers = 1 if cfg.zero_stage < 3 else 2 * cfg.num_microbatches
    return (1 + gathers) * collective_time_s(Collective.ALL_GATHER, 1e-30, ranks, link)


def _pool_dp_latency_s(cfg: TrainConfig, pool, experts: bool) -> float:
    """Latency of a rank's DP collectives on `pool`: the dense group's, and the expert-DP group's where the
    model has routed experts (costmodel.train.step._dp_time_s runs no collective for a group without
    parameters)."""
    return _dp_latency_one(cfg, pool, dense=True) + (_dp_latency_one(cfg, pool, dense=False) if experts else 0.0)


def _dp_latency_s(cfg: TrainConfig, cluster: ClusterSpec, experts: bool) -> float:
    return max(_pool_dp_latency_s(cfg, p, experts) for p in cluster.pools)


def _dp_min_latency_s(cfg: TrainConfig, cluster: ClusterSpec, experts: bool) -> float:
    """The latency part of the exposed floor, as costmodel.train.step prices it: (1 - overlap) x latency
    with --overlap-grad-reduce, all of it without."""
    return max((1 - p.gpu.efficiency.dp_overlap if cfg.overlap_grad_reduce else 1.0)
               * _pool_dp_latency_s(cfg, p, experts) for p in cluster.pools)


@dataclass(frozen=True, slots=True)
class Layout:
    """Chunk boundaries (0 = b_0 < b_1 < … < b_S = n), full-recompute layers and pool per chunk."""

    bounds: tuple[int, ...]
    recompute: tuple[int, ...]
    pools: tuple[int, ...]


def int_objective(tab: CandidateTables, layout: Layout) -> tuple[int, bool]:
    """(scaled integer step time, fits in memory) of a layout, exactly as the CP-SAT model counts it."""
    cfg = tab.config
    pp, vpp, m = cfg.dims.pp, cfg.dims.vpp, cfg.num_microbatches
    s = tab.num_chunks
    b, r, q = layout.bounds, layout.recompute, layout.pools
    rank_time = [0] * pp
    rank_dp_full = [tab.dp_latency_us] * pp
    rank_dp_min = [tab.dp_min_latency_us] * pp
    rank_win = [0] * pp
    rank_opt = [0] * pp
    rank_state = [tab.zero3_extra_mib] * pp
    rank_act = [0] * pp
    rank_rc = [tab.base_full] * pp
    for k in range(s):
        p = tab.pools[q[k]]
        lo, hi = b[k], b[k + 1]
        rk = k % pp
        t = int(p.time_us[hi] - p.time_us[lo]) + r[k] * p.recompute_extra_us
        if k + 1 < s:
            t += p.p2p_us if q[k] == q[k + 1] else tab.cross_p2p_us[(q[k], q[k + 1])]
        if k > 0:
            t += p.p2p_us if q[k - 1] == q[k] else tab.cross_p2p_us[(q[k - 1], q[k])]
        rank_time[rk] += t
        rank_dp_full[rk] += int(p.dp_full_us[hi] - p.dp_full_us[lo])
        rank_dp_min[rk] += int(p.dp_min_us[hi] - p.dp_min_us[lo])
        rank_win[rk] += int(p.window_us[hi] - p.window_us[lo])
        rank_opt[rk] += int(p.opt_us[hi] - p.opt_us[lo])
        rank_state[rk] += int(p.state_mib[hi] - p.state_mib[lo])
        rank_act[rk] += int(p.act_mib[hi] - p.act_mib[lo]) - r[k] * p.recompute_saving_mib
        rank_rc[rk] = rank_rc[rk] or r[k] > 0
    fits = True
    for rk in range(pp):
        p = tab.pools[q[rk]]
        mem = vpp * rank_state[rk] + tab.in_flight_chunks[rk] * rank_act[rk] + vpp * p.working_mib * rank_rc[rk]
        fits = fits and mem <= vpp * p.capacity_mib
    tmax = max(rank_time)
    tail = max(max(rank_dp_min[i], rank_dp_full[i] - rank_win[i], 0) + rank_opt[i] for i in range(pp))
    scale = tab.scale
    obj = (scale // vpp) * ((m * vpp - 1) * tmax + sum(rank_time)) + scale * tail
    return obj, fits


def even_layout(tab: CandidateTables, pool_of_rank: Sequence[int] | None = None) -> Layout | None:
    """Megatron's default split (decoder layers even, embedding with the first chunk, output with
    the last); None when the decoder layers do not divide evenly."""
    s = tab.num_chunks
    n_dec = int(tab.decoders[-1])
    if n_dec % s:
        return None
    per = n_dec // s
    bounds = [0] + [1 + per * (k + 1) for k in range(s - 1)] + [tab.num_layers]
    pp = tab.config.dims.pp
    pools = tuple((pool_of_rank[k % pp] if pool_of_rank else 0) for k in range(s))
    return Layout(bounds=tuple(bounds), recompute=(0,) * s, pools=pools)
