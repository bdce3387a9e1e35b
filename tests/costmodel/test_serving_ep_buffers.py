"""DeepEP low-latency buffers in the serving memory: DeepEP's `LowLatencyLayout` size
(deepseek-ai/DeepEP csrc/config.hpp, commit 79bbb546) worked by hand for DeepSeek-V3 and Qwen3-235B,
and the KV cache of an attention-DP + EP decode engine shrinking by exactly the buffers."""

from __future__ import annotations

import pytest

import autoshard.costmodel.serve.memory as memory_module
from autoshard.costmodel.serve.compute import MOE_DP_CHUNK
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.ep_buffers import (
    VLLM_DEEPEP_NVL_BYTES,
    VLLM_MOE_DP_CHUNK_SIZE,
    deepep_ll_buffer_bytes,
    deepep_ll_engine_bytes,
    vllm_deepep_ll_budget,
    vllm_deepep_ll_cap,
)
from autoshard.costmodel.serve.comm_memory import NON_TORCH_BYTES
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.search.serve.solve import solve_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.units import GIB

DSV3 = load_model("deepseek-v3")
QWEN235 = load_model("qwen3-235b-a22b")
LLAMA70 = load_model("llama-3.1-70b")
H100 = load_cluster("dgx-h100")
H100_GPU = H100.primary.gpu
MI300X_GPU = load_cluster("mi300x").primary.gpu
A100_GPU = load_cluster("dgx-a100-80gb").primary.gpu


def _by_hand(hidden: int, experts: int, cap: int) -> int:
    """DeepEP's LowLatencyLayout, line by line."""
    scales = hidden // 128
    dispatch = 16 + max(hidden * 2, hidden + scales * 4)  # int4 header + BF16, or FP8 + FP32 scales
    combine = scales * 4 + hidden * 2  # per-128-channel bf16x2 min/max + BF16
    send = max(cap * dispatch, experts * cap * combine)
    recv = max(experts * cap * dispatch, experts * cap * combine)
    signaling = -(-(experts * 4) // 128) * 128
    total = 2 * send + 2 * recv + 2 * signaling
    return (total + 128) // 128 * 128  # get_low_latency_rdma_size_hint's rounding


@pytest.mark.parametrize(
    "model, cap, expected",
    [
        # DeepSeek-V3: hidden 7168 (56 scale groups), 256 routed experts.
        # dispatch 16 + max(14336, 7168 + 224) = 14352 B, combine 224 + 14336 = 14560 B;
        # send = recv = 256 x cap x 14560; signalling 2 x 1024; + 128 rounding
        (DSV3, 128, 4 * 256 * 128 * 14560 + 2 * 1024 + 128),
        (DSV3, 256, 4 * 256 * 256 * 14560 + 2 * 1024 + 128),
        # Qwen3-235B-A22B: hidden 4096 (32 groups), 128 experts: dispatch 8208 B, combine 8320 B
        (QWEN235, 128, 4 * 128 * 128 * 8320 + 2 * 512 + 128),
        (QWEN235, 256, 4 * 128 * 256 * 8320 + 2 * 512 + 128),
    ],
)
def test_buffer_is_deepeps_layout(model, cap, expected):
    assert deepep_ll_buffer_bytes(model, cap, 32) == expected
    assert expected == _by_hand(model.hidden_size, model.moe.num_experts, cap)


def test_deepseek_v3_figures():
    # the sizes vLLM (cap 256) and SGLang (cap 128) allocate for DeepSeek-V3: 3.55 and 1.78 GiB
    assert deepep_ll_buffer_bytes(DSV3, 256, 32) == 3_816_818_816
    assert deepep_ll_buffer_bytes(DSV3, 256, 32) / GIB == pytest.approx(3.5547, abs=1e-4)
    assert deepep_ll_buffer_bytes(DSV3, 128, 32) == 1_908_410_496
    assert deepep_ll_buffer_bytes(QWEN235, 256, 16) == 1_090_520_192  # 1.016 GiB


@pytest.mark.parametrize("ep", [1, 8, 16, 32, 64, 256])
def test_the_ep_size_does_not_enter_the_layout(ep):
    assert deepep_ll_buffer_bytes(DSV3, 256, ep) == deepep_ll_buffer_bytes(DSV3, 256, 8)


def test_dense_model_needs_no_buffer():
    assert deepep_ll_buffer_bytes(LLAMA70, 256, 8) == 0


@pytest.mark.parametrize("cap, ep", [(0, 8), (-1, 8), (1.5, 8), (256, 0), (256, 2.0)])
def test_bad_arguments_are_refused(cap, ep):
    with pytest.raises(ValueError):
        deepep_ll_buffer_bytes(DSV3, cap, ep)


def test_vllm_cap_is_the_step_budget_or_the_older_chunk():
    # vLLM 0.33.0: cap = FusedMoEConfig.max_num_tokens = the scheduler's --max-num-batched-tokens
    # (fused_moe/layer.py:286,373 -> all2all_utils.py:260 -> all2all.py:327-352); vLLM 0.11.0: the
    # 256-token DP chunk it ran each pass in (ServeConfig.moe_dp_chunk)
    assert VLLM_MOE_DP_CHUNK_SIZE == MOE_DP_CHUNK == 256
    cfg = ServeConfig(dp_attention=8, expert_parallel=True, max_num_batched_tokens=1024)
    assert vllm_deepep_ll_cap(cfg) == 1024
    assert vllm_deepep_ll_cap(ServeConfig(dp_attention=8, expert_parallel=True, moe_dp_chunk=256)) == 256


@pytest.mark.parametrize(
    "model, budget, expected",
    [
        # DeepSeek-V3 at the 8,192 autoshard's aggregated lines used to pass: 113.8 GiB per GPU
        (DSV3, 8192, 4 * 256 * 8192 * 14560 + 2 * 1024 + 128),
        (DSV3, 512, 4 * 256 * 512 * 14560 + 2 * 1024 + 128),
        # Qwen3-235B-A22B at 8,192: 32.5 GiB
        (QWEN235, 8192, 4 * 128 * 8192 * 8320 + 2 * 512 + 128),
    ],
)
def test_vllm_engine_buffer_at_its_budget_is_the_closed_form(model, budget, expected):
    cfg = ServeConfig(tp=1, dp_attention=16, expert_parallel=True, weight_dtype=WeightDtype.FP8,
                      max_num_seqs=min(budget, 256), max_num_batched_tokens=budget)
    assert deepep_ll_engine_bytes(model, H100_GPU, cfg) == expected + VLLM_DEEPEP_NVL_BYTES
    assert expected == _by_hand(model.hidden_size, model.moe.num_experts, budget)


def test_deepseek_and_qwen_at_8192_are_the_figures_the_issue_names():
    assert deepep_ll_buffer_bytes(DSV3, 8192, 16) / GIB == pytest.approx(113.75, abs=0.01)
    assert deepep_ll_buffer_bytes(QWEN235, 8192, 16) / GIB == pytest.approx(32.50, abs=0.01)


@pytest.mark.parametrize(
    "seqs, drafts, budget",
    [(1, 0, 256), (128, 1, 256), (200, 0, 256), (256, 0, 256), (257, 0, 512), (256, 1, 512), (462, 0, 512),
     (1024, 0, 1024), (700, 2, 2304)],
)
def test_smallest_vllm_budget_holds_the_decode_tokens(seqs, drafts, budget):
    """Decode tokens per rank rounded up to 256, at least vLLM's default of 256 for the backend."""
    assert vllm_deepep_ll_budget(seqs, drafts) == budget


@pytest.mark.parametrize("seqs, drafts", [(0, 0), (-3, 0), (1.5, 0), (4, -1)])
def test_vllm_budget_refuses_bad_arguments(seqs, drafts):
    with pytest.raises(ValueError):
        vllm_deepep_ll_budget(seqs, drafts)


DECODE = ServeConfig(tp=1, dp_attention=32, expert_parallel=True, weight_dtype=WeightDtype.FP8, max_num_seqs=224,
                     max_num_batched_tokens=256)


@pytest.mark.parametrize(
    "model, gpu, cfg, charged",
    [
        (DSV3, H100_GPU, DECODE, True),
        (QWEN235, H100_GPU, ServeConfig(tp=2, dp_attention=4, expert_parallel=True), True),
        (DSV3, H100_GPU, ServeConfig(tp=8, pp=2, expert_parallel=True, weight_dtype=WeightDtype.FP8), False),
        (DSV3, H100_GPU, ServeConfig(tp=8, pp=2, weight_dtype=WeightDtype.FP8), False),
        (DSV3, MI300X_GPU, ServeConfig(dp_attention=8, expert_parallel=True, weight_dtype=WeightDtype.FP8), False),
        (QWEN235, A100_GPU, ServeConfig(tp=2, dp_attention=4, expert_parallel=True), False),
    ],
)
def test_charged_only_where_the_low_latency_kernels_run(model, gpu, cfg, charged):
    """Attention DP + EP on Hopper or later, the buffer at the engine's budget (8,192 for the Qwen3 one)."""
    cap = cfg.max_num_batched_tokens
    expected = deepep_ll_buffer_bytes(model, cap, cfg.ep) + VLLM_DEEPEP_NVL_BYTES if charged else 0.0
    assert deepep_ll_engine_bytes(model, gpu, cfg) == expected


def test_decode_engine_kv_cache_shrinks_by_exactly_the_buffers(monkeypatch):
    with_buffers = serve_memory(DSV3, H100_GPU, DECODE, context_len=2000)
    monkeypatch.setattr(memory_module, "deepep_ll_engine_bytes", lambda *args, **kwargs: 0.0)
    without = serve_memory(DSV3, H100_GPU, DECODE, context_len=2000)
    buffers = deepep_ll_buffer_bytes(DSV3, 256, 32) + VLLM_DEEPEP_NVL_BYTES
    assert with_buffers.ep_buffer_bytes == buffers == pytest.approx(4.5547 * GIB, rel=1e-4)
    assert without.ep_buffer_bytes == 0.0
    assert with_buffers.non_torch_bytes == NON_TORCH_BYTES + buffers
    assert without.kv_cache_bytes - with_buffers.kv_cache_bytes == pytest.approx(buffers, abs=1.0)
    per_token = without.kv_cache_bytes / without.kv_cache_tokens
    lost = without.kv_cache_tokens - with_buffers.kv_cache_tokens
    assert lost == pytest.approx(buffers / per_token, abs=16)  # whole 16-token blocks


def test_disaggregated_solver_charges_the_decode_instances():
    """DeepSeek-V3 on 12 nodes of H100 (1000/1000, FP8): the decode instance's memory holds the
    buffers and its KV cache is what is left after them."""
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8)
    plan = solve_serve(
        DSV3, H100.with_gpus(96), job, pins=None, top_k=1, time_limit_s=20, num_workers=2, disaggregate="on"
    )[0]
    dec = plan.role("decode")
    assert dec.attention_dp > 1 and dec.ep > 1
    mem = dec.prediction.memory
    cfg = dec.prediction.config
    assert cfg.max_num_batched_tokens == vllm_deepep_ll_budget(cfg.max_num_seqs, cfg.speculative_tokens)
    buffers = deepep_ll_buffer_bytes(DSV3, cfg.max_num_batched_tokens, dec.ep) + VLLM_DEEPEP_NVL_BYTES
    assert mem.ep_buffer_bytes == buffers
    left = mem.budget_bytes - mem.weights_bytes - mem.activation_bytes - mem.cuda_graph_bytes
    assert mem.kv_cache_bytes == pytest.approx(left - NON_TORCH_BYTES - buffers, rel=1e-12)
    assert dec.prediction.concurrency * job.context_len <= mem.kv_cache_tokens
