"""Serving cost model of vLLM-style engines (vLLM, SGLang, TensorRT-LLM): memory, step times,
throughput and latency.

Which file owns what:
- config.py: the engine's settings (ServeConfig, named as vLLM's flags) and layers per PP stage.
- weights.py: weight bytes per GPU (per storage dtype, TP/EP sharded) and KV-cache bytes per token.
- memory.py: vLLM's memory accounting (activation peak, CUDA graphs, KV cache left: ServeMemory).
- comm_memory.py: NCCL's memory per GPU (communicators, NVLS buffers) and where vLLM charges it.
- compute.py: per-GPU compute and HBM terms of a step (GEMMs per dtype, grouped experts, elementwise
  kernels).
- attention.py: prefill and decode attention (FlashAttention-3 on Hopper, paged GQA, FlashMLA).
- sharding.py: what TP, EP, PP and attention-DP add (links, TP all-reduces, EP dispatch volumes,
  PP sends, the busiest DP rank's prefill); collectives are priced in `costmodel.comm`.
- step.py: one engine step and a prompt's prefill assembled over the stages (StepTime).
- predict.py: throughput, TTFT and TPOT at a concurrency or an arrival rate (ServePrediction).
- latency.py: queueing (M/D/c waits) and latency quantiles.
- sim.py: a step-by-step simulation of vLLM's scheduler serving a burst of requests (offline benchmarks).
- disagg.py: prefill/decode disaggregation (separate prefill and decode pools, KV transfer).

Entry points re-exported here: `predict_serve`, `latency_at_rate`, `serve_memory`, `step_time`,
`prefill_time`, `ServeConfig`, `ServePrediction`, `ServeMemory`, `StepTime`.
"""

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import ServeMemory, serve_memory
from autoshard.costmodel.serve.predict import ServePrediction, latency_at_rate, predict_serve
from autoshard.costmodel.serve.step import StepTime, prefill_time, step_time

__all__ = [
    "predict_serve", "latency_at_rate", "serve_memory", "step_time", "prefill_time", "ServeConfig",
    "ServePrediction", "ServeMemory", "StepTime",
]
