"""Attention of one serving step on one GPU: prefill (causal flash attention at FlashAttention-3's
measured efficiency on Hopper) and paged decode attention (HBM-bound GQA kernels; MLA's absorbed
decode at FlashMLA's published rates on Hopper).

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import math

from autoshard.costmodel.flops import attention_dims, causal_keys
from autoshard.costmodel.serve.compute import HOPPER_NAMES
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.kv_window import mean_window_keys
from autoshard.costmodel.serve.weights import kv_cache_bytes_per_token_per_gpu
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.model import ModelSpec

__all__ = [
    "FLASH_FWD_HOPPER",
    "FLASH_MLA_HOPPER",
    "FLASH_MLA_GPUS",
    "mla_decode_attention_hopper_s",
    "prefill_attention_s",
]

FLASH_FWD_HOPPER = (0.64, 241.0)
"""Forward flash attention on Hopper as `top * s / (s + half)` of the BF16 peak: FlashAttention-3,
head dim 128, measured on H100 by pytorch/benchmark PR #2391 (commit ff65cb67): 430 / 517 / 566 /
590 / 614 / 621 TFLOP/s at 512 / 1K / 2K / 4K / 8K / 16K tokens = 0.43-0.63 of 989. The engines'
prefill kernels on Hopper are FlashAttention-3 (vLLM, SGLang) or TensorRT-LLM's own fused MHA of the
same design."""


def _forward_attention_efficiency(gpu: GpuSpec, seq_len: float) -> float:
    """Fraction of dense BF16 peak a forward (prefill) flash-attention kernel reaches on a causal
    prompt of `seq_len` tokens: FlashAttention-3's measured curve on Hopper (FLASH_FWD_HOPPER), the
    GPU type's (training-fitted) attention efficiency elsewhere."""
    if any(tag in gpu.name for tag in HOPPER_NAMES):
        top, half = FLASH_FWD_HOPPER
        return max(top * seq_len / (seq_len + half), gpu.efficiency.attention)
    return gpu.efficiency.attention


def prefill_attention_s(
    model: ModelSpec, gpu: GpuSpec, *, tp: int, prompt_len: float, fp8: bool = False
) -> float:
    """Causal attention of one prompt's prefill on one TP rank (the mean over the decoder layers): half the
    s x s square of score and value products (s w - w^2 / 2 of them in a sliding-window layer) at the
    forward flash-attention efficiency for that length, of the BF16 peak or, with `fp8` on a GPU with FP8
    tensor cores, of the FP8 peak (FlashAttention-3 reaches about the same fraction of either: ~1.2 PFLOP/s
    FP8 against 0.74 BF16 on H100, Shah et al. 2024)."""
    qk_dim, v_dim = attention_dims(model)
    heads = model.num_attention_heads / tp
    peak = gpu.fp8_tflops if fp8 and gpu.fp8_tflops else gpu.bf16_tflops
    if not model.has_attention_window:
        flops = 2.0 * prompt_len * prompt_len * heads * (qk_dim + v_dim) * 0.5
        return flops / (peak * 1e12 * _forward_attention_efficiency(gpu, prompt_len))
    # sliding-window layers (w < prompt): min(position, w) keys per query (`flops.causal_keys`), at the kernel
    # efficiency of a w-token prompt (the rows' length); the mean over the decoder layers, as the step prices
    # one layer and multiplies
    total = 0.0
    for window in model.decoder_windows:
        keys = causal_keys(prompt_len, window)
        length = prompt_len if window is None else min(prompt_len, window)
        total += 2.0 * prompt_len * keys * heads * (qk_dim + v_dim) / _forward_attention_efficiency(gpu, length)
    return total / model.num_layers / (peak * 1e12)


def _decode_attention_s(
    model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig, *, seqs: float, context_len: float, query_len: int = 1
) -> float:
    """Paged decode attention of one layer: read the KV cache of `seqs` sequences of `context_len`
    tokens (min(context_len, window) in a sliding-window layer, on the model's mean over its layers;
    HBM-bound, at the GPU's `serve_attention_hbm` when set), or the score/value math if larger. MLA decodes in the absorbed latent form, on Hopper at FlashMLA's published kernel rates
    (`mla_decode_attention_hopper_s`); elsewhere no MLA kernel rate is published, so it keeps the
    GQA pricing. `query_len` query tokens per sequence (speculative verification) read the cache once
    and multiply the math."""
    if seqs <= 0:
        return 0.0
    # sliding-window layers read min(context, window) cached tokens: the mean over the decoder layers
    context_len = mean_window_keys(model, context_len) if model.has_attention_window else context_len
    kv = kv_cache_bytes_per_token_per_gpu(model, tp=cfg.tp, layers=1, dtype=cfg.kv_cache_dtype)
    heads = model.num_attention_heads / cfg.tp
    if model.mla is not None:
        dims = 2 * model.mla.kv_lora_rank + model.mla.qk_rope_head_dim
        if any(tag in gpu.name for tag in FLASH_MLA_GPUS):
            return mla_decode_attention_hopper_s(
                gpu, seqs=seqs, context_len=context_len, heads=heads * query_len, dims=dims, kv_bytes=kv
            )
    else:
        qk, v = attention_dims(model)
        dims = qk + v
    eff = gpu.efficiency
    hbm = eff.serve_attention_hbm if eff.serve_attention_hbm is not None else eff.hbm
    mem_s = seqs * context_len * kv / (gpu.hbm_tbps * 1e12 * hbm)
    math_s = 2.0 * seqs * query_len * context_len * heads * dims / (gpu.bf16_tflops * 1e12 * eff.attention)
    return max(mem_s, math_s) + eff.kernel_overhead_us * 1e-6


FLASH_MLA_HOPPER = (3000 / 3350, 580 / 989, 64, 2)
"""MLA decode attention on Hopper as FlashMLA runs it (deepseek-ai/FlashMLA README: BF16, paged KV
cache in 64-token blocks, "up to 3000 GB/s in memory-bound configuration and 580 TFLOPS in
computation-bound configuration on H800 SXM5"): (fraction of HBM bandwidth, fraction of the dense
BF16 peak, query rows per tile, kernels per call). 3,000 GB/s of the H800's 3.35 TB/s is 0.896; 580 of
its 989 TFLOP/s is 0.586. The kernel tiles a sequence's s_q x h_q query rows (one query token per
sequence at decode) in blocks of 64 (`kBlockM`), so with fewer than 64 heads on a GPU (TP 8 of
DeepSeek-V3's 128) a tile is computed whole: the math of 64 rows. A call is a split-KV kernel plus
the combine of the splits. It is the decode kernel of vLLM's FLASHMLA backend (vLLM's default for MLA
on Hopper from v0.8 to v0.11.0, vllm-project/vllm PR #14451; PR #27363 later made FlashAttention-MLA
the default, measured 1.2-1.7x faster than FlashMLA at 1k-token contexts) and of SGLang's `flashmla`
backend. The GQA paged kernels' `serve_attention_hbm` (fitted on dense engines) and the 0.25 of peak
of `attention` are not this kernel: before, a wide-EP decode rank of DeepSeek-V3 (128 heads, batch
~500, ~1,500-token contexts) had its attention priced at 247 TFLOP/s, 2.4x slower than this."""
FLASH_MLA_GPUS = (*HOPPER_NAMES, "H800")


def mla_decode_attention_hopper_s(
    gpu: GpuSpec, *, seqs: float, context_len: float, heads: float, dims: int, kv_bytes: float
) -> float:
    """One layer's absorbed MLA decode attention on Hopper at FlashMLA's published rates
    (`FLASH_MLA_HOPPER`): the slower of reading `seqs` x `context_len` latent KV entries of `kv_bytes`
    each and the score/value math of `heads` query heads padded up to the kernel's 64-row tile
    (`dims`: QK plus V width per head, 2 x kv_lora_rank + rope dim), plus its kernels' launches.
    With several query tokens per sequence (speculative verification) `heads` is heads x tokens: the
    kernel folds them into the same rows."""
    bw, peak, tile, kernels = FLASH_MLA_HOPPER
    rows = tile * math.ceil(heads / tile - 1e-9)
    mem_s = seqs * context_len * kv_bytes / (gpu.hbm_tbps * 1e12 * bw)
    math_s = 2.0 * seqs * context_len * rows * dims / (gpu.bf16_tflops * 1e12 * peak)
    return max(mem_s, math_s) + kernels * gpu.efficiency.kernel_overhead_us * 1e-6
