"""Where the time of each vLLM burst row goes, as the model predicts it, next to what was measured.

    python tests/validation/burst_breakdown.py

For every checked burst row of serving_runs.yaml (the GPUStack vLLM v0.11.0 runs that
validate_serving.py replays with `autoshard.costmodel.serve.sim.simulate_burst`) it prints:
- measured and predicted total tokens/s, mean TTFT and mean TPOT, and the replay's peak number of
  running requests (what the KV cache admits: every row is KV-limited);
- the replay's seconds by kind of work (`BurstResult.breakdown`: GEMMs, attention, memory-bound
  kernels, logits, TP all-reduce, host), summed over all its steps;
- two steps priced alone, with the routed experts' grouped GEMMs split out of the GEMMs: a
  prefill-only step (one token budget of the prompt, the first steps of a burst) and a decode-only
  step at the replay's peak concurrency, mid-output context (the drain);
- the run's measured median and P99 inter-token latency (MEASURED_ITL): where most of a run's steps
  are decode-only, the median is such a step; the P99 is a full-budget step (at 32k-token prompts the
  chunk that attends to the longest prefix).

No fit, no I/O beyond the YAML: a diagnostic for the cost model's serving terms.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from validate_serving import _model, _pool, load_burst_runs  # noqa: E402

from autoshard.costmodel.serve.compute import _grouped_experts_s, model_serving_gpu  # noqa: E402
from autoshard.costmodel.serve.config import ServeConfig  # noqa: E402
from autoshard.costmodel.serve.sim import BurstResult, simulate_burst  # noqa: E402
from autoshard.costmodel.serve.step import StepTime, step_time  # noqa: E402
from autoshard.specs.job import ServeJob, WeightDtype  # noqa: E402

KINDS = ("gemm_s", "attention_s", "elementwise_s", "logits_s", "tp_comm_s", "host_s")
MEASURED_ITL = {
    "gpustack-qwen3-235b-h100-vllm-tp8-bf16-32000-82": (23.29, 376.34),
    "gpustack-qwen3-235b-h100-vllm-tp8-bf16-3996-184": (30.18, 245.68),
    "gpustack-qwen3-235b-h100-vllm-tp8-bf16-1996-99": (35.94, 244.64),
    "gpustack-qwen3-235b-h100-vllm-tp4-fp8-32000-83": (27.60, 1117.34),
    "gpustack-qwen3-235b-h100-vllm-tp4-fp8-3996-182": (34.82, 642.94),
    "gpustack-qwen3-235b-h100-vllm-tp4-fp8-1996-99": (39.21, 632.84),
    "gpustack-deepseek-r1-h200-vllm-tp8-31999-100": (459.96, 614.75),
    "gpustack-deepseek-r1-h200-vllm-tp8-3995-200": (57.87, 383.79),
    "gpustack-deepseek-r1-h200-vllm-tp8-1997-100": (357.74, 379.46),
}
"""(median, P99) inter-token latency in ms that `vllm bench serve` printed for each checked burst row,
from the same pages as the rows (serving_runs.yaml citations: gpustack/gpustack
docs/performance-lab/qwen3-235b-a22b/h100.md at git 10e9444a, baseline and optimized results;
docs/performance-lab/deepseek-r1/h200.md at git a5c9fafc, baseline results)."""


def burst_setup(run: dict) -> tuple:
    """(model, pool, job, cfg) of one burst row, as validate_serving.predict_burst builds them."""
    model = _model(run["model"])
    pool = _pool(run["cluster"], run["tp"])
    wdt, kvdt = WeightDtype(run["weight_dtype"]), WeightDtype(run["kv_cache_dtype"])
    job = ServeJob(
        input_len=run["input_len"], output_len=run["output_len"], weight_dtype=wdt, kv_cache_dtype=kvdt
    )
    cfg = ServeConfig(
        tp=run["tp"],
        expert_parallel=run["expert_parallel"],
        weight_dtype=wdt,
        kv_cache_dtype=kvdt,
        max_num_seqs=run["max_num_seqs"],
        max_num_batched_tokens=run["max_num_batched_tokens"],
        deep_gemm=False,  # as validate_serving.predict_burst: GPUStack's image has no DeepGEMM
    )
    return model, pool, job, cfg


def expert_gemm_s(model, pool, cfg: ServeConfig, tokens: float) -> float:
    """Seconds of the routed experts' grouped GEMMs in one step of `tokens` tokens (all MoE layers)."""
    if model.moe is None or tokens <= 0:
        return 0.0
    gpu = model_serving_gpu(model, pool.gpu, cfg.weight_dtype)
    return model.num_moe_layers * _grouped_experts_s(model, gpu, cfg, tokens)


def step_rows(run: dict, sim: BurstResult) -> list[tuple[str, StepTime, float]]:
    """(label, step time, routed-expert GEMM seconds inside its gemm_s) of the two reference steps."""
    model, pool, job, cfg = burst_setup(run)
    isl, osl = job.input_len, job.output_len
    chunk = cfg.max_num_batched_tokens  # a burst's first steps fill the budget with prompt tokens
    prefill = step_time(
        model, pool, cfg, decode_seqs=0, prefill_tokens=chunk, prefills=chunk / isl, prefill_len=isl,
        context_len=0,
    )
    batch = sim.max_running
    decode = step_time(
        model, pool, cfg, decode_seqs=batch, prefill_tokens=0, prefills=0, prefill_len=isl,
        context_len=isl + osl / 2,
    )
    return [
        (f"prefill-only step, {chunk} tokens", prefill, expert_gemm_s(model, pool, cfg, chunk)),
        (f"decode-only step, {batch} requests", decode, expert_gemm_s(model, pool, cfg, batch)),
    ]


def _ms(x: float) -> str:
    return f"{x * 1e3:9.1f}"


def main() -> int:
    print(__doc__.split("\n\n")[0])
    for run in load_burst_runs():
        model, pool, job, cfg = burst_setup(run)
        sim = simulate_burst(model, pool, job, cfg, requests=run["requests"])
        total = sim.total_tokens_per_s(job.input_len, job.output_len)
        print(f"\n{run['id']}  ({run['requests']} requests of {job.input_len} in / {job.output_len} out)")
        for name, measured, predicted, scale, unit in (
            ("total tokens/s", run["total_tokens_per_s"], total, 1.0, ""),
            ("mean TTFT", run["ttft_s"], sim.mean_ttft_s, 1.0, " s"),
            ("mean TPOT", run["tpot_s"], sim.mean_tpot_s, 1e3, " ms"),
        ):
            print(
                f"  {name:15} measured {measured * scale:10.2f}{unit:3} predicted {predicted * scale:10.2f}{unit:3}"
                f" {predicted / measured - 1:+7.1%}"
            )
        b = sim.breakdown
        spent = b.total_s
        shares = "  ".join(f"{k[:-2]} {getattr(b, k) / spent:5.1%}" for k in KINDS)
        print(f"  replay: {sim.steps} steps, peak {sim.max_running} running, {spent:.1f} s: {shares}")
        print(f"  {'step (ms)':34} {'experts':>9} {'other GEMM':>10} {'attention':>9} {'memory-b.':>9}"
              f" {'logits':>9} {'TP a-r':>9} {'host':>9} {'total':>9}")
        for label, st, experts in step_rows(run, sim):
            print(
                f"  {label:34} {_ms(experts)} {(st.gemm_s - experts) * 1e3:10.1f} {_ms(st.attention_s)}"
                f" {_ms(st.elementwise_s)} {_ms(st.logits_s)} {_ms(st.tp_comm_s)} {_ms(st.host_s)}"
                f" {_ms(st.total_s)}"
            )
        median, p99 = MEASURED_ITL[run["id"]]
        print(f"  measured inter-token latency: median {median:.1f} ms, P99 {p99:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
