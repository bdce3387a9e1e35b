"""Incumbents: good feasible layouts for a candidate, built quickly before CP-SAT runs. The best one
seeds the solver's hint and, with the lower bounds, decides which candidates enter the model."""

from __future__ import annotations

import numpy as np

from autoshard.search.train.bounds_mixed import major_mask
from autoshard.search.train.bounds_pools import _HeteroCapacity, assignment_capacity, assignment_sends, hetero_capacity_at
from autoshard.search.train.bounds_rank import (
    _threshold,
    _uniform_capacity,
    joint_search,
    layer_capacity,
    rank_capacity_at,
    rank_room,
    rank_work,
    uniform_capacity_at,
    uniform_thresholds,
)
from autoshard.search.train.tables import CandidateTables, Layout, even_layout, int_objective
from autoshard.specs.cluster import ClusterSpec

__all__ = ["loads_layout", "fit_recompute", "incumbent", "hetero_incumbent", "greedy_pools", "assignment_incumbent",
           "safe_capacity_at", "improve", "uniform_assignment_incumbent", "memory_pools"]


def loads_layout(tab: CandidateTables, caps: np.ndarray, pool_of_rank: list[int] | None,
                 per_chunk: int = 0, light_rounds: int = 0) -> Layout | None:
    """A layout giving each rank at most caps[r] decoder layers: start from the caps and shed the
    surplus one layer at a time from the rank with the longest time (its layers plus its fixed work:
    embedding, output, sends; the earlier rank on ties: it holds more micro-batches in flight); each
    rank's layers are split evenly over its chunks, the later chunks taking the remainder. With
    `per_chunk`, no rank sheds below per_chunk decoder layers per chunk (a uniform recompute count).
    With `light_rounds` (interleaving), each rank's first light_rounds chunks hold max(1, per_chunk)
    layer(s) and the rest is split over its other chunks: the layers that open the model (DeepSeek-V3's
    3 dense ones) then go one per rank instead of all to rank 0."""
    pp, vpp = tab.config.dims.pp, tab.config.dims.vpp
    n_dec = int(tab.decoders[-1])
    load = [int(c) for c in caps]
    by_pool = {q: rank_work(tab, q) for q in set(pool_of_rank or [None])}  # one per pool, not per rank
    work = [by_pool[pool_of_rank[r] if pool_of_rank else None] for r in range(pp)]
    per_layer = [float(w[0]) for w in work]
    fixed = [float(w[2][r]) for r, w in enumerate(work)]
    extra = sum(load) - n_dec
    if extra < 0:
        return None
    least = [vpp] * pp
    least[0] -= 1  # chunk 0 may hold only the embedding
    least[pp - 1] -= 1  # the last chunk may hold only the output layer
    least = [max(lo, vpp * per_chunk) for lo in least]
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
    light = min(light_rounds, vpp - 1)
    small = max(1, per_chunk)
    for r in range(pp):
        first = light if load[r] - light * small >= (vpp - light) * per_chunk else 0
        for c in range(first):
            sizes[c * pp + r] = small
        rest = vpp - first
        base, rem = divmod(load[r] - first * small, rest)
        for c in range(rest):
            # the remainder goes to the later chunks, except on the last rank, whose final chunk
            # carries the output layer and may be left without decoder layers
            later = c >= rest - rem if r < pp - 1 else c < rem
            sizes[(first + c) * pp + r] = base + (1 if later else 0)
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
    max_rc = smallest if tab.block_recompute else 0  # one granularity
    for rc in range(max_rc + 1):
        trial = Layout(bounds=lay.bounds, recompute=(rc,) * tab.num_chunks, pools=lay.pools)
        obj, fits = int_objective(tab, trial)
        if fits:
            return obj, trial
    return None


def _light_rounds(tab: CandidateTables) -> int:
    """Interleaving rounds that the leading minority decoder layers (DeepSeek-V3's dense ones) fill
    one per rank: ceil(leading / pp); 0 without interleaving or when the first decoder layer is of
    the most numerous kind."""
    dims = tab.config.dims
    if dims.vpp == 1 or tab.uniform_decoders:
        return 0
    is_major = major_mask(tab)
    leading = int(np.argmax(is_major)) if is_major.any() else 0
    return -(-leading // dims.pp)


def incumbent(tab: CandidateTables, pool_of_rank: list[int] | None, tmax_lb: int,
               uniform: bool) -> tuple[int, Layout] | None:
    """Best of Megatron's even split and balanced splits built from the per-rank capacities at
    slowest-rank times just above the proven lower bounds (per uniform recompute count k); with
    interleaving and leading minority layers, each split also with those layers one per rank."""
    found = [fit_recompute(tab, even_layout(tab, pool_of_rank))]
    rounds = sorted({0, _light_rounds(tab)})

    def splits(caps: np.ndarray) -> list[tuple[int, Layout] | None]:
        return [fit_recompute(tab, loads_layout(tab, caps, pool_of_rank, light_rounds=v)) for v in rounds]

    if tab.config.dims.pp > 1:
        step = max(1, min(p.decoder_unit[0] for p in tab.pools))
        if uniform:
            for t, k in uniform_thresholds(tab)[:3]:
                for i in range(4):
                    found.extend(splits(uniform_capacity_at(tab, t + i * step, k)))
        for i in range(4):
            found.extend(splits(rank_capacity_at(tab, tmax_lb + i * step)))
        if len(tab.pools) == 1:
            cfg = tab.config
            a = (tab.scale // cfg.dims.vpp) * (cfg.num_microbatches * cfg.dims.vpp - 1)
            for caps in joint_search(tab, tmax_lb, a, tab.scale)[1]:
                found.extend(splits(caps))
        found.extend(splits(layer_capacity(tab)))
        if not tab.uniform_decoders and len(tab.pools) == 1:
            # decoder layers that differ: loads every rank can hold whatever layers it gets
            big = max(1, max(int(d) for d in np.diff(tab.pools[0].time_us)[1:-1]))
            for i in range(8):
                found.extend(splits(safe_capacity_at(tab, tmax_lb + i * big)))
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
    # the greedy assignments (fastest pools first; roomiest pools first, the tightest on the last
    # ranks, which hold the fewest micro-batches in flight) always, then the uniform count's, then the bound's ones
    first = [tuple(v) for v in (greedy, memory_pools(cluster, tab)) if v is not None]
    if len(cluster.pools) >= 2:
        first += _uniform_pools(tab, [p.num_gpus for p in cluster.pools], tmax_lb)
    tried -= set(first)
    # the same assignments with exact per-rank capacities (own pool, exact sends), stepping by the
    # slowest pool's layer time so that the slow ranks' loads move too
    slow = max(1, max(p.decoder_unit[0] for p in tab.pools))
    for v in list(dict.fromkeys(first)) + sorted(tried)[:4]:
        found.append(assignment_incumbent(tab, v, tmax_lb, step=slow))
    found = [f for f in found if f]
    return min(found, key=lambda f: f[0]) if found else None


def _uniform_pools(tab: CandidateTables, pool_gpus: list[int], tmax_lb: int, steps: int = 4) -> list[tuple[int, ...]]:
    """The rank -> pool assignment that holds every decoder layer soonest when every chunk recomputes
    one count k (the model's default): per k, the first of a few times from the bound, stepping by
    the fastest pool's layer time, at which the ranks' capacities at that count (own pool, cheapest
    links) hold the layers, and the assignment achieving it; the counts whose time is smallest."""
    rc_allowed = tab.block_recompute
    ks = range(int(tab.decoders[-1]) // tab.num_chunks + 1) if rc_allowed else range(1)
    step = max(1, min(p.decoder_unit[0] for p in tab.pools))
    found = []
    for k in ks:
        cap = _HeteroCapacity(tab, pool_gpus, uniform_k=k)
        for i in range(steps):
            got = cap.at(tmax_lb + i * step)
            if got is not None and got[1] is not None and got[0] >= int(tab.decoders[-1]):
                found.append((i, k, tuple(int(q) for q in got[1])))
                break
    first = min((i for i, _, _ in found), default=None)
    return list(dict.fromkeys(v for i, _, v in sorted(found) if i == first))


def uniform_assignment_incumbent(tab: CandidateTables, assignment: tuple[int, ...] | list[int],
                                 tmax_lb: int) -> tuple[int, Layout] | None:
    """Best layout on a fixed rank -> pool assignment under one recompute count k for every chunk
    (Megatron's --recompute-num-layers, as the model counts it): for each k, each rank's capacity on
    its own pool (memory with k layers per chunk recomputed, time with its exact sends), the smallest
    slowest-rank time at which the capacities hold every decoder layer, and loads shed from there.
    Capacities from the cheapest decoder layer are exact for uniform decoders; every layout is
    re-checked by `int_objective`, so a mix of layer kinds can only make a layout drop, never lie."""
    ranks = list(assignment)
    pools = np.asarray(ranks)
    n_dec = int(tab.decoders[-1])
    vpp = tab.config.dims.vpp
    p2p = min([p.p2p_us for p in tab.pools] + list(tab.cross_p2p_us.values()))
    base_sends = np.zeros(len(ranks))
    for k in range(tab.num_chunks):
        base_sends[k % len(ranks)] += (k + 1 < tab.num_chunks) + (k > 0)
    exact = assignment_sends(tab, ranks) - base_sends * p2p
    parts = []
    for q in sorted(set(ranks)):
        d, x, fixed, least = rank_work(tab, q)
        parts.append((q, rank_room(tab, q), d, x, fixed + exact, least))
    least = parts[0][5]
    rc_allowed = tab.block_recompute
    ks = range(n_dec // tab.num_chunks + 1) if rc_allowed else range(1)
    found = []
    for k in ks:
        floor = np.maximum(least, vpp * k)

        def caps_at(t: float, k: int = k, floor: np.ndarray = floor) -> np.ndarray:
            caps = np.zeros(len(ranks))
            for q, rr, d, x, fixed, _ in parts:
                caps = np.where(pools == q, _uniform_capacity(tab, rr, fixed, d, x, t, k), caps)
            return caps if np.all(caps >= floor) else np.zeros_like(caps)

        hi = int(max(f.max() for *_, f, _ in parts)) + (max(d + max(x, 0) for _, _, d, x, _, _ in parts)) * n_dec + 1
        t = _threshold(min(max(0, int(tmax_lb)), hi), hi, n_dec, caps_at)
        if t is None:
            continue
        step = max(1, max(d for _, _, d, _, _, _ in parts))
        for i in range(3):
            lay = loads_layout(tab, caps_at(t + i * step), ranks, per_chunk=k)
            if lay is None:
                continue
            trial = Layout(bounds=lay.bounds, recompute=(k,) * tab.num_chunks, pools=lay.pools)
            obj, fits = int_objective(tab, trial)
            if fits:
                found.append((obj, trial))
                break
    return min(found, key=lambda f: f[0]) if found else None


def memory_pools(cluster: ClusterSpec, tab: CandidateTables) -> list[int] | None:
    """A pool per pipeline rank by memory: the roomiest pools take the first ranks (they hold the
    most micro-batches in flight), the tightest pool the last ones, within each pool's rank limit;
    the pools with the most HBM first, the faster on ties."""
    dims = tab.config.dims
    need = dims.tp * dims.cp * dims.dp
    free = [p.num_gpus // need for p in cluster.pools]
    if sum(free) < dims.pp:
        return None
    order = sorted(range(len(cluster.pools)), key=lambda i: (-tab.pools[i].capacity_mib, int(tab.pools[i].time_us[-1])))
    ranks = []
    for i in order:
        take = min(free[i], dims.pp - len(ranks))
        ranks.extend([i] * take)
    return ranks


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
    # the capacities above let each rank recompute its own share of layers; the model's recompute
    # count is one for every chunk, which the tight pools of a mixed cluster need to fit at all
    found.append(uniform_assignment_incumbent(tab, assignment, tmax_lb))
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
