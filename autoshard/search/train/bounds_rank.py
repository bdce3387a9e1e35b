"""Lower bounds for one pool (or optimistic over every pool): each pipeline rank's memory room and
fixed work, the decoder layers it can take within a slowest-rank time (memory and continuous
recomputation included), and from them the slowest-rank, tail and joint (slowest rank + tail)
bounds. Capacities are over-estimates, so the thresholds under-estimate; `bounds.bounds` combines
them with the multi-pool (`bounds_pools`) and count-aware (`bounds_mixed`) bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoshard.search.train.tables import CandidateTables, PoolTables

__all__ = [
    "RankRoom", "rank_room", "layer_capacity", "rank_work", "rank_capacity_at", "uniform_thresholds",
    "uniform_capacity_at", "tmax_lower_bound", "tail_lower_bound", "joint_search",
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
        return own + tab.dp_min_latency_us + int(count) * (per(p.dp_min_us) + per(p.opt_us))

    return min(
        max(
            -(-(int(p.opt_us[-1]) + max(int(p.dp_min_us[-1]) + pp * tab.dp_min_latency_us,
                                        int(p.dp_full_us[-1]) + pp * tab.dp_latency_us
                                        - int(p.window_us[-1]))) // pp),
            end_rank(p, 0, least[0]),
            end_rank(p, n - 1, least[-1]),
        )
        for p in tab.pools
    )

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
    g = np.full(pp, float(tab.dp_latency_us if kind == "full" else tab.dp_min_latency_us))
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
