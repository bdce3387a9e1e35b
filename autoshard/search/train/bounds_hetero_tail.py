"""The joint bound on slowest-rank time and slowest-rank tail of a heterogeneous candidate, over every
rank -> pool assignment at once.

`bounds` prices the tail (exposed data-parallel traffic plus optimizer step) by its average over
the ranks, and `hetero_pipeline_bound` the sends by the least total of any assignment: each term at
its own best assignment. Here one assignment has to serve both the slowest-rank time T and the tail
U: a rank on pool q at position r holds at most min(its capacity at T with its sends priced at
their own links, (U - g) / s for each linear form of its tail on q) decoder layers
(`bounds_joint.tail_forms`, every decoder layer at its cheapest slope), and the dynamic programme of
`bounds_sends.SendsCapacity` finds the largest total of those over every assignment within the
pools' rank limits exactly; (T, U) is feasible only when that total reaches the decoder layers. The
smallest U per T comes from a bisection; T runs over a grid from the t_max bound to where a longer
T cannot pay for itself, each segment priced at its left T and its right U and right sum of rank
times (`pipeline_sums`, itself the least over every assignment): valid between grid points, because
the smallest U and sum only shrink as T grows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoshard.search.train.bounds_hetero_sums import joint_sums
from autoshard.search.train.bounds_joint import grid_bound, tail_forms
from autoshard.search.train.bounds_pools import _exact_threshold, _HeteroCapacity, pipeline_sums
from autoshard.search.train.bounds_rank import tail_lower_bound
from autoshard.search.train.tables import CandidateTables

__all__ = ["hetero_joint_tail_bound", "uniform_joint_tail_bound"]


def uniform_joint_tail_bound(tab: CandidateTables, pool_gpus: Sequence[int], tmax: int, a: int, b: int,
                             c: int) -> int:
    """`hetero_joint_tail_bound` when every chunk recomputes one count k of decoder layers (Megatron's
    --recompute-num-layers, what the CP-SAT model allows by default): the smallest over k of the bound
    at that count, whose capacities and sum of rank times both carry the k recomputed layers of every
    chunk at the rank's own pool's price. The per-rank (continuous) recompute of the plain bound lets
    the ranks with room skip the recompute the tight ranks force on every chunk: Qwen3-235B TP4 PP12
    on mixed-3pool, where every rank recomputes two layers in the best layout (81,656 us of its sum
    of rank times), 45,582,462,240 -> 45,678,724,560, the optimum. Counts are tried in order of their
    slowest-rank threshold and stop once that alone (with the tail floor) reaches the best so far."""
    allow_rc = tab.block_recompute
    ks = range(int(tab.decoders[-1]) // tab.num_chunks + 1) if allow_rc else range(1)
    thresholds = sorted((t, k) for k in ks if (t := _exact_threshold(tab, pool_gpus, k, None, None)) is not None)
    floor = b * tail_lower_bound(tab)
    best = None
    for t, k in thresholds:
        start = max(tmax, t)
        if best is not None and a * start + floor >= best:
            break  # thresholds only grow from here
        found = hetero_joint_tail_bound(tab, pool_gpus, start, a, b, c, uniform_k=k)
        if found == 0:
            return 0  # the joint bound does not apply
        best = found if best is None else min(best, found)
    return 0 if best is None else best

def hetero_joint_tail_bound(tab: CandidateTables, pool_gpus: Sequence[int], tmax: int, a: int, b: int,
                            c: int, uniform_k: int | None = None) -> int:
    """Lower bound on a*t_max + b*tail + c*sum_r T_r over every layout and rank -> pool assignment,
    t_max >= `tmax`; 0 when it does not apply (one pool, one rank, or a DP state too large). With
    `uniform_k`, over the layouts whose every chunk recomputes exactly that many decoder layers
    (capacities at that count, and its recompute time in the sum of rank times)."""
    pp, k, n_dec = tab.config.dims.pp, len(tab.pools), int(tab.decoders[-1])
    if k < 2:
        return 0
    sends = _HeteroCapacity(tab, pool_gpus, uniform_k=uniform_k, exact_sends=True).sends
    if sends is None:
        return 0
    is_major = np.ones(n_dec, dtype=bool)
    forms = [[(g, s) for g, s, _ in tail_forms(tab, [q] * pp, is_major)] for q in range(k)]
    top = float(max(g.max() + max(s.max(), 0.0) * n_dec for pool in forms for g, s in pool)) + 1

    def limit(u: float) -> np.ndarray:
        out = np.full((k, pp), np.inf)
        for q, pool in enumerate(forms):
            for g, s in pool:
                positive = s > 0
                # a non-positive slope puts no cap on the count (only an upper bound is needed)
                by_tail = np.where(positive, np.floor((u - g) / np.where(positive, s, 1.0) + 1e-9), np.inf)
                out[q] = np.minimum(out[q], by_tail)
        return out

    def feasible(t: float, u: float) -> bool:
        total = sends.at(t, limit(u))
        return total is not None and total >= n_dec

    def min_tail(t: float) -> int | None:
        """Smallest integer tail U at slowest-rank time t (None: infeasible at any U)."""
        if not feasible(t, top):
            return None
        lo, hi = 0, int(top)
        while lo < hi:
            mid = (lo + hi) // 2
            if feasible(t, mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    plain, joint = pipeline_sums(tab, pool_gpus), joint_sums(sends)

    def sums(t: float) -> int | None:
        """The larger of the two lower bounds on the sum of rank times (None: infeasible at t)."""
        first = plain(t)
        second = None if first is None else joint(t)
        return None if second is None else max(first, second)

    return grid_bound(tmax, a, b, c, lambda ts: [min_tail(t) for t in ts], sums)
