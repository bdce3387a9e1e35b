"""The CP-SAT model: one model per solve, choosing among the surviving candidates.

Variables, per candidate c (all constraints of c hold only when its selector x_c is true):
- chunk boundaries b_1 < … < b_{S-1} over the model's layers (contiguous, monotone layout; the
  embedding and output count as the real layers they are, so stages may be uneven);
- full-recompute layers r_k per chunk (on top of the candidate's base recompute mode);
- the pool q_r of each pipeline rank (heterogeneous clusters).
Stage quantities come from prefix tables looked up with `add_allowed_assignments` at each boundary
and subtracted: no big-M and no products of variables. The objective is the pipeline step time
m*t_max + (sum_r T_r - t_max)/v plus the slowest rank's exposed DP traffic and optimizer step,
scaled to integers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from autoshard.costmodel.train.pipeline import RANK_CHUNK_SPREAD
from autoshard.search.train.tables import CandidateTables, Layout, even_layout

__all__ = ["CandidateVars", "BuiltModel", "build_model"]

# Column order of the boundary lookup tables.
_COLS = ("time_us", "state_mib", "act_mib", "dp_full_us", "dp_min_us", "window_us", "opt_us")


@dataclass(slots=True)
class CandidateVars:
    selected: cp_model.IntVar
    bounds: list[cp_model.IntVar | int]
    recompute: list[cp_model.IntVar | int]
    rank_pools: list[cp_model.IntVar | int]
    objective: cp_model.IntVar


@dataclass(slots=True)
class BuiltModel:
    model: cp_model.CpModel
    candidates: list[CandidateVars]
    tables: list[CandidateTables]


def _decoder_runs(tab: CandidateTables) -> list[tuple[int, int]]:
    """(first layer index, length) of each run of identical decoder layers (the embedding is layer 0)."""
    runs: list[tuple[int, int]] = []
    p = tab.pools[0]
    signature = None
    for i in range(1, tab.num_layers - 1):
        here = tuple(int(getattr(p, c)[i + 1] - getattr(p, c)[i]) for c in _COLS)
        if runs and here == signature:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
            signature = here
    return runs


def _lookup(model: cp_model.CpModel, tab: CandidateTables, pool: cp_model.IntVar | int,
            boundary: cp_model.IntVar | int, cache: dict, hi: int) -> dict[str, cp_model.IntVar | int]:
    """Prefix-table values at `boundary` in `pool`'s tables."""
    key = (id(pool) if not isinstance(pool, int) else pool, id(boundary) if not isinstance(boundary, int) else boundary)
    if key in cache:
        return cache[key]
    if isinstance(pool, int) and not isinstance(boundary, int):
        # Interior boundaries lie in [1, n-1], and the decoder layers form runs of identical layers
        # (e.g. 3 dense then 58 MoE): prefix(b) = prefix(1) + sum_j slope_j * clamp(b - start_j, 0, len_j),
        # each clamp a max/min equality, so every quantity is linear in a few clamped counts.
        p = tab.pools[pool]
        counts = []
        for start, length in _decoder_runs(tab):
            if length == tab.num_layers - 2 and start == 1:
                counts.append((start, boundary - 1))  # one run: the count is linear already
                continue
            above = model.new_int_var(-tab.num_layers, tab.num_layers, "")
            model.add(above == boundary - start)
            clipped = model.new_int_var(0, tab.num_layers, "")
            model.add_max_equality(clipped, [above, 0])
            count = model.new_int_var(0, length, "")
            model.add_min_equality(count, [clipped, length])
            counts.append((start, count))
        out = {}
        for c in _COLS:
            arr = getattr(p, c)
            out[c] = int(arr[1]) + sum(int(arr[start + 1] - arr[start]) * count for start, count in counts)
        out["decoders"] = sum(count for _, count in counts)
        cache[key] = out
        return out
    if isinstance(pool, int) and isinstance(boundary, int):
        p = tab.pools[pool]
        out = {c: int(getattr(p, c)[boundary]) for c in _COLS}
        out["decoders"] = int(tab.decoders[boundary])
        cache[key] = out
        return out
    out = {c: model.new_int_var(0, hi, "") for c in _COLS}
    out["decoders"] = model.new_int_var(0, tab.num_layers, "")
    rows = []
    pools = range(len(tab.pools)) if not isinstance(pool, int) else [pool]
    bounds = range(tab.num_layers + 1) if not isinstance(boundary, int) else [boundary]
    for q in pools:
        p = tab.pools[q]
        for b in bounds:
            row = [int(getattr(p, c)[b]) for c in _COLS] + [int(tab.decoders[b])]
            if not isinstance(pool, int):
                row = [q, *row]
            if not isinstance(boundary, int):
                row = [b, *row]
            rows.append(row)
    vars_ = [out[c] for c in _COLS] + [out["decoders"]]
    if not isinstance(pool, int):
        vars_ = [pool, *vars_]
    if not isinstance(boundary, int):
        vars_ = [boundary, *vars_]
    model.add_allowed_assignments(vars_, rows)
    cache[key] = out
    return out


def _chunk_linear(model: cp_model.CpModel, tab: CandidateTables, k: int, bounds: list, lits: list,
                  x: cp_model.IntVar, n: int) -> tuple[dict, dict]:
    """Chunk k's quantities on a heterogeneous cluster when the decoder layers are identical: its
    decoder count D_k is channelled into one copy per pool (D_kq = D_k on the rank's pool, 0 on the
    others, by half-reification), so every quantity is linear: slope_q * D_kq plus the embedding
    (chunk 0) and output (last chunk) of the chosen pool. Returned as (0, value) pairs."""
    s = tab.num_chunks
    d_k = bounds[k + 1] - bounds[k] - (1 if k == 0 else 0) - (1 if k == s - 1 else 0)
    parts = []
    for q, lit in enumerate(lits):
        dq = model.new_int_var(0, n, "")
        model.add(dq == d_k).only_enforce_if(lit)
        model.add(dq == 0).only_enforce_if(~lit)
        parts.append(dq)
    up: dict = {}
    for c in _COLS:
        terms = []
        for q, (dq, lit) in enumerate(zip(parts, lits, strict=True)):
            arr = getattr(tab.pools[q], c)
            slope = int(arr[2] - arr[1])
            fixed = (int(arr[1] - arr[0]) if k == 0 else 0) + (int(arr[n] - arr[n - 1]) if k == s - 1 else 0)
            terms.append(slope * dq + fixed * lit)
        up[c] = sum(terms)
    up["decoders"] = d_k
    zero = dict.fromkeys([*_COLS, "decoders"], 0)
    return zero, up


def _per_pool(model: cp_model.CpModel, rk: cp_model.IntVar, lits: list, n: int, cache: dict) -> list:
    """rk copied onto the rank's pool: one variable per pool, rk on the pool whose literal holds and 0 on
    the others (half-reified, as `_chunk_linear` channels decoder counts), so a pool's price times it is
    linear. One copy per (count variable, rank): a uniform count shares it across the rank's chunks."""
    key = (id(rk), id(lits[0]))
    if key not in cache:
        copies = []
        for lit in lits:
            c = model.new_int_var(0, n, "")
            model.add(c == rk).only_enforce_if(lit)
            model.add(c == 0).only_enforce_if(~lit)
            copies.append(c)
        cache[key] = copies
    return cache[key]


def _add_candidate(model: cp_model.CpModel, tab: CandidateTables, *, pool_gpus: list[int], uniform_recompute: bool,
                   per_stage_recompute: bool, hint: Layout | None, hi: int, lower: int, tmax_lower: int,
                   fixed_pools: tuple[int, ...] | None = None) -> CandidateVars:
    cfg = tab.config
    dims = cfg.dims
    pp, vpp, m = dims.pp, dims.vpp, cfg.num_microbatches
    s = tab.num_chunks
    n = tab.num_layers
    x = model.new_bool_var("x")
    # a heterogeneous candidate either chooses its ranks' pools (variables) or comes with them fixed
    # (one candidate per pool assignment): then every quantity is a constant-pool lookup
    hetero = len(tab.pools) > 1 and fixed_pools is None

    bounds: list[cp_model.IntVar | int] = [0]
    for k in range(1, s):
        bounds.append(model.new_int_var(k, n - (s - k), f"b{k}"))
    bounds.append(n)
    for k in range(s):
        if not (isinstance(bounds[k], int) and isinstance(bounds[k + 1], int)):
            model.add(bounds[k + 1] >= bounds[k] + 1)

    rank_pools: list[cp_model.IntVar | int] = []
    member: list[list] = []
    if hetero:
        stage_gpus = dims.tp * dims.cp * dims.dp
        for r in range(pp):
            q = model.new_int_var(0, len(tab.pools) - 1, f"q{r}")
            lits = [model.new_bool_var("") for _ in tab.pools]
            model.add_exactly_one(lits)
            model.add(q == sum(i * lit for i, lit in enumerate(lits)))
            rank_pools.append(q)
            member.append(lits)
        for i, gpus in enumerate(pool_gpus):
            model.add(sum(member[r][i] for r in range(pp)) * stage_gpus <= gpus).only_enforce_if(x)
    else:
        rank_pools = list(fixed_pools) if fixed_pools is not None else [0] * pp

    cache: dict = {}
    # recompute's extra time, activation saving and working set are each rank's own pool's: a constant
    # with the pools fixed, with pools chosen linear in the count copied onto the rank's pool
    # (`_per_pool`; the worst pool's values made the model's optimum a layout's upper bound, not its cost)
    pool_of = (lambda r: [tab.pools[rank_pools[r]]]) if not hetero else (lambda r: tab.pools)  # noqa: E731
    extras = [max(p.recompute_extra_us for p in pool_of(r)) for r in range(pp)]
    savings = [min(p.recompute_saving_mib for p in pool_of(r)) for r in range(pp)]
    workings = [max(p.working_mib for p in pool_of(r)) for r in range(pp)]
    copies: dict = {}
    # Megatron-LM takes one --recompute-granularity: block full recompute (--recompute-num-layers)
    # cannot be added to selective recompute, so selective candidates recompute no extra layers
    allow_rc = per_stage_recompute and tab.block_recompute
    uniform = model.new_int_var(0, n, "rc") if (allow_rc and uniform_recompute) else None

    rank_time: list[list] = [[] for _ in range(pp)]
    rank_terms: list[dict[str, list]] = [{c: [] for c in _COLS} for _ in range(pp)]
    rank_rc: list[list] = [[] for _ in range(pp)]
    recompute: list[cp_model.IntVar | int] = []
    p2p_same = max(p.p2p_us for p in tab.pools)
    linear_pools = hetero and tab.uniform_decoders
    vpp = s // pp
    rank_base = [model.new_int_var(0, n, f"chunk_base{r}") for r in range(pp)] if vpp > 1 else []
    for k in range(s):
        r = k % pp
        q = rank_pools[r]
        if linear_pools:
            lo, up = _chunk_linear(model, tab, k, bounds, member[r], x, n)
        else:
            lo = _lookup(model, tab, q, bounds[k], cache, hi)
            up = _lookup(model, tab, q, bounds[k + 1], cache, hi)
        if tab.chunk_decoders is not None:  # the A2A overlap: near-even chunks (CandidateTables.chunk_decoders)
            fewest, most = tab.chunk_decoders
            model.add(up["decoders"] - lo["decoders"] >= fewest).only_enforce_if(x)
            model.add(up["decoders"] - lo["decoders"] <= most).only_enforce_if(x)
        if vpp > 1:  # a rank's chunks within RANK_CHUNK_SPREAD layer of each other (CandidateTables.chunks_allowed)
            model.add(up["decoders"] - lo["decoders"] >= rank_base[r]).only_enforce_if(x)
            model.add(up["decoders"] - lo["decoders"] <= rank_base[r] + RANK_CHUNK_SPREAD).only_enforce_if(x)
        if allow_rc:
            rk = uniform if uniform is not None else model.new_int_var(0, n, f"r{k}")
            model.add(rk <= up["decoders"] - lo["decoders"]).only_enforce_if(x)
        else:
            rk = 0
        recompute.append(rk)
        t = [up["time_us"] - lo["time_us"]]
        if allow_rc:
            if hetero:
                per_pool = _per_pool(model, rk, member[r], n, copies)
                t.append(sum(p.recompute_extra_us * c for p, c in zip(tab.pools, per_pool, strict=True)))
            else:
                t.append(extras[r] * rk)
            rank_rc[r].append(rk)
        for nb in ([k + 1] if k + 1 < s else []) + ([k - 1] if k > 0 else []):
            qn = rank_pools[nb % pp]
            if fixed_pools is not None:
                t.append(tab.pools[q].p2p_us if q == qn else tab.cross_p2p_us[(q, qn)])
            elif not hetero:
                t.append(p2p_same)
            else:
                cost = model.new_int_var(0, hi, "")
                rows = [[a, b, tab.pools[a].p2p_us if a == b else tab.cross_p2p_us[(a, b)]]
                        for a in range(len(tab.pools)) for b in range(len(tab.pools))]
                model.add_allowed_assignments([q, qn, cost], rows)
                t.append(cost)
        rank_time[r].append(sum(t))
        for c in _COLS:
            if c == "time_us":
                continue
            rank_terms[r][c].append(up[c] - lo[c])
        if allow_rc and hetero:
            per_pool = _per_pool(model, rk, member[r], n, copies)
            rank_terms[r]["act_mib"].append(-sum(p.recompute_saving_mib * c for p, c in zip(tab.pools, per_pool, strict=True)))
        else:
            rank_terms[r]["act_mib"].append(-savings[r] * rk if allow_rc else 0)

    tmax = model.new_int_var(min(tmax_lower, hi), hi, "tmax")
    tail = model.new_int_var(0, hi, "tail")
    totals = []
    for r in range(pp):
        tr = model.new_int_var(0, hi, f"T{r}")
        model.add(tr == sum(rank_time[r]))
        model.add(tmax >= tr)
        totals.append(tr)
        terms = rank_terms[r]
        exposed = model.new_int_var(0, hi, "")
        model.add(exposed >= sum(terms["dp_min_us"]) + tab.dp_min_latency_us)
        model.add(exposed >= sum(terms["dp_full_us"]) + tab.dp_latency_us - sum(terms["window_us"]))
        model.add(tail >= exposed + sum(terms["opt_us"]))
        # memory of rank r, scaled by vpp so in-flight chunk counts stay integral
        if tab.base_full:
            work = vpp * workings[r]
        elif allow_rc:
            z = model.new_bool_var("")
            for rk in rank_rc[r]:
                model.add(rk == 0).only_enforce_if(~z)
            work = vpp * workings[r] * z
            if hetero:
                # the working set of the rank's own pool: above the smallest, charged where z and the pool's
                # literal both hold (memory only caps from above, so y >= z + lit - 1 is enough)
                low = min(p.working_mib for p in tab.pools)
                work = vpp * low * z
                for p, lit in zip(tab.pools, member[r], strict=True):
                    if p.working_mib > low:
                        y = model.new_bool_var("")
                        model.add(y >= z + lit - 1)
                        work += vpp * (p.working_mib - low) * y
        else:
            work = 0
        q = rank_pools[r]
        if isinstance(q, int):
            cap = tab.pools[q].capacity_mib
        else:
            cap = model.new_int_var(0, max(p.capacity_mib for p in tab.pools), "")
            model.add_element(q, [p.capacity_mib for p in tab.pools], cap)
        mem = vpp * (sum(terms["state_mib"]) + tab.zero3_extra_mib) + tab.in_flight_chunks[r] * sum(terms["act_mib"]) + work
        model.add(mem <= vpp * cap).only_enforce_if(x)

    scale = tab.scale
    obj = model.new_int_var(0, scale * (m + 2) * hi * (tab.config.dims.pp + 1), "obj")
    model.add(obj >= (scale // vpp) * ((m * vpp - 1) * tmax + sum(totals)) + scale * tail).only_enforce_if(x)
    model.add(obj >= lower * x)  # the candidate's proven lower bound: keeps the LP relaxation tight

    if hint is not None:
        for k in range(1, s):
            model.add_hint(bounds[k], hint.bounds[k])
        hinted: set[int] = set()
        for k, rk in enumerate(recompute):
            if not isinstance(rk, int) and id(rk) not in hinted:  # a uniform count is one variable
                hinted.add(id(rk))
                model.add_hint(rk, hint.recompute[k])
        for r in range(pp):
            if not isinstance(rank_pools[r], int):
                model.add_hint(rank_pools[r], hint.pools[r])
    return CandidateVars(selected=x, bounds=bounds, recompute=recompute, rank_pools=rank_pools, objective=obj)


def _upper(tab: CandidateTables) -> int:
    """A safe upper bound for every time-like variable of a candidate (keeps CP-SAT's int64 sums safe)."""
    worst = 0
    for p in tab.pools:
        worst = max(worst, int(p.time_us[-1]) + tab.num_layers * p.recompute_extra_us, int(p.dp_full_us[-1]),
                    int(p.opt_us[-1]), int(p.state_mib[-1]), int(p.act_mib[-1]), int(p.window_us[-1]))
    p2p = max([p.p2p_us for p in tab.pools] + list(tab.cross_p2p_us.values()))
    return worst + 2 * tab.num_chunks * p2p + tab.dp_latency_us + 1


def build_model(tables: list[CandidateTables], *, pool_gpus: list[int], uniform_recompute: bool,
                per_stage_recompute: bool, hint_index: int | None, hint: Layout | None,
                lower_bounds: list[int], tmax_lower_bounds: list[int], even_layout_only: bool = False,
                fixed_pools: list[tuple[int, ...] | None] | None = None) -> BuiltModel:
    model = cp_model.CpModel()
    cands = []
    for i, tab in enumerate(tables):
        hi = _upper(tab)
        cands.append(_add_candidate(
            model, tab, pool_gpus=pool_gpus, uniform_recompute=uniform_recompute,
            per_stage_recompute=per_stage_recompute, hint=hint if i == hint_index else None, hi=hi,
            lower=lower_bounds[i], tmax_lower=tmax_lower_bounds[i],
            fixed_pools=fixed_pools[i] if fixed_pools else None,
        ))
        if even_layout_only:
            even = even_layout(tab)
            assert even is not None
            for var, value in zip(cands[-1].bounds, even.bounds, strict=True):
                if not isinstance(var, int):
                    model.add(var == value)
    model.add_exactly_one(c.selected for c in cands)
    model.minimize(sum(c.objective for c in cands))
    if hint_index is not None:
        for i, c in enumerate(cands):
            model.add_hint(c.selected, i == hint_index)
    return BuiltModel(model=model, candidates=cands, tables=tables)
