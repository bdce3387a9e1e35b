"""Predict the published disaggregated deployments in disagg_runs.yaml and compare with what was
measured.

    python tests/validation/validate_disagg.py

prints one row per run: the decode instance's predicted output tokens/s per GPU at its KV-limited
concurrency (capped by max_num_seqs) for each workload (the stated one, or each assumed input length
when the source states none), the measured figure, and the error. Nothing is fitted: the figures
come from `autoshard.costmodel.serve.disagg.decode_instance` with the bundled cluster's defaults.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from autoshard.costmodel.serve.disagg import decode_instance
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
    tpot_s: float
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def load_runs() -> list[dict]:
    return yaml.safe_load(RUNS.read_text())


def _decode(run: dict, input_len: int, output_len: int) -> DisaggResult:
    model = load_model(run["model"])
    d = run["decode"]
    e = Engine(0, d["tp"], d["pp"], d["attention_dp"], d["expert_parallel"])
    cluster = load_cluster(run["cluster"]).with_gpus(max(e.gpus, 8))
    pool = cluster.pools[0]
    job = ServeJob(
        input_len=input_len,
        output_len=output_len,
        weight_dtype=WeightDtype(run["weight_dtype"]),
        kv_cache_dtype=WeightDtype(run["kv_cache_dtype"]),
    )
    top = serve_memory(
        model,
        pool.gpu,
        _config(model, pool, job, e, max_num_seqs=run["max_num_seqs"]),
        context_len=job.context_len,
    )
    batch = max(1, min(run["max_num_seqs"], kv_limited_concurrency(top, job)))
    cfg = _config(model, pool, job, e, max_num_seqs=batch)
    inst = decode_instance(
        model,
        pool,
        job,
        cfg,
        serve_memory(model, pool.gpu, cfg, context_len=job.context_len),
        concurrency=batch,
    )
    return DisaggResult(
        run["id"],
        input_len,
        output_len,
        batch,
        inst.tpot_s,
        inst.throughput_tokens_per_s / e.gpus,
        float(run["measured_decode_tokens_per_s_per_gpu"]),
    )


def evaluate_runs() -> list[DisaggResult]:
    out = []
    for run in load_runs():
        if run.get("workload_stated", True):
            out.append(_decode(run, run["input_len"], run["output_len"]))
        else:
            out += [_decode(run, isl, run["assumed_output_len"]) for isl in run["assumed_input_lens"]]
    return out


def main() -> int:
    results = evaluate_runs()
    print(
        f"{'run':<44} {'ISL':>5} {'OSL':>5} {'batch':>6} {'TPOT ms':>8} {'pred tok/s/GPU':>15} "
        f"{'measured':>9} {'error':>7}"
    )
    for r in results:
        print(
            f"{r.id:<44} {r.input_len:>5} {r.output_len:>5} {r.concurrency:>6} {1e3 * r.tpot_s:>8.1f} "
            f"{r.predicted:>15,.0f} {r.measured:>9,.0f} {100 * r.error:>+6.1f}%"
        )
    print(
        "\nworkload not stated by the source: the rows span the assumed input lengths; the measured figure "
        "should fall inside the predicted range, not match one row."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
