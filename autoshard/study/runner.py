"""The solving side of a cost study: worker processes, one CP-SAT worker each, solve one (cluster, GPU
count) through the search layer (`solve_train`, `autoshard.search.serve.solve.solve_serve`) and return
the figures of its best plan. The specs are loaded and validated once in the parent and handed to every
worker when it starts. `autoshard.study.run` assembles the results.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from autoshard.errors import AutoshardError, SolverError
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob, TrainJob
from autoshard.specs.model import ModelSpec

__all__ = ["ProgressFn", "TimedOut"]


# ----------------------------------------------------------------------------- worker side

_WORKER: dict[str, Any] = {}


def _init_worker(model: ModelSpec, clusters: dict[str, ClusterSpec], job: TrainJob | ServeJob,
                 time_limit_s: float, relative_gap: float) -> None:
    _WORKER.update(model=model, clusters=clusters, job=job, time_limit_s=time_limit_s, relative_gap=relative_gap)


def _gpu_names(cluster: ClusterSpec) -> str:
    return "+".join(dict.fromkeys(p.gpu.name for p in cluster.pools))


def _plan_summary(plan: Any) -> str:
    """The plan in one line: degrees, micro-batch, recomputation (with the decoder layers per stage fully
    recomputed on top), ZeRO-2/3."""
    cfg = plan.config
    text = f"{cfg.dims.describe()} mbs{cfg.micro_batch_size}"
    if cfg.recompute.value != "none":
        text += f" rc-{cfg.recompute.value}"
    if plan.recompute_num_layers:  # the terminal report's "+N full/stage" ("mbs4+42" read as a sum)
        text += f" +{plan.recompute_num_layers} full/stage"
    if cfg.zero_stage >= 2:
        text += f" ZeRO-{cfg.zero_stage}"
    return text


def _solve_task(key: str, num_gpus: int, time_limit_s: float | None = None) -> tuple[str, int, dict[str, Any] | None,
                                                                                 str | None]:
    """(cluster key, GPUs, figures of the best plan or None, reason it was skipped or None). `time_limit_s`:
    this size's limit, counted from now (default: the one every worker was started with)."""
    started_at = time.monotonic()
    limit = _WORKER["time_limit_s"] if time_limit_s is None else time_limit_s
    from autoshard.costmodel.bands import band_of
    from autoshard.costmodel.sanity import sanity_for, useful_mfu
    from autoshard.search.train.options import SolverOptions
    from autoshard.search.train.solve import solve_train
    from autoshard.specs.prepare import check_precision

    model, job, spec = _WORKER["model"], _WORKER["job"], _WORKER["clusters"][key]
    cluster = _sized(spec, num_gpus)
    try:
        if isinstance(job, ServeJob):
            from autoshard.search.serve.solve import solve_serve

            sp = solve_serve(model, cluster, job, pins=None, top_k=1, time_limit_s=limit - (time.monotonic() - started_at),
                             num_workers=1, seed=0, disaggregate="auto")[0]
            p = sp.prediction
            pool_gpus: dict[int, int] = {}  # GPUs per pool the deployment runs on (a split's roles may differ)
            for r in sp.roles or ():
                pool_gpus[r.pool_index] = pool_gpus.get(r.pool_index, 0) + r.gpus
            pool_gpus = pool_gpus or {sp.pool_index: sp.num_gpus}
            return key, num_gpus, {
                "gpu": "+".join(dict.fromkeys(cluster.pools[i].gpu.name for i in sorted(pool_gpus))),
                "pool_gpus": pool_gpus, "plan": sp.describe(), "gpus_used": sp.num_gpus, "status": sp.status().value,
                "throughput_tokens_per_s": sp.throughput_tokens_per_s, "ttft_s": sp.ttft_s, "tpot_s": p.tpot_s,
                "meets_targets": sp.meets_targets(), "throughput_band": band_of(sp).tokens_per_s,
                "band_basis": band_of(sp).basis,
            }, None
        options = SolverOptions(num_workers=1, time_limit_s=limit, started_at=started_at,
                                relative_gap=_WORKER["relative_gap"])
        check_precision(cluster, job.precision)
        plan = solve_train(model, cluster, job, options=options)[0]  # band_of: the band api.solve would attach
    except SolverError as exc:  # the clock ran out before any plan: not "no plan fits"
        return key, num_gpus, None, TimedOut(str(exc))
    except AutoshardError as exc:
        return key, num_gpus, None, str(exc)
    cfg, pred = plan.config, plan.prediction
    return key, num_gpus, {
        "gpu": _gpu_names(cluster), "plan": _plan_summary(plan),
        "degrees": {"tp": cfg.dims.tp, "pp": cfg.dims.pp, "dp": cfg.dims.dp, "cp": cfg.dims.cp, "ep": cfg.dims.ep,
                    "vpp": cfg.dims.vpp, "micro_batch_size": cfg.micro_batch_size, "recompute": cfg.recompute.value,
                    "recompute_num_layers": plan.recompute_num_layers, "zero_stage": cfg.zero_stage},
        "status": plan.status().value, "gap": plan.solver.gap, "solve_s": plan.solver.wall_s,
        "mfu": pred.mfu, "useful_mfu": useful_mfu(plan), "tokens_per_s": pred.tokens_per_s,
        "tokens_per_s_band": band_of(plan).tokens_per_s,
        "band_basis": band_of(plan).basis,
        "sanity": sanity_for(plan).message(cite=True) if sanity_for(plan).flagged else "",
    }, None


ProgressFn = Callable[[int, int, str], None]
"""progress(done, total, label of the size just finished); first called with done = 0 once the worker
processes exist (a caller that draws with a thread should start it then, not before the fork)."""


def _sized(spec: ClusterSpec, num_gpus: int) -> ClusterSpec:
    """The cluster at `num_gpus` GPUs; a heterogeneous cluster only at its own size.
    ValueError (with the fix) when the size does not fill whole nodes or NVLink domains."""
    return spec if num_gpus == spec.num_gpus else spec.with_gpus(num_gpus)


class TimedOut(str):
    """A skipped size's reason when its solve's time ran out before any plan (a SolverError), or the
    study's before its turn: unknown, not infeasible."""

    __slots__ = ()


TIME_OUT_REASON = TimedOut("not solved: the study's --time-limit ran out before this size's turn "
                           "(raise --time-limit)")


def _task_limit(cap: float, end: float | None, waiting: int, workers: int) -> float | None:
    """The limit of the next size to start: `cap` (the even share), less where the sizes before it ran
    over, so that the `waiting` sizes not yet started, ceil(waiting / workers) rounds of them, end by
    `end` (a time.monotonic() value); None when the study's time is spent."""
    if end is None:
        return cap
    left = (end - time.monotonic()) / -(-waiting // workers)
    return None if left < MIN_TASK_S else min(cap, left)


MIN_TASK_S = 0.1
"""A size whose turn comes with less than this left of the study is not started (it could not finish
before the study's end, and its solve's first-plan grace would only push the study past it)."""


def _run_tasks(tasks: list[tuple[str, int]], init_args: tuple, jobs: int, progress: ProgressFn | None, *,
               cap: float, end: float | None = None) -> list[tuple[str, int, dict[str, Any] | None, str | None]]:
    """Solve the sizes on `jobs` processes, each size within its `_task_limit` (at most `cap` seconds, the
    even share): the sizes start as workers free up, so time one size overran comes off the later ones,
    not off the study's end. `init_args` go to `_init_worker` in each process."""
    results = []
    # the largest sizes take longest: start them first so no worker is left with one at the end
    queue = sorted(tasks, key=lambda t: -t[1])
    workers = min(jobs, len(tasks)) if jobs > 1 and len(tasks) > 1 else 1

    def start(run: Callable[..., Any]) -> Any:
        key, n = queue.pop(0)
        limit = _task_limit(cap, end, len(queue) + 1, workers)
        return (key, n, None, TIME_OUT_REASON) if limit is None else run(_solve_task, key, n, limit)

    def report(result: tuple) -> None:
        results.append(result)
        if progress:
            progress(len(results), len(tasks), f"{result[0]} x {result[1]}")

    if workers == 1:
        _init_worker(*init_args)
        if progress:
            progress(0, len(tasks), "")
        try:
            while queue:
                report(start(lambda f, *a: f(*a)))
        finally:
            _WORKER.clear()
        return results
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=init_args)
    try:
        pending: set[Future] = set()
        if progress:
            progress(0, len(tasks), "")
        while queue or pending:
            while queue and len(pending) < workers:
                got = start(pool.submit)
                if isinstance(got, Future):
                    pending.add(got)
                else:
                    report(got)
            if not pending:
                continue
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                report(fut.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # Ctrl-C or a bug: do not wait for the queue
        raise
    pool.shutdown()
    return results
