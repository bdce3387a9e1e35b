"""The count-aware joint bound on the slowest rank's time and the slowest rank's tail.

The objective weighs a*t_max + c*sum_r T_r + b*tail, where a rank's tail is its exposed data-parallel
traffic plus its optimizer step: max(dp_min, dp_full + latency - window, 0) + opt, every term a sum
over the rank's layers. Bounding the tail by the average over ranks (`tail_lower_bound`) is loose
when the layers differ: DeepSeek-V3's MoE layers carry ~40x the optimizer work of its dense ones, so
the ranks holding only MoE layers set the tail, not the average. Here each rank's layer counts are
capped at once by time (slowest-rank time T), memory, and tail (U): with j minority layers and n
majority layers, n <= (U - g_r - j * s_minor) / s_major for each of the two linear forms of the tail
(dp_min + opt, and dp_full - window + opt plus the latency), each class at its cheapest slope. The
minority layers are shared out exactly (the max-plus DP of `MixedCapacity`; without interleaving
also in the layers' order, `bounds_order`), so (T, U) is feasible only when the ranks absorb every
majority layer. For each T the smallest feasible U comes from a
bisection; T runs over a grid from the t_max bound to where a longer T cannot pay for itself, each
segment priced at its left T and its right U (and right sum): valid between grid points, because
the smallest U (and sum) only shrink as T grows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from autoshard.search.train.bounds_mixed import _MAX_MINOR, MixedCapacity, holds_every_layer, layer_classes, major_mask
from autoshard.search.train.bounds_rank import rank_work
from autoshard.search.train.tables import CandidateTables

__all__ = ["TailForms", "tail_forms", "joint_tail_bound"]

TailForms = list[tuple[np.ndarray, np.ndarray, np.ndarray]]
"""Per linear form of the tail: (fixed part g_r, cheapest majority slope, cheapest minority slope),
each an array over the pipeline ranks."""


def tail_forms(tab: CandidateTables, assignment: Sequence[int], is_major: np.ndarray) -> TailForms:
    """The two linear lower bounds on each rank's tail, on the rank's own pool: dp_min + opt, and
    dp_full - window + opt plus the DP latency; the embedding's share on rank 0, the output's on
    the last rank; decoder layers at their class's cheapest slope."""
    pp = tab.config.dims.pp
    n = tab.num_layers
    is_dec = np.diff(tab.decoders) > 0
    forms = []
    for full in (False, True):
        g, s_major, s_minor = np.zeros(pp), np.zeros(pp), np.zeros(pp)
        for r in range(pp):
            p = tab.pools[assignment[r]]
            if full:
                per_layer = np.diff(p.dp_full_us) - np.diff(p.window_us) + np.diff(p.opt_us)
            else:
                per_layer = np.diff(p.dp_min_us) + np.diff(p.opt_us)
            dec = per_layer[is_dec]
            s_major[r] = dec[is_major].min()
            s_minor[r] = dec[~is_major].min() if (~is_major).any() else s_major[r]
            g[r] = ((tab.dp_latency_us if full else tab.dp_min_latency_us) + (per_layer[0] if r == 0 else 0)
                    + (per_layer[n - 1] if r == pp - 1 else 0))
        forms.append((g, s_major, s_minor))
    return forms


def joint_tail_bound(tab: CandidateTables, tmax: int, a: int, b: int, *,
                     time_caps: Callable[[np.ndarray], np.ndarray] | None = None, assignment: Sequence[int] | None = None,
                     sums: Callable[[float], int | None] | None = None, c: int = 0) -> int:
    """Lower bound on a*t_max + b*tail (+ c*sum_r T_r with `sums`) over every layout, t_max >= `tmax`.

    One pool (no arguments): the decoder classes of `layer_classes` with their exact counts and the
    capacities of `MixedCapacity` (memory, time, continuous recompute). A fixed rank -> pool
    `assignment`, with `time_caps(ts)` (per-rank decoder capacities (G, pp) at each slowest-rank time
    of ts, a row of zeros where some rank cannot hold its fewest layers) and `sums(t)` (the smallest sum of rank times at
    slowest-rank time t, None when infeasible): every decoder layer in one class at its cheapest slope.
    0 when the bound does not apply (too many minority layers, or no layout fits)."""
    pp = tab.config.dims.pp
    if assignment is None:
        cls = layer_classes(tab)
        if cls.n_minor > _MAX_MINOR:
            return 0
        mixed = MixedCapacity(tab)
        n_major, width, least = cls.n_major, cls.n_minor + 1, mixed.least
        is_major = major_mask(tab)
        caps_of = mixed._caps  # noqa: SLF001 - the same capacities, shared with the t_max bound
        order = mixed.order  # without interleaving: each rank one run of the layer sequence
        assignment = [0] * pp
    else:
        assert time_caps is not None
        n_major, width, least = int(tab.decoders[-1]), 1, rank_work(tab, 0)[3]
        is_major = np.ones(n_major, dtype=bool)
        order = None

        def caps_of(ts: np.ndarray) -> np.ndarray:
            return time_caps(ts)[:, :, None]

    forms = tail_forms(tab, assignment, is_major)
    js = np.arange(width, dtype=np.float64)[None, None, :]

    def feasible(ts: np.ndarray, us: np.ndarray) -> np.ndarray:
        caps = caps_of(ts)
        for g, s_major, s_minor in forms:
            left = us[:, None, None] - g[None, :, None] - js * s_minor[None, :, None]
            positive = s_major[None, :, None] > 0
            # a non-positive slope puts no cap on the majority count (only an upper bound is needed)
            by_tail = np.where(positive, np.floor(left / np.where(positive, s_major[None, :, None], 1) + 1e-9), np.inf)
            caps = np.minimum(caps, by_tail)
        ok = (caps >= 0) & (caps + js >= least[None, :, None])
        return holds_every_layer(np.where(ok, np.minimum(caps, n_major), -np.inf), n_major, order, least)

    top = float(max(g.max() + max(s_major.max(), 0) * n_major + max(s_minor.max(), 0) * (width - 1)
                    for g, s_major, s_minor in forms)) + 1

    def min_tail(ts: list[float]) -> list[int | None]:
        """Smallest integer tail U at each slowest-rank time (None: infeasible at any U)."""
        t = np.asarray(ts, dtype=np.float64)
        lo, hi = np.zeros(len(t)), np.full(len(t), top)
        usable = feasible(t, hi)
        while np.any(lo < hi):
            mid = np.floor((lo + hi) / 2)
            good = feasible(t, mid)
            hi = np.where(good & (lo < hi), mid, hi)
            lo = np.where(~good & (lo < hi), mid + 1, lo)
        return [int(lo[i]) if usable[i] else None for i in range(len(t))]

    def extra(t: float) -> int | None:
        return 0 if sums is None else sums(t)

    return grid_bound(tmax, a, b, c, min_tail, extra)


JOINT_GRID_POINTS = 12
"""Segments of the slowest-rank time grid of the joint bounds."""


def grid_bound(tmax: int, a: int, b: int, c: int, min_tail: Callable[[list[float]], list[int | None]],
               sums: Callable[[float], int | None]) -> int:
    """min over t_max >= `tmax` of a*t_max + b*U(t_max) + c*S(t_max), U the smallest tail and S the
    smallest rank-time sum at a slowest-rank time (both non-increasing, None: infeasible there), on a
    grid whose right ends bound each segment from below. `min_tail` takes a list of times."""
    first, floor = min_tail([float(tmax), math.inf])
    sum_first, sum_floor = sums(float(tmax)), sums(math.inf)
    if floor is None or sum_floor is None:
        return 0
    if a <= 0:
        return b * floor + c * sum_floor
    if first is None or sum_first is None:  # only feasible further out: each term at its floor
        return a * tmax + b * floor + c * sum_floor
    # past tmax + (b * (U(tmax) - U_floor) + c * (S(tmax) - S_floor)) / a a longer T cannot pay for itself
    span = max(1, math.ceil((b * (first - floor) + c * (sum_first - sum_floor)) / a))
    points = JOINT_GRID_POINTS
    grid = [tmax + math.ceil(span * i / points) for i in range(points + 1)]
    tails = [first, *min_tail([float(t) for t in grid[1:]])]
    best = a * grid[-1] + b * floor + c * sum_floor
    for i in range(points):
        right, right_sum = tails[i + 1], sums(float(grid[i + 1]))
        if right is not None and right_sum is not None:
            best = min(best, a * grid[i] + b * right + c * right_sum)
    return best
