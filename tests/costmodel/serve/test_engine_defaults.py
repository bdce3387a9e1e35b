"""What vLLM 0.33.0 and SGLang 0.5.23 pick at start-up that sets an engine's memory
(`autoshard.costmodel.serve.engine_defaults`), in closed form from the engines' rules:
- the KV block of the attention backend each selects, and the concurrency a block-rounded request allows
  (DeepSeek-V3's MLA cache on 8 GPUs: 576 values x 61 layers a token, replicated over TP);
- the decode CUDA-graph capture lists, and vLLM's 1,024-token ceiling on Blackwell in the "graphed"
  decision of its DP MoE engine;
- SGLang's --mem-fraction-static, a fraction of the memory free after its parallel initialization, so
  that the pool SGLang builds is the plan's (Llama 3.1 70B on 8 H100, DeepSeek-V3 on 16 H200)."""

from __future__ import annotations

import math

import pytest

from autoshard.api_serve import evaluate_serve
from autoshard.costmodel.serve.comm_memory import NCCL_COMMUNICATOR_BYTES
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.engine_defaults import (
    CUDA_CONTEXT_BYTES,
    capture_sizes,
    kv_block_tokens,
    sglang_baseline_bytes,
    sglang_capture_batch_sizes,
    vllm_capture_sizes,
)
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.predict import kv_limited_concurrency
from autoshard.costmodel.serve.vllm_dp_moe import gathered_rows
from autoshard.costmodel.serve.weights import kv_cache_bytes_per_token_per_gpu
from autoshard.emit.sglang.command import mem_fraction_static, sglang_memory_utilization
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.specs.prepare import resize
from autoshard.units import GIB, MIB

DSV3 = load_model("deepseek-v3")
LLAMA70 = load_model("llama-3.1-70b")
H100 = load_cluster("dgx-h100").with_gpus(8).primary
H200 = load_cluster("dgx-h200").with_gpus(8).primary
B200 = load_cluster("dgx-b200").with_gpus(8).primary
BF16, FP8 = WeightDtype.BF16, WeightDtype.FP8
MLA_VALUES, LAYERS = 512 + 64, 61  # kv_lora_rank + qk_rope_head_dim a token per layer


def _dsv3(pool, engine: str, kv: WeightDtype):
    cfg = ServeConfig(tp=8, weight_dtype=FP8, kv_cache_dtype=kv, kv_cache_memory_bytes=20 * GIB,
                      engine=engine, max_num_seqs=1024)
    return serve_memory(DSV3, pool, cfg, context_len=2000)


@pytest.mark.parametrize(("pool", "engine", "kv", "block"), [
    (H200, "vllm", BF16, 16),    # FLASH_ATTN_MLA: MultipleOf(16) takes vLLM's default 16
    (H200, "vllm", FP8, 64),     # FLASH_ATTN_MLA takes no FP8 cache: FLASHMLA, 64 only
    (B200, "vllm", BF16, 32),    # FLASHINFER_MLA: [32, 64], 16 unsupported -> the smallest, 32
    (B200, "vllm", FP8, 32),
    (H200, "sglang", FP8, 1),    # fa3, --page-size defaults to 1
    (B200, "sglang", FP8, 64),   # trtllm_mla forces 64
])
def test_mla_blocks_follow_the_backend(pool, engine, kv, block):
    mem = _dsv3(pool, engine, kv)
    default = ServeConfig(kv_cache_dtype=kv, engine=engine)
    assert mem.kv_block_tokens == kv_block_tokens(DSV3, pool.gpu, default) == block
    per_token = MLA_VALUES * LAYERS * (1 if kv is FP8 else 2)
    assert kv_cache_bytes_per_token_per_gpu(DSV3, tp=8, layers=LAYERS, dtype=kv) == per_token
    pool_tokens = 20 * GIB // per_token // block * block
    assert mem.kv_cache_tokens == pool_tokens
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=FP8, kv_cache_dtype=kv)
    assert kv_limited_concurrency(mem, job) == pool_tokens // (block * math.ceil(2000 / block))
    assert mem.max_concurrency == pool_tokens / (block * math.ceil(2000 / block))  # vLLM's num_blocks / cdiv


def test_flashmla_blocks_cost_two_percent_of_deepseek_concurrency():
    """20 GiB of FP8 MLA cache a GPU = 611,191 tokens; in 64-token blocks 9,549 of them (611,136 tokens),
    and a 1000/1000 request ends in 32 blocks (2,048 tokens): 298 requests, 305 counted in tokens."""
    mem = _dsv3(H200, "vllm", FP8)
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=FP8, kv_cache_dtype=FP8)
    assert 20 * GIB // 35_136 == 611_191 and mem.kv_cache_tokens == 9_549 * 64
    assert kv_limited_concurrency(mem, job) == 9_549 // 32 == 298
    assert 611_191 // 2000 == 305 and 298 / 305 - 1 == pytest.approx(-0.023, abs=5e-4)
    assert _dsv3(H200, "vllm", BF16).kv_block_tokens == 16  # autoshard's default BF16 cache: unchanged
    assert kv_block_tokens(LLAMA70, B200.gpu, ServeConfig()) == 16  # FLASHINFER takes vLLM's 16


def test_vllm_capture_sizes():
    """`_set_cudagraph_sizes` (vllm/config/vllm.py:2451-2600): up to min(2 x seqs x q, 512 | 1024, budget)."""
    hopper = vllm_capture_sizes(122, max_num_batched_tokens=8192)  # DeepSeek-V3's decode instance on H200
    assert hopper == sorted([1, 2, 4, *range(8, 241, 8), 122])  # max_num_seqs itself is captured
    assert len(hopper) == 34 and hopper[-1] == 240
    assert capture_sizes(H200.gpu, ServeConfig(max_num_seqs=512))[-1] == 512
    blackwell = capture_sizes(B200.gpu, ServeConfig(max_num_seqs=512, max_num_batched_tokens=16384))
    assert blackwell[-1] == 1024 and blackwell[-17:] == list(range(768, 1025, 16))
    # a step budget under the ceiling caps the list and is captured itself
    assert vllm_capture_sizes(256, max_num_batched_tokens=300)[-3:] == [272, 288, 300]
    # two MTP drafts (q = 3): the token grid to 384 plus 3 x each request count: 3, 6 and 12 are new
    mtp = capture_sizes(H200.gpu, ServeConfig(max_num_seqs=64, speculative_tokens=2))
    assert mtp == sorted({1, 2, 3, 4, 6, 12, *range(8, 256, 8), *range(256, 385, 16)})


def test_sglang_capture_sizes():
    """`handle_gpu_memory_settings` + `generate_decode_cuda_graph_batch_sizes`: the 70B's TP 4 engine on
    H100 (a largest batch of 512 at --tp-size 4, capped at --max-running-requests 173), and a --tp-size 2
    engine on H100 (256)."""
    sizes = capture_sizes(H100.gpu, ServeConfig(tp=4, max_num_seqs=173, engine="sglang"))
    assert sizes == [1, 2, 4, 8, 12, *range(16, 169, 8), 173] and len(sizes) == 26
    assert capture_sizes(H100.gpu, ServeConfig(tp=2, max_num_seqs=300, engine="sglang"))[-1] == 256
    wide = capture_sizes(H100.gpu, ServeConfig(tp=4, max_num_seqs=600, engine="sglang"))
    assert wide[-3:] == [480, 496, 512]
    # EAGLE with one draft: the finer list, each graph 2 tokens a request
    assert sglang_capture_batch_sizes(40, requests=40, drafts=1) == [*range(1, 9), *range(10, 33, 2), 40]
    eagle = capture_sizes(H100.gpu, ServeConfig(tp=8, max_num_seqs=40, engine="sglang", speculative_tokens=1))
    assert eagle[-1] == 80


def test_blackwell_ceiling_keeps_wide_dp_steps_graphed():
    """vLLM's DP MoE engine pads every rank to the busiest only inside a CUDA graph: 600 tokens a rank at
    max_num_seqs 512 is graphed on a B200 (ceiling 1,024) and eager on an H100 (512)."""
    cfg = ServeConfig(tp=1, dp_attention=8, max_num_seqs=512, max_num_batched_tokens=16384)
    assert gathered_rows(cfg, B200.gpu, rows_sum=4000, rows_max=600) == 8 * 600
    assert gathered_rows(cfg, H100.gpu, rows_sum=4000, rows_max=600) == 4000


def _plan(model, cluster: str, gpus: int, job: ServeJob, **kw):
    return evaluate_serve(model, resize(load_cluster(cluster), gpus), job, framework="sglang", **kw)


@pytest.mark.parametrize(("case", "capacity_gib"), [("llama70b-h100x8", 79.6), ("dsv3-h200x16", 140.4)])
def test_mem_fraction_static_builds_the_planned_pool(case, capacity_gib):
    """SGLang's pool is fraction x B - weights, B the memory free after its parallel initialization
    (kv_cache_configurator.py:2990-3061, bootstrap.py:193-223): B = capacity - the CUDA context (1.06 GiB:
    vLLM PR #25359's H100 had 78.59 GiB of 81,559 MiB free before NCCL) - one NCCL communicator (1.5 GiB,
    NVLS off as SGLang runs it). The fraction is the plan's weights + KV over B, so SGLang's pool is the
    plan's less at most 0.001 x B; the fraction of the capacity left it short by fraction x 2.56 GiB.

    Llama 3.1 70B, 8 H100, TP 4 x 2 replicas, 173 requests: static 69.92 GiB, B = 77.04 GiB -> 0.907
    (it was 0.878: a pool of 34.79 GiB for the plan's 37.06, -6.1 %). DeepSeek-V3 FP8, 16 H200, TP 8 x DP 2
    with EP 16: static 117.45 GiB, B = 137.84 GiB -> 0.852 (it was 0.836: 74.03 GiB for 76.24, -2.9 %)."""
    if case == "llama70b-h100x8":
        job = ServeJob(input_len=1000, output_len=1000)
        plan = _plan(LLAMA70, "dgx-h100", 8, job, tp=4, dp=2, max_num_seqs=173)
        want, was = 0.907, 0.878
    else:
        job = ServeJob(input_len=1000, output_len=1000, weight_dtype=FP8)
        plan = _plan(DSV3, "dgx-h200", 16, job, tp=8, dp=2, expert_parallel=True)
        want, was = 0.852, 0.836
    mem, cfg = plan.prediction.memory, plan.prediction.config
    assert mem.capacity_bytes == capacity_gib * GIB and not cfg.nccl_nvls
    assert CUDA_CONTEXT_BYTES == 81559 * MIB - 78.59 * GIB == pytest.approx(1.0575 * GIB, rel=1e-4)
    base = sglang_baseline_bytes(plan.pool, cfg)
    assert base == capacity_gib * GIB - CUDA_CONTEXT_BYTES - NCCL_COMMUNICATOR_BYTES
    static = mem.weights_bytes + mem.kv_cache_bytes
    assert static == pytest.approx(mem.budget_bytes - mem.activation_bytes - mem.overhead_bytes, rel=1e-12)
    fraction = mem_fraction_static(plan)
    assert fraction == math.floor(1000 * static / base) / 1000 == want
    pool = fraction * base - mem.weights_bytes  # what SGLang builds
    assert mem.kv_cache_bytes - 0.001 * base < pool <= mem.kv_cache_bytes
    assert math.floor(1000 * static / mem.capacity_bytes) / 1000 == was  # the old fraction of the capacity
    assert was * base - mem.weights_bytes < mem.kv_cache_bytes - 2.2 * GIB
    # --from-sglang reads the line back to the plan's budget (to the rounding of the fraction)
    util = sglang_memory_utilization(fraction, mem, plan.pool, cfg)
    top = plan.gpu_memory_utilization
    assert top - 0.001 * base / mem.capacity_bytes < util <= top
