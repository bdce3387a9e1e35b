"""Pre-provisioning cost studies: the best plan for every (cluster kind, GPU count), what it costs in
days and dollars, and the answers a buyer wants first (cheapest within a deadline, fastest within a
budget, the Pareto front of time vs cost).

    from autoshard.study.run import run_study
    result = run_study("llama-3.1-70b", ["dgx-h100", "dgx-b200"], [512, 1024], tokens=15e12)
    print(result.answers[0].text)

Solves run through the search layer (`autoshard.search.train.solve.solve_train`,
`autoshard.search.serve.solve.solve_serve`) in worker processes, one CP-SAT worker each; the specs are
loaded and validated once in the parent and handed to every worker when it starts
(`autoshard.study.runner`). Rows, cost arithmetic and answers live in `autoshard.study.costs`;
rendering lives in `autoshard.study.report`, the output set on disk in `autoshard.study.files`, the
serving fronts in `autoshard.study.front`. The study never imports `autoshard.api`:
`autoshard.api.study` is its public entry.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any

from autoshard.emit.vllm.command import check_checkpoint, serve_weight_dtype
from autoshard.errors import InfeasibleError, SolverError, SpecError
from autoshard.specs.base import MAX_GPUS
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob, TrainJob, WeightDtype
from autoshard.specs.model import ModelSpec
from autoshard.study.costs import (
    Row,
    ServeRow,
    Skipped,
    StudyResult,
    TrainRow,
    _serve_answers,
    _train_answers,
    cluster_price,
    deployment_price,
    pareto_front,
    pool_prices,
    serve_costs,
    train_costs,
    train_ranges,
)
from autoshard.study.runner import ProgressFn, TimedOut, _gpu_names, _run_tasks, _sized

__all__ = ["STUDY_RELATIVE_GAP", "run_study"]

MAX_STUDY_SIZES = 64
MAX_STUDY_CLUSTERS = 16
"""A study solves every (cluster, size): at most 16 x 64 solves, each up to --time-limit."""
MAX_PRICE = 10_000.0
"""Dollars per GPU-hour a --price may say (list prices are a few dollars)."""

STUDY_RELATIVE_GAP = 0.01
"""CP-SAT stops once the plan is proven within 1 % of the best possible step time: far below the cost
model's own error, and it lets large sizes finish well inside the time limit."""


# ----------------------------------------------------------------------------- orchestration


def _load_clusters(clusters: Sequence[str | ClusterSpec]) -> dict[str, ClusterSpec]:
    from autoshard.specs import load_cluster

    out: dict[str, ClusterSpec] = {}
    for ref in clusters:
        spec = ref if isinstance(ref, ClusterSpec) else load_cluster(ref)
        key = ref if isinstance(ref, str) else spec.name
        if key in out:
            raise SpecError(f"cluster '{key}' is given twice: list each cluster once", source="--cluster")
        out[key] = spec
    if not out:
        raise SpecError("give at least one cluster to compare, e.g. --cluster dgx-h100", source="--cluster")
    return out


def _overrides(clusters: dict[str, ClusterSpec], overrides: dict[str, float]) -> dict[str, float]:
    """The --price overrides by cluster key (a cluster named by its key or its file's name)."""
    out: dict[str, float] = {}
    for name, usd in overrides.items():
        named = [k for k, spec in clusters.items() if spec.name == name]
        if name not in clusters and len(named) > 1:
            raise SpecError(f"'{name}' names {len(named)} studied clusters ({', '.join(named)}): give the --cluster "
                            "value of the one to price", source="--price")
        key = name if name in clusters else (named[0] if named else None)
        if key is None:
            raise SpecError(f"'{name}' is not one of the studied clusters ({', '.join(clusters)}): "
                            "name a cluster given with --cluster", source="--price")
        if not math.isfinite(usd) or usd <= 0 or usd > MAX_PRICE:
            raise SpecError(f"price for '{name}' must be a positive finite number of dollars per GPU-hour, at most "
                            f"{MAX_PRICE:g}; got {usd}", source="--price")
        if key in out:  # the same cluster under its key and its file's name: the last one silently won
            raise SpecError(f"'{name}' prices the cluster '{key}' a second time: give one --price per cluster",
                            source="--price")
        out[key] = usd
    return out


def _prices(clusters: dict[str, ClusterSpec], overrides: dict[str, float]) -> dict[str, float | None]:
    """Dollars per GPU-hour of each cluster: its pools' GPU-weighted mean, or its --price."""
    prices: dict[str, float | None] = {key: cluster_price(spec) for key, spec in clusters.items()}
    prices.update(_overrides(clusters, overrides))
    return prices


def _pool_prices(clusters: dict[str, ClusterSpec], overrides: dict[str, float]) -> dict[str, tuple[float | None, ...]]:
    """Dollars per GPU-hour of each cluster's pools (a --price sets every pool of its cluster)."""
    over = _overrides(clusters, overrides)
    return {key: pool_prices(spec, over.get(key)) for key, spec in clusters.items()}


def run_study(
    model: str | ModelSpec,
    clusters: Sequence[str | ClusterSpec],
    sizes: Sequence[int],
    *,
    mode: str = "train",
    tokens: float | None = None,
    deadline_days: float | None = None,
    budget_usd: float | None = None,
    prices: dict[str, float] | None = None,
    seq_len: int | None = None,
    global_batch_size: int | None = None,
    precision: str | None = None,
    serve_job: ServeJob | None = None,
    request_rate: float | None = None,
    tpot_ms: float | None = None,
    ttft_s: float | None = None,
    time_limit_s: float = 60.0,
    relative_gap: float = STUDY_RELATIVE_GAP,
    jobs: int = 0,
    progress: ProgressFn | None = None,
    started_at: float | None = None,
    share: float = 1.0,
) -> StudyResult:
    """Solve every (cluster, size) and assemble the study. `time_limit_s` bounds the whole study, counted
    from `started_at` (a time.monotonic() value; default: now): the sizes share `share` of it (the rest is
    the caller's, e.g. the serving fronts), each solved within `task_time_limit`. Raises SpecError for bad
    input and InfeasibleError when no size of any cluster can run the job."""
    from autoshard.specs import load_model
    from autoshard.specs.prepare import train_job

    start = time.perf_counter()
    started_at = time.monotonic() if started_at is None else started_at
    model_spec = model if isinstance(model, ModelSpec) else load_model(model)
    specs = _load_clusters(clusters)
    price = _prices(specs, dict(prices or {}))
    per_pool = _pool_prices(specs, dict(prices or {}))
    sizes = sorted(set(sizes))
    if not sizes or min(sizes) < 1:
        raise SpecError("give at least one positive GPU count, e.g. --gpus 64,128", source="--gpus")
    if max(sizes) > MAX_GPUS:
        raise SpecError(f"{max(sizes)} GPUs is more than autoshard plans for (at most {MAX_GPUS})", source="--gpus")
    if len(sizes) > MAX_STUDY_SIZES or len(specs) > MAX_STUDY_CLUSTERS:
        raise SpecError(f"{len(specs)} clusters x {len(sizes)} sizes is more than one study solves (at most "
                        f"{MAX_STUDY_CLUSTERS} clusters and {MAX_STUDY_SIZES} sizes): split it", source="--gpus/--cluster")
    for flag, value in (("--deadline-days", deadline_days), ("--budget-usd", budget_usd)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise SpecError(f"must be a positive finite number, got {value}", source=flag)
    if mode not in ("train", "serve"):
        raise SpecError(f"mode must be train or serve, got '{mode}'", source="--mode")
    job: TrainJob | ServeJob
    if mode == "train":
        for flag, value in (("--request-rate", request_rate), ("--tpot-ms", tpot_ms), ("--ttft-s", ttft_s),
                            ("serve_job", serve_job)):
            if value is not None:
                raise SpecError("applies to serving studies only: add --mode serve", source=flag)
        job = train_job(model_spec, seq_len=seq_len, global_batch_size=global_batch_size, precision=precision,
                        tokens=tokens)
        if job.tokens is None:
            raise SpecError(f"how many tokens to train? {model_spec.name} has no training.tokens: pass --tokens "
                            "(e.g. --tokens 15e12)", source="--tokens")
    else:
        for flag, value in (("--deadline-days", deadline_days), ("--budget-usd", budget_usd), ("--tokens", tokens),
                            ("--seq-len", seq_len), ("--global-batch-size", global_batch_size)):
            if value is not None:  # a serving study's request lengths are --input-len / --output-len's
                raise SpecError("applies to training studies only: drop it or use --mode train", source=flag)
        job = serve_job or _serve_job(model_spec, precision, request_rate, tpot_ms, ttft_s)
    tasks: list[tuple[str, int]] = []
    skipped: list[Skipped] = []
    for key, spec in specs.items():
        for n in sizes:
            try:
                _sized(spec, n)
            except ValueError as exc:
                skipped.append(Skipped(key, n, str(exc)))
                continue
            tasks.append((key, n))
    jobs = jobs or os.cpu_count() or 1
    per_task = task_time_limit(time_limit_s * share - (time.monotonic() - started_at), len(tasks), jobs)
    init_args = (model_spec, specs, job, per_task, relative_gap)
    found = _run_tasks(tasks, init_args, jobs, progress, cap=per_task, end=started_at + time_limit_s * share)
    order = {key: i for i, key in enumerate(specs)}
    found.sort(key=lambda r: (order[r[0]], r[1]))
    rows: list[Row] = []
    for key, n, figures, reason in found:
        if figures is None:
            skipped.append(Skipped(key, n, str(reason or "no plan"), isinstance(reason, TimedOut)))
        elif isinstance(job, TrainJob):
            rows.append(_train_row(key, n, figures, float(job.tokens or 0), price[key]))
        else:
            rows.append(_serve_row(key, n, figures, job, deployment_price(per_pool[key], figures["pool_gpus"])))
    skipped.sort(key=lambda s: (order[s.cluster], s.num_gpus))
    if not rows:
        lines = "\n".join(f"  {s.cluster} x {s.num_gpus}: {s.reason}" for s in skipped)
        if not tasks:  # no size is a whole number of any cluster's nodes: bad input (exit 2), not "no plan"
            raise SpecError(f"no studied size fits the clusters' nodes:\n{lines}", source="--gpus")
        if any(s.timed_out for s in skipped):  # unknown, as solve reports a time-out (status "unknown")
            raise SolverError(f"no plan of {model_spec.name} was found within the study's {time_limit_s:g} s "
                              f"--time-limit ({sum(s.timed_out for s in skipped)} of {len(skipped)} size(s) timed "
                              f"out; raise --time-limit):\n{lines}")
        raise InfeasibleError(f"no studied size can run {model_spec.name}:\n{lines}")
    priced = [i for i, r in enumerate(rows) if r.y is not None]
    pareto: list[Row] = []
    for i in pareto_front([(rows[j].x, rows[j].y or 0.0) for j in priced]):
        r = rows[priced[i]]  # the same deployment offered more GPUs than it uses is one option, not several
        if not any((p.cluster, p.plan, p.x, p.y) == (r.cluster, r.plan, r.x, r.y) for p in pareto):
            pareto.append(r)
    if isinstance(job, TrainJob):
        answers = _train_answers([r for r in rows if isinstance(r, TrainRow)], deadline_days, budget_usd)
    else:
        answers = _serve_answers([r for r in rows if isinstance(r, ServeRow)], job.request_rate)
    result = StudyResult(
        mode=mode, inputs=_inputs(model_spec, specs, sizes, job, price, prices or {}, deadline_days, budget_usd,
                                  (time_limit_s, per_task), relative_gap),
        rows=rows, skipped=skipped, answers=answers, pareto=pareto,
    )
    result.notes = _notes(result, price)
    result.assumptions = _assumptions(result, specs, price, _overrides(specs, dict(prices or {})), job,
                                      {k: _source(ref) for k, ref in zip(specs, clusters)})
    result.wall_s = time.perf_counter() - start
    return result


MIN_TASK_TIME_LIMIT_S = 0.5
"""The least time one size's solve gets: a study whose limit leaves its sizes less is refused."""


def task_time_limit(budget_s: float, tasks: int, jobs: int) -> float:
    """Seconds each of `tasks` solves gets for the study to end within `budget_s` on `jobs` parallel
    processes: the budget over the rounds of solves (ceil(tasks / jobs)). SpecError naming --time-limit
    when that is under MIN_TASK_TIME_LIMIT_S."""
    rounds = -(-max(tasks, 1) // max(jobs, 1))
    if budget_s / rounds < MIN_TASK_TIME_LIMIT_S:
        # more processes only help while the sizes take several rounds
        fix = "raise --time-limit, study fewer sizes or give more --jobs" if rounds > 1 else "raise --time-limit"
        raise SpecError(f"{tasks} size(s) on {jobs} parallel process(es) need at least {MIN_TASK_TIME_LIMIT_S:g} s "
                        f"each, {rounds * MIN_TASK_TIME_LIMIT_S:g} s of solving, and the limit leaves "
                        f"{max(budget_s, 0):.1f} s after start-up: {fix}", source="--time-limit")
    return budget_s / rounds


def _serve_job(model: ModelSpec, precision: str | None, rate: float | None, tpot_ms: float | None,
               ttft_s: float | None) -> ServeJob:
    from autoshard.specs.loader import validate

    data: dict[str, Any] = {}
    if model.serving is not None:
        for key in ("input_len", "output_len", "max_model_len"):
            if getattr(model.serving, key) is not None:
                data[key] = getattr(model.serving, key)
    dtype = precision or (model.serving.precision if model.serving else None)
    if dtype is not None and dtype not in {d.value for d in WeightDtype}:
        raise SpecError(f"'{dtype}' is not a serving weight type: use "
                        f"{', '.join(d.value for d in WeightDtype)}", source="--precision")
    # a quantized-only repository (DeepSeek-V3's FP8) decides the default and refuses what it cannot load
    dtype = serve_weight_dtype(model, dtype, flag="--precision")
    if dtype is not None:
        data["weight_dtype"] = dtype
    if rate is not None:
        data["request_rate"] = rate
    if tpot_ms is not None:
        data["tpot_target_s"] = tpot_ms / 1e3
    if ttft_s is not None:
        data["ttft_target_s"] = ttft_s
    job = validate(ServeJob, data, source=f"serving job for {model.name}")
    check_checkpoint(model, job.weight_dtype, flag="--precision")  # as solve's --weight-dtype: before solving
    return job


def _train_row(key: str, n: int, f: dict[str, Any], tokens: float, price: float | None) -> TrainRow:
    days, gpu_hours, total, per_m = train_costs(tokens=tokens, tokens_per_s=f["tokens_per_s"], num_gpus=n,
                                                price_per_gpu_hour=price)
    d_lo, d_hi, usd_lo, usd_hi = train_ranges(tokens=tokens, band=f["tokens_per_s_band"], num_gpus=n,
                                              price_per_gpu_hour=price)
    return TrainRow(cluster=key, gpu=f["gpu"], num_gpus=n, plan=f["plan"], degrees=f["degrees"], status=f["status"],
                    gap=f["gap"], solve_s=f["solve_s"], mfu=f["mfu"], tokens_per_s=f["tokens_per_s"], days=days,
                    gpu_hours=gpu_hours, price_per_gpu_hour=price, total_usd=total, usd_per_million_tokens=per_m,
                    days_low=d_lo, days_high=d_hi, total_usd_low=usd_lo, total_usd_high=usd_hi,
                    band_basis=f["band_basis"], useful_mfu=f.get("useful_mfu"), sanity=f.get("sanity", ""))


def _serve_row(key: str, n: int, f: dict[str, Any], job: ServeJob, price: float | None) -> ServeRow:
    capacity = f["throughput_tokens_per_s"]
    served = min(capacity, job.request_rate * job.output_len) if job.request_rate else capacity
    per_hour, per_m = serve_costs(gpus_used=f["gpus_used"], served_tokens_per_s=served, price_per_gpu_hour=price)
    lo, hi = f["throughput_band"]
    limit = job.request_rate * job.output_len if job.request_rate else float("inf")
    per_m_hi = serve_costs(gpus_used=f["gpus_used"], served_tokens_per_s=min(lo, limit), price_per_gpu_hour=price)[1]
    per_m_lo = serve_costs(gpus_used=f["gpus_used"], served_tokens_per_s=min(hi, limit), price_per_gpu_hour=price)[1]
    return ServeRow(cluster=key, gpu=f["gpu"], num_gpus=n, plan=f["plan"], gpus_used=f["gpus_used"],
                    status=f["status"], throughput_tokens_per_s=capacity, served_tokens_per_s=served,
                    requests_per_s=capacity / job.output_len, ttft_s=f["ttft_s"], tpot_s=f["tpot_s"],
                    meets_targets=f["meets_targets"], price_per_gpu_hour=price, usd_per_hour=per_hour,
                    usd_per_million_output_tokens=per_m, throughput_tokens_per_s_low=lo,
                    throughput_tokens_per_s_high=hi, usd_per_million_output_tokens_low=per_m_lo,
                    usd_per_million_output_tokens_high=per_m_hi, band_basis=f["band_basis"])


def _inputs(model: ModelSpec, specs: dict[str, ClusterSpec], sizes: list[int], job: TrainJob | ServeJob,
            price: dict[str, float | None], overrides: dict[str, float], deadline: float | None,
            budget: float | None, limits: tuple[float, float], gap: float) -> dict[str, Any]:
    """`limits`: the study's --time-limit and each size's share of it."""
    return {
        "model": model.name, "params": model.num_params, "clusters": list(specs), "sizes": sizes,
        "job": job.model_dump(mode="json"), "tokens": job.tokens if isinstance(job, TrainJob) else None,
        "deadline_days": deadline, "budget_usd": budget, "prices_usd_per_gpu_hour": price,
        "price_overrides": dict(overrides), "time_limit_s": limits[0], "task_time_limit_s": limits[1],
        "relative_gap": gap,
    }


def _notes(result: StudyResult, price: dict[str, float | None]) -> list[str]:
    notes = []
    unpriced = [k for k, v in price.items() if v is None]
    if unpriced:
        notes.append(f"No price for {', '.join(unpriced)}: their $ columns are n/a and they are left out of the "
                     "dollar answers and the Pareto front (set one with --price CLUSTER=USD_PER_GPU_HOUR).")
    open_gap = [r for r in result.rows if r.status != "optimal"]
    if open_gap:
        worst = max((getattr(r, "gap", 0.0) for r in open_gap), default=0.0)
        notes.append(f"{len(open_gap)} of {len(result.rows)} plans are the best found within the solver's time or "
                     f"gap limit rather than proven optimal (largest remaining gap {_pct(worst)}); a longer "
                     "--time-limit can only make them faster.")
    if any(isinstance(r, ServeRow) and not r.meets_targets for r in result.rows):
        notes.append("Some serving plans miss a latency target (see the table).")
    return notes


def _pct(x: float) -> str:
    """A gap as the table writes it: a percentage (the note said 6.6e-06 beside the table's 0.00066%)."""
    return f"{x:.1%}" if x >= 0.01 else f"{100 * x:.2g}%"


def _source(ref: str | ClusterSpec) -> str:
    """Where a studied cluster's price comes from: its file as given, a bundled file, or the spec object."""
    if isinstance(ref, ClusterSpec):
        return "its ClusterSpec"
    if ref.endswith((".yaml", ".yml", ".json")) or "/" in ref or "\\" in ref:
        return ref  # a user's ./h/x.yaml, not clusters/<its name>.yaml
    return f"clusters/{ref}.yaml"


def _assumptions(result: StudyResult, specs: dict[str, ClusterSpec], price: dict[str, float | None],
                 overrides: dict[str, float], job: TrainJob | ServeJob, sources: dict[str, str]) -> list[str]:
    """`overrides`: the --price overrides by cluster key (`_overrides`): a second cluster of the same name
    is not overridden by the first's --price."""
    out = []
    for key, spec in specs.items():
        usd = price[key]
        src = "--price override" if key in overrides else sources[key]
        if usd is not None and len(spec.pools) > 1 and key not in overrides:
            src += "; pools " + ", ".join(f"{p.name} ${p.price_per_gpu_hour:.2f}" for p in spec.pools
                                          if p.price_per_gpu_hour is not None)
            src += ", a deployment priced at the pools it uses" if isinstance(job, ServeJob) else ""
        out.append(f"{key}: {_gpu_names(spec)}, " + (f"${usd:.2f} per GPU-hour ({src})." if usd is not None
                                                           else "no price."))
    if isinstance(job, TrainJob):
        out.append(f"Job: sequence length {job.seq_len}, global batch {job.global_batch_size} sequences, "
                   f"{job.precision.value}, {job.optimizer.value}; {job.tokens:.3g} tokens. Days = tokens / "
                   "predicted tokens/s / 86400, run at the predicted steady-state speed with no failures, "
                   "restarts, evaluation or checkpoint stalls; dollars = GPU-hours x price, paying for every GPU "
                   "of the size for the whole run.")
    else:
        out.append(f"Job: {job.input_len} input + {job.output_len} output tokens per request, weights "
                   f"{job.weight_dtype.value}, KV cache {job.kv_cache_dtype.value}"
                   + (f", {job.request_rate:g} requests/s" if job.request_rate else "")
                   + (f", TPOT <= {job.tpot_target_s * 1e3:g} ms" if job.tpot_target_s else "")
                   + (f", TTFT <= {job.ttft_target_s:g} s" if job.ttft_target_s else "")
                   + ". Dollars per million output tokens = the GPUs the deployment uses x price / tokens served "
                   "(at the request rate when given, else at full throughput).")
        out.append("Serving speeds are priced for vLLM's kernels, as autoshard's vLLM launch line runs them "
                   "(`solve --mode serve --target sglang` prices SGLang's).")
    out.append("Speeds come from autoshard's cost model with each cluster file's efficiency knobs (the fitted "
               "defaults unless the file sets its own); GPU types without a published run to fit on scale with "
               "their datasheet peaks.")
    out.append(f"Each plan is the solver's best within {result.inputs['task_time_limit_s']:.3g} s (the study's "
               f"{result.inputs['time_limit_s']:g} s shared by its sizes) and a "
               f"{result.inputs['relative_gap']:.0%} optimality gap, one CP-SAT worker per size.")
    return out
