"""A vLLM DP + EP line without --all2all-backend runs vLLM 0.33.0's default backend,
allgather_reducescatter (`ParallelConfig.all2all_backend`, vllm/config/parallel.py:220 in the 0.33.0
wheel; VLLM_ALL2ALL_BACKEND is no longer read), which is not one of `use_batched_dp_moe`'s backends
(deepep_low_latency, nixl_ep: config/parallel.py:795-805): vLLM gives it its usual step budget (8,192
and 1,024 requests on an H100, engine/arg_utils.py:3163-3180), not the batched-DP 256, and sizes no
DeepEP buffer at the budget. `evaluate --from-vllm` priced it with deepep_low_latency's 256 (13,897
output tokens/s for DeepSeek-V3 DP16 x EP16 on 16 H100, 1,000 in / 1,000 out), refused
--max-num-seqs 512 and --max-num-batched-tokens 8192 (a 114.8 GiB buffer the line never allocates);
it now runs vLLM's own defaults (8,935 tokens/s, TTFT 0.32 s instead of 0.62 s: 8,192-token prefill
steps, a 4.5 GiB activation peak that shrinks the KV cache from 87 to 56 requests per rank)."""

from __future__ import annotations

import pytest

from autoshard.api_serve import evaluate_vllm
from autoshard.costmodel.serve.ep_buffers import VLLM_DEEPEP_NVL_BYTES, deepep_ll_buffer_bytes
from autoshard.search.serve.evaluate import batched_dp_backend
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

DSV3 = load_model("deepseek-v3")
H100x16 = load_cluster("dgx-h100").with_gpus(16)
JOB = ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8)
LINE = ("vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 1 --data-parallel-size 16 "
        "--enable-expert-parallel --max-model-len 2000")


def _plan(extra: str = ""):
    return evaluate_vllm(DSV3, H100x16, LINE + extra, job=JOB)


def test_batched_dp_backends_are_vllms():
    assert batched_dp_backend(None) and batched_dp_backend("deepep_low_latency") and batched_dp_backend("nixl_ep")
    assert not batched_dp_backend("allgather_reducescatter") and not batched_dp_backend("deepep_high_throughput")


def test_line_without_a_backend_runs_vllms_usual_budget():
    plan = _plan()
    cfg, mem = plan.prediction.config, plan.prediction.memory
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == (8192, 1024)
    # no buffer grows with the budget: DeepEP's kernels priced in 256-token passes, their buffer at 256
    assert cfg.moe_dp_chunk == 256
    assert mem.ep_buffer_bytes == deepep_ll_buffer_bytes(DSV3, 256, 16) + VLLM_DEEPEP_NVL_BYTES
    assert plan.prediction.concurrency == 56
    assert plan.throughput_tokens_per_s == pytest.approx(8935.5, rel=2e-3)
    assert plan.prediction.ttft_s == pytest.approx(0.319, rel=0.01)
    assert any("allgather_reducescatter (vLLM's default" in w and "not modelled" in w for w in plan.warnings)
    # relaunched as it was read (no --all2all-backend), and read back to the same figures
    assert "--all2all-backend" not in plan.launch["vllm"] and "--max-num-batched-tokens 8192" in plan.launch["vllm"]
    again = evaluate_vllm(DSV3, H100x16, plan.launch["vllm"], job=JOB)
    assert again.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-12)


def test_low_latency_line_keeps_vllms_256():
    plan = _plan(" --all2all-backend deepep_low_latency")
    cfg = plan.prediction.config
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.moe_dp_chunk) == (256, 256, None)
    assert plan.prediction.memory.ep_buffer_bytes == deepep_ll_buffer_bytes(DSV3, 256, 16) + VLLM_DEEPEP_NVL_BYTES
    # the 256-token steps' small activation peak leaves a larger KV cache than the default backend's 8,192
    # (89 requests a rank, 14,069 tokens/s)
    default = _plan()
    assert plan.prediction.memory.kv_cache_tokens > 1.5 * default.prediction.memory.kv_cache_tokens
    assert plan.prediction.concurrency == 89
    assert plan.throughput_tokens_per_s == pytest.approx(14069.3, rel=2e-3)


def test_default_backend_takes_seqs_and_budgets_vllm_starts():
    # both were refused as if the line sized a DeepEP low-latency buffer at its budget
    seqs = _plan(" --max-num-seqs 512")
    assert (seqs.prediction.config.max_num_seqs, seqs.prediction.concurrency) == (512, 62)
    big = _plan(" --max-num-batched-tokens 8192")
    assert big.prediction.memory.ep_buffer_bytes == deepep_ll_buffer_bytes(DSV3, 256, 16) + VLLM_DEEPEP_NVL_BYTES
    assert big.throughput_tokens_per_s == pytest.approx(_plan().throughput_tokens_per_s, rel=1e-12)
