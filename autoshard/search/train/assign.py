"""Heterogeneous clusters: split a training candidate into one candidate per rank -> pool assignment
the pools can host, each with its own (much tighter) bound and incumbent, so that CP-SAT then only
places layers."""

from __future__ import annotations

import itertools
from collections import Counter

from autoshard.search.deadline import Deadline
from autoshard.search.train.bounds_pools import assignment_bounds, pool_rank_limits
from autoshard.search.train.incumbents import assignment_incumbent
from autoshard.search.train.options import SolverOptions

__all__ = ["split_by_assignment"]


def _kth(values: list[int], k: int) -> int | None:
    k = max(1, k)
    return values[k - 1] if len(values) >= k else None


_MAX_ASSIGNMENTS = 512
"""Largest number of rank -> pool assignments a heterogeneous candidate is split into; past it the
candidate keeps its pool variables (CP-SAT chooses the pools)."""


def split_by_assignment(kept: list, pool_gpus: list[int], best_ub: int | None, incumbents: list[int],
                        options: SolverOptions, pruned: Counter[str], deadline: Deadline) -> tuple[list, int | None]:
    """On a heterogeneous cluster, one candidate per rank -> pool assignment that the pools can host:
    each gets its own (much tighter) bound and incumbent, and CP-SAT then only places layers. The
    assignments pruned by their bound carry a certificate like any candidate; a candidate with too
    many assignments (or when time runs short) stays whole, with CP-SAT choosing its pools. Counts
    what it prunes in `pruned`."""
    out = []
    for lb, tmax_lb, inc, tab in sorted(kept, key=lambda item: item[0]):
        pp = tab.config.dims.pp
        k = len(tab.pools)
        limits = [min(pp, g) for g in pool_rank_limits(tab, pool_gpus)]
        if k ** pp > 8 * _MAX_ASSIGNMENTS or deadline.expired() or (best_ub is not None and lb > best_ub):
            out.append((lb, tmax_lb, inc, tab))
            continue
        vectors = [v for v in itertools.product(range(k), repeat=pp)
                   if all(v.count(q) <= limits[q] for q in range(k))]
        if len(vectors) > _MAX_ASSIGNMENTS:
            out.append((lb, tmax_lb, inc, tab))
            continue
        original = tuple(inc[1].pools[:pp]) if inc is not None else None
        split = []
        for v in vectors:
            if deadline.expired():
                break
            found = assignment_bounds(tab, v, pool_gpus, lb, cutoff=best_ub)
            if found is None:
                pruned["pool assignment: does not fit in memory"] += 1
                continue
            lb_v, tmax_v = found
            if best_ub is not None and lb_v > best_ub:
                pruned["pool assignment: bound cannot beat the best plan found"] += 1
                continue
            inc_v = assignment_incumbent(tab, v, tmax_v)
            if v == original and (inc_v is None or inc[0] < inc_v[0]):
                inc_v = inc  # the candidate's incumbent stays: the bounds already pruned against it
            if inc_v is not None:
                incumbents = sorted([*incumbents, inc_v[0]])[: max(1, options.top_k)]
                best_ub = _kth(incumbents, options.top_k)
            split.append((lb_v, tmax_v, inc_v, tab, v))
        if deadline.expired():  # not every assignment bounded: the candidate stays whole
            out.append((lb, tmax_lb, inc, tab))
            out.extend(item for item in split if item[2] is not None and (best_ub is None or item[2][0] <= best_ub))
            continue
        out.extend(item for item in split if best_ub is None or item[0] <= best_ub)
        pruned["pool assignment: bound cannot beat the best plan found"] += sum(
            1 for item in split if best_ub is not None and item[0] > best_ub)
    return out, best_ub
