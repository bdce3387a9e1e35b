"""Serving search: enumerate vLLM-legal engines (TP, PP, expert parallelism, attention DP) with a
reason for every candidate dropped, tabulate each at a ladder of concurrencies with the serving cost
model (both in `autoshard.search.serve.space`), and let CP-SAT pick one row.

Objective: without a request rate, maximize the output tokens/s the deployment delivers per GPU of
the cluster (idle GPUs count as zero), subject to TPOT <= target and TTFT <= target; among equal
throughput a second solve picks the most GPUs at work, then the shortest TTFT. With a request
rate, minimize the GPUs that sustain it (ties: the higher throughput per GPU). Only integers reach the
solver: one index variable selects a table row and `add_element` reads its columns (the model:
`search.serve.model`; the xPyD plan and the auto choice: `search.serve.result`; the messages when no
plan exists: `search.serve.messages`; an evaluated plan: `search.serve.evaluate`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

from ortools.sat.python.cp_model import CpSolver, LinearExprT

from autoshard.costmodel.bands import mark_ties
from autoshard.costmodel.serve.engines import DEFAULT_ENGINE, SGLANG_UNPRICED
from autoshard.errors import InfeasibleError, SolverError, SpecError
from autoshard.plans.base import SolverStats
from autoshard.search.cpsat import has_solution, is_infeasible, is_optimal, new_solver, stop_reason, time_left
from autoshard.search.deadline import Deadline
from autoshard.search.serve.disagg import TIME_CUT, DisaggTables, tabulate_disagg
from autoshard.search.serve.evaluate import evaluated_row
from autoshard.search.serve.ladder import ENUM_TIME_CUT, ROWS_TIME_CUT, best_row, meets_targets
from autoshard.search.serve.messages import (
    check_context_len, disagg_message, no_engine_message, rate_message, target_message, time_cut_text,
)
from autoshard.search.serve.model import (
    Pick, ServeModel, build_model, element, exclude, objective_units, product, read_pick, solve_for_plan,
)
from autoshard.search.serve.pins import check_serve_pins
from autoshard.search.serve.result import deep_gemm_warning, disagg_serve_plan, with_choice
from autoshard.search.serve.space import (
    GPU_MEMORY_UTILIZATION, TIE_SCALE, Row, ServeSpace, enumerate_serve, tabulate,
)
from autoshard.plans.serve import ServePlan
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec

__all__ = ["solve_serve", "evaluate_serve", "model_for_path"]

DISAGGREGATE = ("auto", "on", "off")
_TABLES_SHARE = 0.75
"""Share of the time left that the last table built may take (the aggregated rows, or the prefill/decode
tables of a split-only solve); CP-SAT, the tie-break and the auto choice get the rest (and all the tables
leave unused). Past it the engines left are not tabulated and the plan, chosen from what was, comes back
FEASIBLE (stop_reason time_limit)."""
_SPLIT_FIRST_SHARE = 0.5
"""With `disaggregate` "auto" the prefill/decode tables are built first, in at most this share of the time
left (they take a fraction of the aggregated rows' time: 0.09-0.31 s against 0.4-2.8 s on the commands
`examples/benchmark_solver.py --serve-limits` runs), the aggregated rows in `_TABLES_SHARE` of the rest."""
FIRST_ROW_GRACE_S = 0.8
"""Past its deadline the aggregated tabulation goes on while no row meets the targets and no split deployment
exists, and CP-SAT while no plan exists (stopping at its first plan), for at most this long past the solve's
limit (as a training solve with no plan yet may: `train.solve`); the enumeration (0.01-0.04 s on the commands
above, and what the tables draw on) stops only at the end of this grace."""
_FIRST_PLAN_S = 0.3
"""With less than this left for CP-SAT and no plan yet, it stops at its first plan that serves (`solve_for_plan`)."""

TIME_CUTS = (ENUM_TIME_CUT, TIME_CUT, ROWS_TIME_CUT)
"""The `pruned` reasons of candidates the time limit left unexamined: a plan with any of them is FEASIBLE."""


def _no_plan_message(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, space: ServeSpace,
                     rows: list[Row], disaggregate: str) -> str:
    """Targets no aggregated row meets; else, for a request rate no aggregated engine sustains (also
    when a split was tried beside them), the GPUs it needs in whole engines; else why no split exists."""
    if rows:
        return target_message(job, rows)
    if job.request_rate is not None and disaggregate != "on":
        return rate_message(model, cluster, job, space)
    return disagg_message(model, cluster, job, space)


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
    framework: str = DEFAULT_ENGINE,
    deadline: Deadline | None = None,
) -> list[ServePlan]:
    """The best `top_k` serving plans with distinct degrees, best first, each with its certificate.

    `disaggregate`: "off" plans aggregated replicas only, "on" prefill/decode (xPyD) deployments only,
    "auto" lets the solver choose between both in one model. `framework`: the engine ("vllm" or
    "sglang") every candidate is priced for, as its launch line runs it (`costmodel.serve.engines`).

    Raises SpecError for a job the model cannot take, InfeasibleError (needs X, has Y, nearest fix)
    when no plan fits or meets the targets, SolverError when CP-SAT returns nothing in time.
    The whole call honours `time_limit_s` (counted from `started_at`, a `time.monotonic()` value, when
    given; `deadline`, when given, replaces both): the enumeration, the tables and the top-k solves share
    it, and a plan chosen from tables the deadline cut short is FEASIBLE, stop_reason time_limit, with the
    engines left out counted in `pruned` (`TIME_CUTS`)."""
    deadline = deadline or Deadline(time_limit_s, start=started_at)
    start = time.perf_counter()
    if disaggregate not in DISAGGREGATE:
        raise SpecError(f"disaggregate must be one of {', '.join(DISAGGREGATE)}, got '{disaggregate}'",
                        field="--disaggregate")
    check_serve_pins(model, cluster, pins or {}, disaggregate)
    check_context_len(model, job)  # the plan carries both vLLM's and SGLang's launch lines
    if top_k < 1:
        raise SpecError(f"top_k must be at least 1, got {top_k}")
    grace = deadline.later(FIRST_ROW_GRACE_S)
    space = enumerate_serve(model, cluster, job, pins=pins, framework=framework, deadline=grace)
    if not space.engines:  # (the enumeration stops early only once it has an engine)
        raise InfeasibleError(no_engine_message(model, cluster, job, space))
    rows: list[Row] = []
    dropped: Counter[str] = Counter()
    tables = split = None
    if disaggregate != "off":  # first: the cheaper tables (`_SPLIT_FIRST_SHARE`)
        share = _TABLES_SHARE if disaggregate == "on" else _SPLIT_FIRST_SHARE
        split = tabulate_disagg(model, cluster, job, space, deadline=deadline.part(share))
        tables = split if split.prefill and split.decode else None
    if disaggregate != "on":  # with no split deployment, past the limit until a row meets the targets (a grace)
        rows, dropped = tabulate(model, cluster, job, space, pins=pins, deadline=deadline.part(_TABLES_SHARE),
                                 grace=grace if tables is None else None)
    if split is not None:
        dropped.update(split.dropped)
    pruned = space.reasons() + dropped
    cut = sum(pruned.get(k, 0) for k in TIME_CUTS)  # candidates the deadline left unexamined
    if not rows and tables is None:
        if cut:
            raise SolverError(_time_out(time_limit_s, pruned, len(space.engines)))
        raise InfeasibleError(_no_plan_message(model, cluster, job, space, rows, disaggregate))
    built = build_model(rows, space.engines, job, tables, cluster)
    setup_s = time.perf_counter() - start
    known = best_row(job, rows)  # the aggregated row to start from (a plan whenever it meets the targets)
    if known is not None:
        built.cp.add_hint(built.row, rows.index(known))
    floor = known.objective if known is not None and job.request_rate is None and meets_targets(job, known) else 1
    tie = _tie_key(built, rows, tables, cluster) if job.request_rate is None else None
    plans: list[ServePlan] = []
    while len(plans) < top_k:
        if plans and deadline.remaining() < 0.05:
            break  # the limit is spent: return the plans found so far
        solver = new_solver(num_workers=num_workers, seed=seed)
        solver.parameters.max_time_in_seconds = time_left(deadline, 0.1)
        short = not plans and solver.parameters.max_time_in_seconds < _FIRST_PLAN_S  # no time to search
        t0 = time.perf_counter()
        status = solve_for_plan(built, solver, maximize=job.request_rate is None, short=short,
                                grace_s=0.0 if plans else grace.remaining(), floor=floor)
        wall = time.perf_counter() - t0 + (setup_s if not plans else 0.0)
        if not has_solution(status):
            if plans:
                break  # the plans found so far (no other engine, or no time for one)
            if is_infeasible(status) and cut:  # the engines left out might have met the targets
                raise SolverError(_time_out(time_limit_s, pruned, len(space.engines), "meeting the targets "))
            if is_infeasible(status):
                raise InfeasibleError(_no_plan_message(model, cluster, job, space, rows, disaggregate))
            raise SolverError(
                f"no deployment found within the {time_limit_s:g} s time limit ({len(space.engines)} candidate "
                "engines in the model, none placed before the limit): raise --time-limit"
            )
        in_model = len(rows) + (len(tables.prefill) + len(tables.decode) if tables else 0)
        stats = SolverStats(
            # a plan chosen from tables the deadline cut short is the best of what was tabulated only
            status="FEASIBLE" if cut else solver.status_name(status),
            # gap limit 0: CP-SAT stops short of a proof only at its time limit, the rest of the deadline
            stop_reason=stop_reason(is_optimal(status) and not cut, status, time_cut=bool(cut)),
            wall_s=wall,
            objective=objective_units(job, solver.objective_value),
            bound=objective_units(job, solver.best_objective_bound),
            conflicts=solver.num_conflicts,
            branches=solver.num_branches,
            candidates=in_model + pruned.total(), candidates_in_model=in_model,
            pruned=dict(pruned),
        )
        if tie is not None and is_optimal(status) and deadline.remaining() > 0.05:
            limit = min(time_left(deadline, 0.1), max(1.0, 2 * solver.wall_time))  # leave time for the rest
            solver = _break_tie(built, tie, round(solver.objective_value), solver, limit, num_workers, seed)
        pick = read_pick(built, solver)
        plans.append(_picked_plan(model, cluster, job, rows, tables, pick, stats))
        exclude(built, solver, None if pick.disaggregated else space.engines.index(rows[pick.row].engine))
    if disaggregate == "auto" and rows and tables is not None:
        other = _best_other(
            model, cluster, job, rows, tables, space, plans[0], time_left(deadline, 0.1), num_workers,
            seed,
        )
        plans[0] = with_choice(job, plans[0], other)
    if framework == "sglang" and (left := pruned.get(SGLANG_UNPRICED, 0)):
        note = (f"{left} engine(s) with attention DP + EP left out: {SGLANG_UNPRICED}; --target vllm plans them "
                "(vLLM's line runs DeepEP)")
        plans = [dataclasses.replace(p, warnings=(*p.warnings, note)) for p in plans]
    return mark_ties(plans)


def _time_out(time_limit_s: float, pruned: Counter[str], engines: int, what: str = "") -> str:
    """No deployment (`what`: "meeting the targets ") among what was tabulated before the time limit."""
    return (f"no deployment {what}found within the {time_limit_s:g} s time limit "
            f"({time_cut_text(pruned, engines)} before it): raise --time-limit")


def _tie_key(built: ServeModel, rows: list[Row], tables: DisaggTables | None,
             cluster: ClusterSpec) -> LinearExprT:
    """Among plans of equal throughput per cluster GPU, the one a user expects (more is better): the most
    GPUs at work (the cluster is paid for: spare GPUs become prefill capacity), then the shortest TTFT
    (prefill + first decode step, at the planned load)."""
    cp, parts, ttft = built.cp, [], []
    if rows:
        extra = [0] if tables is not None else []
        parts.append(element(cp, built.row, [r.gpus for r in rows] + extra, "tie_gpus"))
        ttft.append(element(cp, built.row, [r.ttft_us for r in rows] + extra, "tie_ttft_us"))
    if tables is not None:
        assert built.p is not None and built.d is not None and built.x is not None and built.y is not None
        total = cluster.num_gpus
        for var, count, table in ((built.p, built.x, tables.prefill), (built.d, built.y, tables.decode)):
            gpus = element(cp, var, [r.engine.gpus for r in table], "tie_role_gpus")
            parts.append(product(cp, count, gpus, total, "tie_role_gpus_total"))
        p_ttft = element(cp, built.p, [r.ttft_us for r in tables.prefill], "tie_prefill_ttft_us")
        d_first = element(cp, built.d, [r.first_us for r in tables.decode], "tie_decode_first_us")
        ttft.append(product(cp, built.dis, p_ttft, 10**12, "tie_split_prefill_ttft_us"))
        ttft.append(product(cp, built.dis, d_first, 10**12, "tie_split_first_step_us"))
    return sum(parts) * TIE_SCALE**2 - sum(ttft)


def _break_tie(built: ServeModel, key: LinearExprT, value: int, solver: CpSolver, limit_s: float,
               num_workers: int, seed: int) -> CpSolver:
    """A solver holding the plan of objective `value` (the proven optimum) that maximizes `key`; `solver`
    when that solve finds nothing within `limit_s`. The model keeps its objective afterwards."""
    cp = built.cp
    at_best = cp.new_bool_var("at_the_optimum")
    cp.add(built.objective == value).only_enforce_if(at_best)
    cp.clear_objective()
    cp.maximize(key)
    cp.add_assumptions([at_best])
    second = new_solver(num_workers=num_workers, seed=seed)
    second.parameters.max_time_in_seconds = limit_s
    status = second.solve(cp)
    cp.clear_assumptions()
    cp.clear_objective()
    cp.maximize(built.objective)
    return second if has_solution(status) else solver


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
        built = build_model(rows, space.engines, job)
    else:
        built = build_model([], space.engines, job, tables, cluster)
    solver = new_solver(num_workers=num_workers, seed=seed)
    solver.parameters.max_time_in_seconds = time_limit_s
    status = solver.solve(built.cp)
    if not has_solution(status):
        return None
    stats = SolverStats(
        status=solver.status_name(status),
        stop_reason=stop_reason(is_optimal(status), status),
        wall_s=solver.wall_time,
        objective=objective_units(job, solver.objective_value),
        bound=objective_units(job, solver.best_objective_bound),
    )
    return _picked_plan(model, cluster, job, rows, tables, read_pick(built, solver), stats)


def _picked_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    rows: list[Row],
    tables: DisaggTables | None,
    pick: Pick,
    stats: SolverStats,
) -> ServePlan:
    """The plan of a solution read off the model (no launch commands: the API attaches them)."""
    if not pick.disaggregated:
        return _plan(model, cluster, job, rows[pick.row], stats)
    assert tables is not None
    return disagg_serve_plan(
        model, cluster, job, tables.prefill[pick.p], tables.decode[pick.d], pick.x, pick.y, pick.nvl, stats, pick.served
    )


def _plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    row: Row,
    stats: SolverStats,
    warnings: tuple[str, ...] = (),
) -> ServePlan:
    e, cfg = row.engine, row.config
    dp = e.dp_attention * row.replicas  # attention-DP ranks of one engine, or replicas
    if (note := deep_gemm_warning(model, cfg, cluster.pools[e.pool].gpu.name)) is not None:
        warnings = (*warnings, note)
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
    tp: int, pp: int = 1, dp: int = 1,
    expert_parallel: bool = False, attention_dp: bool = False,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
    pool: int = 0,
    warnings: tuple[str, ...] = (),
    concurrency: int | None = None,
    nccl_nvls: bool | None = None, deep_gemm: bool | None = None,
    framework: str = DEFAULT_ENGINE,
    max_len_flag: str | None = None,
    role: str = "aggregated",
    all2all_backend: str | None = None, allow_long_context: bool = False, hybrid_kv_cache: bool | None = None,
) -> ServePlan:
    """Predictions for a plan the user already has (vLLM semantics: --enable-expert-parallel makes
    EP = TP x DP over one engine; `attention_dp`: SGLang's attention DP with the experts TP-sharded over
    all TP x DP GPUs of one engine, `costmodel.serve.dp_tp_moe`). `concurrency`: requests in flight over the whole deployment (default:
    as many as max_num_seqs and the KV cache allow). Raises InfeasibleError if it would not start,
    SpecError if illegal. `framework`: the engine it runs on; `nccl_nvls` / `deep_gemm`: what its command
    sets, where that differs from the engine's launch defaults (None: the defaults); `max_len_flag`: the
    command's option for the max model length when the plan was read from a launch line (a context past
    the model's is refused naming it and that engine's own refusal; None: autoshard's --max-model-len);
    `role`: "prefill" prices a vLLM attention-DP + EP engine on `--all2all-backend deepep_high_throughput`
    (every step on DeepEP's normal kernels, its fixed buffers, no CUDA graphs: `ServeConfig.role`);
    `all2all_backend`: a vLLM line's --all2all-backend (`evaluate.batched_dp_backend`); `allow_long_context`:
    its environment lets its engine start past the model's context (`messages.check_context_len`: a note)."""
    warnings = (*warnings, *filter(None, [check_context_len(
        model, job, flag=max_len_flag or "--max-model-len", engine=max_len_flag and framework, allow_long=allow_long_context)]))
    row, stats, warn = evaluated_row(
        model, cluster, job, tp=tp, pp=pp, dp=dp, expert_parallel=expert_parallel, attention_dp=attention_dp,
        gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, pool=pool, warnings=warnings, concurrency=concurrency,
        nccl_nvls=nccl_nvls, deep_gemm=deep_gemm, framework=framework, role=role, carry=True,
        all2all_backend=all2all_backend, hybrid_kv_cache=hybrid_kv_cache,
    )
    return _plan(model, cluster, job, row, stats, warn)


def model_for_path(path: str, flag: str = "--from-vllm") -> ModelSpec:
    """The bundled model a launcher's model path names: its Hugging Face repo id (an -Instruct or
    -FP8 variant of it too), a checkpoint it lists, or its bundled name. Raises SpecError naming `flag` (the option that gave
    the command) when none matches."""
    from autoshard.plans.serve import model_path
    from autoshard.specs.loader import bundled_models, load_model

    wanted = path.rstrip("/").lower()
    stem = wanted.rsplit("/", 1)[-1]
    matches: list[tuple[int, ModelSpec]] = []
    for name in bundled_models():
        spec = load_model(name)
        repo = model_path(spec).lower()
        base = repo.rsplit("/", 1)[-1]
        if wanted in (repo, name) or stem in (base, name) or wanted in {c.repo.lower() for c in spec.checkpoints}:
            return spec  # (a checkpoint's repo: another release of the same architecture, e.g. DeepSeek-R1)
        if stem.startswith((base + "-", name + "-")):
            matches.append((len(name), spec))
    if matches:
        return max(matches, key=lambda m: m[0])[1]
    raise SpecError(
        f"cannot tell which model '{path}' is: pass MODEL (a bundled name, a YAML file or its "
        "config.json) before the cluster",
        field=flag,
    )
