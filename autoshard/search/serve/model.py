"""The serving CP-SAT model: one model over both deployment kinds. Only integers reach the solver:
one index variable selects an aggregated table row (engine, concurrency, replicas) and `add_element`
reads its columns; with prefill/decode disaggregation, a prefill row, a decode row and their
instance counts. `read_pick` reads a solution back, `exclude` forbids its engine(s) for the next
of the top-k solves."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from autoshard.search.serve.disagg import MILLI, DisaggTables
from autoshard.search.serve.space import TIE_SCALE, Engine, Row
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob
from autoshard.units import time_to_us

__all__ = ["ServeModel", "Pick", "build_model", "read_pick", "exclude", "objective_units", "element", "product",
           "FirstPlan", "solve_for_plan"]


@dataclass(slots=True)
class ServeModel:
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


def element(cp: cp_model.CpModel, index: cp_model.IntVar, values: list[int], name: str) -> cp_model.IntVar:
    var = cp.new_int_var(min(values), max(values), name)
    cp.add_element(index, values, var)
    return var


def product(
    cp: cp_model.CpModel, a: cp_model.IntVar, b: cp_model.IntVar, hi: int, name: str
) -> cp_model.IntVar:
    var = cp.new_int_var(0, hi, name)
    cp.add_multiplication_equality(var, [a, b])
    return var


def build_model(
    rows: list[Row],
    engines: list[Engine],
    job: ServeJob,
    tables: DisaggTables | None = None,
    cluster: ClusterSpec | None = None,
) -> ServeModel:
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
        engine = element(cp, row, [engines.index(r.engine) for r in rows] + [len(engines)] * extra, "engine")
        if extra:
            cp.add(row == len(rows)).only_enforce_if(dis)
            cp.add(row != len(rows)).only_enforce_if(~dis)
        if job.tpot_target_s is not None:
            tpot = element(cp, row, [r.tpot_us for r in rows] + [0] * extra, "tpot_us")
            cp.add(tpot <= time_to_us(job.tpot_target_s))
        if job.ttft_target_s is not None:
            ttft = element(cp, row, [r.ttft_us for r in rows] + [0] * extra, "ttft_us")
            cp.add(ttft <= time_to_us(job.ttft_target_s))
        agg = element(cp, row, values, "agg_objective")
    else:
        row = cp.new_int_var(0, 0, "row")
        engine = cp.new_int_var(0, 0, "engine")
        agg = cp.new_int_var(0, 0, "agg_objective")
    built = ServeModel(cp, row, engine, agg, dis)
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
    m: ServeModel, t: DisaggTables, engines: list[Engine], job: ServeJob, cluster: ClusterSpec
) -> cp_model.LinearExprT:
    """Add the xPyD half of the model; returns its objective term (0 unless disaggregated).
    Instances may sit on different pools (e.g. prefill on H100s, decode on A100s), each role within
    its pool's GPUs; the KV transfer then crosses the inter-pool network."""
    cp, dis = m.cp, m.dis
    pools = cluster.pools
    most = max(p.num_gpus for p in pools)
    p = cp.new_int_var(0, len(t.prefill) - 1, "prefill_row")
    d = cp.new_int_var(0, len(t.decode) - 1, "decode_row")
    gp = element(cp, p, [r.engine.gpus for r in t.prefill], "prefill_gpus")
    gd = element(cp, d, [r.engine.gpus for r in t.decode], "decode_gpus")
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
    pool = element(cp, p, [r.engine.pool for r in t.prefill], "prefill_pool")
    total = sum(q.num_gpus for q in pools)
    xgp = product(cp, x, gp, total, "prefill_gpus_total")
    ygd = product(cp, y, gd, total, "decode_gpus_total")
    used = xgp + ygd
    same = cp.new_bool_var("same_pool")
    if len(pools) == 1:
        cp.add(same == 1)
        cp.add(used <= pools[0].num_gpus)
    else:  # each role on its own pool's GPUs; prefill on one GPU type, decode on another is allowed
        dpool = element(cp, d, [r.engine.pool for r in t.decode], "decode_pool")
        cp.add(pool == dpool).only_enforce_if(same)
        cp.add(pool != dpool).only_enforce_if(~same)
        for k, q in enumerate(pools):
            gpk = element(
                cp, p, [r.engine.gpus if r.engine.pool == k else 0 for r in t.prefill], f"prefill_gpus_{k}"
            )
            gdk = element(
                cp, d, [r.engine.gpus if r.engine.pool == k else 0 for r in t.decode], f"decode_gpus_{k}"
            )
            cp.add(
                product(cp, x, gpk, q.num_gpus, f"prefill_on_{k}")
                + product(cp, y, gdk, q.num_gpus, f"decode_on_{k}")
                <= q.num_gpus
            )
    domain = element(cp, pool, [q.domain_fill_size for q in pools], "pool_domain")  # GPUs a rack fills
    rp = element(cp, p, [r.rate_milli for r in t.prefill], "prefill_rate")
    rd = element(cp, d, [r.rate_milli for r in t.decode], "decode_rate")
    xrp = product(cp, x, rp, xmax * max(r.rate_milli for r in t.prefill), "prefill_capacity")
    yrd = product(cp, y, rd, ymax * max(r.rate_milli for r in t.decode), "decode_capacity")
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
            send = element(cp, p, [r.send_us[k] for r in t.prefill], f"send_us_{k}")
            recv = element(cp, d, [r.recv_us[k] for r in t.decode], f"recv_us_{k}")
            cp.add(tr >= send + t.latency_us[k]).only_enforce_if(lits)
            cp.add(tr >= recv + t.latency_us[k]).only_enforce_if(lits)
        ttft_p = element(cp, p, [r.ttft_us for r in t.prefill], "prefill_ttft_us")
        first_d = element(cp, d, [r.first_us for r in t.decode], "decode_first_token_us")
        cp.add(ttft_p + tr + first_d <= time_to_us(job.ttft_target_s)).only_enforce_if(dis)
    m.p, m.d, m.x, m.y, m.nvl = p, d, x, y, nvl
    m.p_engine = element(cp, p, [engines.index(r.engine) for r in t.prefill], "prefill_engine")
    m.d_engine = element(cp, d, [engines.index(r.engine) for r in t.decode], "decode_engine")
    if job.request_rate is None:
        # output tokens/s per cluster GPU x 1000 = served (milli-requests/s) x output_len / GPUs
        top = served_hi * job.output_len // cluster.num_gpus
        per_gpu = cp.new_int_var(0, top, "disagg_objective")
        cp.add_division_equality(per_gpu, served * job.output_len, cluster.num_gpus)
        return per_gpu
    cp.add(served >= int(job.request_rate * MILLI + 0.999999)).only_enforce_if(dis)
    return used * TIE_SCALE


def objective_units(job: ServeJob, value: float) -> float:
    """Integer objective -> tokens/s per cluster GPU, or GPUs (rate mode)."""
    if job.request_rate is None:
        return value / 1000
    return float(math.ceil(value / TIE_SCALE - 1e-9))


@dataclass(frozen=True, slots=True)
class Pick:
    """One solution read off the model: an aggregated row (`row`), or, when `disaggregated`, the
    prefill and decode rows, their instance counts, whether the KV cache moves over NVLink, and the
    requests/s the deployment is planned to serve."""

    disaggregated: bool
    row: int = 0
    p: int = 0
    d: int = 0
    x: int = 0
    y: int = 0
    nvl: bool = False
    served: float = 0.0


def read_pick(built: ServeModel, solver: cp_model.CpSolver) -> Pick:
    """The solution `solver` found for `built`."""
    if not solver.value(built.dis):
        return Pick(False, row=solver.value(built.row))
    assert built.p is not None and built.d is not None and built.served is not None
    assert built.x is not None and built.y is not None and built.nvl is not None
    return Pick(True, p=solver.value(built.p), d=solver.value(built.d), x=solver.value(built.x),
                y=solver.value(built.y), nvl=bool(solver.value(built.nvl)), served=solver.value(built.served) / MILLI)


def exclude(built: ServeModel, solver: cp_model.CpSolver, engine: int | None = None) -> None:
    """Forbid the solution's degrees in the next solve (top-k plans have distinct degrees): the
    aggregated engine `engine` (its index), or with a disaggregated solution its (prefill engine,
    decode engine) pair."""
    if engine is not None:
        built.cp.add(built.engine != engine).only_enforce_if(~built.dis)
        return
    assert built.p_engine is not None and built.d_engine is not None
    pe, de = solver.value(built.p_engine), solver.value(built.d_engine)
    same_p = built.cp.new_bool_var("")
    same_d = built.cp.new_bool_var("")
    built.cp.add(built.p_engine == pe).only_enforce_if(same_p)
    built.cp.add(built.p_engine != pe).only_enforce_if(~same_p)
    built.cp.add(built.d_engine == de).only_enforce_if(same_d)
    built.cp.add(built.d_engine != de).only_enforce_if(~same_d)
    built.cp.add_bool_or([~built.dis, ~same_p, ~same_d])


class FirstPlan(cp_model.CpSolverSolutionCallback):
    """Stops CP-SAT at its first solution that deploys something (any, with the GPUs minimized) and with a
    throughput objective scores at least `floor` (>= 1: the model's empty pick scores 0; the best aggregated
    row that meets the targets, a plan the solve already has); `solve_serve` uses it when the time limit
    leaves no time to search."""

    def __init__(self, objective: cp_model.LinearExprT, maximize: bool, floor: int = 1) -> None:
        super().__init__()
        self.objective, self.maximize, self.floor = objective, maximize, max(1, floor)

    def on_solution_callback(self) -> None:
        if not self.maximize or self.value(self.objective) >= self.floor:
            self.stop_search()


def solve_for_plan(built: ServeModel, solver: cp_model.CpSolver, *, maximize: bool, short: bool,
                   grace_s: float, floor: int = 1) -> int:
    """CP-SAT's status on `built`, never a solution that deploys nothing nor, with a throughput objective,
    one below `floor` (a plan already known) when the grace allows: `short` (too little time to search)
    stops at the first solution at `floor` or above (`FirstPlan`) within `grace_s`; a search whose time
    ran out below it goes on to one within `grace_s`; one that deploys nothing (objective 0) is UNKNOWN."""
    params = solver.parameters
    if short:
        params.max_time_in_seconds = max(params.max_time_in_seconds, grace_s)
        status = solver.solve(built.cp, FirstPlan(built.objective, maximize, floor))
    else:
        status = solver.solve(built.cp)
    if maximize and status == cp_model.FEASIBLE and solver.objective_value < max(1, floor):
        if not short and grace_s > 0:
            params.max_time_in_seconds = grace_s
            status = solver.solve(built.cp, FirstPlan(built.objective, maximize, floor))
        if status == cp_model.FEASIBLE and solver.objective_value <= 0:
            return cp_model.UNKNOWN
    return status
