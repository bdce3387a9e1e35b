"""The slowest-rank bound of a heterogeneous candidate with every point-to-point send priced exactly.

`bounds_pools` lets every rank send over the cheapest link of the cluster, whatever its
neighbours' pools: loose when a send across pools (or within a slow pool) costs ~15x one within an
NVLink pool (GPT-3 TP4 PP24 on mixed-3pool: 580 vs 40 us per boundary). A rank's sends depend only
on its own pool and its two neighbours' (rank r - 1 and r + 1, cyclically with interleaving, as
`bounds_pools.assignment_sends` prices them), so a dynamic programme over the ranks in order, with
the pools of ranks 0 and 1, of the last two ranks and the ranks used per pool as state, finds the
largest total capacity over every rank -> pool assignment within the pools' rank limits exactly."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoshard.search.train.bounds_rank import RankRoom, _rank_capacity, _rank_sends, _uniform_capacity
from autoshard.search.train.tables import CandidateTables

__all__ = ["link_matrix", "send_multiplicity", "pool_send_floor", "SendsCapacity", "min_total_sends"]

MAX_STATES = 250_000
"""Largest DP state (pools^4 x ranks-per-pool counts) for which the exact-sends bound runs."""


def link_matrix(tab: CandidateTables) -> np.ndarray:
    """us per boundary from a chunk on pool a to the next chunk on pool b (`int_objective`'s price)."""
    k = len(tab.pools)
    out = np.zeros((k, k))
    for a in range(k):
        for b in range(k):
            out[a, b] = tab.pools[a].p2p_us if a == b else tab.cross_p2p_us[(a, b)]
    return out


def send_multiplicity(pp: int, vpp: int) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries each rank shares with the rank before it (r - 1, rank 0 with the last rank) and
    with the rank after it (r + 1, the last rank with rank 0): vpp each, one fewer at the ends."""
    left = np.full(pp, vpp, dtype=np.float64)
    right = np.full(pp, vpp, dtype=np.float64)
    left[0] -= 1
    right[pp - 1] -= 1
    return left, right


def pool_send_floor(tab: CandidateTables) -> np.ndarray:
    """(pools, pp): the least a rank on each pool pays for its sends per micro-batch beyond what the
    cheapest link of the cluster (`bounds_rank.rank_work`'s price) charges. Every send of a rank on
    pool q crosses a link that touches q: from the rank before on some pool a (L[a, q]) or to the rank
    after on some pool c (L[q, c]), so the cheapest such links price it from below."""
    pp, vpp = tab.config.dims.pp, tab.config.dims.vpp
    if pp == 1:  # one rank: no sends (and no cross-pool prices in the tables)
        return np.zeros((len(tab.pools), pp))
    links = link_matrix(tab)
    relaxed = np.asarray(_rank_sends(tab), dtype=np.float64) * float(links.min())
    ml, mr = send_multiplicity(pp, vpp)
    return np.stack([ml * links[:, q].min() + mr * links[q, :].min() - relaxed for q in range(len(tab.pools))])


class SendsCapacity:
    """Largest total decoder capacity at slowest-rank time t over every rank -> pool assignment,
    sends exact. `parts` per pool: (room, layer us, recompute extra us, fixed us per rank with the
    sends at the cheapest-link price plus `pool_send_floor`); `least` the fewest layers per rank; `barred` the capacity that rules a rank
    out of a pool; `uniform_k` as `bounds_pools._HeteroCapacity`."""

    def __init__(self, tab: CandidateTables, parts: Sequence[tuple[RankRoom, int, int, np.ndarray]],
                 least: np.ndarray, barred: float, limits: Sequence[int], uniform_k: int | None = None) -> None:
        self.tab, self.least, self.barred, self.uniform_k = tab, least, barred, uniform_k
        self.n_dec = int(tab.decoders[-1])
        pp, vpp = tab.config.dims.pp, tab.config.dims.vpp
        k = len(tab.pools)
        self.pp, self.k = pp, k
        self.lim = [min(pp, int(x)) for x in limits]
        links = link_matrix(tab)
        p2p = float(links.min())
        relaxed = np.asarray(_rank_sends(tab), dtype=np.float64) * p2p
        floor = pool_send_floor(tab)
        ml, mr = send_multiplicity(pp, vpp)
        # fixed[b][a, c, r]: rank r's fixed work on pool b, left neighbour on a, right on c
        self.fixed = []
        for b, (_, _, _, fixed) in enumerate(parts):
            sends = ml[None, None, :] * links[:, b][:, None, None] + mr[None, None, :] * links[b, :][None, :, None]
            self.fixed.append((fixed - relaxed - floor[b])[None, None, :] + sends)
        self.parts = parts
        # the most any rank's sends exceed the cheapest-link price: how much later its threshold can be
        self.extra_us = int(np.ceil(float((ml + mr).max()) * float(links.max() - p2p))) + 1

    @staticmethod
    def fits(k: int, pp: int, limits: Sequence[int]) -> bool:
        """Whether the DP's state is small enough (and the pipeline long enough) to run it."""
        if pp < 2 or k < 2:
            return False
        size = k ** 4
        for x in list(limits)[:-1]:
            size *= min(pp, int(x)) + 1
        return size <= MAX_STATES

    def caps(self, t: float, limit: np.ndarray | None = None) -> np.ndarray:
        """(pp, left pool, own pool, right pool) capacities, barred where below the minimum; with
        `limit` (pools, pp), each rank's capacity on each pool is at most that (a tail's cap)."""
        out = np.empty((self.pp, self.k, self.k, self.k))
        for b, (rr, d, x, _) in enumerate(self.parts):
            fixed = self.fixed[b]
            if self.uniform_k is None:
                cap = _rank_capacity(rr, t - fixed, d, x, self.n_dec)
            else:
                cap = _uniform_capacity(self.tab, rr, fixed, d, x, t, self.uniform_k)
            if limit is not None:
                cap = np.minimum(cap, limit[b][None, None, :])
            cap = np.where(cap >= self.least, cap, self.barred)
            out[:, :, b, :] = np.moveaxis(cap, 2, 0)
        return out

    def at(self, t: float, limit: np.ndarray | None = None) -> float | None:
        """The largest total capacity at t (None: the pools cannot host the ranks); `limit` as `caps`."""
        return self.best_total(self.caps(t, limit))

    def best_total(self, c: np.ndarray) -> float | None:
        """The largest sum over the ranks of c[r, pool before, own pool, pool after] over every
        assignment within the pools' rank limits (neighbours cyclic, as the sends); None: none."""
        k, pp, lim = self.k, self.pp, self.lim
        counted = lim[:-1]  # ranks on every pool but the last are state; the last one's follow
        shape = (k, k, k, k, *[x + 1 for x in counted])
        grids = np.meshgrid(*[np.arange(x + 1) for x in counted], indexing="ij")
        used = sum(grids) if grids else np.zeros(())
        neg = -np.inf
        v = np.full(shape, neg)
        for p0 in range(k):
            for p1 in range(k):
                n = [0] * len(counted)
                for q in (p0, p1):
                    if q < k - 1:
                        n[q] += 1
                if any(n[q] > counted[q] for q in range(len(counted))) or 2 - sum(n) > lim[-1]:
                    continue
                v[(p0, p1, p0, p1, *n)] = 0.0
        for r in range(1, pp - 1):
            new = np.full(shape, neg)
            for nxt in range(k):
                # rank r's capacity is known once the next rank's pool is: max over the rank before
                add = c[r][:, :, nxt]  # (prev, cur)
                extra = (None,) * len(counted)
                tmp = (v + add[(None, None, slice(None), slice(None), *extra)]).max(axis=2)  # (p0, p1, cur, n...)
                if nxt < k - 1:
                    tmp = _one_more(tmp, 3 + nxt, neg)
                else:
                    tmp = np.where((r + 2 - used) <= lim[-1], tmp, neg)
                new[:, :, :, nxt] = tmp
            v = new
        # the last rank (its right neighbour: rank 0) and rank 0 (left: the last rank, right: rank 1)
        extra = (None,) * len(counted)
        last = np.transpose(c[pp - 1], (2, 0, 1))[(slice(None), None, slice(None), slice(None), *extra)]
        first = np.transpose(c[0], (1, 2, 0))[(slice(None), slice(None), None, slice(None), *extra)]
        total = float((v + last + first).max())
        return None if total == neg else total


def _one_more(values: np.ndarray, axis: int, fill: float) -> np.ndarray:
    """`values` moved one step along a pool's rank-count axis (the next rank goes on that pool): the
    entry for n ranks becomes the one for n + 1; counts of 0 get `fill` (unreachable)."""
    shifted = np.full_like(values, fill)
    src = [slice(None)] * values.ndim
    dst = [slice(None)] * values.ndim
    src[axis], dst[axis] = slice(0, -1), slice(1, None)
    shifted[tuple(dst)] = values[tuple(src)]
    return shifted


def min_total_sends(tab: CandidateTables, limits: Sequence[int]) -> float | None:
    """Smallest sum over the ranks of their sends per micro-batch (every boundary counted on both
    sides, at its own link's price) over every rank -> pool assignment within the pools' rank
    limits; None when the state is too large (or the pools cannot host the ranks)."""
    pp, vpp, k = tab.config.dims.pp, tab.config.dims.vpp, len(tab.pools)
    if not SendsCapacity.fits(k, pp, limits):
        return None
    links = link_matrix(tab)
    lim = [min(pp, int(x)) for x in limits]
    counted = lim[:-1]
    shape = (k, k, *[x + 1 for x in counted])  # (pool of rank 0, pool of the last rank so far, counts)
    grids = np.meshgrid(*[np.arange(x + 1) for x in counted], indexing="ij")
    used = sum(grids)
    v = np.full(shape, np.inf)
    for p0 in range(k):
        n = [0] * len(counted)
        if p0 < k - 1:
            n[p0] += 1
        if (p0 < k - 1 and counted[p0] < 1) or (p0 == k - 1 and lim[-1] < 1):
            continue
        v[(p0, p0, *n)] = 0.0
    extra = (None,) * len(counted)
    for r in range(1, pp):
        new = np.full(shape, np.inf)
        for nxt in range(k):
            tmp = (v + 2 * vpp * links[:, nxt][(None, slice(None), *extra)]).min(axis=1)  # (p0, n...)
            if nxt < k - 1:
                tmp = _one_more(tmp, 1 + nxt, np.inf)
            else:
                tmp = np.where((r + 1 - used) <= lim[-1], tmp, np.inf)
            new[:, nxt] = tmp
        v = new
    # the wrap-around boundaries of interleaving: the last rank to rank 0, vpp - 1 of them
    total = float((v + 2 * (vpp - 1) * links.T[(slice(None), slice(None), *extra)]).min())
    return None if total == np.inf else total
