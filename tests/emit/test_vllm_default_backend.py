"""A vLLM DP + EP line without --all2all-backend runs vLLM 0.33.0's default backend,
allgather_reducescatter (`ParallelConfig.all2all_backend`, vllm/config/parallel.py:220 in the 0.33.0
wheel; VLLM_ALL2ALL_BACKEND is no longer read), which is not one of `use_batched_dp_moe`'s backends
(deepep_low_latency, nixl_ep: config/parallel.py:795-805): vLLM gives it its usual step budget (8,192
and 1,024 requests on an H100, engine/arg_utils.py:3163-3180), not the batched-DP 256, and sizes no
DeepEP buffer at the budget. `evaluate --from-vllm` priced it with deepep_low_latency's 256 (13,897
output tokens/s for DeepSeek-V3 DP16 x EP16 on 16 H100, 1,000 in / 1,000 out), refused
--max-num-seqs 512 and --max-num-batched-tokens 8192 (a 114.8 GiB buffer the line never allocates);
it then ran vLLM's own defaults but still priced DeepEP's kernels in 256-token passes with a DeepEP buffer
charged (8,935 tokens/s). It is now priced as vLLM runs it (`ServeConfig.all2all_backend`,
`costmodel.serve.vllm_dp_moe`): no DeepEP buffer, each MoE layer an all-gather of the 16 ranks' tokens
and a reduce-scatter of the outputs, the experts in one pass on the gathered rows, whose workspace in
vLLM's profiling forward (16 x 8,192 rows: 50 GiB) does not fit beside the 55.8 GiB of weights, so the
line as written is refused, naming the largest budget that starts; at --max-num-batched-tokens 1024
--max-num-seqs 256 it runs 8,892 tokens/s (10,729 when priced as DeepEP's 256-token passes)."""

from __future__ import annotations

import pytest

from autoshard.api_serve import evaluate_vllm
from autoshard.costmodel.serve.config import AGRS_BACKEND
from autoshard.costmodel.serve.ep_buffers import VLLM_DEEPEP_NVL_BYTES, deepep_ll_buffer_bytes
from autoshard.errors import InfeasibleError
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


def test_line_without_a_backend_is_refused_at_vllms_usual_budget():
    # vLLM's usual 8,192 tokens x 16 DP ranks through the experts at once in the profiling forward
    with pytest.raises(InfeasibleError, match=r"all-gathers the 16 DP ranks' tokens.*8,192.*50\.0 GiB of activations"
                                              r".*pass --max-num-batched-tokens 2038 or less"):
        _plan()
    with pytest.raises(InfeasibleError, match=r"pass --max-num-batched-tokens 2163 or less"):
        _plan(" --max-num-seqs 512")


def test_refusal_at_the_least_budget_names_the_start_check_and_its_fix():
    """Without --max-model-len vLLM starts only if the KV cache holds one request of the model's 163,840-token
    context (vllm/v1/core/kv_cache_planning.py:151-185). At the least budget, 1,024, the activations fit (7.5 GiB)
    and that check is what fails: the refusal says so and names --max-model-len (it said "lower --max-num-seqs or
    use more GPUs per engine", found by a review helper); the line it names starts."""
    bare = LINE.replace(" --max-model-len 2000", "")
    with pytest.raises(InfeasibleError, match=r"at 1,024 \(vLLM's least.*the activations take 7\.5 GiB and the KV cache "
                                              r"holds 93,776 tokens, less than one request of max_model_len 163,840: "
                                              r"pass --max-num-batched-tokens 1024 with --max-model-len 93776 or less"):
        evaluate_vllm(DSV3, H100x16, bare, job=JOB)
    plan = evaluate_vllm(DSV3, H100x16, bare + " --max-num-batched-tokens 1024 --max-model-len 93776", job=JOB)
    assert plan.prediction.memory.kv_cache_tokens == 93776
    assert plan.throughput_tokens_per_s == pytest.approx(8004.7, rel=2e-3)


def test_line_without_a_backend_priced_as_allgather_reducescatter():
    plan = _plan(" --max-num-batched-tokens 1024 --max-num-seqs 256")
    cfg, mem = plan.prediction.config, plan.prediction.memory
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.all2all_backend, cfg.moe_dp_chunk) == (
        1024, 256, AGRS_BACKEND, None)
    assert mem.ep_buffer_bytes == 0
    assert plan.prediction.concurrency == 55
    assert plan.throughput_tokens_per_s == pytest.approx(8892.3, rel=2e-3)
    assert plan.prediction.ttft_s == pytest.approx(0.218, rel=0.01)
    assert any("allgather_reducescatter (vLLM's default" in w and "priced as it runs" in w for w in plan.warnings)
    # relaunched as it was read (no --all2all-backend), and read back to the same figures
    assert "--all2all-backend" not in plan.launch["vllm"] and "--max-num-batched-tokens 1024" in plan.launch["vllm"]
    again = evaluate_vllm(DSV3, H100x16, plan.launch["vllm"], job=JOB)
    assert again.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-12)
    assert again.prediction.config.all2all_backend == AGRS_BACKEND
    # pplx and naive fall back to it in vLLM 0.33.0
    pplx = _plan(" --all2all-backend pplx --max-num-batched-tokens 1024 --max-num-seqs 256")
    assert pplx.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-12)
    assert any("removed: vLLM 0.33.0 runs allgather_reducescatter" in w for w in pplx.warnings)


def test_low_latency_line_keeps_vllms_256():
    plan = _plan(" --all2all-backend deepep_low_latency")
    cfg = plan.prediction.config
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.moe_dp_chunk, cfg.all2all_backend) == (256, 256, None, None)
    assert plan.prediction.memory.ep_buffer_bytes == deepep_ll_buffer_bytes(DSV3, 256, 16) + VLLM_DEEPEP_NVL_BYTES
    assert plan.prediction.concurrency == 89
    assert plan.throughput_tokens_per_s == pytest.approx(14069.3, rel=2e-3)
    assert "--all2all-backend deepep_low_latency" in plan.launch["vllm"]


def test_default_backend_takes_seqs_past_its_budget_and_a_smaller_budget():
    seqs = _plan(" --max-num-seqs 512 --max-num-batched-tokens 512")
    assert (seqs.prediction.config.max_num_seqs, seqs.prediction.memory.ep_buffer_bytes) == (512, 0)
    small = _plan(" --max-num-batched-tokens 512 --max-num-seqs 256")
    assert small.prediction.concurrency == 78
    assert small.throughput_tokens_per_s == pytest.approx(12051.1, rel=2e-3)
