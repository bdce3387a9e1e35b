"""Pre-provisioning cost studies: the best plan for every (cluster kind, GPU count), what it costs in
days and dollars, and the answers a buyer wants first (cheapest within a deadline, fastest within a
budget, the Pareto front of time vs cost).

    from autoshard.study import run_study
    result = run_study("llama-3.1-70b", ["dgx-h100", "dgx-b200"], [512, 1024], tokens=15e12)
    print(result.answers[0].text)

Solves run through the public API (`autoshard.api.solve`, `autoshard.search.serve.solve_serve`) in
worker processes, one CP-SAT worker each; the specs are loaded and validated once in the parent and
handed to every worker when it starts. Rendering lives in `autoshard.report.study_report`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autoshard.errors import AutoshardError, InfeasibleError, SpecError
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob, TrainJob, WeightDtype
from autoshard.specs.model import ModelSpec

__all__ = [
    "SCHEMA", "STUDY_RELATIVE_GAP", "TrainRow", "ServeRow", "Skipped", "Answer", "StudyResult",
    "train_costs", "serve_costs", "cluster_price", "pareto_front", "cheapest_within_deadline", "fastest_within_budget",
    "run_study", "run_study_cli",
]

SCHEMA = "autoshard.study/v1"
SECONDS_PER_DAY = 86_400.0
STUDY_RELATIVE_GAP = 0.01
"""CP-SAT stops once the plan is proven within 1 % of the best possible step time: far below the cost
model's own error, and it lets large sizes finish well inside the time limit."""


# ----------------------------------------------------------------------------- rows


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainRow:
    """The best training plan for one (cluster kind, GPU count), with its time and cost."""

    cluster: str
    gpu: str
    num_gpus: int
    plan: str
    """Short summary, e.g. "TP8 PP4 DP4 mbs1"."""
    degrees: dict[str, Any]
    status: str
    """"optimal" or "feasible" (time or gap limit; see `gap`)."""
    gap: float
    solve_s: float
    mfu: float
    tokens_per_s: float
    days: float
    gpu_hours: float
    price_per_gpu_hour: float | None
    total_usd: float | None
    usd_per_million_tokens: float | None

    @property
    def x(self) -> float:
        return self.days

    @property
    def y(self) -> float | None:
        return self.total_usd


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeRow:
    """The best serving plan for one (cluster kind, GPU count) and what a million output tokens cost."""

    cluster: str
    gpu: str
    num_gpus: int
    """GPUs of the cluster offered to the solver."""
    plan: str
    gpus_used: int
    """GPUs the deployment needs (the fewest that sustain the request rate, when one is given)."""
    status: str
    throughput_tokens_per_s: float
    """Output tokens/s the deployment can deliver."""
    served_tokens_per_s: float
    """Output tokens/s actually served: the request rate x output length when a rate is given."""
    requests_per_s: float
    ttft_s: float
    tpot_s: float
    meets_targets: bool
    price_per_gpu_hour: float | None
    usd_per_hour: float | None
    usd_per_million_output_tokens: float | None

    @property
    def x(self) -> float:
        return self.tpot_s * 1e3

    @property
    def y(self) -> float | None:
        return self.usd_per_million_output_tokens


Row = TrainRow | ServeRow


@dataclass(frozen=True, slots=True)
class Skipped:
    cluster: str
    num_gpus: int
    reason: str


@dataclass(frozen=True, slots=True)
class Answer:
    key: str
    """cheapest_within_deadline, fastest_within_budget, cheapest_per_token, fewest_gpus_for_rate."""
    title: str
    row: Row | None
    text: str


@dataclass(slots=True)
class StudyResult:
    mode: str
    inputs: dict[str, Any]
    rows: list[Row]
    skipped: list[Skipped]
    answers: list[Answer]
    pareto: list[Row]
    notes: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def is_pareto(self, row: Row) -> bool:
        return any(row is p for p in self.pareto)

    def to_json(self) -> dict[str, Any]:
        def row_json(r: Row) -> dict[str, Any]:
            return {**asdict(r), "pareto": self.is_pareto(r)}

        return {
            "schema": SCHEMA,
            "mode": self.mode,
            "inputs": self.inputs,
            "answers": {a.key: {"title": a.title, "text": a.text, "row": asdict(a.row) if a.row else None}
                        for a in self.answers},
            "rows": [row_json(r) for r in self.rows],
            "pareto": [asdict(r) for r in self.pareto],
            "skipped": [asdict(s) for s in self.skipped],
            "notes": list(self.notes),
            "assumptions": list(self.assumptions),
            "wall_s": self.wall_s,
        }


# ----------------------------------------------------------------------------- arithmetic and answers


def train_costs(*, tokens: float, tokens_per_s: float, num_gpus: int,
                price_per_gpu_hour: float | None) -> tuple[float, float, float | None, float | None]:
    """(days, GPU-hours, total dollars, dollars per million tokens) to train `tokens`."""
    seconds = tokens / tokens_per_s
    days = seconds / SECONDS_PER_DAY
    gpu_hours = num_gpus * seconds / 3600.0
    if price_per_gpu_hour is None:
        return days, gpu_hours, None, None
    total = gpu_hours * price_per_gpu_hour
    return days, gpu_hours, total, total / (tokens / 1e6)


def serve_costs(*, gpus_used: int, served_tokens_per_s: float,
                price_per_gpu_hour: float | None) -> tuple[float | None, float | None]:
    """(dollars per hour, dollars per million output tokens served)."""
    if price_per_gpu_hour is None:
        return None, None
    per_hour = gpus_used * price_per_gpu_hour
    return per_hour, per_hour / (served_tokens_per_s * 3600.0) * 1e6


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (both minimized; a point is
    dominated when another is <= on both and < on one), sorted by x then y. Equal points all stay."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front: list[int] = []
    best_y = float("inf")
    for i in order:
        x, y = points[i]
        if y < best_y:
            front.append(i)
            best_y = y
        elif front and points[front[-1]] == (x, y):
            front.append(i)  # an exact tie with a point on the front
    return front


def cheapest_within_deadline(rows: Sequence[TrainRow], deadline_days: float | None) -> TrainRow | None:
    """The lowest total cost among priced rows finishing within the deadline (any, without one)."""
    ok = [r for r in rows if r.total_usd is not None and (deadline_days is None or r.days <= deadline_days)]
    return min(ok, key=lambda r: (r.total_usd, r.days, r.num_gpus), default=None)


def fastest_within_budget(rows: Sequence[TrainRow], budget_usd: float | None) -> TrainRow | None:
    """The fewest days among rows costing at most the budget (any row, priced or not, without one)."""
    ok = [r for r in rows if budget_usd is None or (r.total_usd is not None and r.total_usd <= budget_usd)]
    return min(ok, key=lambda r: (r.days, r.total_usd if r.total_usd is not None else float("inf"), r.num_gpus),
               default=None)


def money(usd: float | None) -> str:
    if usd is None:
        return "n/a"
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(usd) >= div:
            return f"${usd / div:.2f}{unit}"
    return f"${usd:.2f}"


def where(row: Row) -> str:
    return f"{row.num_gpus:,} x {row.gpu} ({row.cluster})"


def _train_answers(rows: list[TrainRow], deadline: float | None, budget: float | None) -> list[Answer]:
    out = []
    best = cheapest_within_deadline(rows, deadline)
    title = f"Cheapest within {deadline:g} days" if deadline is not None else "Cheapest option"
    if best is not None:
        text = (f"{title}: {where(best)}, {best.plan}: {best.days:,.1f} days, {money(best.total_usd)} "
                f"(${best.usd_per_million_tokens:.3f} per million tokens).")
    elif not any(r.total_usd is not None for r in rows):
        text = f"{title}: unknown, no studied cluster has a price (pass --price CLUSTER=USD_PER_GPU_HOUR)."
    else:
        quickest = min(rows, key=lambda r: r.days)
        text = (f"{title}: no option finishes within {deadline:g} days; the fastest, {where(quickest)}, "
                f"takes {quickest.days:,.1f} days ({money(quickest.total_usd)}).")
    out.append(Answer("cheapest_within_deadline", title, best, text))
    fast = fastest_within_budget(rows, budget)
    title = f"Fastest within {money(budget)}" if budget is not None else "Fastest option"
    if fast is not None:
        text = f"{title}: {where(fast)}, {fast.plan}: {fast.days:,.1f} days, {money(fast.total_usd)}."
    elif not any(r.total_usd is not None for r in rows):
        text = f"{title}: unknown, no studied cluster has a price (pass --price CLUSTER=USD_PER_GPU_HOUR)."
    else:
        cheap = min((r for r in rows if r.total_usd is not None), key=lambda r: r.total_usd or 0.0)
        text = (f"{title}: no option costs {money(budget)} or less; the cheapest, {where(cheap)}, costs "
                f"{money(cheap.total_usd)} and takes {cheap.days:,.1f} days.")
    out.append(Answer("fastest_within_budget", title, fast, text))
    return out


def _serve_answers(rows: list[ServeRow], request_rate: float | None) -> list[Answer]:
    out = []
    priced = [r for r in rows if r.usd_per_million_output_tokens is not None]
    cheap = min(priced, key=lambda r: (r.usd_per_million_output_tokens, r.gpus_used), default=None)
    title = "Cheapest per million output tokens"
    if cheap is not None:
        text = (f"{title}: {cheap.gpus_used} x {cheap.gpu} ({cheap.cluster}), {cheap.plan}: "
                f"${cheap.usd_per_million_output_tokens:.3f} per million output tokens, "
                f"TPOT {cheap.tpot_s * 1e3:.1f} ms.")
    else:
        text = f"{title}: unknown, no studied cluster has a price (pass --price CLUSTER=USD_PER_GPU_HOUR)."
    out.append(Answer("cheapest_per_token", title, cheap, text))
    if request_rate is not None:
        few = min(rows, key=lambda r: (r.gpus_used, r.usd_per_hour or float("inf")), default=None)
        title = f"Fewest GPUs sustaining {request_rate:g} requests/s"
        text = (f"{title}: {few.gpus_used} x {few.gpu} ({few.cluster}), {few.plan}, {money(few.usd_per_hour)}/hour."
                if few else f"{title}: none of the studied sizes can.")
        out.append(Answer("fewest_gpus_for_rate", title, few, text))
    return out


# ----------------------------------------------------------------------------- worker side

_WORKER: dict[str, Any] = {}


def _init_worker(model: ModelSpec, clusters: dict[str, ClusterSpec], job: TrainJob | ServeJob,
                 time_limit_s: float, relative_gap: float) -> None:
    _WORKER.update(model=model, clusters=clusters, job=job, time_limit_s=time_limit_s, relative_gap=relative_gap)


def _gpu_names(cluster: ClusterSpec) -> str:
    return "+".join(dict.fromkeys(p.gpu.name for p in cluster.pools))


def _plan_summary(plan: Any) -> str:
    cfg = plan.config
    text = f"{cfg.dims.describe()} mbs{cfg.micro_batch_size}"
    if cfg.recompute.value != "none":
        text += f" rc-{cfg.recompute.value}"
    if plan.recompute_num_layers:
        text += f"+{plan.recompute_num_layers}"
    if cfg.zero_stage >= 2:
        text += f" ZeRO-{cfg.zero_stage}"
    return text


def _solve_task(key: str, num_gpus: int) -> tuple[str, int, dict[str, Any] | None, str | None]:
    """(cluster key, GPUs, figures of the best plan or None, reason it was skipped or None)."""
    from autoshard.api import solve
    from autoshard.search.run import SolverOptions

    model, job, spec = _WORKER["model"], _WORKER["job"], _WORKER["clusters"][key]
    cluster = _sized(spec, num_gpus)
    try:
        if isinstance(job, ServeJob):
            from autoshard.search.serve import solve_serve

            sp = solve_serve(model, cluster, job, pins=None, top_k=1, time_limit_s=_WORKER["time_limit_s"],
                             num_workers=1, seed=0)[0]
            p = sp.prediction
            return key, num_gpus, {
                "gpu": sp.pool.gpu.name, "plan": sp.describe(), "gpus_used": sp.num_gpus, "status": sp.status().value,
                "throughput_tokens_per_s": sp.throughput_tokens_per_s, "ttft_s": p.ttft_s, "tpot_s": p.tpot_s,
                "meets_targets": sp.meets_targets(),
            }, None
        options = SolverOptions(num_workers=1, time_limit_s=_WORKER["time_limit_s"],
                                relative_gap=_WORKER["relative_gap"])
        plan = solve(model, cluster, job, options=options)[0]
    except AutoshardError as exc:
        return key, num_gpus, None, str(exc)
    cfg, pred = plan.config, plan.prediction
    return key, num_gpus, {
        "gpu": _gpu_names(cluster), "plan": _plan_summary(plan),
        "degrees": {"tp": cfg.dims.tp, "pp": cfg.dims.pp, "dp": cfg.dims.dp, "cp": cfg.dims.cp, "ep": cfg.dims.ep,
                    "vpp": cfg.dims.vpp, "micro_batch_size": cfg.micro_batch_size, "recompute": cfg.recompute.value,
                    "recompute_num_layers": plan.recompute_num_layers, "zero_stage": cfg.zero_stage},
        "status": plan.status().value, "gap": plan.solver.gap, "solve_s": plan.solver.wall_s,
        "mfu": pred.mfu, "tokens_per_s": pred.tokens_per_s,
    }, None


# ----------------------------------------------------------------------------- orchestration

ProgressFn = Callable[[int, int, str], None]
"""progress(done, total, label of the size just finished); first called with done = 0 once the worker
processes exist (a caller that draws with a thread should start it then, not before the fork)."""


def _sized(spec: ClusterSpec, num_gpus: int) -> ClusterSpec:
    """The cluster at `num_gpus` GPUs; a heterogeneous cluster only at its own size.
    ValueError (with the fix) when the size does not fill whole nodes or NVLink domains."""
    return spec if num_gpus == spec.num_gpus else spec.with_gpus(num_gpus)


def cluster_price(spec: ClusterSpec) -> float | None:
    """Dollars per GPU-hour: the pools' prices weighted by their GPUs (None if a pool has none)."""
    prices = [p.price_per_gpu_hour for p in spec.pools]
    if any(p is None for p in prices):
        return None
    return sum((p.price_per_gpu_hour or 0.0) * p.num_gpus for p in spec.pools) / spec.num_gpus


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


def _prices(clusters: dict[str, ClusterSpec], overrides: dict[str, float]) -> dict[str, float | None]:
    names = {spec.name: key for key, spec in clusters.items()}
    prices: dict[str, float | None] = {key: cluster_price(spec) for key, spec in clusters.items()}
    for name, usd in overrides.items():
        key = name if name in clusters else names.get(name)
        if key is None:
            raise SpecError(f"'{name}' is not one of the studied clusters ({', '.join(clusters)}): "
                            "name a cluster given with --cluster", source="--price")
        if usd <= 0:
            raise SpecError(f"price for '{name}' must be positive, got {usd}", source="--price")
        prices[key] = usd
    return prices


def _run_tasks(tasks: list[tuple[str, int]], init_args: tuple, jobs: int,
               progress: ProgressFn | None) -> list[tuple[str, int, dict[str, Any] | None, str | None]]:
    results = []
    # the largest sizes take longest: start them first so no worker is left with one at the end
    ordered = sorted(tasks, key=lambda t: -t[1])
    if jobs <= 1 or len(tasks) <= 1:
        _init_worker(*init_args)
        if progress:
            progress(0, len(tasks), "")
        try:
            for i, (key, n) in enumerate(ordered):
                results.append(_solve_task(key, n))
                if progress:
                    progress(i + 1, len(tasks), f"{key} x {n}")
        finally:
            _WORKER.clear()
        return results
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=_init_worker, initargs=init_args)
    try:
        pending: set[Future] = {pool.submit(_solve_task, key, n) for key, n in ordered}
        if progress:
            progress(0, len(tasks), "")
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                results.append(fut.result())
                if progress:
                    key, n = results[-1][:2]
                    progress(len(results), len(tasks), f"{key} x {n}")
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # Ctrl-C or a bug: do not wait for the queue
        raise
    pool.shutdown()
    return results


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
    time_limit_s: float = 20.0,
    relative_gap: float = STUDY_RELATIVE_GAP,
    jobs: int = 0,
    progress: ProgressFn | None = None,
) -> StudyResult:
    """Solve every (cluster, size) and assemble the study. Raises SpecError for bad input and
    InfeasibleError when no size of any cluster can run the job."""
    from autoshard.api import train_job
    from autoshard.specs import load_model

    start = time.perf_counter()
    model_spec = model if isinstance(model, ModelSpec) else load_model(model)
    specs = _load_clusters(clusters)
    price = _prices(specs, dict(prices or {}))
    sizes = sorted(set(sizes))
    if not sizes or min(sizes) < 1:
        raise SpecError("give at least one positive GPU count, e.g. --gpus 64,128", source="--gpus")
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
        for flag, value in (("--deadline-days", deadline_days), ("--budget-usd", budget_usd), ("--tokens", tokens)):
            if value is not None:
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
    init_args = (model_spec, specs, job, time_limit_s, relative_gap)
    jobs = jobs or os.cpu_count() or 1
    found = _run_tasks(tasks, init_args, jobs, progress)
    order = {key: i for i, key in enumerate(specs)}
    found.sort(key=lambda r: (order[r[0]], r[1]))
    rows: list[Row] = []
    for key, n, figures, reason in found:
        if figures is None:
            skipped.append(Skipped(key, n, reason or "no plan"))
        elif isinstance(job, TrainJob):
            rows.append(_train_row(key, n, figures, float(job.tokens or 0), price[key]))
        else:
            rows.append(_serve_row(key, n, figures, job, price[key]))
    skipped.sort(key=lambda s: (order[s.cluster], s.num_gpus))
    if not rows:
        lines = "\n".join(f"  {s.cluster} x {s.num_gpus}: {s.reason}" for s in skipped)
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
                                  time_limit_s, relative_gap),
        rows=rows, skipped=skipped, answers=answers, pareto=pareto,
    )
    result.notes = _notes(result, price)
    result.assumptions = _assumptions(result, specs, price, prices or {}, job)
    result.wall_s = time.perf_counter() - start
    return result


def _serve_job(model: ModelSpec, precision: str | None, rate: float | None, tpot_ms: float | None,
               ttft_s: float | None) -> ServeJob:
    from autoshard.specs.loader import validate

    data: dict[str, Any] = {}
    if model.serving is not None:
        for key in ("input_len", "output_len", "max_model_len"):
            if getattr(model.serving, key) is not None:
                data[key] = getattr(model.serving, key)
    dtype = precision or (model.serving.precision if model.serving else None)
    if dtype is not None:
        if dtype not in {d.value for d in WeightDtype}:
            raise SpecError(f"'{dtype}' is not a serving weight type: use bf16, fp8, int8 or int4",
                            source="--precision")
        data["weight_dtype"] = dtype
    if rate is not None:
        data["request_rate"] = rate
    if tpot_ms is not None:
        data["tpot_target_s"] = tpot_ms / 1e3
    if ttft_s is not None:
        data["ttft_target_s"] = ttft_s
    return validate(ServeJob, data, source=f"serving job for {model.name}")


def _train_row(key: str, n: int, f: dict[str, Any], tokens: float, price: float | None) -> TrainRow:
    days, gpu_hours, total, per_m = train_costs(tokens=tokens, tokens_per_s=f["tokens_per_s"], num_gpus=n,
                                                price_per_gpu_hour=price)
    return TrainRow(cluster=key, gpu=f["gpu"], num_gpus=n, plan=f["plan"], degrees=f["degrees"], status=f["status"],
                    gap=f["gap"], solve_s=f["solve_s"], mfu=f["mfu"], tokens_per_s=f["tokens_per_s"], days=days,
                    gpu_hours=gpu_hours, price_per_gpu_hour=price, total_usd=total, usd_per_million_tokens=per_m)


def _serve_row(key: str, n: int, f: dict[str, Any], job: ServeJob, price: float | None) -> ServeRow:
    capacity = f["throughput_tokens_per_s"]
    served = min(capacity, job.request_rate * job.output_len) if job.request_rate else capacity
    per_hour, per_m = serve_costs(gpus_used=f["gpus_used"], served_tokens_per_s=served, price_per_gpu_hour=price)
    return ServeRow(cluster=key, gpu=f["gpu"], num_gpus=n, plan=f["plan"], gpus_used=f["gpus_used"],
                    status=f["status"], throughput_tokens_per_s=capacity, served_tokens_per_s=served,
                    requests_per_s=capacity / job.output_len, ttft_s=f["ttft_s"], tpot_s=f["tpot_s"],
                    meets_targets=f["meets_targets"], price_per_gpu_hour=price, usd_per_hour=per_hour,
                    usd_per_million_output_tokens=per_m)


def _inputs(model: ModelSpec, specs: dict[str, ClusterSpec], sizes: list[int], job: TrainJob | ServeJob,
            price: dict[str, float | None], overrides: dict[str, float], deadline: float | None,
            budget: float | None, time_limit_s: float, gap: float) -> dict[str, Any]:
    return {
        "model": model.name, "params": model.num_params, "clusters": list(specs), "sizes": sizes,
        "job": job.model_dump(mode="json"), "tokens": job.tokens if isinstance(job, TrainJob) else None,
        "deadline_days": deadline, "budget_usd": budget, "prices_usd_per_gpu_hour": price,
        "price_overrides": dict(overrides), "time_limit_s": time_limit_s, "relative_gap": gap,
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
    return f"{x:.1%}" if x >= 0.001 else f"{x:.1e}"


def _assumptions(result: StudyResult, specs: dict[str, ClusterSpec], price: dict[str, float | None],
                 overrides: dict[str, float], job: TrainJob | ServeJob) -> list[str]:
    out = []
    for key, spec in specs.items():
        usd = price[key]
        src = "--price override" if key in overrides or spec.name in overrides else f"clusters/{spec.name}.yaml"
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
    out.append("Speeds come from autoshard's cost model with each cluster file's efficiency knobs (the fitted "
               "defaults unless the file sets its own); GPU types without a published run to fit on scale with "
               "their datasheet peaks.")
    out.append(f"Each plan is the solver's best within {result.inputs['time_limit_s']:g} s and a "
               f"{result.inputs['relative_gap']:.0%} optimality gap, one CP-SAT worker per size.")
    return out


# ----------------------------------------------------------------------------- CLI entry


def run_study_cli(*, model: str, clusters: list[str], sizes: list[int], tokens: float | None,
                  deadline_days: float | None, budget_usd: float | None, prices: dict[str, float], mode: str,
                  seq_len: int | None, global_batch_size: int | None, precision: str | None, out_dir: Path | None,
                  json_out: bool, time_limit: float, jobs: int, request_rate: float | None, console: Any, err: Any,
                  tpot_ms: float | None = None, ttft_s: float | None = None) -> StudyResult:
    """`autoshard study`: solve with a progress bar on `err`, print the answers and the table on
    `console` (or one JSON object with `json_out`), and write the report files under `out_dir`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autoshard.report.study_report import render_study, write_outputs

    bar = Progress(TextColumn("solving"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=err, transient=True,
                   disable=json_out or not err.is_terminal)
    task = bar.add_task("", total=None)

    def progress(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, description=f"last: {label}" if label else "")
        if done == 0:
            bar.start()  # its refresh thread starts after the worker processes are forked

    try:
        result = run_study(model, clusters, sizes, mode=mode, tokens=tokens, deadline_days=deadline_days,
                           budget_usd=budget_usd, prices=prices, seq_len=seq_len, global_batch_size=global_batch_size,
                           precision=precision, request_rate=request_rate, tpot_ms=tpot_ms, ttft_s=ttft_s,
                           time_limit_s=time_limit, jobs=jobs, progress=progress)
    finally:
        bar.stop()
    written = write_outputs(result, out_dir) if out_dir is not None else []
    if json_out:
        import json

        obj = result.to_json()
        if written:
            obj["files"] = [str(p) for p in written]
        console.file.write(json.dumps(obj, indent=2) + "\n")
        console.file.flush()
    else:
        render_study(result, console)
        for path in written:
            err.print(f"wrote {path}", highlight=False)
    return result
