"""Predict the published disaggregated deployments in disagg_runs.yaml and compare with what was
measured.

    python tests/validation/validate_disagg.py

prints one row per run: the decode instances' predicted output tokens/s per decode GPU and TPOT at
the run's decode concurrency, the measured figures, and the errors; then, where the source states the
workload and the prefill layout, the predicted prefill capacity against the rate the decode side
drains (a measured figure that is decode-bound needs a prefill side that keeps up).

The decode concurrency per DP rank is, in this order: the benchmark client's in-flight requests
spread over the decode DP ranks (`client_concurrency`, when the source states it), capped by
`max_num_seqs` and by what the KV cache holds (`kv_limited_concurrency`). Where the source states no
workload, one row per assumed input length. Nothing is fitted: the figures come from
`autoshard.costmodel.serve.disagg.decode_instance` / `prefill_instance` with the bundled cluster's
defaults.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from autoshard.costmodel.serve.disagg import decode_instance, prefill_instance
from autoshard.costmodel.serve.step import kv_limited_concurrency, serve_memory
from autoshard.search.serve.space import Engine, _config
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

HERE = Path(__file__).resolve().parent
RUNS = HERE / "disagg_runs.yaml"


@dataclass(frozen=True)
class DisaggResult:
    id: str
    input_len: int
    output_len: int
    concurrency: int
    """Requests per decode DP rank the prediction ran at."""
    tpot_s: float
    predicted: float
    """Output tokens/s per decode GPU."""
    measured: float
    measured_tpot_s: float | None = None
    decode_requests_per_s: float | None = None
    """Requests/s all decode instances finish (predicted)."""
    prefill_requests_per_s: float | None = None
    """Requests/s all prefill instances take at full load (predicted), when the layout is stated."""

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def tpot_error(self) -> float | None:
        return None if self.measured_tpot_s is None else self.tpot_s / self.measured_tpot_s - 1.0

    @property
    def prefill_load(self) -> float | None:
        """Predicted prefill utilization at the predicted decode rate (> 1: prefill-bound)."""
        if self.prefill_requests_per_s is None or self.decode_requests_per_s is None:
            return None
        return self.decode_requests_per_s / self.prefill_requests_per_s


def load_runs() -> list[dict]:
    return yaml.safe_load(RUNS.read_text())


def _engine(role: dict) -> Engine:
    return Engine(0, role["tp"], role["pp"], role["attention_dp"], role["expert_parallel"])


def decode_ranks(run: dict) -> int:
    """DP ranks over all decode instances (each schedules its own requests)."""
    return run["decode"]["instances"] * run["decode"]["attention_dp"]


def _job(run: dict, input_len: int, output_len: int) -> ServeJob:
    return ServeJob(
        input_len=input_len,
        output_len=output_len,
        weight_dtype=WeightDtype(run["weight_dtype"]),
        kv_cache_dtype=WeightDtype(run["kv_cache_dtype"]),
    )


def _prefill_rate(run: dict, job: ServeJob) -> float | None:
    p = run.get("prefill")
    if not p or "instances" not in p:
        return None
    model = load_model(run["model"])
    e = _engine(p)
    pool = load_cluster(run["cluster"]).with_gpus(max(e.gpus, 8)).pools[0]
    seqs = run.get("prefill_max_num_seqs", run["max_num_seqs"])
    budget = run.get("prefill_max_num_batched_tokens")
    cfg = _config(model, pool, job, e, max_num_seqs=seqs, max_num_batched_tokens=budget)
    memory = serve_memory(model, pool.gpu, cfg, context_len=job.context_len)
    inst = prefill_instance(model, pool, job, cfg, memory)
    return p["instances"] * inst.requests_per_s


def _decode(run: dict, input_len: int, output_len: int) -> DisaggResult:
    model = load_model(run["model"])
    e = _engine(run["decode"])
    cluster = load_cluster(run["cluster"]).with_gpus(max(e.gpus, 8))
    pool = cluster.pools[0]
    job = _job(run, input_len, output_len)
    top = serve_memory(
        model,
        pool.gpu,
        _config(model, pool, job, e, max_num_seqs=run["max_num_seqs"]),
        context_len=job.context_len,
    )
    cap = min(run["max_num_seqs"], kv_limited_concurrency(top, job))
    if "client_concurrency" in run:
        cap = min(cap, run["client_concurrency"] // decode_ranks(run))
    batch = max(1, cap)
    cfg = _config(model, pool, job, e, max_num_seqs=batch)
    inst = decode_instance(
        model,
        pool,
        job,
        cfg,
        serve_memory(model, pool.gpu, cfg, context_len=job.context_len),
        concurrency=batch,
    )
    tpot_ms = run.get("measured_tpot_ms")
    return DisaggResult(
        run["id"],
        input_len,
        output_len,
        batch,
        inst.tpot_s,
        inst.throughput_tokens_per_s / e.gpus,
        float(run["measured_decode_tokens_per_s_per_gpu"]),
        None if tpot_ms is None else tpot_ms * 1e-3,
        run["decode"]["instances"] * inst.requests_per_s,
        _prefill_rate(run, job),
    )


def evaluate_runs() -> list[DisaggResult]:
    out = []
    for run in load_runs():
        if run.get("workload_stated", True):
            out.append(_decode(run, run["input_len"], run["output_len"]))
        else:
            out += [_decode(run, isl, run["assumed_output_len"]) for isl in run["assumed_input_lens"]]
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def main() -> int:
    results = evaluate_runs()
    print(
        f"{'run':<44} {'ISL':>5} {'OSL':>5} {'batch':>6} {'TPOT ms':>8} {'meas.':>6} {'err':>7} "
        f"{'pred tok/s/GPU':>15} {'measured':>9} {'error':>7} {'prefill load':>13}"
    )
    for r in results:
        meas_tpot = "-" if r.measured_tpot_s is None else f"{1e3 * r.measured_tpot_s:.0f}"
        load = "-" if r.prefill_load is None else f"{100 * r.prefill_load:.0f}%"
        print(
            f"{r.id:<44} {r.input_len:>5} {r.output_len:>5} {r.concurrency:>6} {1e3 * r.tpot_s:>8.1f} "
            f"{meas_tpot:>6} {_pct(r.tpot_error):>7} {r.predicted:>15,.0f} {r.measured:>9,.0f} "
            f"{_pct(r.error):>7} {load:>13}"
        )
    stated = [r for r in results if r.measured_tpot_s is not None]
    if stated:
        errs = sorted(abs(r.error) for r in stated)
        print(
            f"\nstated workloads: {len(stated)} rows, median |error| {100 * errs[len(errs) // 2]:.0f}% "
            f"(max {100 * errs[-1]:.0f}%) in tokens/s per decode GPU"
        )
    print(
        "workload not stated by the source: the rows span the assumed input lengths; the measured figure "
        "should fall inside the predicted range, not match one row.\n"
        "batch: requests per decode DP rank; prefill load: predicted decode rate / predicted prefill "
        "capacity of the stated prefill instances (> 100%: the prediction is prefill-bound)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
