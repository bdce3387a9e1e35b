"""Lower bounds on a heterogeneous cluster: which pool each pipeline rank runs on, within how many
ranks each pool can host. The best pool per rank (exact for two pools, a Lagrangian bound for
more), the slowest-rank and pipeline-sum bounds over every assignment, and the tighter bounds of one
fixed rank -> pool assignment that `solve` splits a candidate into."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from autoshard.search.train.bounds_rank import (
    _least,
    _rank_capacity,
    _rank_sends,
    _threshold,
    _uniform_capacity,
    rank_room,
    rank_work,
    tail_lower_bound,
)
from autoshard.search.train.bounds_joint import joint_tail_bound
from autoshard.search.train.bounds_sends import SendsCapacity, min_total_sends, pool_send_floor
from autoshard.search.train.tables import CandidateTables

__all__ = [
    "pool_rank_limits", "two_pool_assignment", "three_pool_assignment", "pools_assignment", "hetero_capacity_at", "hetero_tmax_lower_bound",
    "assignment_sends", "assignment_capacity", "assignment_bounds", "hetero_pipeline_bound", "pipeline_sums",
]


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

    Two pools: exact (greedy by marginal gain); three: exact (`three_pool_assignment`) while the
    counts are small enough. More: Lagrangian relaxation of the pool limits; for
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
    if k == 3 and (lim[0] + 1) * (lim[1] + 1) * pp <= _EXACT_STATES:
        return three_pool_assignment(caps, lim)
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


_EXACT_STATES = 60_000
"""Largest (ranks on pool 0 + 1) x (ranks on pool 1 + 1) x ranks for which three pools are assigned
exactly (`three_pool_assignment`, a few numpy operations per rank); past it, the Lagrangian bound."""


_ENUMERATE_RANKS = 6
"""Up to this many ranks, `three_pool_assignment` scores every assignment at once (3^6 = 729)."""


@lru_cache(maxsize=256)
def _assignments(pp: int, lim: tuple[int, ...]) -> np.ndarray:
    """Every pool per rank (one row each) within the pools' rank limits."""
    rows = [v for v in itertools.product(range(len(lim)), repeat=pp) if all(v.count(q) <= n for q, n in enumerate(lim))]
    return np.asarray(rows, dtype=np.int64).reshape(len(rows), pp)


def three_pool_assignment(caps: np.ndarray, lim: np.ndarray) -> tuple[float, np.ndarray] | None:
    """Largest total capacity when each rank picks one of three pools within the pools' rank limits,
    and the pool of each rank achieving it: exact, by dynamic programming over the ranks with the
    counts on pools 0 and 1 as state (the count on pool 2 follows)."""
    pp = caps.shape[1]
    if pp <= _ENUMERATE_RANKS:
        vectors = _assignments(pp, tuple(int(x) for x in lim))
        if not len(vectors):
            return None
        totals = caps[vectors, np.arange(pp)].sum(axis=1)
        best = int(np.argmax(totals))
        return float(totals[best]), vectors[best].astype(np.int64)
    neg = -np.inf
    a = np.arange(lim[0] + 1)[:, None]
    b = np.arange(lim[1] + 1)[None, :]
    best = np.full((lim[0] + 1, lim[1] + 1), neg)
    best[0, 0] = 0.0
    choice = np.zeros((pp, lim[0] + 1, lim[1] + 1), dtype=np.int8)
    ways = np.full((3, lim[0] + 1, lim[1] + 1), neg)  # rank r on pool 0, 1 or 2
    for r in range(pp):
        before = r - a - b  # ranks on pool 2 among the first r
        ways[0, 1:, :] = best[:-1, :] + caps[0, r]
        ways[1, :, 1:] = best[:, :-1] + caps[1, r]
        ways[2] = np.where((before >= 0) & (before < lim[2]), best + caps[2, r], neg)
        choice[r] = np.argmax(ways, axis=0)
        best = np.max(ways, axis=0)
    end = np.where(pp - a - b <= lim[2], best, neg)
    if not np.isfinite(end.max()):
        return None
    i, j = np.unravel_index(int(np.argmax(end)), end.shape)
    total = float(end[i, j])
    pools = np.zeros(pp, dtype=np.int64)
    for r in range(pp - 1, -1, -1):
        q = int(choice[r, i, j])
        pools[r] = q
        i, j = i - (q == 0), j - (q == 1)
    return total, pools


class _HeteroCapacity:
    """Per-pool rank work and memory room, computed once, for the k-pool capacity function. With
    `uniform_k`, every chunk recomputes exactly that many decoder layers (Megatron's
    --recompute-num-layers, one count for the whole model) instead of each rank its own share."""

    def __init__(self, tab: CandidateTables, pool_gpus: Sequence[int], uniform_k: int | None = None,
                 exact_sends: bool = False) -> None:
        self.tab, self.uniform_k = tab, uniform_k
        self.n_dec = int(tab.decoders[-1])
        self.parts = []
        floor = pool_send_floor(tab)  # each pool's sends at its own cheapest links
        for q in range(len(tab.pools)):
            d, x, fixed, least = rank_work(tab, q)
            self.parts.append((rank_room(tab, q), d, x, fixed + floor[q]))
        self.least = least if uniform_k is None else np.maximum(least, tab.config.dims.vpp * uniform_k)
        self.limits = pool_rank_limits(tab, pool_gpus)
        # a rank that cannot hold its minimum (one decoder layer per chunk) on a pool cannot run there:
        # its capacity there counts so negative that no assignment using it reaches the layer count
        self.barred = -float(self.n_dec + 1) * (tab.config.dims.pp + 1)
        # every send at its own link's price (`bounds_sends`): the total only, no assignment
        self.sends = None
        if exact_sends and SendsCapacity.fits(len(tab.pools), tab.config.dims.pp, self.limits):
            self.sends = SendsCapacity(tab, self.parts, self.least, self.barred, self.limits, uniform_k)

    def at(self, t: float) -> tuple[float, np.ndarray | None] | None:
        if self.sends is not None:
            total = self.sends.at(t)
            return None if total is None else (total, None)
        if self.uniform_k is None:
            caps = np.stack([_rank_capacity(rr, t - fixed, d, x, self.n_dec) for rr, d, x, fixed in self.parts])
        else:
            caps = np.stack([_uniform_capacity(self.tab, rr, fixed, d, x, t, self.uniform_k)
                             for rr, d, x, fixed in self.parts])
        caps = np.where(caps >= self.least, caps, self.barred)
        return pools_assignment(caps, self.limits)


def hetero_capacity_at(tab: CandidateTables, t: float, pool_gpus: Sequence[int]) -> tuple[float, np.ndarray] | None:
    """(upper bound on the decoder layers the ranks can absorb within time t, pool per rank)."""
    return _HeteroCapacity(tab, pool_gpus).at(t)


def hetero_tmax_lower_bound(tab: CandidateTables, pool_gpus: Sequence[int], probe: int | None = None,
                            uniform_recompute: bool = False) -> int | None:
    """Slowest-rank time bound when each rank's pool is chosen optimally within the pools' sizes.
    With `probe` (a time the caller only cares to beat): probe + 1 after one evaluation when even
    it cannot absorb the layers. With `uniform_recompute`, the best over the one recompute count k
    every chunk shares (a tight pool that can hold only a few layers caps k for every rank)."""
    if not uniform_recompute:
        return _exact_threshold(tab, pool_gpus, None, probe, None)
    allow_rc = tab.block_recompute
    ks = range(int(tab.decoders[-1]) // tab.num_chunks + 1) if allow_rc else range(1)
    best = None
    for k in ks:
        found = _exact_threshold(tab, pool_gpus, k, probe, best)
        if found is not None and (best is None or found < best):
            best = found
    return best


def _exact_threshold(tab: CandidateTables, pool_gpus: Sequence[int], uniform_k: int | None, probe: int | None,
                     ceiling: int | None) -> int | None:
    """The cheapest-link threshold, then, where it could still matter (at most `probe` and below
    `ceiling`, the best of the other recompute counts), the exact-sends one searched from it: the
    exact capacities are never larger, so the exact threshold is never smaller."""
    loose = _hetero_threshold(tab, _HeteroCapacity(tab, pool_gpus, uniform_k=uniform_k), probe)
    if loose is None or (probe is not None and loose > probe) or (ceiling is not None and loose >= ceiling):
        return loose
    exact = _HeteroCapacity(tab, pool_gpus, uniform_k=uniform_k, exact_sends=True)
    if exact.sends is None:
        return loose
    return _hetero_threshold(tab, exact, probe, lo_at_least=loose, extra_hi=exact.sends.extra_us)


def _hetero_threshold(tab: CandidateTables, cap: _HeteroCapacity, probe: int | None, lo_at_least: int = 0,
                      extra_hi: int = 0) -> int | None:
    n_dec = int(tab.decoders[-1])
    _, _, fixed, _ = rank_work(tab)
    d = max(p.decoder_unit[0] for p in tab.pools)
    x = max(p.recompute_extra_us for p in tab.pools)
    lo, hi = int(fixed.max()), int(fixed.max()) + (d + max(x, 0)) * n_dec * 4 + 1 + extra_hi
    lo = min(max(lo, lo_at_least), hi)

    def capacity(t: float) -> np.ndarray:
        found = cap.at(t)
        return np.array([0.0 if found is None else found[0]])

    if probe is not None and lo <= probe < hi:
        if capacity(probe).sum() < n_dec:
            return probe + 1
        hi = probe
    return _threshold(lo, hi, n_dec, capacity)

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

    def at(t: float | np.ndarray) -> np.ndarray:
        """Capacities at t (pp,), or at each time of an array of times (G, pp)."""
        ts = np.asarray(t, dtype=np.float64)
        if ts.ndim:
            ts = ts[:, None]
        caps = np.zeros(np.broadcast_shapes(ts.shape, pools.shape))
        for q, (rr, d, x, fixed, _) in enumerate(parts):
            mask = pools == q
            if mask.any():
                caps = np.where(mask, _rank_capacity(rr, ts - fixed, d, x, n_dec), caps)
        if caps.ndim == 1:
            return _least(caps, least)
        return np.where(np.all(caps >= least, axis=1, keepdims=True), caps, 0.0)

    return at


def assignment_bounds(tab: CandidateTables, assignment: Sequence[int], pool_gpus: Sequence[int],
                      base_lower: int, cutoff: int | None = None) -> tuple[int, int] | None:
    """(objective bound, slowest-rank bound) of a candidate whose ranks' pools are fixed; None when
    no layout fits. Never weaker than `base_lower`, the candidate's bound over every assignment.
    With `cutoff`, a cheaper bound already above it comes back without the joint tail bound."""
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
    sends = assignment_sends(tab, assignment)
    pipeline = hetero_pipeline_bound(tab, pool_gpus, tmax, a, c, assignment=assignment, sends=sends)
    lower = max(base_lower, pipeline + tab.scale * tail_lower_bound(tab))
    if cutoff is not None and lower > cutoff:
        return lower, tmax
    # the tail of the ranks each on its own pool, jointly with t_max and the sum of rank times
    joint = joint_tail_bound(tab, tmax, a, tab.scale, time_caps=at, assignment=assignment,
                             sums=pipeline_sums(tab, pool_gpus, assignment=assignment, sends=sends), c=c)
    return max(lower, joint), tmax


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
    smallest_sum = pipeline_sums(tab, pool_gpus, assignment=assignment, sends=sends)
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


def pipeline_sums(tab: CandidateTables, pool_gpus: Sequence[int], assignment: Sequence[int] | None = None,
                  sends: np.ndarray | None = None):
    """The smallest sum of the ranks' times at slowest-rank time t, as a function of t (None where
    the ranks cannot hold every decoder layer); see `hetero_pipeline_bound`."""
    pp = tab.config.dims.pp
    n_dec = int(tab.decoders[-1])
    n = tab.num_layers
    limits = np.minimum(pool_rank_limits(tab, pool_gpus), pp)
    own = None if assignment is None else np.asarray(assignment)
    p2p = min([p.p2p_us for p in tab.pools] + list(tab.cross_p2p_us.values()))
    exact = 0.0 if sends is None else sends - np.asarray(_rank_sends(tab), dtype=np.float64) * p2p
    floor = pool_send_floor(tab) if sends is None else np.zeros((len(tab.pools), pp))
    parts = []
    for q in range(len(tab.pools)):
        d, x, fixed, _ = rank_work(tab, q)
        parts.append((d, rank_room(tab, q), x, fixed + exact + floor[q], int(limits[q]),
                      None if own is None else own == q))
    parts.sort(key=lambda item: item[0])
    p2p = min([p.p2p_us for p in tab.pools] + list(tab.cross_p2p_us.values()))
    ends = (min(int(p.time_us[1] - p.time_us[0]) for p in tab.pools)
            + min(int(p.time_us[n] - p.time_us[n - 1]) for p in tab.pools)
            + (2 * (tab.num_chunks - 1) * p2p if sends is None else int(sends.sum())))
    if sends is None:  # every assignment's sends, each at its own link's price, at the least
        least_sends = min_total_sends(tab, limits)
        if least_sends is not None:
            ends += max(0, int(least_sends) - 2 * (tab.num_chunks - 1) * p2p)

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

    return smallest_sum
