"""MLA decode attention on Hopper at FlashMLA's published kernel rates (#10, #13): the absorbed decode
of DeepSeek-V3's latent KV cache is priced as FlashMLA runs it (`FLASH_MLA_HOPPER`), not at the GQA
paged kernel's fitted bandwidth and the 0.25-of-peak attention default. Checked against the kernel's
own published figures, which are no validation row."""

from __future__ import annotations

import pytest

from autoshard.costmodel.serve.attention import FLASH_MLA_HOPPER, _decode_attention_s
from autoshard.costmodel.serve.compute import model_serving_gpu, serving_gpu
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype

DSV3 = load_model("deepseek-v3")
BF16, FP8 = WeightDtype.BF16, WeightDtype.FP8
FLASH_MLA_H800_GBPS = 3000.0
FLASH_MLA_H800_TFLOPS = 580.0
"""deepseek-ai/FlashMLA README: "up to 3000 GB/s in memory-bound configuration and 580 TFLOPS in
computation-bound configuration on H800 SXM5" (BF16, paged KV in 64-token blocks)."""
LATENT = 512 + 64  # DeepSeek-V3 kv_lora_rank + qk_rope_head_dim: one latent entry per token and layer


def _gpu(cluster: str):
    return serving_gpu(load_cluster(cluster).pools[0].gpu)


def _attn(gpu, *, tp: int, kv: WeightDtype, seqs: float, ctx: float) -> float:
    cfg = ServeConfig(tp=tp, kv_cache_dtype=kv)
    return _decode_attention_s(DSV3, gpu, cfg, seqs=seqs, context_len=ctx)


def _flops(heads: float, seqs: float, ctx: float) -> float:
    # absorbed MLA: scores over the 576-wide latent + rope, values over the 512-wide latent
    return 2.0 * seqs * ctx * heads * (2 * 512 + 64)


def test_compute_bound_decode_reaches_flashmlas_published_tflops():
    """128 query heads on a GPU (attention DP, TP 1), batch 128 at 8k context (FlashMLA's benchmark
    shape, its longest context): the useful math runs at 580 TFLOP/s on H800, within the two kernel
    launches."""
    h800 = _gpu("hgx-h800")
    seqs, ctx = 128, 32768
    t = _attn(h800, tp=1, kv=BF16, seqs=seqs, ctx=ctx)
    assert _flops(128, seqs, ctx) / t / 1e12 == pytest.approx(FLASH_MLA_H800_TFLOPS, rel=0.01)


def test_memory_bound_decode_reaches_flashmlas_published_bandwidth():
    """16 heads per GPU (TP 8), BF16 latent: the padded 64-row tile needs 64 x 2 x 1,088 FLOPs per
    1,152 bytes, below the H800's 580 / 3.0 = 193 FLOP/byte, so the kernel reads at 3,000 GB/s."""
    h800 = _gpu("hgx-h800")
    seqs, ctx = 128, 32768
    t = _attn(h800, tp=8, kv=BF16, seqs=seqs, ctx=ctx)
    read = seqs * ctx * LATENT * 2
    assert read / t / 1e9 == pytest.approx(FLASH_MLA_H800_GBPS, rel=0.01)


def test_fewer_heads_than_the_tile_cost_a_full_tile():
    """With an FP8 latent (576 bytes per token) a full 64-row tile is compute-bound (242 FLOP/byte):
    16 heads (TP 8) and 32 (TP 4) cost what 64 (TP 2) cost; 128 (TP 1) twice that."""
    h100 = _gpu("dgx-h100")
    times = {tp: _attn(h100, tp=tp, kv=FP8, seqs=256, ctx=4096) for tp in (1, 2, 4, 8)}
    assert times[8] == pytest.approx(times[2], rel=1e-9)
    assert times[4] == pytest.approx(times[2], rel=1e-9)
    overhead = FLASH_MLA_HOPPER[3] * h100.efficiency.kernel_overhead_us * 1e-6
    assert times[1] - overhead == pytest.approx(2 * (times[2] - overhead), rel=1e-9)


def test_wide_ep_decode_rank_is_2_4x_faster_than_the_gqa_default():
    """The issue's figure: a DP-attention rank of DeepSeek-V3 (128 heads, ~500 requests, ~1,500-token
    contexts) was priced at `attention` = 0.25 of peak; FlashMLA's 580 / 989 makes it 2.35x faster."""
    h100 = _gpu("dgx-h100")
    t = _attn(h100, tp=1, kv=FP8, seqs=500, ctx=1500)
    old = _flops(128, 500, 1500) / (h100.bf16_tflops * 1e12 * h100.efficiency.attention)
    overhead = FLASH_MLA_HOPPER[3] * h100.efficiency.kernel_overhead_us * 1e-6
    assert old / (t - overhead) == pytest.approx(580 / 989 / 0.25, rel=1e-6)


def test_block_fp8_gpu_copy_keeps_the_mla_pricing():
    """The GEMM-side copy of the GPU for block-scaled FP8 checkpoints is still a Hopper GPU."""
    h100 = load_cluster("dgx-h100").pools[0].gpu
    a = _attn(model_serving_gpu(DSV3, h100, FP8), tp=1, kv=FP8, seqs=64, ctx=2048)
    b = _attn(serving_gpu(h100), tp=1, kv=FP8, seqs=64, ctx=2048)
    assert a == b


def test_gpus_without_a_published_mla_kernel_rate_keep_the_gqa_pricing():
    """MI300X (AITER's MLA kernels) and B200: no published absolute kernel rate was found, so the
    paged-attention roofline (`serve_attention_hbm` or `hbm`, `attention` of peak) stays."""
    for cluster in ("mi300x", "dgx-b200"):
        gpu = _gpu(cluster)
        eff = gpu.efficiency
        seqs, ctx = 256, 2048
        hbm = eff.serve_attention_hbm if eff.serve_attention_hbm is not None else eff.hbm
        mem = seqs * ctx * LATENT * 2 / (gpu.hbm_tbps * 1e12 * hbm)
        math_s = _flops(128, seqs, ctx) / (gpu.bf16_tflops * 1e12 * eff.attention)
        want = max(mem, math_s) + eff.kernel_overhead_us * 1e-6
        assert _attn(gpu, tp=1, kv=BF16, seqs=seqs, ctx=ctx) == pytest.approx(want, rel=1e-12)


def test_gqa_models_are_not_priced_as_mla():
    """Llama 3.1 70B on H100 keeps the fitted paged-kernel bandwidth."""
    llama = load_model("llama-3.1-70b")
    gpu = _gpu("dgx-h100")
    cfg = ServeConfig(tp=4, kv_cache_dtype=BF16)
    t = _decode_attention_s(llama, gpu, cfg, seqs=64, context_len=2048)
    kv = 2 * 8 / 4 * 128 * 2  # K and V of 8 KV heads over TP 4, head dim 128, BF16, one layer
    mem = 64 * 2048 * kv / (gpu.hbm_tbps * 1e12 * gpu.efficiency.serve_attention_hbm)
    assert t == pytest.approx(mem + gpu.efficiency.kernel_overhead_us * 1e-6, rel=1e-9)
