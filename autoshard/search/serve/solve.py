"""Serving search: enumerate vLLM-legal engines (TP, PP, expert parallelism, attention DP) with a
reason for every candidate dropped, tabulate each at a ladder of concurrencies with the serving cost
model (both in `autoshard.search.serve.space`, re-exported here), and let CP-SAT pick one row.

Objective: without a request rate, maximize the output tokens/s the deployment delivers per GPU of
the cluster (idle GPUs count as zero), subject to TPOT <= target and TTFT <= target. With a request
rate, minimize the GPUs that sustain it (ties: the higher throughput per GPU). Only integers reach the
solver: one index variable selects a table row and `add_element` reads its columns.
"""

from __future__ import annotations

import dataclasses

import math
import time
from collections import Counter
from dataclasses import dataclass

from ortools.sat.python import cp_model

from autoshard.costmodel.bands import mark_ties
from autoshard.costmodel.serve.disagg import disagg_ttft_s
from autoshard.costmodel.serve.step import ServePrediction, predict_serve, total_weight_bytes
from autoshard.errors import InfeasibleError, SolverError, SpecError
from autoshard.plans.train import SolverStats
from autoshard.search.serve.disagg import (
    MILLI,
    DecodeRow,
    DisaggTables,
    PrefillRow,
    tabulate_disagg,
    transfer_for,
)
from autoshard.search.deadline import Deadline
from autoshard.search.serve.space import (
    GPU_MEMORY_UTILIZATION,
    MAX_CONCURRENCY,
    TIE_SCALE,
    Engine,
    Row,
    ServeSpace,
    _config,
    _engine_rules,
    enumerate_serve,
    tabulate,
)
from autoshard.plans.serve import Disaggregation, Role, ServePlan
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB, time_to_us

__all__ = [
    "Engine",
    "ServeSpace",
    "Row",
    "enumerate_serve",
    "tabulate",
    "solve_serve",
    "evaluate_serve",
    "evaluate_vllm",
    "model_for_path",
    "GPU_MEMORY_UTILIZATION",
    "MAX_CONCURRENCY",
    "TIE_SCALE",
]

# --------------------------------------------------------------------------- CP-SAT


@dataclass(slots=True)
class _Model:
    cp: cp_model.CpModel
    row: cp_model.IntVar
    engine: cp_model.IntVar
    objective: cp_model.LinearExprT
    dis: cp_model.IntVar
    """1 when the deployment is disaggregated (xPyD)."""
    p: cp_model.IntVar | None = None
    d: cp_model.IntVar | None = None
    x: cp_model.IntVar | None = None
    y: cp_model.IntVar | None = None
    nvl: cp_model.IntVar | None = None
    p_engine: cp_model.IntVar | None = None
    d_engine: cp_model.IntVar | None = None
    served: cp_model.IntVar | None = None


DISAGGREGATE = ("auto", "on", "off")


def _element(cp: cp_model.CpModel, index: cp_model.IntVar, values: list[int], name: str) -> cp_model.IntVar:
    var = cp.new_int_var(min(values), max(values), name)
    cp.add_element(index, values, var)
    return var


def _product(
    cp: cp_model.CpModel, a: cp_model.IntVar, b: cp_model.IntVar, hi: int, name: str
) -> cp_model.IntVar:
    var = cp.new_int_var(0, hi, name)
    cp.add_multiplication_equality(var, [a, b])
    return var


def _build(
    rows: list[Row],
    engines: list[Engine],
    job: ServeJob,
    tables: DisaggTables | None = None,
    cluster: ClusterSpec | None = None,
) -> _Model:
    """One model over both deployment kinds: `dis` = 0 picks one aggregated row (engine, concurrency,
    replicas); `dis` = 1 picks a prefill row, a decode row and their instance counts x and y, with
    x * prefill rate >= y * decode rate (prefill keeps up with decode at its planned utilization),
    x * prefill GPUs + y * decode GPUs within the pool, and the TTFT target met with the KV transfer
    priced on NVLink only when the whole deployment sits in one NVLink domain."""
    cp = cp_model.CpModel()
    dis = cp.new_bool_var("disaggregated")
    use_agg = bool(rows)
    use_dis = tables is not None and bool(tables.prefill) and bool(tables.decode)
    if not use_agg:
        cp.add(dis == 1)
    if not use_dis:
        cp.add(dis == 0)
    # With both kinds, aggregated row len(rows) is "none" (objective, TPOT and TTFT 0): chosen exactly
    # when the deployment is disaggregated, so objective = aggregated row + xPyD value (0 when not
    # split) stays one linear sum, which CP-SAT bounds far better than two enforced equalities.
    extra = 1 if use_agg and use_dis else 0
    values = [r.objective for r in rows] + [0] * extra
    if use_agg:
        row = cp.new_int_var(0, len(rows) - 1 + extra, "row")
        engine = _element(cp, row, [engines.index(r.engine) for r in rows] + [len(engines)] * extra, "engine")
        if extra:
            cp.add(row == len(rows)).only_enforce_if(dis)
            cp.add(row != len(rows)).only_enforce_if(~dis)
        if job.tpot_target_s is not None:
            tpot = _element(cp, row, [r.tpot_us for r in rows] + [0] * extra, "tpot_us")
            cp.add(tpot <= time_to_us(job.tpot_target_s))
        if job.ttft_target_s is not None:
            ttft = _element(cp, row, [r.ttft_us for r in rows] + [0] * extra, "ttft_us")
            cp.add(ttft <= time_to_us(job.ttft_target_s))
        agg = _element(cp, row, values, "agg_objective")
    else:
        row = cp.new_int_var(0, 0, "row")
        engine = cp.new_int_var(0, 0, "engine")
        agg = cp.new_int_var(0, 0, "agg_objective")
    built = _Model(cp, row, engine, agg, dis)
    objective: cp_model.LinearExprT = agg
    if use_dis:
        assert tables is not None and cluster is not None
        value = _build_disagg(built, tables, engines, job, cluster)
        objective = agg + value
    built.objective = objective
    if job.request_rate is None:
        cp.maximize(objective)
    else:
        cp.minimize(objective)
    return built


def _build_disagg(
    m: _Model, t: DisaggTables, engines: list[Engine], job: ServeJob, cluster: ClusterSpec
) -> cp_model.LinearExprT:
    """Add the xPyD half of the model; returns its objective term (0 unless disaggregated).
    Instances may sit on different pools (e.g. prefill on H100s, decode on A100s), each role within
    its pool's GPUs; the KV transfer then crosses the inter-pool network."""
    cp, dis = m.cp, m.dis
    pools = cluster.pools
    most = max(p.num_gpus for p in pools)
    p = cp.new_int_var(0, len(t.prefill) - 1, "prefill_row")
    d = cp.new_int_var(0, len(t.decode) - 1, "decode_row")
    gp = _element(cp, p, [r.engine.gpus for r in t.prefill], "prefill_gpus")
    gd = _element(cp, d, [r.engine.gpus for r in t.decode], "decode_gpus")
    xmax = most // min(r.engine.gpus for r in t.prefill)
    ymax = most // min(r.engine.gpus for r in t.decode)
    x = cp.new_int_var(0, xmax, "prefill_instances")
    y = cp.new_int_var(0, ymax, "decode_instances")
    cp.add(x >= 1).only_enforce_if(dis)
    cp.add(y >= 1).only_enforce_if(dis)
    cp.add(x == 0).only_enforce_if(~dis)
    cp.add(y == 0).only_enforce_if(~dis)
    cp.add(p == 0).only_enforce_if(~dis)  # unused choices pinned: no search over them
    cp.add(d == 0).only_enforce_if(~dis)
    pool = _element(cp, p, [r.engine.pool for r in t.prefill], "prefill_pool")
    total = sum(q.num_gpus for q in pools)
    xgp = _product(cp, x, gp, total, "prefill_gpus_total")
    ygd = _product(cp, y, gd, total, "decode_gpus_total")
    used = xgp + ygd
    same = cp.new_bool_var("same_pool")
    if len(pools) == 1:
        cp.add(same == 1)
        cp.add(used <= pools[0].num_gpus)
    else:  # each role on its own pool's GPUs; prefill on one GPU type, decode on another is allowed
        dpool = _element(cp, d, [r.engine.pool for r in t.decode], "decode_pool")
        cp.add(pool == dpool).only_enforce_if(same)
        cp.add(pool != dpool).only_enforce_if(~same)
        for k, q in enumerate(pools):
            gpk = _element(
                cp, p, [r.engine.gpus if r.engine.pool == k else 0 for r in t.prefill], f"prefill_gpus_{k}"
            )
            gdk = _element(
                cp, d, [r.engine.gpus if r.engine.pool == k else 0 for r in t.decode], f"decode_gpus_{k}"
            )
            cp.add(
                _product(cp, x, gpk, q.num_gpus, f"prefill_on_{k}")
                + _product(cp, y, gdk, q.num_gpus, f"decode_on_{k}")
                <= q.num_gpus
            )
    domain = _element(cp, pool, [q.node.domain_size for q in pools], "pool_domain")
    rp = _element(cp, p, [r.rate_milli for r in t.prefill], "prefill_rate")
    rd = _element(cp, d, [r.rate_milli for r in t.decode], "decode_rate")
    xrp = _product(cp, x, rp, xmax * max(r.rate_milli for r in t.prefill), "prefill_capacity")
    yrd = _product(cp, y, rd, ymax * max(r.rate_milli for r in t.decode), "decode_capacity")
    served_hi = ymax * max(r.rate_milli for r in t.decode)
    served = cp.new_int_var(0, served_hi, "served_rate")
    cp.add(served <= xrp)
    cp.add(served <= yrd)
    m.served = served
    nvl = cp.new_bool_var("kv_over_nvlink")  # the whole deployment in one NVLink domain of one pool
    cp.add(used <= domain).only_enforce_if(nvl)
    cp.add(same == 1).only_enforce_if(nvl)
    cp.add(used > domain).only_enforce_if([~nvl, same])
    if job.ttft_target_s is not None:
        tr_hi = max(max(r.send_us) for r in t.prefill) + max(max(r.recv_us) for r in t.decode)
        tr = cp.new_int_var(0, tr_hi, "kv_transfer_us")
        for k, lits in ((0, [nvl]), (1, [~nvl, same]), (2, [~same])):
            send = _element(cp, p, [r.send_us[k] for r in t.prefill], f"send_us_{k}")
            recv = _element(cp, d, [r.recv_us[k] for r in t.decode], f"recv_us_{k}")
            cp.add(tr >= send + t.latency_us[k]).only_enforce_if(lits)
            cp.add(tr >= recv + t.latency_us[k]).only_enforce_if(lits)
        ttft_p = _element(cp, p, [r.ttft_us for r in t.prefill], "prefill_ttft_us")
        tpot_d = _element(cp, d, [r.tpot_us for r in t.decode], "decode_tpot_us")
        cp.add(ttft_p + tr + tpot_d <= time_to_us(job.ttft_target_s)).only_enforce_if(dis)
    m.p, m.d, m.x, m.y, m.nvl = p, d, x, y, nvl
    m.p_engine = _element(cp, p, [engines.index(r.engine) for r in t.prefill], "prefill_engine")
    m.d_engine = _element(cp, d, [engines.index(r.engine) for r in t.decode], "decode_engine")
    if job.request_rate is None:
        # output tokens/s per cluster GPU x 1000 = served (milli-requests/s) x output_len / GPUs
        top = served_hi * job.output_len // cluster.num_gpus
        per_gpu = cp.new_int_var(0, top, "disagg_objective")
        cp.add_division_equality(per_gpu, served * job.output_len, cluster.num_gpus)
        return per_gpu
    cp.add(served >= int(job.request_rate * MILLI + 0.999999)).only_enforce_if(dis)
    return used * TIE_SCALE


def _objective_units(job: ServeJob, value: float) -> float:
    """Integer objective -> tokens/s per cluster GPU, or GPUs (rate mode)."""
    if job.request_rate is None:
        return value / 1000
    return float(math.ceil(value / TIE_SCALE - 1e-9))


def solve_serve(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    *,
    pins: dict[str, int] | None,
    top_k: int,
    time_limit_s: float,
    num_workers: int = 8,
    seed: int = 0,
    disaggregate: str = "off",
    started_at: float | None = None,
) -> list[ServePlan]:
    """The best `top_k` serving plans with distinct degrees, best first, each with its certificate.

    `disaggregate`: "off" plans aggregated replicas only, "on" prefill/decode (xPyD) deployments only,
    "auto" lets the solver choose between both in one model.

    Raises SpecError for a job the model cannot take, InfeasibleError (needs X, has Y, nearest fix)
    when no plan fits or meets the targets, SolverError when CP-SAT returns nothing in time.
    The whole call honours `time_limit_s` (counted from `started_at`, a `time.monotonic()` value, when
    given): the top-k solves share what the setup leaves."""
    deadline = Deadline(time_limit_s, start=started_at)
    start = time.perf_counter()
    if disaggregate not in DISAGGREGATE:
        raise SpecError(
            f"disaggregate must be one of {', '.join(DISAGGREGATE)}, got '{disaggregate}'",
            field="--disaggregate",
        )
    if job.context_len > model.max_position_embeddings:
        raise SpecError(
            f"max_model_len {job.context_len} exceeds the model's max_position_embeddings "
            f"{model.max_position_embeddings}: shorten the requests or --max-model-len"
        )
    if top_k < 1:
        raise SpecError(f"top_k must be at least 1, got {top_k}")
    space = enumerate_serve(model, cluster, job, pins=pins)
    if not space.engines:
        raise InfeasibleError(_no_engine_message(model, cluster, job, space))
    rows: list[Row] = []
    dropped: Counter[str] = Counter()
    if disaggregate != "on":
        rows, dropped = tabulate(model, cluster, job, space, pins=pins)
    tables = None
    if disaggregate != "off":
        tables = tabulate_disagg(model, cluster, job, space)
        dropped.update(tables.dropped)
        if not (tables.prefill and tables.decode):
            tables = None
    if not rows and tables is None:
        if disaggregate == "on" or job.request_rate is None:
            raise InfeasibleError(
                _target_message(job, rows) if rows else _disagg_message(model, cluster, job, space)
            )
        raise InfeasibleError(_rate_message(model, cluster, job, space))
    pruned = space.reasons() + dropped
    built = _build(rows, space.engines, job, tables, cluster)
    setup_s = time.perf_counter() - start
    sign = 1 if job.request_rate is None else -1
    if rows:
        built.cp.add_hint(built.row, max(range(len(rows)), key=lambda i: sign * rows[i].objective))
    plans: list[ServePlan] = []
    while len(plans) < top_k:
        if plans and deadline.remaining() < 0.05:
            break  # the limit is spent: return the plans found so far
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, deadline.remaining() - 0.1)
        solver.parameters.num_workers = num_workers
        solver.parameters.random_seed = seed
        solver.parameters.relative_gap_limit = 0.0
        t0 = time.perf_counter()
        status = solver.solve(built.cp)
        wall = time.perf_counter() - t0 + (setup_s if not plans else 0.0)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if plans and status == cp_model.INFEASIBLE:
                break
            if status == cp_model.INFEASIBLE:
                raise InfeasibleError(
                    _target_message(job, rows) if rows else _disagg_message(model, cluster, job, space)
                )
            raise SolverError(
                f"CP-SAT returned {solver.status_name(status)} within {time_limit_s} s: raise --time-limit"
            )
        stats = SolverStats(
            status=solver.status_name(status),
            # gap limit 0: CP-SAT stops short of a proof only at its time limit, the rest of the deadline
            stop_reason="optimal" if status == cp_model.OPTIMAL else "time_limit",
            wall_s=wall,
            objective=_objective_units(job, solver.objective_value),
            bound=_objective_units(job, solver.best_objective_bound),
            conflicts=solver.num_conflicts,
            branches=solver.num_branches,
            candidates=space.enumerated,
            candidates_in_model=len(rows) + (len(tables.prefill) + len(tables.decode) if tables else 0),
            pruned=dict(pruned),
        )
        if solver.value(built.dis):
            assert tables is not None and built.p is not None and built.d is not None
            assert built.x is not None and built.y is not None and built.nvl is not None
            assert built.p_engine is not None and built.d_engine is not None
            prow, drow = tables.prefill[solver.value(built.p)], tables.decode[solver.value(built.d)]
            x, y = solver.value(built.x), solver.value(built.y)
            served = solver.value(built.served) / MILLI
            plans.append(
                _disagg_plan(
                    model, cluster, job, prow, drow, x, y, bool(solver.value(built.nvl)), stats, served
                )
            )
            pe, de = solver.value(built.p_engine), solver.value(built.d_engine)
            same_p = built.cp.new_bool_var("")
            same_d = built.cp.new_bool_var("")
            built.cp.add(built.p_engine == pe).only_enforce_if(same_p)
            built.cp.add(built.p_engine != pe).only_enforce_if(~same_p)
            built.cp.add(built.d_engine == de).only_enforce_if(same_d)
            built.cp.add(built.d_engine != de).only_enforce_if(~same_d)
            built.cp.add_bool_or([~built.dis, ~same_p, ~same_d])
        else:
            chosen = rows[solver.value(built.row)]
            plans.append(_plan(model, cluster, job, chosen, stats))
            built.cp.add(built.engine != space.engines.index(chosen.engine)).only_enforce_if(~built.dis)
    if disaggregate == "auto" and rows and tables is not None:
        other = _best_other(
            model, cluster, job, rows, tables, space, plans[0], max(0.01, deadline.remaining() - 0.1), num_workers,
            seed,
        )
        plans[0] = dataclasses.replace(plans[0], choice=_choice(job, plans[0], other))
    return mark_ties(plans)


def _best_other(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    rows: list[Row],
    tables: DisaggTables,
    space: ServeSpace,
    best: ServePlan,
    time_limit_s: float,
    num_workers: int,
    seed: int,
) -> ServePlan | None:
    """The best plan of the kind `best` is not (None when that kind has no plan meeting the job)."""
    if best.disaggregated:
        built = _build(rows, space.engines, job)
    else:
        built = _build([], space.engines, job, tables, cluster)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = seed
    status = solver.solve(built.cp)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    stats = SolverStats(
        status=solver.status_name(status),
        stop_reason="optimal" if status == cp_model.OPTIMAL else "time_limit",
        wall_s=solver.wall_time,
        objective=_objective_units(job, solver.objective_value),
        bound=_objective_units(job, solver.best_objective_bound),
    )
    if best.disaggregated:
        return _plan(model, cluster, job, rows[solver.value(built.row)], stats)
    assert built.p is not None and built.d is not None and built.x is not None and built.y is not None
    assert built.nvl is not None and built.served is not None
    return _disagg_plan(
        model,
        cluster,
        job,
        tables.prefill[solver.value(built.p)],
        tables.decode[solver.value(built.d)],
        solver.value(built.x),
        solver.value(built.y),
        bool(solver.value(built.nvl)),
        stats,
        solver.value(built.served) / MILLI,
    )


def _choice(job: ServeJob, best: ServePlan, other: ServePlan | None) -> str:
    """One sentence: which kind won and by how much, or why the other kind had no plan."""
    kind = "disaggregated" if best.disaggregated else "aggregated"
    other_kind = "aggregated replicas" if best.disaggregated else "a prefill/decode split"
    if other is None:
        return f"{kind}: no plan with {other_kind} meets the targets on these GPUs"

    def figures(p: ServePlan) -> str:
        return f"TPOT {1e3 * p.prediction.tpot_s:.1f} ms, TTFT {p.ttft_s:.2f} s"

    if job.request_rate is not None:
        return (
            f"{kind}: {best.num_gpus} GPUs sustain {job.request_rate:g} req/s ({figures(best)}); "
            f"{other_kind} need {other.num_gpus} ({other.describe()}; {figures(other)})"
        )
    a = best.throughput_tokens_per_s / best.cluster.num_gpus
    b = other.throughput_tokens_per_s / other.cluster.num_gpus
    split = best if best.disaggregated else other
    pre = split.role("prefill")
    idle = split.cluster.num_gpus - split.num_gpus
    cost = (
        f"the split gives {pre.gpus} of {split.num_gpus} GPUs to prefill ({100 * pre.utilization:.0f}% busy)"
        + (f" and leaves {idle} idle" if idle else "")
    )
    if best.disaggregated:
        reason = f"its decode steps carry no prefill chunks, which outweighs the cost: {cost}"
    else:
        reason = f"chunked prefill inside each engine costs less than the split: {cost}"
    return (
        f"{kind}: {a:,.0f} output tokens/s per GPU ({figures(best)}) vs {b:,.0f} for the best plan with "
        f"{other_kind} ({other.describe()}; {figures(other)}); {reason}"
    )


def _decode_at_load(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, drow: DecodeRow, rate: float):
    """The decode instance at the fewest running requests that sustain `rate` requests/s (Little's
    law with TPOT growing with the batch): below capacity it runs a smaller batch, so a lower TPOT
    than at its max_num_seqs. Its config (max_num_seqs) stays the planned cap."""
    from autoshard.costmodel.serve.disagg import decode_instance

    full = drow.instance
    if rate >= full.requests_per_s * (1 - 1e-9):
        return full
    pool = cluster.pools[drow.engine.pool]
    lo, hi = 1, full.concurrency  # hi sustains the rate
    while lo < hi:
        mid = (lo + hi) // 2
        if (
            decode_instance(model, pool, job, full.config, full.memory, concurrency=mid).requests_per_s
            >= rate
        ):
            hi = mid
        else:
            lo = mid + 1
    return decode_instance(model, pool, job, full.config, full.memory, concurrency=lo)


def _disagg_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    prow: PrefillRow,
    drow: DecodeRow,
    x: int,
    y: int,
    same_domain: bool,
    stats: SolverStats,
    served: float,
    warnings: tuple[str, ...] = (),
) -> ServePlan:
    """The ServePlan of a chosen xPyD deployment, its figures recomputed in floats. `served`: the
    requests/s it is planned to take (at most what either role sustains at its planned load)."""
    pi, di = prow.instance, drow.instance
    transfer = transfer_for(model, cluster, job, prow, drow, same_domain=same_domain)
    load = min(served, y * di.requests_per_s, x * pi.requests_per_s * prow.utilization)
    if job.request_rate is not None:
        load = min(load, job.request_rate)
    util = load / (x * pi.requests_per_s)
    di = _decode_at_load(model, cluster, job, drow, load / y)
    ttft = disagg_ttft_s(pi, transfer, di.tpot_s, util)
    prefill_pred = ServePrediction(
        config=pi.config,
        concurrency=pi.config.max_num_seqs,
        memory=pi.memory,
        decode=pi.step,
        prefill=pi.prompt,
        tpot_s=pi.step.total_s,
        ttft_s=ttft,
        throughput_tokens_per_s=pi.requests_per_s,
        input_len=job.input_len,
        output_len=job.output_len,
    )
    decode_pred = ServePrediction(
        config=di.config,
        concurrency=di.concurrency,
        memory=di.memory,
        decode=di.step,
        prefill=pi.prompt,
        tpot_s=di.tpot_s,
        ttft_s=ttft,
        throughput_tokens_per_s=di.throughput_tokens_per_s,
        input_len=job.input_len,
        output_len=job.output_len,
    )
    roles = tuple(
        Role(
            role=name,
            instances=n,
            tp=e.tp,
            pp=e.pp,
            ep=e.ep,
            attention_dp=e.dp_attention,
            max_num_seqs=pred.config.max_num_seqs,
            max_num_batched_tokens=pred.config.max_num_batched_tokens,
            gpu_memory_utilization=pred.config.gpu_memory_utilization,
            prediction=pred,
            requests_per_s=rate,
            utilization=u,
            pool_index=e.pool,
        )
        for name, n, e, pred, rate, u in (
            ("prefill", x, prow.engine, prefill_pred, pi.requests_per_s, util),
            (
                "decode",
                y,
                drow.engine,
                decode_pred,
                drow.instance.requests_per_s,
                load / (y * drow.instance.requests_per_s),
            ),
        )
    )
    e = drow.engine
    plan = ServePlan(
        model=model,
        cluster=cluster,
        job=job,
        tp=e.tp,
        pp=e.pp,
        dp=e.dp_attention if e.expert_parallel else 1,
        ep=e.ep,
        gpu_memory_utilization=di.config.gpu_memory_utilization,
        max_num_seqs=di.config.max_num_seqs,
        max_num_batched_tokens=di.config.max_num_batched_tokens,
        prediction=decode_pred,
        solver=stats,
        pool_index=e.pool,
        warnings=warnings,
        roles=roles,
        disaggregation=Disaggregation(
            throughput_tokens_per_s=load * job.output_len,
            ttft_s=ttft,
            transfer=transfer,
            ttft_p90_s=disagg_ttft_s(pi, transfer, di.tpot_s, util, q=0.9),
        ),
    )
    return plan


def _plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    row: Row,
    stats: SolverStats,
    warnings: tuple[str, ...] = (),
) -> ServePlan:
    e, cfg = row.engine, row.config
    dp = e.dp_attention if e.expert_parallel else row.replicas
    plan = ServePlan(
        model=model,
        cluster=cluster,
        job=job,
        tp=e.tp,
        pp=e.pp,
        dp=dp,
        ep=e.ep,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        prediction=row.prediction,
        solver=stats,
        pool_index=e.pool,
        warnings=warnings,
    )
    return plan


# --------------------------------------------------------------------------- evaluate a given plan


def evaluate_serve(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    *,
    tp: int,
    pp: int = 1,
    dp: int = 1,
    expert_parallel: bool = False,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    pool: int = 0,
    warnings: tuple[str, ...] = (),
    concurrency: int | None = None,
) -> ServePlan:
    """Predictions for a plan the user already has (vLLM semantics: --enable-expert-parallel makes
    EP = TP x DP over one engine). `concurrency`: requests in flight over the whole deployment (default:
    as many as max_num_seqs and the KV cache allow). Raises InfeasibleError if it would not start,
    SpecError if illegal."""
    if not 0 <= pool < len(cluster.pools):
        raise SpecError(f"pool index {pool} out of range: the cluster has {len(cluster.pools)} pools")
    spec = cluster.pools[pool]
    warn = list(warnings)
    if expert_parallel and not model.is_moe:
        warn.append("--enable-expert-parallel has no effect on a dense model; ignored")
        expert_parallel = False
    e = Engine(pool, tp, pp, dp if expert_parallel else 1, expert_parallel)
    replicas = 1 if expert_parallel else dp
    reason = _engine_rules(model, spec, e, check_size=False)
    if reason:
        raise SpecError(f"{e.label()} is not a legal vLLM engine for {model.name}: {reason}")
    if e.gpus * replicas > spec.num_gpus:
        raise InfeasibleError(
            f"TP{tp} x PP{pp} x DP{dp} needs {e.gpus * replicas} GPUs; pool '{spec.name}' has "
            f"{spec.num_gpus}: use fewer replicas or a larger --gpus"
        )
    seqs = max_num_seqs or (1024 if spec.gpu.hbm_gib >= 70 and "A100" not in spec.gpu.name.upper() else 256)
    cfg = _config(
        model,
        spec,
        job,
        e,
        max_num_seqs=seqs,
        util=gpu_memory_utilization,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    ranks = dp  # DP ranks: replicas, or attention-DP ranks of one expert-parallel engine
    per_rank = None if concurrency is None else max(1, -(-concurrency // ranks))
    if per_rank is not None and per_rank * ranks != concurrency:
        warn.append(f"concurrency {concurrency} over {ranks} DP ranks: predicted at {per_rank} per rank")
    pred = predict_serve(model, spec, job, cfg, concurrency=per_rank)
    if per_rank is not None and pred.concurrency < per_rank:
        warn.append(f"concurrency {concurrency} exceeds what max-num-seqs and the KV cache admit: "
                    f"predicted at {pred.concurrency} running requests per DP rank (the rest queue)")
    stats = SolverStats(
        status="EVALUATED",
        stop_reason="evaluated",
        wall_s=0.0,
        objective=pred.tokens_per_s_per_gpu,
        bound=pred.tokens_per_s_per_gpu,
        candidates=1,
        candidates_in_model=0,
    )
    row = Row(e, cfg, pred, replicas, 0, time_to_us(pred.tpot_s), time_to_us(pred.ttft_s))
    return _plan(model, cluster, job, row, stats, tuple(warn))


def model_for_path(path: str) -> ModelSpec:
    """The bundled model a launcher's model path names: its Hugging Face repo id (an -Instruct or
    -FP8 variant of it too) or its bundled name. Raises SpecError when none matches."""
    from autoshard.plans.serve import model_path
    from autoshard.specs.loader import bundled_models, load_model

    wanted = path.rstrip("/").lower()
    stem = wanted.rsplit("/", 1)[-1]
    matches: list[tuple[int, ModelSpec]] = []
    for name in bundled_models():
        spec = load_model(name)
        repo = model_path(spec).lower()
        base = repo.rsplit("/", 1)[-1]
        if wanted in (repo, name) or stem in (base, name):
            return spec
        if stem.startswith((base + "-", name + "-")):
            matches.append((len(name), spec))
    if matches:
        return max(matches, key=lambda m: m[0])[1]
    raise SpecError(
        f"cannot tell which model '{path}' is: pass MODEL (a bundled name, a YAML file or its "
        "config.json) before the cluster",
        field="--from-vllm",
    )


# --------------------------------------------------------------------------- infeasibility messages


def _gib(x: float) -> str:
    return f"{x / GIB:,.0f} GiB" if x >= 10 * GIB else f"{x / GIB:.1f} GiB"


def _no_engine_message(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, space: ServeSpace) -> str:
    reasons = space.reasons()
    if space.closest is None:
        top = "; ".join(f"{r} ({n}x)" for r, n in reasons.most_common(3))
        return f"no vLLM engine is legal for {model.name} on {cluster.name}: {top}"
    engine, need, has, per_token = space.closest
    pool = cluster.pools[engine.pool]
    where = "this node has" if pool.num_nodes == 1 else f"these {pool.num_gpus} GPUs have"
    hbm = pool.num_gpus * pool.gpu.hbm_gib * GIB
    usable = hbm * GPU_MEMORY_UTILIZATION
    weights = total_weight_bytes(model, job.weight_dtype)
    fixes: list[str] = []
    if weights > usable:
        head = (
            f"weights alone need {_gib(weights)} at {job.weight_dtype.value}; {where} {_gib(hbm)} "
            f"({_gib(usable)} at gpu_memory_utilization {GPU_MEMORY_UTILIZATION:.2f}; {pool.gpu.name})"
        )
    else:
        head = (
            f"the closest engine for {model.name}, {engine.label()} on {engine.gpus} GPUs, needs "
            f"{_gib(need)} per GPU "
            f"(weights, activations, CUDA graphs and one {job.context_len}-token request's KV cache); "
            f"gpu_memory_utilization {GPU_MEMORY_UTILIZATION:.2f} leaves {_gib(has)} of {pool.gpu.name}'s "
            f"{pool.gpu.hbm_gib:g} GiB"
        )
        room = has - (need - job.context_len * per_token)
        if room > 0 and any("KV cache holds" in r for r in reasons):
            fixes.append(f"shorten max_model_len to at most {int(room // per_token)} tokens")
            if job.kv_cache_dtype is WeightDtype.BF16:
                fixes.append("use an fp8 KV cache")
    for dtype in (WeightDtype.FP8, WeightDtype.INT4):
        w = total_weight_bytes(model, dtype)
        if w < weights and w < usable * 0.85:
            fixes.append(f"quantize the weights to {dtype.value} ({_gib(w)})")
            break
    per_gpu = pool.gpu.hbm_gib * GIB * GPU_MEMORY_UTILIZATION * 0.85
    count = math.ceil(weights / per_gpu)
    per_node = pool.node.gpus_per_node
    count = per_node * math.ceil(count / per_node) if count > per_node else 1 << (count - 1).bit_length()
    if count <= pool.num_gpus:
        count = pool.num_gpus + per_node if pool.num_gpus >= per_node else 2 * pool.num_gpus
    fixes.append(f"use at least {count} GPUs (--gpus {count})")
    return head + ": nearest fix: " + "; or ".join(fixes)


def _rate_message(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, space: ServeSpace) -> str:
    best = 0.0
    for e in space.engines:
        pool = cluster.pools[e.pool]
        cfg = _config(model, pool, job, e, max_num_seqs=MAX_CONCURRENCY)
        try:
            pred = predict_serve(model, pool, job, cfg)
        except InfeasibleError:
            continue
        best = max(best, pred.requests_per_s / e.gpus)
    rate = job.request_rate or 0.0
    need = math.ceil(rate / best) if best else 0
    per_node = cluster.primary.node.gpus_per_node
    if need > per_node:
        need = per_node * math.ceil(need / per_node)
    return (
        f"sustaining {rate:g} requests/s of {job.input_len}+{job.output_len} tokens needs about {need} "
        f"GPUs at "
        f"the best rate per GPU ({best:.3g} req/s); {cluster.name} has {cluster.num_gpus}: "
        f"nearest fix: use at least {need} GPUs (--gpus), or lower the request rate"
    )


def _target_message(job: ServeJob, rows: list[Row]) -> str:
    parts = []
    fastest = min(rows, key=lambda r: r.tpot_us)
    quickest = min(rows, key=lambda r: r.ttft_us)
    if job.tpot_target_s is not None and fastest.tpot_us > time_to_us(job.tpot_target_s):
        parts.append(
            f"TPOT <= {job.tpot_target_s * 1e3:g} ms (the fastest plan, {fastest.engine.label()} at "
            f"concurrency {fastest.prediction.concurrency}, reaches {fastest.prediction.tpot_s * 1e3:.1f} ms)"
        )
    if job.ttft_target_s is not None and quickest.ttft_us > time_to_us(job.ttft_target_s):
        parts.append(
            f"TTFT <= {job.ttft_target_s * 1e3:g} ms (the quickest plan, {quickest.engine.label()}, "
            f"reaches {quickest.prediction.ttft_s * 1e3:.1f} ms)"
        )
    if not parts:
        parts.append("the TPOT and TTFT targets together (each alone is reachable, not both with one plan)")
    return (
        "no plan meets "
        + " and ".join(parts)
        + ": nearest fix: relax the target, quantize the weights, or use faster GPUs"
    )


def _disagg_message(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, space: ServeSpace) -> str:
    """Why no xPyD deployment exists: too few GPUs for two instances, or the targets out of reach."""
    from autoshard.costmodel.serve.disagg import decode_instance
    from autoshard.costmodel.serve.step import serve_memory

    smallest = min(e.gpus for e in space.engines)
    if 2 * smallest > max(p.num_gpus for p in cluster.pools):
        return (
            f"a prefill/decode split of {model.name} needs at least {2 * smallest} GPUs (one prefill and "
            f"one decode instance of {smallest}, the smallest legal engine); {cluster.name} has "
            f"{cluster.num_gpus}: nearest fix: --gpus {2 * smallest}, or --disaggregate auto/off"
        )
    parts = []
    if job.tpot_target_s is not None:
        best = math.inf
        for e in space.engines:
            pool = cluster.pools[e.pool]
            cfg = _config(model, pool, job, e, max_num_seqs=1)
            mem = serve_memory(model, pool.gpu, cfg, context_len=job.context_len)
            best = min(best, decode_instance(model, pool, job, cfg, mem, concurrency=1).tpot_s)
        parts.append(
            f"TPOT <= {job.tpot_target_s * 1e3:g} ms "
            f"(the fastest decode instance reaches {best * 1e3:.1f} ms)"
        )
    if job.ttft_target_s is not None:
        parts.append(f"TTFT <= {job.ttft_target_s * 1e3:g} ms")
    if job.request_rate is not None:
        parts.append(f"{job.request_rate:g} requests/s")
    need = " and ".join(parts) or "the job"
    return (
        f"no prefill/decode deployment of {model.name} on {cluster.name} ({cluster.num_gpus} GPUs) "
        f"meets {need}: nearest fix: relax the targets, use more or faster GPUs (--gpus), "
        "or --disaggregate auto"
    )
