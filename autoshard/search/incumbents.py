"""Incumbents: good feasible layouts for a candidate, built quickly before CP-SAT runs. The best one
seeds the solver's hint and, with the lower bounds, decides which candidates enter the model."""

from __future__ import annotations

import numpy as np

from autoshard.parallel import Recompute
from autoshard.search.bounds import (
    assignment_capacity,
    hetero_capacity_at,
    joint_search,
    layer_capacity,
    rank_capacity_at,
    rank_work,
    uniform_capacity_at,
    uniform_thresholds,
)
from autoshard.search.tables import CandidateTables, Layout, even_layout, int_objective
from autoshard.specs.cluster import ClusterSpec

__all__ = ["loads_layout", "fit_recompute", "incumbent", "hetero_incumbent", "greedy_pools", "assignment_incumbent",
           "safe_capacity_at", "improve"]


def loads_layout(tab: CandidateTables, caps: np.ndarray, pool_of_rank: list[int] | None) -> Layout | None:
    """A layout giving each rank at most caps[r] decoder layers: start from the caps and shed the
    surplus one layer at a time from the rank with the longest time (its layers plus its fixed work:
    embedding, output, sends; the earlier rank on ties: it holds more micro-batches in flight); each
    rank's layers are split evenly over its chunks, the later chunks taking the remainder."""
    pp, vpp = tab.config.dims.pp, tab.config.dims.vpp
    n_dec = int(tab.decoders[-1])
    load = [int(c) for c in caps]
    work = [rank_work(tab, pool_of_rank[r] if pool_of_rank else None) for r in range(pp)]
    per_layer = [float(w[0]) for w in work]
    fixed = [float(w[2][r]) for r, w in enumerate(work)]
    extra = sum(load) - n_dec
    if extra < 0:
        return None
    least = [vpp] * pp
    least[0] -= 1  # chunk 0 may hold only the embedding
    least[pp - 1] -= 1  # the last chunk may hold only the output layer
    while extra > 0:
        r = max((i for i in range(pp) if load[i] > least[i]),
                key=lambda i: (fixed[i] + load[i] * per_layer[i], -i), default=None)
        if r is None:
            break
        load[r] -= 1
        extra -= 1
    if extra or any(x < lo for x, lo in zip(load, least, strict=True)):
        return None
    sizes = [0] * (pp * vpp)
    for r in range(pp):
        base, rem = divmod(load[r], vpp)
        for c in range(vpp):
            # the remainder goes to the later chunks, except on the last rank, whose final chunk
            # carries the output layer and may be left without decoder layers
            later = c >= vpp - rem if r < pp - 1 else c < rem
            sizes[c * pp + r] = base + (1 if later else 0)
    if any(size == 0 for k, size in enumerate(sizes) if 0 < k < pp * vpp - 1):
        return None
    bounds = [0]
    acc = 1
    for k, size in enumerate(sizes):
        acc += size
        bounds.append(acc if k < len(sizes) - 1 else tab.num_layers)
    pools = tuple((pool_of_rank[k % pp] if pool_of_rank else 0) for k in range(pp * vpp))
    return Layout(bounds=tuple(bounds), recompute=(0,) * (pp * vpp), pools=pools)


def fit_recompute(tab: CandidateTables, lay: Layout | None) -> tuple[int, Layout] | None:
    """`lay` with the fewest uniformly recomputed layers per chunk that make it fit."""
    if lay is None:
        return None
    smallest = min(int(tab.decoders[lay.bounds[k + 1]] - tab.decoders[lay.bounds[k]]) for k in range(tab.num_chunks))
    max_rc = 0 if tab.base_full or tab.config.recompute is Recompute.SELECTIVE else smallest  # one granularity
    for rc in range(max_rc + 1):
        trial = Layout(bounds=lay.bounds, recompute=(rc,) * tab.num_chunks, pools=lay.pools)
        obj, fits = int_objective(tab, trial)
        if fits:
            return obj, trial
    return None


def incumbent(tab: CandidateTables, pool_of_rank: list[int] | None, tmax_lb: int,
               uniform: bool) -> tuple[int, Layout] | None:
    """Best of Megatron's even split and balanced splits built from the per-rank capacities at
    slowest-rank times just above the proven lower bounds (per uniform recompute count k)."""
    found = [fit_recompute(tab, even_layout(tab, pool_of_rank))]
    if tab.config.dims.pp > 1:
        step = max(1, min(p.decoder_unit[0] for p in tab.pools))
        if uniform:
            for t, k in uniform_thresholds(tab)[:3]:
                for i in range(4):
                    found.append(fit_recompute(tab, loads_layout(tab, uniform_capacity_at(tab, t + i * step, k), pool_of_rank)))
        for i in range(4):
            found.append(fit_recompute(tab, loads_layout(tab, rank_capacity_at(tab, tmax_lb + i * step), pool_of_rank)))
        if len(tab.pools) == 1:
            cfg = tab.config
            a = (tab.scale // cfg.dims.vpp) * (cfg.num_microbatches * cfg.dims.vpp - 1)
            for caps in joint_search(tab, tmax_lb, a, tab.scale)[1]:
                found.append(fit_recompute(tab, loads_layout(tab, caps, pool_of_rank)))
        found.append(fit_recompute(tab, loads_layout(tab, layer_capacity(tab), pool_of_rank)))
        if not tab.uniform_decoders and len(tab.pools) == 1:
            # decoder layers that differ: loads every rank can hold whatever layers it gets
            big = max(1, max(int(d) for d in np.diff(tab.pools[0].time_us)[1:-1]))
            for i in range(8):
                found.append(fit_recompute(tab, loads_layout(tab, safe_capacity_at(tab, tmax_lb + i * big), pool_of_rank)))
    found = [f for f in found if f]
    return min(found, key=lambda f: f[0]) if found else None


def safe_capacity_at(tab: CandidateTables, t: float) -> np.ndarray:
    """Decoder layers each rank can hold within slowest-rank time t without recomputation, counting
    the worst mix it could get: as many of the minority layers (e.g. DeepSeek-V3's 3 dense ones) as
    there are, each class at its most expensive layer. Loads within these caps fit (single pool)."""
    p = tab.pools[0]
    pp, vpp, n = tab.config.dims.pp, tab.config.dims.vpp, tab.num_layers
    is_dec = np.diff(tab.decoders) > 0
    units = np.stack([np.diff(p.time_us), np.diff(p.state_mib), np.diff(p.act_mib)], axis=1)[is_dec]
    keys = [tuple(u) for u in units]
    major_key = max(set(keys), key=lambda k: (keys.count(k), k))
    major_mask = np.array([k == major_key for k in keys])
    major = units[major_mask].max(axis=0).astype(np.float64)
    minor = units[~major_mask].max(axis=0).astype(np.float64) if (~major_mask).any() else major
    n_minor = int((~major_mask).sum())
    chunks = np.asarray(tab.in_flight_chunks, dtype=np.float64)
    room = np.full(pp, float(vpp * (p.capacity_mib - tab.zero3_extra_mib)))
    room[0] -= vpp * int(p.state_mib[1] - p.state_mib[0]) + chunks[0] * int(p.act_mib[1] - p.act_mib[0])
    room[pp - 1] -= vpp * int(p.state_mib[n] - p.state_mib[n - 1]) + chunks[pp - 1] * int(p.act_mib[n] - p.act_mib[n - 1])
    if tab.base_full:
        room -= vpp * p.working_mib
    pl_major = vpp * major[1] + chunks * major[2]
    pl_minor = vpp * minor[1] + chunks * minor[2]
    sends = np.zeros(pp)
    for k in range(tab.num_chunks):
        sends[k % pp] += (k + 1 < tab.num_chunks) + (k > 0)
    budget = t - sends * p.p2p_us
    budget[0] -= int(p.time_us[1] - p.time_us[0])
    budget[pp - 1] -= int(p.time_us[n] - p.time_us[n - 1])
    extra_mem = n_minor * np.maximum(0.0, pl_minor - pl_major)
    extra_time = n_minor * max(0.0, minor[0] - major[0])
    by_mem = np.floor(np.maximum(room - extra_mem, 0) / np.maximum(pl_major, 1e-9))
    by_time = np.floor(np.maximum(budget - extra_time, 0) / max(major[0], 1.0))
    return np.minimum(by_mem, by_time)


def hetero_incumbent(cluster: ClusterSpec, tab: CandidateTables, tmax_lb: int) -> tuple[int, Layout] | None:
    """Layouts whose ranks take the pool and the load the bound's assignment gives them at times
    just above the bound, plus the greedy fastest-pools-first assignment with Megatron's even split."""
    found = []
    tried: set[tuple[int, ...]] = set()
    greedy = greedy_pools(cluster, tab)
    if greedy is not None:
        found.append(fit_recompute(tab, even_layout(tab, greedy)))
    if len(cluster.pools) >= 2:
        pool_gpus = [p.num_gpus for p in cluster.pools]
        step = max(1, min(p.decoder_unit[0] for p in tab.pools))
        for i in range(8):
            got = hetero_capacity_at(tab, tmax_lb + i * step, pool_gpus)
            if got is None:
                continue
            _, pools = got
            ranks = [int(q) for q in pools]
            caps = np.zeros(len(ranks))
            for q in range(len(cluster.pools)):
                cap = rank_capacity_at(tab, tmax_lb + i * step, pool=q)
                caps = np.where(np.asarray(ranks) == q, cap, caps)
            found.append(fit_recompute(tab, loads_layout(tab, caps, ranks)))
            tried.add(tuple(ranks))
    if greedy is not None:
        tried.add(tuple(greedy))
    # the same assignments with exact per-rank capacities (own pool, exact sends), stepping by the
    # slowest pool's layer time so that the slow ranks' loads move too
    slow = max(1, max(p.decoder_unit[0] for p in tab.pools))
    for v in sorted(tried)[:4]:
        found.append(assignment_incumbent(tab, v, tmax_lb, step=slow))
    found = [f for f in found if f]
    return min(found, key=lambda f: f[0]) if found else None


def greedy_pools(cluster: ClusterSpec, tab: CandidateTables) -> list[int] | None:
    """A greedy pool per pipeline rank for the incumbent: fastest pools first, within capacity."""
    dims = tab.config.dims
    need = dims.tp * dims.cp * dims.dp
    free = [p.num_gpus for p in cluster.pools]
    order = sorted(range(len(cluster.pools)), key=lambda i: int(tab.pools[i].time_us[-1]))
    ranks = []
    for _ in range(dims.pp):
        for i in order:
            if free[i] >= need:
                free[i] -= need
                ranks.append(i)
                break
        else:
            return None
    return ranks


def assignment_incumbent(tab: CandidateTables, assignment: tuple[int, ...], tmax_lb: int,
                         step: int | None = None) -> tuple[int, Layout] | None:
    """Best of Megatron's even split and balanced splits at times just above the slowest-rank bound,
    with every rank on its given pool."""
    ranks = list(assignment)
    found = [fit_recompute(tab, even_layout(tab, ranks))]
    at = assignment_capacity(tab, assignment)
    step = step or max(1, min(p.decoder_unit[0] for p in tab.pools))
    for i in range(6):
        found.append(fit_recompute(tab, loads_layout(tab, at(tmax_lb + i * step), ranks)))
    found = [f for f in found if f]
    return min(found, key=lambda f: f[0]) if found else None


def _rank_times(tab: CandidateTables, lay: Layout) -> list[int]:
    pp = tab.config.dims.pp
    times = [0] * pp
    for k in range(tab.num_chunks):
        p = tab.pools[lay.pools[k]]
        times[k % pp] += int(p.time_us[lay.bounds[k + 1]] - p.time_us[lay.bounds[k]]) + lay.recompute[k] * p.recompute_extra_us
    return times


def improve(tab: CandidateTables, found: tuple[int, Layout], *, max_rounds: int = 60) -> tuple[int, Layout]:
    """Local search on a layout: move one chunk boundary by one layer while the integer objective
    drops, or stays and the ranks' times get more even (sum of squares), and the layout still fits;
    then retry with fewer recomputed layers. Cheap, and it turns a balanced-by-count split into one
    balanced by the real per-layer costs (dense-first MoE models)."""
    best_obj, lay = found
    key = (best_obj, sum(t * t for t in _rank_times(tab, lay)))
    s = tab.num_chunks
    dec = tab.decoders
    for _ in range(max_rounds):
        step = None
        for k in range(1, s):
            for delta in (-1, 1):
                b = list(lay.bounds)
                b[k] += delta
                if not b[k - 1] < b[k] < b[k + 1]:
                    continue
                rc = lay.recompute
                if any(rc[i] > int(dec[b[i + 1]] - dec[b[i]]) for i in (k - 1, k)):
                    continue
                trial = Layout(bounds=tuple(b), recompute=rc, pools=lay.pools)
                obj, fits = int_objective(tab, trial)
                if not fits or obj > key[0]:
                    continue
                trial_key = (obj, sum(t * t for t in _rank_times(tab, trial)))
                if trial_key < key and (step is None or trial_key < step[0]):
                    step = (trial_key, trial)
        if step is None:
            break
        key, lay = step
    best_obj = key[0]
    fewer = fit_recompute(tab, Layout(bounds=lay.bounds, recompute=(0,) * s, pools=lay.pools))
    if fewer is not None and fewer[0] < best_obj:
        return fewer
    return best_obj, lay
