"""Serving search: enumerate vLLM-legal engines (TP, PP, expert parallelism, attention DP) with a
reason for every candidate dropped, tabulate each at a ladder of concurrencies with the serving cost
model (both in `autoshard.search.serve_space`, re-exported here), and let CP-SAT pick one row.

Objective: without a request rate, maximize the output tokens/s the deployment delivers per GPU of
the cluster (idle GPUs count as zero), subject to TPOT <= target and TTFT <= target. With a request
rate, minimize the GPUs that sustain it (ties: the higher throughput per GPU). Only integers reach the
solver: one index variable selects a table row and `add_element` reads its columns.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from autoshard.costmodel.serving import predict_serve, total_weight_bytes
from autoshard.errors import InfeasibleError, SolverError, SpecError
from autoshard.plan import SolverStats
from autoshard.search.deadline import Deadline
from autoshard.search.serve_space import (
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
from autoshard.serve_plan import ServePlan
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
    objective: cp_model.IntVar


def _build(rows: list[Row], engines: list[Engine], job: ServeJob) -> _Model:
    cp = cp_model.CpModel()
    row = cp.new_int_var(0, len(rows) - 1, "row")
    engine_ids = [engines.index(r.engine) for r in rows]
    engine = cp.new_int_var(0, len(engines) - 1, "engine")
    cp.add_element(row, engine_ids, engine)
    if job.tpot_target_s is not None:
        tpot = cp.new_int_var(0, max(r.tpot_us for r in rows), "tpot_us")
        cp.add_element(row, [r.tpot_us for r in rows], tpot)
        cp.add(tpot <= time_to_us(job.tpot_target_s))
    if job.ttft_target_s is not None:
        ttft = cp.new_int_var(0, max(r.ttft_us for r in rows), "ttft_us")
        cp.add_element(row, [r.ttft_us for r in rows], ttft)
        cp.add(ttft <= time_to_us(job.ttft_target_s))
    values = [r.objective for r in rows]
    objective = cp.new_int_var(min(values), max(values), "objective")
    cp.add_element(row, values, objective)
    if job.request_rate is None:
        cp.maximize(objective)
    else:
        cp.minimize(objective)
    return _Model(cp, row, engine, objective)


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
    started_at: float | None = None,
) -> list[ServePlan]:
    """The best `top_k` serving plans with distinct degrees, best first, each with its certificate.

    Raises SpecError for a job the model cannot take, InfeasibleError (needs X, has Y, nearest fix)
    when no plan fits or meets the targets, SolverError when CP-SAT returns nothing in time.
    The whole call honours `time_limit_s` (counted from `started_at`, a `time.monotonic()` value, when
    given): the top-k solves share what the setup leaves."""
    deadline = Deadline(time_limit_s, start=started_at)
    start = time.perf_counter()
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
    rows, dropped = tabulate(model, cluster, job, space, pins=pins)
    if not rows:
        raise InfeasibleError(_rate_message(model, cluster, job, space))
    pruned = space.reasons() + dropped
    built = _build(rows, space.engines, job)
    setup_s = time.perf_counter() - start
    sign = 1 if job.request_rate is None else -1
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
                raise InfeasibleError(_target_message(job, rows))
            raise SolverError(
                f"CP-SAT returned {solver.status_name(status)} within {time_limit_s} s: raise --time-limit"
            )
        chosen = rows[solver.value(built.row)]
        stats = SolverStats(
            status=solver.status_name(status),
            wall_s=wall,
            objective=_objective_units(job, solver.objective_value),
            bound=_objective_units(job, solver.best_objective_bound),
            conflicts=solver.num_conflicts,
            branches=solver.num_branches,
            candidates=space.enumerated,
            candidates_in_model=len(rows),
            pruned=dict(pruned),
        )
        plans.append(_plan(model, cluster, job, chosen, stats))
        built.cp.add(built.engine != space.engines.index(chosen.engine))
    return plans


def _plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    row: Row,
    stats: SolverStats,
    warnings: tuple[str, ...] = (),
) -> ServePlan:
    from autoshard.emit.sglang import sglang_command
    from autoshard.emit.vllm import vllm_command

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
    return plan.with_launch({"vllm": vllm_command(plan), "sglang": sglang_command(plan)})


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
) -> ServePlan:
    """Predictions for a plan the user already has (vLLM semantics: --enable-expert-parallel makes
    EP = TP x DP over one engine). Raises InfeasibleError if it would not start, SpecError if illegal."""
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
    pred = predict_serve(model, spec, job, cfg)
    stats = SolverStats(
        status="EVALUATED",
        wall_s=0.0,
        objective=pred.tokens_per_s_per_gpu,
        bound=pred.tokens_per_s_per_gpu,
        candidates=1,
        candidates_in_model=0,
    )
    row = Row(e, cfg, pred, replicas, 0, time_to_us(pred.tpot_s), time_to_us(pred.ttft_s))
    return _plan(model, cluster, job, row, stats, tuple(warn))


def evaluate_vllm(model: ModelSpec | None, cluster: ClusterSpec, command: str, *, job: ServeJob) -> ServePlan:
    """`evaluate --from-vllm`: read the plan from a `vllm serve` command line and predict it. The
    command's --max-model-len, --quantization and --kv-cache-dtype override the job's. With no model
    given, the command's model path must name a bundled model's Hugging Face repository."""
    from autoshard.emit.serve_parse import parse_vllm

    parsed = parse_vllm(command)
    if model is None:
        model = model_for_path(parsed.model)
    return evaluate_serve(
        model,
        cluster,
        parsed.apply_to(job),
        tp=parsed.tp,
        pp=parsed.pp,
        dp=parsed.dp,
        expert_parallel=parsed.enable_expert_parallel,
        gpu_memory_utilization=parsed.gpu_memory_utilization,
        max_num_seqs=parsed.max_num_seqs,
        max_num_batched_tokens=parsed.max_num_batched_tokens,
        warnings=parsed.warnings,
    )


def model_for_path(path: str) -> ModelSpec:
    """The bundled model a launcher's model path names: its Hugging Face repo id (an -Instruct or
    -FP8 variant of it too) or its bundled name. Raises SpecError when none matches."""
    from autoshard.serve_plan import model_path
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
