"""The count-aware bound for models whose decoder layers differ (dense-first MoE, hybrids): each
class of layer at its own cheapest cost, the minority layers shared out exactly over the ranks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.search.train.bounds_order import Segments, minor_limits, ordered_fit, segments
from autoshard.search.train.bounds_rank import rank_room, rank_work
from autoshard.search.train.tables import CandidateTables

__all__ = ["LayerClasses", "layer_classes", "major_mask", "MixedCapacity", "absorbed_majority", "holds_every_layer",
           "mixed_tmax_lower_bound"]


_MAX_MINOR = 64
"""Largest count of minority decoder layers the count-aware bound handles (its DP is quadratic in it)."""


def absorbed_majority(caps: np.ndarray) -> np.ndarray:
    """(G, pp, D+1) caps -> most majority layers the ranks absorb while holding exactly the D minority
    layers between them (max-plus DP over ranks; -inf marks a count a rank cannot take)."""
    g, pp, width = caps.shape
    best = caps[:, 0, :]
    k = np.arange(width)
    before = k[:, None] - k[None, :]  # [k, j]: the count the ranks before hold when this one takes j
    taken = before >= 0
    for r in range(1, pp):
        # nxt[k] = max over j of best[k - j] + caps[r, j], all (k, j) at once
        prior = np.where(taken, best[:, np.maximum(before, 0)], -np.inf)
        best = (prior + caps[:, r, None, :]).max(axis=2)
    return best[:, -1]


def holds_every_layer(caps: np.ndarray, n_major: int, order: Segments | None, fewest: np.ndarray) -> np.ndarray:
    """(G, pp, D+1) caps -> (G,) whether the ranks hold every decoder layer: the order-free max-plus
    DP, and where it passes and `order` is given (no interleaving), the order-aware test of
    `bounds_order` too (both are relaxations of every layout, so both must pass)."""
    ok = absorbed_majority(caps) >= n_major
    if order is not None and ok.any():
        ok[ok] = ordered_fit(caps[ok], order, fewest)
    return ok


@dataclass(frozen=True, slots=True)
class LayerClasses:
    """Decoder layers split into the most numerous kind (major) and all others (minor), with the
    cheapest (time us, state MiB, activation MiB) of each class, read from the tables' per-layer
    differences (so they are exactly what the solver counts), optimistic over `pools`."""

    major: tuple[int, int, int]
    minor: tuple[int, int, int]
    n_major: int
    n_minor: int


def _decoder_units(tab: CandidateTables, pools) -> list[np.ndarray]:
    is_dec = np.diff(tab.decoders) > 0
    return [np.stack([np.diff(p.time_us), np.diff(p.state_mib), np.diff(p.act_mib)], axis=1)[is_dec] for p in pools]


def major_mask(tab: CandidateTables, pool: int | None = None) -> np.ndarray:
    """Per decoder layer: whether it is of the most numerous kind. A layer's kind is its (time,
    state, activation) signature on `pool` (None: the first pool; identical layers give identical
    integers)."""
    sig = [tuple(row) for row in _decoder_units(tab, (tab.pools[pool or 0],))[0]]
    counts: dict[tuple, int] = {}
    for key in sig:
        counts[key] = counts.get(key, 0) + 1
    major_key = max(counts, key=lambda k: (counts[k], k))
    return np.array([key == major_key for key in sig])


def layer_classes(tab: CandidateTables, pool: int | None = None) -> LayerClasses:
    pools = tab.pools if pool is None else (tab.pools[pool],)
    units = _decoder_units(tab, pools)
    is_major = major_mask(tab, pool)
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
    ranks of cap_r(T, j); T is feasible when that reaches the majority count (and, without
    interleaving, when the ranks can take the layers in their order: `bounds_order`). Valid for any layout:
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
        # without interleaving each rank holds one run of the layer sequence: the minority layers'
        # positions decide which ranks can hold them (`bounds_order`)
        is_major = major_mask(tab, pool)
        self.order = segments(is_major) if vpp == 1 else None
        # chunks of at least one layer each: a minority layer only reaches the ranks of the chunks
        # its position allows (`bounds_order.minor_limits`)
        self.minor_limit = minor_limits(tab.decoders, is_major, tab.config.dims.pp, vpp).astype(np.float64)

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
        ok = (cap >= 0) & (budget >= 0) & (room >= 0) & (cap + js >= need) & (js <= self.minor_limit[None, :, None])
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
        ok = (cap >= 0) & (budget >= 0) & (cap + js >= self.least[None, :, None]) & (js <= self.minor_limit[None, :, None])
        return np.where(ok, np.minimum(cap, self.cls.n_major), -np.inf)

    def fits(self, ts: np.ndarray) -> np.ndarray:
        """Whether the ranks can hold every decoder layer at each time in ts (with `uniform` set:
        every chunk recomputing exactly `uniform` layers): the minority layers shared out exactly, and
        without interleaving each rank's layers one run of the sequence, in rank order."""
        ts = np.asarray(ts, dtype=np.float64)
        caps = self._caps(ts) if self.uniform is None else self._caps_uniform(ts, self.uniform)
        fewest = self.least if self.uniform is None else np.maximum(self.least, self.vpp * self.uniform)
        return holds_every_layer(caps, self.cls.n_major, self.order, fewest)

    def threshold(self, lo: int, probe: int | None = None) -> int | None:
        """Smallest integer T >= lo at which the ranks can absorb every decoder layer (None: never).
        With `probe`, a T the caller only cares to beat: when even it is infeasible, probe + 1 (a
        valid lower bound) comes back after one evaluation."""
        span = (max(self.d_major, self.d_minor) + max(self.x, 0)) * self.n_dec + 1
        hi = int(self.fixed.max()) + span
        if probe is not None and lo <= probe < hi:
            if not self.fits(np.array([float(probe)]))[0]:
                return probe + 1
            hi = probe
        elif not self.fits(np.array([float(hi)]))[0]:
            return None
        lo = min(int(lo), hi)
        while hi - lo > 0:
            grid = np.unique(np.linspace(lo, hi, 33).astype(np.int64))
            good = self.fits(grid.astype(np.float64))
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
