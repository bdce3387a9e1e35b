"""The order-aware test behind the count-aware bounds without interleaving (VPP 1).

With one chunk per rank, rank r holds one contiguous run of the decoder layers, so which minority
layers it can hold is fixed by their positions: DeepSeek-V3's 3 dense layers come first and sit on
rank 0 (or on the first few ranks when rank 0 holds fewer than 3 decoder layers); they cannot be
spread one per rank as cheap fillers, which the order-free max-plus DP (`absorbed_majority`) allows.

Given per-rank capacities cap_r(j) (the most majority layers rank r can hold next to j minority
layers, -inf where it cannot hold j) and each rank's fewest decoder layers, `ordered_fit` says
whether the ranks can split the layer sequence into consecutive runs, rank 0 first, each run within
its rank's capacity. Capacities are first raised to their running maximum from the right
(cap'_r(j) = max over j' >= j of cap_r(j')), which only relaxes them and makes them non-increasing
in j; then a run that fits still fits when shortened, so the ends a rank can reach from start s
form one interval [s + fewest, E_r(s)] with E_r non-decreasing in s, and one pass per rank settles
which boundaries are reachable. Exact for non-increasing capacities, a relaxation otherwise: the
bounds built on it stay valid (tests/search/test_order_bound.py checks it against every split).

With interleaving, `minor_limits` keeps a weaker part of the order: every chunk holds at least one
layer, so chunk k holds only layers k .. n - S + k (n layers, S chunks), and a minority layer at
position i can only sit on the ranks of chunks i - (n - S) .. i: DeepSeek-V3's dense layers 1-3 on
ranks 0-3 at most, never on the last rank of a deep pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Segments", "segments", "ordered_fit", "minor_limits"]


@dataclass(frozen=True, slots=True)
class Segments:
    """For each start s (0..N) and minority count j (0..D): the run ends e with exactly j minority
    layers in [s, e) form [lo, hi] (lo = inf where the sequence has fewer than j minority layers
    left after s); `base` is s + j."""

    lo: np.ndarray
    hi: np.ndarray
    base: np.ndarray

    @property
    def num_layers(self) -> int:
        return self.lo.shape[0] - 1


def segments(is_major: np.ndarray) -> Segments:
    """Run-end intervals of a decoder sequence (True: a majority layer, False: a minority layer)."""
    is_minor = ~np.asarray(is_major, dtype=bool)
    n = len(is_minor)
    positions = np.flatnonzero(is_minor)
    d = len(positions)
    before = np.concatenate([[0], np.cumsum(is_minor)])  # minority layers in [0, s)
    s = np.arange(n + 1)[:, None]
    j = np.arange(d + 1)[None, :]
    k = before[s] + j  # index of the run's (j+1)-th minority layer counted from the sequence start
    ext = np.concatenate([positions, [n]])  # past the last minority layer: the sequence end
    lo = np.where(j == 0, s, ext[np.clip(k - 1, 0, d)] + 1).astype(np.float64)
    hi = ext[np.clip(k, 0, d)].astype(np.float64)
    return Segments(lo=np.where(k <= d, lo, np.inf), hi=hi, base=(s + j).astype(np.float64))


def ordered_fit(caps: np.ndarray, seg: Segments, fewest: np.ndarray) -> np.ndarray:
    """(G, pp, D+1) capacities -> (G,) whether the ranks, in order, can hold every decoder layer in
    consecutive runs, rank r at least fewest[r] layers and at most cap_r(j) majority layers next to
    its j minority layers."""
    g_count, pp, _ = caps.shape
    n = seg.num_layers
    idx = np.arange(n + 1)
    reach = np.zeros((g_count, n + 1), dtype=bool)
    reach[:, 0] = True
    # running maximum from the right: non-increasing in j, never below the capacity itself
    raised = np.maximum.accumulate(caps[:, :, ::-1], axis=2)[:, :, ::-1]
    furthest = np.full((g_count, pp, n + 1), -1.0)  # E_r(s); -1: not even an empty run
    for j in range(caps.shape[2]):
        ends = np.minimum(seg.hi[:, j], seg.base[:, j] + raised[:, :, j, None])  # (G, pp, N+1)
        np.maximum(furthest, np.where(ends >= seg.lo[:, j], ends, -1.0), out=furthest)
    for r in range(pp):
        # the furthest-reaching reachable start at most e - fewest decides whether e is reachable
        last = np.maximum.accumulate(np.where(reach, idx, -1), axis=1)
        f = int(fewest[r])
        start = np.full((g_count, n + 1), -1)
        start[:, f:] = last[:, : n + 1 - f]
        reach = (start >= 0) & (np.take_along_axis(furthest[:, r], np.maximum(start, 0), axis=1) >= idx)
        if not reach.any():
            break
    return reach[:, n]


def minor_limits(decoders: np.ndarray, is_major: np.ndarray, pp: int, vpp: int) -> np.ndarray:
    """Most minority decoder layers each pipeline rank can hold in any layout with pp x vpp chunks of
    at least one layer each: a layer at position i (embedding at 0) lies in a chunk k with
    i - (n - S) <= k <= i, on rank k mod pp. `decoders` is the prefix count of decoder layers."""
    n = len(decoders) - 1
    chunks = pp * vpp
    layer_of = np.flatnonzero(np.diff(decoders) > 0)  # position of each decoder layer
    limits = np.zeros(pp, dtype=np.int64)
    for i in layer_of[~np.asarray(is_major, dtype=bool)]:
        first, last = max(0, int(i) - (n - chunks)), min(int(i), chunks - 1)
        ranks = {k % pp for k in range(first, last + 1)} if last - first + 1 < pp else range(pp)
        for r in ranks:
            limits[r] += 1
    return limits
