"""Predict the published inference runs in serving_runs.yaml and compare with what was measured.

    python tests/validation/validate_serving.py

prints one row per run (measured and predicted output tokens/s of the instance, error), the median
and max absolute error, and whether the predicted TP1 -> TP8 ordering of the Llama-3.1-70B H100 runs
matches the measured one. The pytest suite imports `evaluate_runs` and holds the errors to the targets
(median |error| <= 25 %, same ordering).

PLAINLY: these are TensorRT-LLM 0.17 numbers (NVIDIA's perf-overview table), a different engine from
vLLM. autoshard's serving model is written for vLLM; the rows check the physics it shares with any
engine (weight and KV-cache memory, KV-limited concurrency, HBM- vs compute-bound decode, prefill
share, TP all-reduces), with the engine settings trtllm-bench itself picks:
- FP8 weights (embedding and lm_head BF16) and an FP8 KV cache (trtllm-bench forces it for FP8);
- KV cache = 0.95 of the memory left after the engine loads (kv_cache_free_gpu_mem_fraction);
  "left" subtracts the weights, the activation buffers of max_num_tokens, and the GPU type's
  `efficiency.reserved_memory_gib` (CUDA context, cuBLAS workspace, runtime buffers);
- max_batch_size and max_num_tokens from trtllm-bench's `finetune_setting` heuristic
  (tensorrt_llm/bench/build/tuning.py, reproduced in `trtllm_engine_settings`);
- concurrency = what the KV cache holds at ISL + OSL per request (the guaranteed-no-evict scheduler).

Knobs: none fitted. Every number comes from the bundled cluster's GpuSpec.efficiency defaults
(gemm_fp8, gemm_half_dim, attention, hbm, intra_node_bw, latencies, kernel overhead,
reserved_memory_gib), one value per GPU type as for training.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from autoshard.costmodel.serving import (
    ServeConfig,
    activation_peak_bytes,
    predict_serve,
    serve_memory,
    total_weight_bytes,
)
from autoshard.specs import ModelSpec, load_cluster
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.units import GIB

HERE = Path(__file__).resolve().parent
RUNS = HERE / "serving_runs.yaml"
KV_FREE_FRACTION = 0.95


@dataclass(frozen=True)
class RunResult:
    id: str
    model: str
    gpu: str
    tp: int
    measured: float
    predicted: float
    concurrency: int
    tpot_s: float

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def load_runs() -> list[dict]:
    return yaml.safe_load(RUNS.read_text())


def _model(arch: dict) -> ModelSpec:
    arch = dict(arch)
    n = arch.pop("num_layers")
    arch["layers"] = [{"kind": "embedding"}, {"kind": "dense", "count": n}, {"kind": "output"}]
    return ModelSpec.model_validate(arch)


def trtllm_engine_settings(
    model: ModelSpec,
    *,
    hbm_gib: float,
    tp: int,
    pp: int,
    weight_bytes: float,
    kv_bytes: float,
    input_len: int,
    output_len: int,
) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) as trtllm-bench's `calc_engine_setting` + `finetune_setting`."""
    per_token_gib = 2 * model.num_layers * max(tp, model.kv_heads) * model.kv_channels * kv_bytes / GIB
    engine_gib = model.num_params * weight_bytes / GIB
    cache_gib = (hbm_gib * tp * pp - engine_gib) * KV_FREE_FRACTION
    requests = cache_gib / (per_token_gib * (input_len + output_len))
    raw_bs = min(requests, 4096) / pp
    raw_tokens = min(raw_bs * (1 + input_len / output_len), 32768)
    if raw_bs < 256:
        bs = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        bs = 128 * math.ceil(raw_bs / 128)
    else:
        bs = 256 * math.ceil(raw_bs / 256)
    if raw_tokens < 4096:
        tokens = max(2048, 256 * math.ceil(raw_tokens / 256))
    elif raw_tokens < 8192:
        tokens = 512 * math.ceil(raw_tokens / 512)
    else:
        tokens = 1024 * math.ceil(raw_tokens / 1024)
    return bs, tokens


def predict_run(run: dict) -> RunResult:
    model = _model(run["model"])
    tp, pp = run["tp"], run["pp"]
    pool = load_cluster(run["cluster"]).with_gpus(tp * pp).primary
    gpu = pool.gpu
    wdt, kvdt = WeightDtype(run["weight_dtype"]), WeightDtype(run["kv_cache_dtype"])
    job = ServeJob(
        input_len=run["input_len"], output_len=run["output_len"], weight_dtype=wdt, kv_cache_dtype=kvdt
    )
    bs, tokens = trtllm_engine_settings(
        model,
        hbm_gib=gpu.hbm_gib,
        tp=tp,
        pp=pp,
        weight_bytes=wdt.bytes_per_param,
        kv_bytes=kvdt.bytes_per_param,
        input_len=job.input_len,
        output_len=job.output_len,
    )
    base = ServeConfig(
        tp=tp,
        pp=pp,
        weight_dtype=wdt,
        kv_cache_dtype=kvdt,
        max_num_seqs=bs,
        max_num_batched_tokens=tokens,
        cuda_graphs=False,
    )
    mem = serve_memory(model, gpu, base, context_len=job.context_len)
    act = activation_peak_bytes(model, tp=tp, ep=1, tokens=tokens, num_seqs=0)
    free = gpu.hbm_gib * GIB - gpu.efficiency.reserved_memory_gib * GIB - mem.weights_bytes - act
    cfg = ServeConfig(
        tp=tp,
        pp=pp,
        weight_dtype=wdt,
        kv_cache_dtype=kvdt,
        max_num_seqs=bs,
        max_num_batched_tokens=tokens,
        cuda_graphs=False,
        kv_cache_memory_bytes=KV_FREE_FRACTION * free,
    )
    pred = predict_serve(model, pool, job, cfg)
    assert (
        abs(mem.weights_bytes * tp - total_weight_bytes(model, wdt)) / total_weight_bytes(model, wdt) < 0.05
    )
    return RunResult(
        id=run["id"],
        model=model.name,
        gpu=gpu.name,
        tp=tp,
        measured=float(run["measured_output_tokens_per_s"]),
        predicted=pred.throughput_tokens_per_s,
        concurrency=pred.concurrency,
        tpot_s=pred.tpot_s,
    )


def evaluate_runs() -> list[RunResult]:
    return [predict_run(r) for r in load_runs()]


def tp_ordering(results: list[RunResult]) -> tuple[list[int], list[int]]:
    """TP degrees of the Llama-3.1-70B H100 runs sorted by measured and by predicted throughput."""
    rows = [r for r in results if r.model == "llama-3.1-70b"]
    measured = [r.tp for r in sorted(rows, key=lambda r: r.measured)]
    predicted = [r.tp for r in sorted(rows, key=lambda r: r.predicted)]
    return measured, predicted


def main() -> int:
    results = evaluate_runs()
    print("TensorRT-LLM 0.17 measurements (a different engine from vLLM); output tokens/s of the instance")
    print(f"{'run':46} {'measured':>9} {'predicted':>9} {'error':>8} {'batch':>6} {'TPOT ms':>8}")
    for r in results:
        print(
            f"{r.id:46} {r.measured:9.0f} {r.predicted:9.0f} {r.error:+8.1%} {r.concurrency:6d} "
            f"{r.tpot_s * 1e3:8.1f}"
        )
    errs = [abs(r.error) for r in results]
    print(f"\n{len(errs)} runs: median |error| {statistics.median(errs):.1%}, max |error| {max(errs):.1%}")
    measured, predicted = tp_ordering(results)
    verdict = "matches" if measured == predicted else "DOES NOT match"
    print(
        f"TP ordering by throughput (Llama-3.1-70B, H100): measured {measured}, "
        f"predicted {predicted}: {verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
