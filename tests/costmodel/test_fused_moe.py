"""vLLM's fused_moe as the serving model prices it (#10, `autoshard.costmodel.serve.fused_moe`): the
moe_sum copies, the Poisson-padded tiles, the Triton block-FP8 rate at prefill tiles and the DeepGEMM
choice. Closed forms and brute-force sums, no validation row."""

from __future__ import annotations

import math
import random

import pytest

from autoshard.costmodel.flops import mlp_gemms
from autoshard.costmodel.serve.compute import (
    BLOCK_FP8_GEMM_HOPPER,
    _elementwise_bytes,
    _grouped_experts_s,
    model_serving_gpu,
)
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.fused_moe import (
    DEEP_GEMM_ROWS,
    TRITON_BLOCK_FP8_HOPPER,
    deep_gemm_experts,
    deep_gemm_shape,
    expected_padded_rows,
    fused_moe_tile_rows,
    moe_sum_rows,
    runs_fused_moe,
)
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype
from autoshard.specs.layers import LayerKind
from conftest import closed_form_experts_s

QWEN = load_model("qwen3-235b-a22b")
DSV3 = load_model("deepseek-v3")
FP8, BF16 = WeightDtype.FP8, WeightDtype.BF16


def _poisson_tail_sum(mean: float, block: int) -> float:
    """block * sum_j P(n > j block) / P(n >= 1): the same expectation by the tail-sum identity
    E[ceil(n / b)] = sum_{j >= 0} P(n > j b), with the pmf built by recurrence (no lgamma)."""
    log_pmf, cdf, n = -mean, 0.0, 0
    cdfs = []
    limit = int(mean + 20 * math.sqrt(mean) + 4 * block)
    while n <= limit:
        cdf += math.exp(log_pmf)
        cdfs.append(cdf)
        n += 1
        log_pmf += math.log(mean / n)
    tails = sum(1.0 - cdfs[j * block] for j in range(len(cdfs) // block))
    return block * tails / (1.0 - math.exp(-mean))


@pytest.mark.parametrize(("mean", "block"), [(0.3, 16), (4.8, 16), (17.0, 16), (256.0, 64), (1024.0, 64)])
def test_padded_rows_match_the_tail_sum_identity(mean, block):
    assert expected_padded_rows(mean, block) == pytest.approx(_poisson_tail_sum(mean, block), rel=1e-9)


def test_padded_rows_limits_and_a_simulation():
    assert expected_padded_rows(0.0, 16) == 16.0  # an expert no pair reaches still costs one tile if hit
    assert expected_padded_rows(1e-4, 16) == pytest.approx(16.0, rel=1e-6)  # n = 1 almost surely
    # far from zero the residue n mod b is uniform: about (b - 1) / 2 padding rows
    assert expected_padded_rows(1999.0, 64) == pytest.approx(1999.0 + 31.5, rel=1e-4)
    assert expected_padded_rows(2001.0, 64) == 2001.0 + 31.5
    rng = random.Random(7)

    def poisson(lam):  # Knuth's method, fine at these means
        n, p, limit = 0, 1.0, math.exp(-lam)
        while True:
            p *= rng.random()
            if p < limit:
                return n
            n += 1

    draws = [n for n in (poisson(9.5) for _ in range(40000)) if n >= 1]
    simulated = sum(16 * math.ceil(n / 16) for n in draws) / len(draws)
    assert expected_padded_rows(9.5, 16) == pytest.approx(simulated, rel=0.01)


def test_tiles_switch_at_vllms_nearest_tuned_key():
    assert fused_moe_tile_rows(1) == fused_moe_tile_rows(768) == 16
    assert fused_moe_tile_rows(769) == fused_moe_tile_rows(16384) == 64
    # BF16 tables (E=128,N=192 H100): 64 rows through key 1024, 128 from 1536 (nearest from 1,280)
    assert fused_moe_tile_rows(768, bf16=True) == 16
    assert fused_moe_tile_rows(1279, bf16=True) == 64
    assert fused_moe_tile_rows(1280, bf16=True) == fused_moe_tile_rows(8192, bf16=True) == 128


def test_moe_sum_moves_k_plus_one_rows_where_permutes_move_4k():
    """Qwen3-235B (top-8, hidden 4,096) at TP 8: per token a fused_moe layer moves 9 hidden rows outside
    its GEMMs, TensorRT-LLM's plugin as priced 32: (32 - 9) x 4,096 x 2 bytes apart."""
    assert moe_sum_rows(8) == 9
    fused = _elementwise_bytes(QWEN, LayerKind.MOE, ServeConfig(tp=8))
    trt = _elementwise_bytes(QWEN, LayerKind.MOE, ServeConfig(tp=8, moe_kernels="tensorrt_llm"))
    assert trt - fused == pytest.approx((32 - 9) * 4096 * 2)
    # attention-DP + EP engines (DeepEP) keep the generic copies
    dp = ServeConfig(tp=1, dp_attention=8, expert_parallel=True)
    assert not runs_fused_moe(dp)
    trt_dp = ServeConfig(tp=1, dp_attention=8, expert_parallel=True, moe_kernels="tensorrt_llm")
    assert _elementwise_bytes(QWEN, LayerKind.MOE, dp) == _elementwise_bytes(QWEN, LayerKind.MOE, trt_dp)


QWEN30 = load_model("qwen3-30b-a3b")


@pytest.mark.parametrize(("model", "tp", "ep", "engine", "deep"), [
    # vLLM v0.11.0 `_valid_deep_gemm` (fused_moe/deep_gemm_moe.py:29-31, 45-72): N = the expert's width
    # per GPU a multiple of 128 and above 512, K = hidden a multiple of 128
    (DSV3, 1, False, "vllm", True),  # N 2,048
    (DSV3, 2, False, "vllm", True),  # N 1,024
    (DSV3, 4, False, "vllm", False),  # N 512: "DeepGemm disabled for N <= 512"
    (DSV3, 8, False, "vllm", False),  # N 256 (and TP 8: vLLM PR #29346)
    (QWEN, 2, False, "vllm", True),  # N 768
    (QWEN, 4, False, "vllm", False),  # N 384
    (QWEN, 8, False, "vllm", False),  # N 192: not a multiple of 128 either
    (QWEN30, 1, False, "vllm", True),  # N 768
    (QWEN30, 2, False, "vllm", False),  # N 384
    (QWEN, 4, True, "vllm", True),  # expert parallelism: whole experts, N 1,536
    # SGLang's DeepGEMM runner: DeepGEMM's own 128-alignment only
    (QWEN, 4, False, "sglang", True),  # N 384
    (DSV3, 8, False, "sglang", True),  # N 256
    (QWEN, 8, False, "sglang", False),  # N 192
])
def test_deep_gemm_takes_the_expert_shapes_the_engine_hands_it(model, tp, ep, engine, deep):
    cfg = ServeConfig(tp=tp, expert_parallel=ep, engine=engine)
    assert deep_gemm_shape(model, cfg) is deep
    assert deep_gemm_experts(model, cfg, 8192) is deep
    assert not deep_gemm_experts(model, cfg, DEEP_GEMM_ROWS - 1)  # _valid_deep_gemm: M >= 128
    assert not deep_gemm_experts(model, ServeConfig(tp=tp, expert_parallel=ep, engine=engine, deep_gemm=False), 8192)


def test_decode_steps_of_128_tokens_pad_each_expert_to_128_rows_on_deep_gemm():
    """vLLM v0.11.0 hands any step of M >= 128 tokens to DeepGEMM's contiguous grouped GEMM, decode steps
    included, with each expert's rows rounded up to 128 (fused_moe.py:1398-1399 -> deep_gemm_moe_fp8 ->
    deepgemm_moe_permute, deep_gemm_utils.py:36-49; the masked layout is only behind DeepEP low-latency
    / pplx, fp8.py:837-865). DeepSeek-V3 FP8 at TP 2 on H200 (1,024-wide experts): a 128-token decode
    step is priced on 128-row segments at the block kernels' rate, a 127-token one on fused_moe's
    16-row tiles."""
    h200 = model_serving_gpu(DSV3, load_cluster("dgx-h200").pools[0].gpu, FP8)
    cfg = ServeConfig(tp=2, weight_dtype=FP8)
    for tokens, tile in ((128, 128), (256, 128), (127, 16)):
        assert _grouped_experts_s(DSV3, h200, cfg, tokens) == pytest.approx(
            closed_form_experts_s(DSV3, h200, tp=2, tokens=tokens, rate=BLOCK_FP8_GEMM_HOPPER, tile=tile), rel=1e-9)


def test_prefill_tiles_of_block_fp8_experts_run_at_the_triton_rate_without_deep_gemm():
    """Qwen3-235B FP8 on H100, a 16,384-token step (the GPUStack run's budget): at TP 2 (768-wide experts
    per GPU) 64-row tiles at Triton's 0.22 of the FP8 peak without DeepGEMM; with it 128-row segments at
    the block kernels' 0.37. Both math-bound: the Triton step is slower by about 0.37 / 0.22 less the
    padding difference. At TP 4 (384 wide) vLLM keeps Triton with DeepGEMM installed (N <= 512)."""
    gpu = model_serving_gpu(QWEN, load_cluster("dgx-h100").pools[0].gpu, FP8)
    triton = _grouped_experts_s(QWEN, gpu, ServeConfig(tp=2, weight_dtype=FP8, deep_gemm=False), 16384)
    deep = _grouped_experts_s(QWEN, gpu, ServeConfig(tp=2, weight_dtype=FP8), 16384)
    assert triton == pytest.approx(
        closed_form_experts_s(QWEN, gpu, tp=2, tokens=16384, rate=TRITON_BLOCK_FP8_HOPPER, tile=64), rel=1e-9
    )
    assert deep == pytest.approx(
        closed_form_experts_s(QWEN, gpu, tp=2, tokens=16384, rate=BLOCK_FP8_GEMM_HOPPER, tile=128), rel=1e-9
    )
    assert 1.5 < triton / deep < 0.37 / 0.22
    for deep_gemm in (True, False):
        assert _grouped_experts_s(QWEN, gpu, ServeConfig(tp=4, weight_dtype=FP8, deep_gemm=deep_gemm), 16384) == (
            pytest.approx(closed_form_experts_s(QWEN, gpu, tp=4, tokens=16384, rate=TRITON_BLOCK_FP8_HOPPER, tile=64),
                          rel=1e-9))


def test_decode_tiles_keep_the_block_kernels_rate():
    """At a 64-token decode step the 16-row tiles are priced at BLOCK_FP8_GEMM_HOPPER whatever the
    install (DeepGEMM runs no step under 128 tokens), and the TP 8 prefill of DeepSeek-V3 goes to Triton
    even with DeepGEMM installed."""
    gpu = model_serving_gpu(QWEN, load_cluster("dgx-h100").pools[0].gpu, FP8)
    for deep_gemm in (True, False):
        cfg = ServeConfig(tp=4, weight_dtype=FP8, deep_gemm=deep_gemm)
        assert _grouped_experts_s(QWEN, gpu, cfg, 64) == pytest.approx(
            closed_form_experts_s(QWEN, gpu, tp=4, tokens=64, rate=BLOCK_FP8_GEMM_HOPPER, tile=16), rel=1e-9
        )
    h200 = model_serving_gpu(DSV3, load_cluster("dgx-h200").pools[0].gpu, FP8)
    assert _grouped_experts_s(DSV3, h200, ServeConfig(tp=8, weight_dtype=FP8), 8192) == pytest.approx(
        closed_form_experts_s(DSV3, h200, tp=8, tokens=8192, rate=TRITON_BLOCK_FP8_HOPPER, tile=64), rel=1e-9
    )


def test_tensorrt_llm_keeps_the_mean_padded_tiles():
    """TensorRT-LLM's plugin rows stay priced as before: the mean rows of a hit expert rounded up to 16."""
    gpu = model_serving_gpu(QWEN, load_cluster("dgx-h100").pools[0].gpu, BF16)
    cfg = ServeConfig(tp=8, moe_kernels="tensorrt_llm")
    tokens = 8192
    pairs = tokens * 8
    hit = 128 * (1 - (1 - 8 / 128) ** tokens)
    padded = 16 * math.ceil(pairs / hit / 16 - 1e-9)
    eff = gpu.efficiency
    want = 0.0
    for g in mlp_gemms(QWEN, 1, QWEN.moe.expert_ffn_hidden_size, 8):
        d = min(padded, g.n, g.k)
        rate = eff.gemm * d / (d + eff.gemm_half_dim)
        math_s = 2 * hit * padded * g.n * g.k / (gpu.bf16_tflops * 1e12 * rate)
        mem_s = (hit * g.n * g.k * 2 + pairs * (g.k + g.n) * 2) / (gpu.hbm_tbps * 1e12 * eff.hbm)
        want += max(math_s, mem_s) + eff.kernel_overhead_us * 1e-6
    assert _grouped_experts_s(QWEN, gpu, cfg, tokens) == pytest.approx(want, rel=1e-12)


def test_moe_kernels_must_be_named():
    with pytest.raises(ValueError, match="moe_kernels must be fused_moe or tensorrt_llm"):
        ServeConfig(moe_kernels="cutlass")
