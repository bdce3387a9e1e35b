"""Lower bounds on a candidate's integer objective over every layout, without solving it.

They drive the best-first search in `run.prepare`: a candidate whose bound cannot beat the best plan
found so far is pruned with a certificate, and the bounds of the candidates kept tighten the CP-SAT
model. Every bound here is valid: capacities are over-estimated (cheapest layers, most memory,
continuous recomputation), so thresholds are under-estimated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from autoshard.costmodel.train.step import TrainConfig, _p2p_s, layer_cost
from autoshard.search.train.tables import CandidateTables, PoolTables
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.model import LayerKind, ModelSpec
from autoshard.units import US_PER_S

__all__ = [
    "bounds", "RankRoom", "rank_room", "layer_capacity", "rank_capacity_at", "tmax_lower_bound",
    "uniform_thresholds", "uniform_capacity_at", "pool_rank_limits", "two_pool_assignment", "pools_assignment", "hetero_capacity_at",
    "hetero_tmax_lower_bound", "joint_search", "quick_lower_bound", "rank_work", "LayerClasses", "layer_classes",
    "MixedCapacity", "mixed_tmax_lower_bound", "hetero_pipeline_bound", "tail_lower_bound",
    "assignment_capacity", "assignment_bounds",
]


def _rank_sends(tab: CandidateTables) -> list[int]:
    """Point-to-point sends per micro-batch of each pipeline rank (fixed by the chunk count)."""
    pp, s = tab.config.dims.pp, tab.num_chunks
    sends = [0] * pp
    for k in range(s):
        sends[k % pp] += (k + 1 < s) + (k > 0)
    return sends


@dataclass(frozen=True, slots=True)
class RankRoom:
    """Per pipeline rank, in vpp-scaled MiB: memory left for decoder layers after the fixed layers,
    what one decoder layer costs there, what recomputing it saves, and the recompute working set.
    Optimistic across pools and layer kinds, so capacities derived from it are upper bounds."""

    room: np.ndarray
    per_layer: np.ndarray
    saving: np.ndarray
    working: int


def rank_room(tab: CandidateTables, pool: int | None = None) -> RankRoom:
    """Memory room per rank on `pool` (None: optimistic over every pool)."""
    vpp = tab.config.dims.vpp
    pp = tab.config.dims.pp
    n = tab.num_layers
    pools = tab.pools if pool is None else (tab.pools[pool],)
    chunks = np.asarray(tab.in_flight_chunks, dtype=np.float64)
    cap = max(p.capacity_mib for p in pools)
    state = min(p.decoder_unit[1] for p in pools)
    act = min(p.decoder_unit[2] for p in pools)
    emb_state = min(int(p.state_mib[1] - p.state_mib[0]) for p in pools)
    emb_act = min(int(p.act_mib[1] - p.act_mib[0]) for p in pools)
    out_state = min(int(p.state_mib[n] - p.state_mib[n - 1]) for p in pools)
    out_act = min(int(p.act_mib[n] - p.act_mib[n - 1]) for p in pools)
    room = np.full(pp, float(vpp * (cap - tab.zero3_extra_mib)))
    room[0] -= vpp * emb_state + chunks[0] * emb_act
    room[pp - 1] -= vpp * out_state + chunks[pp - 1] * out_act
    working = min(p.working_mib for p in pools)
    if tab.base_full:
        room -= vpp * working
        saving = np.zeros(pp)
    else:
        saving = chunks * max(p.recompute_saving_mib for p in pools)
    return RankRoom(room=room, per_layer=vpp * state + chunks * act, saving=saving, working=vpp * working)


def _rank_capacity(rr: RankRoom, budget: np.ndarray, d: int, x: int, n_max: int) -> np.ndarray:
    """Upper bound on the decoder layers each rank can hold within a time budget (us per
    micro-batch) and its memory, letting it fully recompute any fraction of them (continuous)."""
    budget = np.maximum(budget, 0)
    mem_plain = np.where(rr.per_layer > 0, np.floor(np.maximum(rr.room, 0) / np.maximum(rr.per_layer, 1e-9)), n_max)
    n1 = np.minimum(mem_plain, np.floor(budget / d))
    n2 = n1
    if x >= 0 and np.any(rr.saving > 0):
        w = np.maximum(rr.saving, 1e-9)
        over = rr.working - rr.room  # memory beyond the room once recompute starts
        by_time = (budget - x * over / w) / (d + x * rr.per_layer / w)
        by_mem = np.where(rr.per_layer > w, (rr.room - rr.working) / np.maximum(rr.per_layer - w, 1e-9), n_max)
        n2 = np.floor(np.minimum(by_time, by_mem) + 1e-9)
        # the recompute branch only exists past the room: below it, r would be negative
        threshold = (rr.room - rr.working) / np.maximum(rr.per_layer, 1e-9)
        n2 = np.where((rr.saving > 0) & (n2 >= threshold), n2, n1)
    return np.clip(np.maximum(n1, n2), 0, n_max)


def layer_capacity(tab: CandidateTables) -> np.ndarray:
    """Memory-only upper bound on the decoder layers each rank can hold."""
    rr = rank_room(tab)
    n_dec = int(tab.decoders[-1])
    budget = np.full(len(rr.room), 1e30)
    return _rank_capacity(rr, budget, 1, max(p.recompute_extra_us for p in tab.pools), n_dec)


def rank_work(tab: CandidateTables, pool: int | None = None) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(cheapest decoder layer us, cheapest recompute extra us, fixed us per rank: embedding on
    rank 0, output on the last rank, p2p sends; fewest decoder layers per rank) on `pool`
    (None: optimistic across pools)."""
    pp = tab.config.dims.pp
    n = tab.num_layers
    pools = tab.pools if pool is None else (tab.pools[pool],)
    d = max(1, min(p.decoder_unit[0] for p in pools))
    x = min(p.recompute_extra_us for p in pools)
    emb = min(int(p.time_us[1] - p.time_us[0]) for p in pools)
    out = min(int(p.time_us[n] - p.time_us[n - 1]) for p in pools)
    p2p = min([p.p2p_us for p in tab.pools] + list(tab.cross_p2p_us.values()))
    fixed = np.asarray(_rank_sends(tab), dtype=np.float64) * p2p
    fixed[0] += emb
    fixed[pp - 1] += out
    # every chunk holds at least one layer: a rank's vpp chunks need vpp decoder layers, except
    # that chunk 0 may hold only the embedding and the last chunk only the output layer
    vpp = tab.config.dims.vpp
    min_layers = np.full(pp, float(vpp))
    min_layers[0] -= 1
    min_layers[pp - 1] -= 1
    return d, x, fixed, np.maximum(min_layers, 0)


def _least(cap: np.ndarray, min_layers: np.ndarray) -> np.ndarray:
    """Capacities, or all zeros when some rank cannot even hold its minimum (one layer per chunk)."""
    return cap if np.all(cap >= min_layers) else np.zeros_like(cap)


def rank_capacity_at(tab: CandidateTables, t: float, pool: int | None = None) -> np.ndarray:
    """Decoder layers each rank can take within slowest-rank time t (memory and recompute included)
    on `pool` (None: optimistic over the pools)."""
    d, x, fixed, least = rank_work(tab, pool)
    return _least(_rank_capacity(rank_room(tab, pool), t - fixed, d, x, int(tab.decoders[-1])), least)


def _uniform_capacity(tab: CandidateTables, rr: RankRoom, fixed: np.ndarray, d: int, x: int, t: float, k: int) -> np.ndarray:
    """Decoder layers per rank within time t when every chunk recomputes exactly k layers."""
    n_dec = int(tab.decoders[-1])
    recomputed = tab.config.dims.vpp * k
    room = np.maximum(rr.room, 0) - (rr.working if k else 0) + rr.saving * recomputed
    by_mem = np.where(rr.per_layer > 0, np.floor(np.maximum(room, 0) / np.maximum(rr.per_layer, 1e-9)), n_dec)
    by_time = np.floor(np.maximum(t - fixed - recomputed * x, 0) / d)
    cap = np.clip(np.minimum(by_mem, by_time), 0, n_dec)
    return np.where(cap >= recomputed, cap, 0)  # each chunk must hold its k recomputed layers


def _threshold(lo: int, hi: int, n_dec: int, capacity) -> int | None:
    """Smallest t in [lo, hi] with capacity(t).sum() >= n_dec (None if even hi is too small)."""
    if capacity(hi).sum() < n_dec:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if capacity(mid).sum() >= n_dec:
            hi = mid
        else:
            lo = mid + 1
    return lo


def uniform_thresholds(tab: CandidateTables) -> list[tuple[int, int]]:
    """(smallest slowest-rank time, k) for each uniform per-chunk recompute count k that can fit,
    fastest first. One vectorized bisection over every k at once."""
    n_dec = int(tab.decoders[-1])
    d, x, fixed, least = rank_work(tab)
    rr = rank_room(tab)
    vpp = tab.config.dims.vpp
    if tab.base_full or not np.any(rr.saving > 0):
        ks = np.array([0])
    else:
        ks = np.arange(n_dec // tab.num_chunks + 1)
    recomputed = (vpp * ks)[:, None].astype(np.float64)  # (K, 1)
    room = np.maximum(rr.room, 0)[None, :] - np.where(ks[:, None] > 0, rr.working, 0) + rr.saving[None, :] * recomputed
    by_mem = np.where(rr.per_layer[None, :] > 0,
                      np.floor(np.maximum(room, 0) / np.maximum(rr.per_layer[None, :], 1e-9)), n_dec)

    def total(t: np.ndarray) -> np.ndarray:
        by_time = np.floor(np.maximum(t[:, None] - fixed[None, :] - recomputed * x, 0) / d)
        cap = np.clip(np.minimum(by_mem, by_time), 0, n_dec)
        cap = np.where(cap >= recomputed, cap, 0)  # each chunk must hold its k recomputed layers
        ok = np.all(cap >= least[None, :], axis=1)
        return np.where(ok, cap.sum(axis=1), 0)

    lo = np.full(len(ks), float(fixed.max()))
    hi = np.full(len(ks), float(fixed.max()) + (d + max(x, 0)) * n_dec + 1)
    feasible = total(hi) >= n_dec
    while np.any(lo < hi):
        mid = np.floor((lo + hi) / 2)
        good = total(mid) >= n_dec
        hi = np.where(good & (lo < hi), mid, hi)
        lo = np.where(~good & (lo < hi), mid + 1, lo)
    return sorted((int(lo[i]), int(ks[i])) for i in range(len(ks)) if feasible[i])


def uniform_capacity_at(tab: CandidateTables, t: float, k: int) -> np.ndarray:
    d, x, fixed, least = rank_work(tab)
    return _least(_uniform_capacity(tab, rank_room(tab), fixed, d, x, t, k), least)


def pool_rank_limits(tab: CandidateTables, pool_gpus: Sequence[int]) -> list[int]:
    """How many pipeline ranks each pool can host (a rank needs TP x CP x DP GPUs)."""
    need = tab.config.dims.tp * tab.config.dims.cp * tab.config.dims.dp
    return [g // need for g in pool_gpus]


def two_pool_assignment(caps0: np.ndarray, caps1: np.ndarray, limits: Sequence[int]) -> tuple[float, np.ndarray] | None:
    """Largest total capacity when ranks choose pool 0 or 1 within the pools' rank limits, and the
    pool of each rank achieving it (greedy by marginal gain is exact for two pools)."""
    pp = len(caps0)
    gain = caps0 - caps1
    order = np.argsort(-gain, kind="stable")
    best = None
    for k in range(max(0, pp - limits[1]), min(pp, limits[0]) + 1):
        total = float(caps1.sum() + gain[order[:k]].sum())
        if best is None or total > best[0]:
            pools = np.ones(pp, dtype=np.int64)
            pools[order[:k]] = 0
            best = (total, pools)
    return best


def pools_assignment(caps: np.ndarray, limits: Sequence[int]) -> tuple[float, np.ndarray] | None:
    """Upper bound on the total capacity when each rank picks one of k pools within the pools' rank
    limits, and a pool per rank that respects the limits (None: the pools cannot host every rank).

    Two pools: exact (greedy by marginal gain). More: Lagrangian relaxation of the pool limits; for
    any multipliers lam >= 0, sum_r max_q (caps[q, r] - lam_q) + sum_q lam_q * L_q bounds the best
    assignment from above, so the smallest over a few multiplier updates is a valid bound. The
    assignment comes from the last multipliers, with ranks over a pool's limit moved to their next
    best pool that has room."""
    k, pp = caps.shape
    lim = np.minimum(np.asarray(limits, dtype=np.int64), pp)
    if lim.sum() < pp:
        return None
    if k == 2:
        return two_pool_assignment(caps[0], caps[1], lim)
    lam = np.zeros(k)
    best = math.inf
    for _ in range(2 * k):
        adj = caps - lam[:, None]
        best = min(best, float(adj.max(axis=0).sum() + (lam * lim).sum()))
        choice = adj.argmax(axis=0)
        counts = np.bincount(choice, minlength=k)
        over = np.flatnonzero(counts > lim)
        if len(over) == 0:
            break
        for q in over:
            others = np.delete(adj, q, axis=0).max(axis=0)
            margins = np.sort((adj[q] - others)[choice == q])[::-1]
            lam[q] += max(0.0, float(margins[lim[q]]))
    # a feasible assignment: ranks in order of how much they lose by leaving their pool
    adj = caps - lam[:, None]
    order = np.argsort(-(np.sort(adj, axis=0)[-1] - np.sort(adj, axis=0)[-2]), kind="stable")
    free = lim.copy()
    pools = np.zeros(pp, dtype=np.int64)
    for r in order:
        for q in np.argsort(-adj[:, r], kind="stable"):
            if free[q] > 0:
                free[q] -= 1
                pools[r] = q
                break
    return best, pools


class _HeteroCapacity:
    """Per-pool rank work and memory room, computed once, for the k-pool capacity function."""

    def __init__(self, tab: CandidateTables, pool_gpus: Sequence[int]) -> None:
        self.n_dec = int(tab.decoders[-1])
        self.parts = []
        for q in range(len(tab.pools)):
            d, x, fixed, _ = rank_work(tab, q)
            self.parts.append((rank_room(tab, q), d, x, fixed))
        self.limits = pool_rank_limits(tab, pool_gpus)

    def at(self, t: float) -> tuple[float, np.ndarray] | None:
        caps = np.stack([_rank_capacity(rr, t - fixed, d, x, self.n_dec) for rr, d, x, fixed in self.parts])
        return pools_assignment(caps, self.limits)


def hetero_capacity_at(tab: CandidateTables, t: float, pool_gpus: Sequence[int]) -> tuple[float, np.ndarray] | None:
    """(upper bound on the decoder layers the ranks can absorb within time t, pool per rank)."""
    return _HeteroCapacity(tab, pool_gpus).at(t)


def hetero_tmax_lower_bound(tab: CandidateTables, pool_gpus: Sequence[int], probe: int | None = None) -> int | None:
    """Slowest-rank time bound when each rank's pool is chosen optimally within the pools' sizes.
    With `probe` (a time the caller only cares to beat): probe + 1 after one evaluation when even
    it cannot absorb the layers."""
    n_dec = int(tab.decoders[-1])
    _, _, fixed, _ = rank_work(tab)
    d = max(p.decoder_unit[0] for p in tab.pools)
    x = max(p.recompute_extra_us for p in tab.pools)
    lo, hi = int(fixed.max()), int(fixed.max()) + (d + max(x, 0)) * n_dec * 4 + 1
    cap = _HeteroCapacity(tab, pool_gpus)

    def capacity(t: float) -> np.ndarray:
        found = cap.at(t)
        return np.array([0.0 if found is None else found[0]])

    if probe is not None and lo <= probe < hi:
        if capacity(probe).sum() < n_dec:
            return probe + 1
        hi = probe
    return _threshold(lo, hi, n_dec, capacity)


def tmax_lower_bound(tab: CandidateTables, *, uniform_recompute: bool = False) -> int | None:
    """Smallest slowest-rank time any layout can reach, or None when no layout fits in memory.

    Rank r carries fixed work (embedding on rank 0, output on the last rank, its p2p sends) plus
    whole decoder layers, as many as its memory allows with the recomputation that takes (each
    recomputed layer costing extra time); binary search on the threshold T at which the ranks can
    absorb every decoder layer. With `uniform_recompute` every chunk recomputes the same number k of
    layers (Megatron's --recompute-num-layers) and the bound is the best over k."""
    if uniform_recompute:
        found = uniform_thresholds(tab)
        return found[0][0] if found else None
    n_dec = int(tab.decoders[-1])
    d, x, fixed, least = rank_work(tab)
    rr = rank_room(tab)
    lo, hi = int(fixed.max()), int(fixed.max()) + (d + max(x, 0)) * n_dec + 1
    return _threshold(lo, hi, n_dec, lambda t: _least(_rank_capacity(rr, t - fixed, d, x, n_dec), least))


_MAX_MINOR = 64
"""Largest count of minority decoder layers the count-aware bound handles (its DP is quadratic in it)."""


@dataclass(frozen=True, slots=True)
class LayerClasses:
    """Decoder layers split into the most numerous kind (major) and all others (minor), with the
    cheapest (time us, state MiB, activation MiB) of each class, read from the tables' per-layer
    differences (so they are exactly what the solver counts), optimistic over `pools`."""

    major: tuple[int, int, int]
    minor: tuple[int, int, int]
    n_major: int
    n_minor: int


def layer_classes(tab: CandidateTables, pool: int | None = None) -> LayerClasses:
    pools = tab.pools if pool is None else (tab.pools[pool],)
    is_dec = np.diff(tab.decoders) > 0
    units = []
    for p in pools:
        units.append(np.stack([np.diff(p.time_us), np.diff(p.state_mib), np.diff(p.act_mib)], axis=1)[is_dec])
    # a layer's kind is its signature on the first pool (identical layers give identical integers)
    sig = [tuple(row) for row in units[0]]
    counts: dict[tuple, int] = {}
    for key in sig:
        counts[key] = counts.get(key, 0) + 1
    major_key = max(counts, key=lambda k: (counts[k], k))
    is_major = np.array([key == major_key for key in sig])
    stacked = np.stack(units)  # (pools, layers, 3)
    major = tuple(int(v) for v in stacked[:, is_major, :].min(axis=(0, 1)))
    if is_major.all():
        minor = major
    else:
        minor = tuple(int(v) for v in stacked[:, ~is_major, :].min(axis=(0, 1)))
    return LayerClasses(major=major, minor=minor, n_major=int(is_major.sum()), n_minor=int((~is_major).sum()))


class MixedCapacity:
    """Count-aware capacities for models whose decoder layers differ (dense-first MoE, hybrids).

    A rank holding j minority layers and n majority layers needs their real time and memory (each
    class at its own cheapest cost, not the cheapest layer of the model), and may fully recompute up
    to n + j of them (continuous relaxation). The ranks must share the minority layers exactly, so the
    largest number of majority layers they can absorb at slowest-rank time T is a max-plus DP over
    ranks of cap_r(T, j); T is feasible when that reaches the majority count. Valid for any layout:
    capacities are over-estimates, so the threshold under-estimates the slowest rank."""

    def __init__(self, tab: CandidateTables, pool: int | None = None) -> None:
        self.cls = layer_classes(tab, pool)
        self.rr = rank_room(tab, pool)
        d, x, fixed, least = rank_work(tab, pool)
        self.x, self.fixed, self.least = x, fixed, least
        vpp = tab.config.dims.vpp
        chunks = np.asarray(tab.in_flight_chunks, dtype=np.float64)
        self.d_major = max(1, self.cls.major[0])
        self.d_minor = max(0, self.cls.minor[0])
        self.pl_major = vpp * self.cls.major[1] + chunks * self.cls.major[2]
        self.pl_minor = vpp * self.cls.minor[1] + chunks * self.cls.minor[2]
        self.n_dec = int(tab.decoders[-1])
        self.vpp = vpp
        self.uniform: int | None = None

    def _caps_uniform(self, ts: np.ndarray, k: int) -> np.ndarray:
        """As `_caps` when every chunk recomputes exactly k layers (Megatron's --recompute-num-layers):
        rank r then recomputes vpp*k of its layers, each costing the recompute time and saving its
        activations, and holds at least that many layers."""
        rr, D = self.rr, self.cls.n_minor
        js = np.arange(D + 1, dtype=np.float64)[None, None, :]
        rc = self.vpp * k
        budget = (ts[:, None] - self.fixed[None, :])[:, :, None] - js * self.d_minor - rc * max(self.x, 0)
        room = (rr.room[None, :, None] - js * self.pl_minor[None, :, None] + rc * rr.saving[None, :, None]
                - (rr.working if k > 0 else 0))
        pl = np.maximum(self.pl_major, 1e-9)[None, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            cap = np.floor(np.minimum(room / pl, budget / float(self.d_major)) + 1e-9)
        need = np.maximum(self.least[None, :, None], rc)
        ok = (cap >= 0) & (budget >= 0) & (room >= 0) & (cap + js >= need)
        return np.where(ok, np.minimum(cap, self.cls.n_major), -np.inf)

    def _caps(self, ts: np.ndarray) -> np.ndarray:
        """(G, pp, D+1): majority layers rank r can add to j minority layers within time ts[g];
        -inf where even the j minority layers (or the rank's fewest layers) do not fit."""
        rr, D = self.rr, self.cls.n_minor
        js = np.arange(D + 1, dtype=np.float64)[None, None, :]
        budget = (ts[:, None] - self.fixed[None, :])[:, :, None] - js * self.d_minor  # (G, pp, D+1)
        room = (rr.room[None, :, None] - js * self.pl_minor[None, :, None])
        pl = np.maximum(self.pl_major, 1e-9)[None, :, None]
        d = float(self.d_major)
        with np.errstate(divide="ignore", invalid="ignore"):
            n1 = np.minimum(room / pl, budget / d)
            w = rr.saving[None, :, None]
            if np.any(rr.saving > 0):
                W = float(rr.working)
                x = float(max(self.x, 0))
                by_mem = np.where(pl > w, (room - W + js * w) / np.maximum(pl - w, 1e-9), np.inf)
                if x > 0:
                    by_time = (budget * w + x * (room - W)) / (pl * x + d * w)
                else:
                    by_time = np.full_like(budget, np.inf)
                n2 = np.minimum(np.minimum(by_mem, by_time), budget / d)
                n2 = np.where(w > 0, n2, -np.inf)
                cap = np.maximum(n1, n2)
            else:
                cap = n1
        cap = np.floor(cap + 1e-9)
        ok = (cap >= 0) & (budget >= 0) & (cap + js >= self.least[None, :, None])
        return np.where(ok, np.minimum(cap, self.cls.n_major), -np.inf)

    def absorbed(self, ts: np.ndarray) -> np.ndarray:
        """Most majority layers the ranks can absorb at each time in ts while holding every minority
        layer (with `uniform` set: every chunk recomputing exactly `uniform` layers)."""
        ts = np.asarray(ts, dtype=np.float64)
        caps = self._caps(ts) if self.uniform is None else self._caps_uniform(ts, self.uniform)
        g, pp, width = caps.shape
        best = caps[:, 0, :]
        for r in range(1, pp):
            nxt = np.full((g, width), -np.inf)
            for j in range(width):
                shifted = np.full((g, width), -np.inf)
                shifted[:, j:] = best[:, : width - j]
                nxt = np.maximum(nxt, shifted + caps[:, r, j][:, None])
            best = nxt
        return best[:, -1]

    def threshold(self, lo: int, probe: int | None = None) -> int | None:
        """Smallest integer T >= lo at which the ranks can absorb every decoder layer (None: never).
        With `probe`, a T the caller only cares to beat: when even it is infeasible, probe + 1 (a
        valid lower bound) comes back after one evaluation."""
        span = (max(self.d_major, self.d_minor) + max(self.x, 0)) * self.n_dec + 1
        hi = int(self.fixed.max()) + span
        if probe is not None and lo <= probe < hi:
            if self.absorbed(np.array([float(probe)]))[0] < self.cls.n_major:
                return probe + 1
            hi = probe
        elif self.absorbed(np.array([hi]))[0] < self.cls.n_major:
            return None
        lo = min(int(lo), hi)
        while hi - lo > 0:
            grid = np.unique(np.linspace(lo, hi, 33).astype(np.int64))
            good = self.absorbed(grid.astype(np.float64)) >= self.cls.n_major
            first = int(np.argmax(good))  # good[-1] is True: hi is feasible
            if first == 0:
                return int(grid[0])
            lo, hi = int(grid[first - 1]) + 1, int(grid[first])
        return lo


def mixed_tmax_lower_bound(tab: CandidateTables, pool: int | None = None, probe: int | None = None, *,
                           uniform_recompute: bool = False) -> int | None | bool:
    """Count-aware slowest-rank bound when the decoder layers differ; True when it does not apply
    (identical decoder layers, or too many minority layers), None when no layout fits in memory.
    `probe`: see `MixedCapacity.threshold`. With `uniform_recompute` every chunk recomputes the same
    number k of layers and the bound is the smallest over k (each k priced exactly per rank)."""
    cls = layer_classes(tab, pool)
    if cls.n_minor == 0 or cls.n_minor > _MAX_MINOR:
        return True
    cap = MixedCapacity(tab, pool)
    lo = int(cap.fixed.max())
    if not uniform_recompute:
        return cap.threshold(lo, probe)
    if tab.base_full or not np.any(cap.rr.saving > 0):
        ks = [0]
    else:
        ks = range(cap.n_dec // tab.num_chunks + 1)
    found = []
    for k in ks:
        cap.uniform = k
        t = cap.threshold(lo, probe)
        if t is not None:
            found.append(t)
            if probe is not None and t <= probe:
                probe = t - 1  # later k only matter if they beat this one
    return min(found) if found else None


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
    # decoder layers that differ: each class at its own cost, the minority shared out exactly
    # (first: it is also the sharpest memory check)
    probe = None
    if cutoff is not None and m * vpp > 1:
        probe = (cutoff // max(1, tab.scale // vpp) - total) // (m * vpp - 1)  # beyond it the bound passes the cutoff
    mixed = mixed_tmax_lower_bound(tab, probe=probe, uniform_recompute=uniform_recompute)
    if mixed is None:
        return None
    slowest = -(-total // pp) if mixed is True else max(-(-total // pp), mixed)
    if cutoff is not None:
        first = (tab.scale // vpp) * ((m * vpp - 1) * slowest + total)
        if first > cutoff:
            return first, slowest
    if len(tab.pools) >= 2 and pool_gpus is not None:
        found = hetero_tmax_lower_bound(tab, pool_gpus, probe=probe)
    else:
        found = tmax_lower_bound(tab, uniform_recompute=uniform_recompute)
    if found is None:
        return None
    tmax = max(slowest, found)
    tail = tail_lower_bound(tab)
    scale = tab.scale
    a, b = (scale // vpp) * (m * vpp - 1), scale
    pipeline_and_tail = a * tmax + b * tail
    if len(tab.pools) == 1 and pp > 1:
        pipeline_and_tail = max(pipeline_and_tail, joint_search(tab, tmax, a, b)[0])
    lower = (scale // vpp) * total + pipeline_and_tail
    if len(tab.pools) >= 2 and pool_gpus is not None:
        lower = max(lower, hetero_pipeline_bound(tab, pool_gpus, tmax, a, scale // vpp) + b * tail)
    return lower, tmax


def tail_lower_bound(tab: CandidateTables) -> int:
    """The slowest rank's tail is at least the average over ranks of max(dp_min_r, dp_full_r -
    window_r) + opt_r, and at least what the first rank (embedding + its fewest decoder layers) and
    the last rank (output + its fewest) must exchange and update."""
    pp = tab.config.dims.pp
    _, _, _, least = rank_work(tab)
    n = tab.num_layers

    def end_rank(p: PoolTables, layer: int, count: float) -> int:
        per = lambda arr: int(arr[2] - arr[1]) if tab.uniform_decoders else 0  # noqa: E731
        own = int(p.dp_min_us[layer + 1] - p.dp_min_us[layer]) + int(p.opt_us[layer + 1] - p.opt_us[layer])
        return own + int(count) * (per(p.dp_min_us) + per(p.opt_us))

    return min(
        max(
            -(-(int(p.opt_us[-1]) + max(int(p.dp_min_us[-1]), int(p.dp_full_us[-1]) + pp * tab.dp_latency_us
                                        - int(p.window_us[-1]))) // pp),
            end_rank(p, 0, least[0]),
            end_rank(p, n - 1, least[-1]),
        )
        for p in tab.pools
    )


def assignment_sends(tab: CandidateTables, assignment: Sequence[int]) -> np.ndarray:
    """Point-to-point time per micro-batch of each rank when rank r runs on pool assignment[r]:
    every chunk boundary priced as `int_objective` prices it (same pool or across pools)."""
    pp, s = tab.config.dims.pp, tab.num_chunks
    out = np.zeros(pp)
    for k in range(s):
        a = assignment[k % pp]
        for nb in ([k + 1] if k + 1 < s else []) + ([k - 1] if k > 0 else []):
            b = assignment[nb % pp]
            out[k % pp] += tab.pools[a].p2p_us if a == b else tab.cross_p2p_us[(a, b) if nb > k else (b, a)]
    return out


def assignment_capacity(tab: CandidateTables, assignment: Sequence[int]):
    """Per-rank decoder capacity at slowest-rank time t when rank r runs on pool assignment[r]
    (memory and recompute included, as `rank_capacity_at`; sends priced exactly)."""
    pools = np.asarray(assignment)
    n_dec = int(tab.decoders[-1])
    p2p = min([p.p2p_us for p in tab.pools] + list(tab.cross_p2p_us.values()))
    exact = assignment_sends(tab, assignment) - np.asarray(_rank_sends(tab), dtype=np.float64) * p2p
    parts = []
    for q in range(len(tab.pools)):
        d, x, fixed, least = rank_work(tab, q)
        parts.append((rank_room(tab, q), d, x, fixed + exact, least))
    least = parts[0][4]

    def at(t: float) -> np.ndarray:
        caps = np.zeros(len(pools))
        for q, (rr, d, x, fixed, _) in enumerate(parts):
            mask = pools == q
            if mask.any():
                caps = np.where(mask, _rank_capacity(rr, t - fixed, d, x, n_dec), caps)
        return _least(caps, least)

    return at


def assignment_bounds(tab: CandidateTables, assignment: Sequence[int], pool_gpus: Sequence[int],
                      base_lower: int) -> tuple[int, int] | None:
    """(objective bound, slowest-rank bound) of a candidate whose ranks' pools are fixed; None when
    no layout fits. Never weaker than `base_lower`, the candidate's bound over every assignment."""
    cfg = tab.config
    pp, vpp, m = cfg.dims.pp, cfg.dims.vpp, cfg.num_microbatches
    n_dec = int(tab.decoders[-1])
    at = assignment_capacity(tab, assignment)
    p2p = min([p.p2p_us for p in tab.pools] + list(tab.cross_p2p_us.values()))
    exact = assignment_sends(tab, assignment) - np.asarray(_rank_sends(tab), dtype=np.float64) * p2p
    # each rank's fixed work on its own pool: no layout is faster than the slowest of them
    lo = int(max(rank_work(tab, q)[2][r] + exact[r] for r, q in enumerate(assignment)))
    d = max(p.decoder_unit[0] for p in tab.pools)
    x = max(max(p.recompute_extra_us for p in tab.pools), 0)
    tmax = _threshold(lo, lo + (d + x) * n_dec + 1, n_dec, at)
    if tmax is None:
        return None
    a, c = (tab.scale // vpp) * (m * vpp - 1), tab.scale // vpp
    pipeline = hetero_pipeline_bound(tab, pool_gpus, tmax, a, c, assignment=assignment,
                                     sends=assignment_sends(tab, assignment))
    return max(base_lower, pipeline + tab.scale * tail_lower_bound(tab)), tmax


def hetero_pipeline_bound(tab: CandidateTables, pool_gpus: Sequence[int], tmax: int, a: int, c: int,
                          assignment: Sequence[int] | None = None, sends: np.ndarray | None = None) -> int:
    """Lower bound on a*t_max + c*sum_r T_r on a heterogeneous cluster.

    The sum of the ranks' times is the time of every layer on the pool that runs it. At slowest-rank
    time T each pool's ranks hold at most their capacity at T (the pool's L_q most capable ranks,
    each rank counted for every pool: a relaxation), so the smallest sum fills the pools with the
    cheapest decoder layer first. That sum shrinks as T grows, so T runs over a grid from the t_max
    bound to where a longer T cannot pay for itself, each segment priced at its left T and right sum.
    With `assignment` (the pool of each rank), each pool counts exactly its own ranks, and `sends`
    (per rank, exact for that assignment) replace the cheapest-link estimate of the p2p time."""
    pp = tab.config.dims.pp
    n_dec = int(tab.decoders[-1])
    n = tab.num_layers
    limits = np.minimum(pool_rank_limits(tab, pool_gpus), pp)
    own = None if assignment is None else np.asarray(assignment)
    p2p = min([p.p2p_us for p in tab.pools] + list(tab.cross_p2p_us.values()))
    exact = 0.0 if sends is None else sends - np.asarray(_rank_sends(tab), dtype=np.float64) * p2p
    parts = []
    for q in range(len(tab.pools)):
        d, x, fixed, _ = rank_work(tab, q)
        parts.append((d, rank_room(tab, q), x, fixed + exact, int(limits[q]), None if own is None else own == q))
    parts.sort(key=lambda item: item[0])
    p2p = min([p.p2p_us for p in tab.pools] + list(tab.cross_p2p_us.values()))
    ends = (min(int(p.time_us[1] - p.time_us[0]) for p in tab.pools)
            + min(int(p.time_us[n] - p.time_us[n - 1]) for p in tab.pools)
            + (2 * (tab.num_chunks - 1) * p2p if sends is None else int(sends.sum())))

    def smallest_sum(t: float) -> int | None:
        left, total = n_dec, 0
        for d, rr, x, fixed, limit, mine in parts:
            if limit <= 0 or (mine is not None and not mine.any()):
                continue
            caps = _rank_capacity(rr, t - fixed, d, x, n_dec)
            room = caps[mine].sum() if mine is not None else np.sort(caps)[::-1][:limit].sum()
            take = min(left, int(room))
            total += take * d
            left -= take
            if left == 0:
                return total + ends
        return None

    floor = smallest_sum(math.inf)
    if floor is None:
        return 0
    first = smallest_sum(tmax)
    if a <= 0:
        return c * floor
    if first is None:
        first = smallest_sum(tmax + 1)
        if first is None:  # only feasible further out: price from the floor
            return a * tmax + c * floor
    span = max(1, math.ceil(c * (first - floor) / a))
    points = 12
    grid = [tmax + math.ceil(span * i / points) for i in range(points + 1)]
    sums = [smallest_sum(t) for t in grid]
    best = a * grid[-1] + c * floor
    for i in range(points):
        right = sums[i + 1]
        if right is not None:
            best = min(best, a * grid[i] + c * right)
    return best


def joint_search(tab: CandidateTables, tmax: int, a: int, b: int) -> tuple[int, list[np.ndarray]]:
    """Lower bound on a*t_max + b*tail, and the per-rank load caps at the best points found.

    The rank holding the embedding (or the output) must take fewer decoder layers to keep its
    data-parallel + optimizer tail short, which pushes layers, and time, onto the other ranks. For a
    slowest-rank time T the ranks' loads are capped by time and memory; the smallest tail U they then
    allow is found by binary search. T runs over a grid from the t_max bound up to where a longer T
    cannot pay for itself; each segment is priced at its left T and right U, which keeps the bound
    valid between grid points."""
    p = tab.pools[0]
    pp = tab.config.dims.pp
    n_dec = int(tab.decoders[-1])
    n = tab.num_layers
    d, x, fixed, least = rank_work(tab)
    rr = rank_room(tab)

    # a rank's tail is max(dp_min, dp_full + latency - window) + optimizer, each linear in its layers:
    # bound it by whichever of the two grows faster per decoder layer
    def diff(arr, i: int) -> int:
        return int(arr[i + 1] - arr[i])

    def slope(kind: str, i: int) -> int:
        if kind == "full":
            return diff(p.dp_full_us, i) - diff(p.window_us, i) + diff(p.opt_us, i)
        return diff(p.dp_min_us, i) + diff(p.opt_us, i)

    # decoder layers may differ (dense and MoE): the cheapest one keeps the capacities upper bounds
    decoders = range(1, n - 1)
    kind = "full" if min(slope("full", i) for i in decoders) >= min(slope("min", i) for i in decoders) else "min"
    e = min(slope(kind, i) for i in decoders)
    g = np.full(pp, float(tab.dp_latency_us if kind == "full" else 0))
    g[0] += slope(kind, 0)
    g[pp - 1] += slope(kind, n - 1)
    if e <= 0:
        return 0, []

    def min_tails(ts: list[float]) -> list[tuple[int, np.ndarray] | None]:
        """For each slowest-rank time, the smallest tail the loads allow (one vectorized bisection)."""
        by_time = np.stack([_rank_capacity(rr, t - fixed, d, x, n_dec) for t in ts])  # (G, pp)
        usable = (by_time.sum(axis=1) >= n_dec) & np.all(by_time >= least[None, :], axis=1)
        lo = np.full(len(ts), float(g.max()))
        hi = np.full(len(ts), float(g.max()) + e * n_dec + 1)
        while np.any(lo < hi):
            mid = np.floor((lo + hi) / 2)
            cap = np.minimum(by_time, np.floor((mid[:, None] - g[None, :]) / e))
            good = (cap.sum(axis=1) >= n_dec) & np.all(cap >= least[None, :], axis=1)
            hi = np.where(good & (lo < hi), mid, hi)
            lo = np.where(~good & (lo < hi), mid + 1, lo)
        caps = np.minimum(by_time, np.floor((lo[:, None] - g[None, :]) / e))
        return [(int(lo[i]), caps[i]) if usable[i] else None for i in range(len(ts))]

    first, floor = min_tails([tmax, float("inf")])
    if first is None or floor is None:
        return 0, []
    if a <= 0:  # one micro-batch, no interleaving: the slowest rank's time does not weigh in
        return b * floor[0], [floor[1]]
    # past T_max + b/a * (U(t_max) - U_floor) a longer slowest rank costs more than any tail it saves
    span = max(1, math.ceil(b * (first[0] - floor[0]) / a))
    points = 12
    grid = [tmax + math.ceil(span * i / points) for i in range(points + 1)]
    found = [first, *min_tails(grid[1:])]
    best, caps = None, []
    for i, t in enumerate(grid):
        right = found[i + 1] if i + 1 < len(grid) else floor
        if right is None:
            continue
        value = a * t + b * right[0]
        if best is None or value < best:
            best = value
        if found[i] is not None:
            caps.append((a * t + b * found[i][0], found[i][1]))
    caps.sort(key=lambda item: item[0])
    return best or 0, [c for _, c in caps[:3]]


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
    dims = cfg.dims
    pp, vpp, m = dims.pp, dims.vpp, cfg.num_microbatches
    major, count = _major_decoder(model)
    per_pool = [
        round(layer_cost(model, major, pool, cfg, cfg.recompute).time_s * US_PER_S) * count if major else 0
        for pool in cluster.pools
    ]
    total = min(per_pool)
    if pp > 1 and not cluster.is_heterogeneous:
        total += 2 * (pp * vpp - 1) * math.ceil(_p2p_s(model, cfg, cluster.primary, cluster.primary, cluster) * US_PER_S)
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
