"""The routed experts as vLLM's fused_moe runs them (the Triton kernels vLLM and SGLang use for
TP-sharded experts), where they differ from a permute / grouped-GEMM / un-permute pipeline: what moves
outside the GEMMs, how each expert's rows are padded, and the rate of block-scaled FP8 tiles on Hopper.
`serve.compute._grouped_experts_s` and `serve.compute._elementwise_bytes` apply them where
`runs_fused_moe`: `ServeConfig.moe_kernels` "fused_moe" (the default) on an engine without attention
data parallelism. TensorRT-LLM's plugin and the attention-DP + EP engines, whose experts run behind
DeepEP's dispatch and combine on DeepGEMM's grouped kernels (permute and un-permute kernels around
them), keep the generic pricing.

One MoE layer in vLLM v0.11 (vllm/model_executor/layers/fused_moe/fused_moe.py): `topk_softmax`;
`moe_align_block_size` sorts the token-expert pairs by expert and pads each expert's run of rows to
BLOCK_SIZE_M; the first grouped GEMM reads each pair's hidden row through the sorted ids (no permuted
copy of the hidden states is written); `silu_and_mul`; the second grouped GEMM writes one row per pair,
scaled by its routing weight; `moe_sum` adds a token's top-k rows. Outside the GEMMs a token's hidden
vector moves k + 1 times (moe_sum reads k rows and writes one), where separate permute and un-permute
kernels (Megatron's, TensorRT-LLM's expandInputRows / finalize) move it 4k times as priced for those.

Pure functions: no I/O.
"""

from __future__ import annotations

import math

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.specs.model import ModelSpec

__all__ = [
    "FUSED_MOE_TILE_ROWS",
    "FUSED_MOE_LARGE_TILE_TOKENS",
    "BF16_TILE_ROWS",
    "BF16_LARGE_TILE_TOKENS",
    "TRITON_BLOCK_FP8_HOPPER",
    "fused_moe_tile_rows",
    "expected_padded_rows",
    "moe_sum_rows",
    "runs_fused_moe",
    "DEEP_GEMM_ROWS",
    "DEEP_GEMM_MIN_N",
    "deep_gemm_shape",
    "deep_gemm_experts",
]

FUSED_MOE_TILE_ROWS = (16, 64)
"""BLOCK_SIZE_M of fused_moe's tiles (rows of one expert a tile computes; each expert's rows are padded
to a multiple): (decode-sized steps, prefill-sized steps). vLLM picks the kernel config whose key in
the tuned table for the layer's shape and GPU is nearest the step's token count; its Hopper tables use
16-row tiles through key 512 and 64 from key 1024 (configs/E=256,N=256,device_name=NVIDIA_H200,
dtype=fp8_w8a8,block_shape=[128,128].json, DeepSeek-V3 at TP 8), and `get_default_config` gives
block-FP8 layers without a table 64 rows."""
FUSED_MOE_LARGE_TILE_TOKENS = 768
"""Tokens above which the nearest tuned key is 1024 rather than 512: fused_moe runs 64-row tiles."""
BF16_TILE_ROWS = 128
BF16_LARGE_TILE_TOKENS = 1280
"""BF16 experts' tables go on to 128-row tiles from key 1536 (E=128,N=192,device_name=
NVIDIA_H100_80GB_HBM3.json, Qwen3-235B at TP 8: 64 rows at keys 512-1024, 128 from 1536), the
nearest key from 1,280 tokens. That table already uses 32 and 64 rows from 192 and 384 tokens;
those decode-sized steps are priced with 16-row tiles here (they read the hit experts' weights)."""

TRITON_BLOCK_FP8_HOPPER = 0.22
"""Fraction of the dense FP8 peak fused_moe's block-scaled FP8 tiles reach on Hopper at prefill sizes
(64-row tiles), in place of BLOCK_FP8_GEMM_HOPPER (CUTLASS/DeepGEMM, 0.37). The Triton kernel
multiplies each 128-deep partial product by its activation and weight block scales in the K loop on
the CUDA cores; vLLM measured its Triton block-FP8 GEMM, the same tl.dot + per-block-scale loop without
the row gather, at 403-407 TFLOP/s at M = 4,096-8,192 (N = 2,112, K = 7,168, H100; vllm-project/vllm
PR #23280): 0.22 of 1,979 after the shape fall-off of `gemm_time_s`. This is the MoE kernel a vLLM
install runs for block-scaled checkpoints with TP-sharded experts: the PyPI wheel ships no DeepGEMM
(vLLM builds it separately, tools/install_deepgemm.sh; GPUStack's vLLM 0.11.0 image, gpustack/runner
pack/cuda/Dockerfile, installs vllm==0.11.0, FlashInfer and LMCache only), and from vLLM PR #29346 TP 8
block-FP8 MoE layers take Triton even with DeepGEMM present (measured faster there), as do experts
narrower than vLLM's DeepGEMM shape rule (DEEP_GEMM_MIN_N); where those rules allow, an install with
DeepGEMM (`ServeConfig.deep_gemm`, `deep_gemm_experts`) runs its grouped GEMMs at
BLOCK_FP8_GEMM_HOPPER on 128-row-aligned expert segments (DEEP_GEMM_ROWS). SGLang's TP-sharded
experts run this Triton kernel under its default runner (`serve.engines`). With 16-row
tiles (decode) the kernel reads each hit expert's weights once and stays priced at the block rate of
the dense GEMMs: the median inter-token latencies of the GPUStack vLLM runs (mostly decode-only
steps) agree with that within 7 % and are 30-50 % shorter than 0.22 at 16-row tiles would make them."""


def fused_moe_tile_rows(tokens: float, *, bf16: bool = False) -> int:
    """BLOCK_SIZE_M fused_moe uses for a step routing `tokens` tokens on this rank (`bf16`: unquantized
    experts, whose tuned tables go on to BF16_TILE_ROWS)."""
    small, large = FUSED_MOE_TILE_ROWS
    if bf16 and tokens >= BF16_LARGE_TILE_TOKENS:
        return BF16_TILE_ROWS
    return large if tokens > FUSED_MOE_LARGE_TILE_TOKENS else small


def expected_padded_rows(mean: float, block: int) -> float:
    """Expected rows a hit expert computes, E[block * ceil(n / block) | n >= 1], for n ~ Poisson(mean)
    token-expert pairs landing on it (routing at random): at least one tile, and on average about
    (block - 1) / 2 padding rows once the mean is many tiles."""
    if mean <= 1e-9:
        return float(block)
    if mean > 2000.0:  # far from zero: the residue n mod block is uniform
        return mean + (block - 1) / 2.0
    spread = 12.0 * math.sqrt(mean) + block
    lo, hi = max(1, int(mean - spread)), int(mean + spread) + 1
    log_mean = math.log(mean)
    total = 0.0
    for n in range(lo, hi):
        total += math.exp(n * log_mean - mean - math.lgamma(n + 1)) * block * math.ceil(n / block)
    return total / -math.expm1(-mean)


def moe_sum_rows(top_k: int) -> int:
    """Hidden-size rows per token fused_moe moves outside its GEMMs: moe_sum reads top_k, writes one."""
    return top_k + 1


def runs_fused_moe(cfg: ServeConfig) -> bool:
    """Whether the engine's routed experts run fused_moe as priced here (see the module docstring)."""
    return cfg.moe_kernels == "fused_moe" and cfg.dp_attention == 1


DEEP_GEMM_ROWS = 128
"""Row alignment of DeepGEMM's contiguous grouped GEMM (`get_m_alignment_for_contiguous_layout`, its
BLOCK_M), checked in vLLM v0.11.0's wheel: `fused_experts` hands a block-FP8 MoE layer to
`deep_gemm_moe_fp8` when allow_deep_gemm and `_valid_deep_gemm` (vllm/model_executor/layers/fused_moe/
fused_moe.py:1398-1399); `DeepGemmExperts.apply` then permutes the token-expert pairs with
`deepgemm_moe_permute`, which rounds each expert's rows up to a multiple of 128 (deep_gemm_utils.py:
36-49 `compute_aligned_M`, :349-355), and runs `m_grouped_fp8_gemm_nt_contiguous` over them. That is
the contiguous layout for every step DeepGEMM takes, decode steps of >= 128 tokens included: the
masked (low-latency) layout, `BatchedDeepGemmExperts` (batched_deep_gemm_moe.py:216, its
`fp8_m_grouped_gemm_nt_masked` at :315-321), is what `Fp8MoEMethod.select_gemm_impl` picks only for a
batched activation format, i.e. behind DeepEP low-latency or pplx all-to-all (quantization/fp8.py:
837-865), which runs the attention-DP + EP engines (`runs_fused_moe` False)."""
DEEP_GEMM_MIN_N = 512
"""vLLM v0.11.0's `_valid_deep_gemm` (deep_gemm_moe.py:29-31, 45-72) refuses DeepGEMM, and fused_moe
falls back to Triton, unless the step has M >= 128 tokens, both the expert's intermediate width per
GPU N (`_, K, N = w2.size()`) and the hidden size K are multiples of 128, and N > 512 ("DeepGemm
disabled for N <= 512 ... fallback to triton for this specific shape for further speed up"). On Hopper
no E8M0 short-circuit applies (`is_deep_gemm_e8m0_used` needs VLLM_USE_DEEP_GEMM_E8M0_HOPPER=1,
default 0: vllm/utils/deep_gemm.py:34-60). So DeepSeek-V3's 2,048-wide experts reach DeepGEMM at
TP 1-2 (N 2,048 / 1,024), not at TP 4 (512) or 8 (256); Qwen3-235B's 1,536 at TP 1-2 (1,536 / 768),
not at TP 4 (384) or 8 (192); with expert parallelism the experts are whole (N = the full width)."""


def deep_gemm_shape(model: ModelSpec, cfg: ServeConfig) -> bool:
    """Whether the engine's expert shapes pass the engine's DeepGEMM shape rules: N (the expert's
    intermediate width on one GPU) and K (the hidden size) multiples of DEEP_GEMM_ROWS, and for vLLM
    N > DEEP_GEMM_MIN_N and TP other than 8 (vLLM PR #29346, after v0.11, turned DeepGEMM MoE off at
    TP 8, where Triton measured faster). SGLang's DeepGEMM runner has no such width rule."""
    if model.moe is None:
        return False
    shards = 1 if cfg.expert_parallel else cfg.tp
    n, k = model.moe.expert_ffn_hidden_size / shards, model.hidden_size
    if n != int(n) or int(n) % DEEP_GEMM_ROWS or k % DEEP_GEMM_ROWS:
        return False
    return cfg.engine != "vllm" or (n > DEEP_GEMM_MIN_N and cfg.tp != 8)


def deep_gemm_experts(model: ModelSpec, cfg: ServeConfig, tokens: float) -> bool:
    """Whether a block-scaled FP8 MoE layer of `tokens` tokens runs on DeepGEMM rather than Triton:
    allowed (`ServeConfig.deep_gemm`), at least DEEP_GEMM_ROWS tokens and shapes DeepGEMM takes
    (`deep_gemm_shape`)."""
    return cfg.deep_gemm and tokens >= DEEP_GEMM_ROWS and deep_gemm_shape(model, cfg)
