"""Predict the published disaggregated deployments in disagg_runs.yaml and compare with what was
measured.

    python tests/validation/validate_disagg.py

prints one row per run: the decode instances' predicted output tokens/s per decode GPU and TPOT at
the run's decode concurrency, the measured figures, and the errors; then, where the source states the
workload and the prefill layout, the predicted prefill capacity against the rate the decode side
drains (a measured figure that is decode-bound needs a prefill side that keeps up).

Rows of `kind: prefill` are a prefill instance measured alone at full load (prompt tokens/s per
prefill GPU), against `prefill_instance` at the row's step budget (autoshard's default where the
source states none).

Rows of `kind: kv_transfer` are a 1P1D pair measured one request at a time: for each prompt length the
source's KV-cache size, the hand-off time and the mean TTFT, against `kv_transfer_bytes`,
`kv_transfer` (over the cluster's NICs) and an idle TTFT (the prompt's prefill + the hand-off + one
decode step; no queue at concurrency 1). A row may give its model as a Hugging Face config
(`model_hf_config`) and its NIC speed (`inter_node_gbps`) where the testbed differs from the bundled
cluster.

The decode concurrency per DP rank is what the source states, the requests per rank
(`requests_per_rank`) or the benchmark client's in-flight requests spread over the decode DP ranks
(`client_concurrency`), capped by `max_num_seqs` and by what the KV cache holds
(`kv_limited_concurrency`); where the source states none, one row per assumed requests per rank
(`assumed_concurrency`). Nothing is fitted: the figures come from
`autoshard.costmodel.serve.disagg.decode_instance` / `prefill_instance` with the bundled cluster's
defaults.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from autoshard.costmodel.serve.disagg import (
    PrefillInstance,
    decode_instance,
    disagg_ttft_s,
    kv_link,
    kv_transfer,
    prefill_instance,
    prefill_wait_s,
)
from autoshard.costmodel.serve.compute import MOE_DP_CHUNK
from autoshard.costmodel.serve.memory import default_max_num_batched_tokens, serve_memory
from autoshard.costmodel.serve.predict import kv_limited_concurrency
from autoshard.costmodel.serve.step import StepTime, prefill_time
from autoshard.search.serve.space import Engine, _config
from autoshard.specs import load_cluster, load_model
from autoshard.specs.hf import model_from_hf_config
from autoshard.specs.job import ServeJob, WeightDtype

MIB = 2**20

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
    ttft_s: float | None = None
    """Mean TTFT predicted at the measured request rate, where the source gives the TTFT."""
    measured_ttft_s: float | None = None
    ttft_prefill_s: float | None = None
    """The prefill part of `ttft_s` (wait for the running step + its own step: `prefill_wait_s`)."""
    ttft_utilization: float | None = None
    """Prefill utilization at the measured request rate."""
    prefill_tokens_per_s_per_gpu: float | None = None
    """Prompt tokens/s per prefill GPU at full load (predicted), where the source measured it."""
    measured_prefill_tokens_per_s_per_gpu: float | None = None

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def tpot_error(self) -> float | None:
        return None if self.measured_tpot_s is None else self.tpot_s / self.measured_tpot_s - 1.0

    @property
    def ttft_error(self) -> float | None:
        return None if self.ttft_s is None else self.ttft_s / self.measured_ttft_s - 1.0

    @property
    def prefill_error(self) -> float | None:
        if self.prefill_tokens_per_s_per_gpu is None:
            return None
        return self.prefill_tokens_per_s_per_gpu / self.measured_prefill_tokens_per_s_per_gpu - 1.0

    @property
    def prefill_load(self) -> float | None:
        """Predicted prefill utilization at the predicted decode rate (> 1: prefill-bound)."""
        if self.prefill_requests_per_s is None or self.decode_requests_per_s is None:
            return None
        return self.decode_requests_per_s / self.prefill_requests_per_s


@dataclass(frozen=True)
class PrefillResult:
    """A `kind: prefill` row: one prefill instance at full load."""

    id: str
    gpus: int
    predicted: float
    """Prompt tokens/s per prefill GPU."""
    measured: float
    chart_read: bool
    step: StepTime
    """The predicted engine step (`max_num_batched_tokens` prompt tokens per DP rank), by kind of work."""
    step_tokens: int

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def measured_step_s(self) -> float:
        """The step the measured rate implies: the same prompt tokens per rank at the measured speed
        (the rows run TP 1, one GPU per DP rank)."""
        return self.step_tokens / self.measured


@dataclass(frozen=True)
class TransferResult:
    """One prompt length of a `kind: kv_transfer` row."""

    id: str
    prompt_len: int
    kv_mib: float
    measured_kv_mib: float
    transfer_s: float
    measured_transfer_s: float
    ttft_s: float
    measured_ttft_s: float
    prefill_s: float
    """The prompt's prefill alone (part of ttft_s)."""

    @property
    def transfer_error(self) -> float:
        return self.transfer_s / self.measured_transfer_s - 1.0

    @property
    def ttft_error(self) -> float:
        return self.ttft_s / self.measured_ttft_s - 1.0


def load_runs(kind: str = "decode") -> list[dict]:
    """The rows of one kind: "decode" (the default: decode throughput), "prefill" or "kv_transfer"."""
    return [r for r in yaml.safe_load(RUNS.read_text()) if r.get("kind", "decode") == kind]


def _model(run: dict):
    if "model_hf_config" in run:
        return model_from_hf_config(run["model_hf_config"], source=run["id"])
    return load_model(run["model"])


def _pool(run: dict, gpus: int):
    pool = load_cluster(run["cluster"]).with_gpus(max(gpus, 8)).pools[0]
    if "inter_node_gbps" in run:
        node = pool.node.model_copy(update={"inter_node_gbps": run["inter_node_gbps"]})
        pool = pool.model_copy(update={"node": node})
    return pool


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


def _prefill(run: dict, job: ServeJob) -> PrefillInstance | None:
    """One prefill instance of the stated layout, or None when the source states none."""
    p = run.get("prefill")
    if not p or "instances" not in p:
        return None
    model = _model(run)
    e = _engine(p)
    pool = _pool(run, e.gpus)
    seqs = run.get("prefill_max_num_seqs", run["max_num_seqs"])
    budget = run.get("prefill_max_num_batched_tokens")
    cfg = _config(model, pool, job, e, max_num_seqs=seqs, max_num_batched_tokens=budget, role="prefill")
    memory = serve_memory(model, pool.gpu, cfg, context_len=job.context_len)
    return prefill_instance(model, pool, job, cfg, memory)


def _ttft_at_measured_rate(
    run: dict, job: ServeJob, prefill: PrefillInstance, decode
) -> tuple[float, float, float]:
    """Mean TTFT (`disagg_ttft_s`) at the request rate the source measured (output tokens/s / OSL)
    over the stated prefill instances, with the hand-off across nodes and the predicted TPOT; with its
    prefill part and the prefill utilization."""
    model = _model(run)
    pool = _pool(run, prefill.gpus)
    hand_off = kv_transfer(model, job, prefill.config, decode.config, kv_link(pool, same_domain=False))
    rate = run["measured_output_tokens_per_s"] / job.output_len
    utilization = rate / (run["prefill"]["instances"] * prefill.requests_per_s)
    return (
        disagg_ttft_s(prefill, hand_off, decode.tpot_s, utilization),
        prefill_wait_s(prefill, utilization),
        utilization,
    )


def concurrency_stated(run: dict) -> bool:
    """False where the source publishes neither the client's cap nor the engines' batch limit
    (`assumed_concurrency`: one prediction per assumed per-rank concurrency)."""
    return "assumed_concurrency" not in run


def _older_vllm_decode(model, pool, job: ServeJob, e: Engine, seqs: int):
    """A measured decode instance as the vLLM it ran runs it: the wide-EP rows (vLLM blog posts of
    2025-12 and 2026-02, on the vLLM of their day) and Moreh's vLLM 0.11.0 fork predate vLLM 0.33.0,
    and are priced as before: the `vllm serve` default step budget and vLLM 0.11.0's 256-token MoE DP
    chunks with a 256-token DeepEP low-latency buffer (`ServeConfig.moe_dp_chunk`), not the one-pass
    step at the planned budget autoshard's own 0.33.0 lines run."""
    budget = default_max_num_batched_tokens(pool.gpu)
    cfg = _config(model, pool, job, e, max_num_seqs=seqs, max_num_batched_tokens=budget, role="decode")
    return replace(cfg, moe_dp_chunk=MOE_DP_CHUNK)


def _decode(run: dict, input_len: int, output_len: int, assumed: int | None = None) -> DisaggResult:
    model = _model(run)
    e = _engine(run["decode"])
    pool = _pool(run, e.gpus)
    job = _job(run, input_len, output_len)
    top = serve_memory(
        model,
        pool.gpu,
        _older_vllm_decode(model, pool, job, e, run["max_num_seqs"]),
        context_len=job.context_len,
    )
    cap = min(run["max_num_seqs"], kv_limited_concurrency(top, job))
    if "client_concurrency" in run:
        cap = min(cap, run["client_concurrency"] // decode_ranks(run))
    if "requests_per_rank" in run:
        cap = min(cap, run["requests_per_rank"])
    if assumed is not None:
        cap = min(cap, assumed)
    batch = max(1, cap)
    cfg = _older_vllm_decode(model, pool, job, e, batch)
    inst = decode_instance(
        model,
        pool,
        job,
        cfg,
        serve_memory(model, pool.gpu, cfg, context_len=job.context_len),
        concurrency=batch,
    )
    tpot_ms = run.get("measured_tpot_ms")
    prefill = _prefill(run, job)
    ttft = part = load = None
    if prefill is not None and "measured_ttft_ms" in run:
        ttft, part, load = _ttft_at_measured_rate(run, job, prefill, inst)
    prefill_per_gpu = None
    if prefill is not None and "measured_prefill_tokens_per_s_per_gpu" in run:
        prefill_per_gpu = prefill.requests_per_s * input_len / prefill.gpus
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
        None if prefill is None else run["prefill"]["instances"] * prefill.requests_per_s,
        ttft,
        None if ttft is None else run["measured_ttft_ms"] * 1e-3,
        part,
        load,
        prefill_per_gpu,
        run.get("measured_prefill_tokens_per_s_per_gpu"),
    )


def _transfer_points(run: dict) -> list[TransferResult]:
    model = _model(run)
    pe, de = _engine(run["prefill"]), _engine(run["decode"])
    pool = _pool(run, pe.gpus + de.gpus)
    link = kv_link(pool, same_domain=False)
    out = []
    for prompt_len, kv_mib, transfer_ms, ttft_ms in run["points"]:
        job = _job(run, prompt_len, run["output_len"])
        pcfg = _config(model, pool, job, pe, max_num_seqs=1, role="prefill")
        dcfg = _config(model, pool, job, de, max_num_seqs=1, role="decode")
        hand_off = kv_transfer(model, job, pcfg, dcfg, link)
        prompt = prefill_time(model, pool, pcfg, prompt_len=prompt_len).total_s
        memory = serve_memory(model, pool.gpu, dcfg, context_len=job.context_len)
        first = decode_instance(model, pool, job, dcfg, memory, concurrency=1).tpot_s
        out.append(
            TransferResult(
                run["id"],
                prompt_len,
                hand_off.bytes_per_request / MIB,
                float(kv_mib),
                hand_off.seconds,
                transfer_ms * 1e-3,
                prompt + hand_off.seconds + first,
                ttft_ms * 1e-3,
                prompt,
            )
        )
    return out


def evaluate_prefills() -> list[PrefillResult]:
    out = []
    for run in load_runs("prefill"):
        job = _job(run, run["input_len"], run["output_len"])
        p = _prefill(run, job)
        out.append(
            PrefillResult(
                run["id"],
                p.gpus,
                p.requests_per_s * job.input_len / p.gpus,
                float(run["measured_prefill_tokens_per_s_per_gpu"]),
                run.get("chart_read", False),
                p.step,
                p.config.max_num_batched_tokens,
            )
        )
    return out


def evaluate_transfers() -> list[TransferResult]:
    return [p for run in load_runs("kv_transfer") for p in _transfer_points(run)]


def evaluate_runs() -> list[DisaggResult]:
    out = []
    for run in load_runs():
        if not concurrency_stated(run):
            out += [_decode(run, run["input_len"], run["output_len"], c) for c in run["assumed_concurrency"]]
        else:
            out.append(_decode(run, run["input_len"], run["output_len"]))
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
    stated_ids = {run["id"] for run in load_runs() if concurrency_stated(run)}
    stated = [r for r in results if r.id in stated_ids]
    if stated:
        errs = sorted(abs(r.error) for r in stated)
        print(
            f"\nstated workloads: {len(stated)} rows, median |error| {100 * errs[len(errs) // 2]:.0f}% "
            f"(max {100 * errs[-1]:.0f}%) in tokens/s per decode GPU"
        )
    for r in results:
        if r.ttft_s is not None:
            print(
                f"{r.id}: mean TTFT {r.ttft_s:.2f} s predicted at the measured request rate "
                f"(prefill {r.ttft_prefill_s:.2f} s at {100 * r.ttft_utilization:.0f}% load), "
                f"{r.measured_ttft_s:.2f} s measured ({_pct(r.ttft_error)})"
            )
    seen = set()
    for r in results:
        if r.prefill_tokens_per_s_per_gpu is not None and r.id not in seen:
            seen.add(r.id)
            print(
                f"{r.id}: prefill {r.prefill_tokens_per_s_per_gpu:,.0f} prompt tokens/s per prefill GPU "
                f"predicted at full load ({r.input_len}-token prompts), "
                f"{r.measured_prefill_tokens_per_s_per_gpu:,.0f} measured ({_pct(r.prefill_error)})"
            )
    prefills = evaluate_prefills()
    if prefills:
        head = f"{'GPUs':>5} {'pred tok/s/GPU':>15} {'measured':>9} {'error':>7}"
        print(f"\n{'prefill alone, full load':<44} {head}   predicted step: GEMM / EP all-to-all / rest")
        for q in prefills:
            read = " (chart reading)" if q.chart_read else ""
            figures = f"{q.predicted:>15,.0f} {q.measured:>9,.0f} {_pct(q.error):>7}"
            rest = q.step.total_s - q.step.gemm_s - q.step.ep_comm_s
            parts = f"{q.step.gemm_s:.2f} / {q.step.ep_comm_s:.2f} / {rest:.2f} s"
            step = f"{q.step_tokens:,} tokens per rank: {parts} (measured {q.measured_step_s:.2f} s)"
            print(f"{q.id:<44} {q.gpus:>5} {figures}   {step}{read}")
    transfers = evaluate_transfers()
    if transfers:
        print(
            f"\n{'1P1D, one request at a time':<36} {'prompt':>6} {'KV MiB':>7} {'meas.':>6} "
            f"{'hand-off ms':>11} {'meas.':>6} {'error':>7} {'TTFT ms':>8} {'meas.':>6} {'error':>7}"
        )
        for t in transfers:
            print(
                f"{t.id:<36} {t.prompt_len:>6} {t.kv_mib:>7,.0f} {t.measured_kv_mib:>6,.0f} "
                f"{1e3 * t.transfer_s:>11.2f} {1e3 * t.measured_transfer_s:>6.2f} "
                f"{_pct(t.transfer_error):>7} "
                f"{1e3 * t.ttft_s:>8.1f} {1e3 * t.measured_ttft_s:>6.1f} {_pct(t.ttft_error):>7}"
            )
    print(
        "\ndecode concurrency not stated by the source: one row per assumed requests per rank; the measured "
        "figure should fall inside the predicted range, not match one row.\n"
        "batch: requests per decode DP rank; prefill load: predicted decode rate / predicted prefill "
        "capacity of the stated prefill instances (> 100%: the prediction is prefill-bound)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
