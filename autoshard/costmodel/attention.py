"""Fused (flash) attention kernels in training: the efficiency a causal or an unmasked kernel reaches
at its length, the kernels a context-parallel ring runs and their BF16 seconds (summed by
`autoshard.costmodel.compute.attention_time_s`), and the same kernels in FP8 (Transformer Engine's
fp8_dot_product_attention) less the time cuDNN's measured FP8 kernels save (`fp8_attention_s`)."""

from __future__ import annotations

import math
from collections import Counter

from autoshard.costmodel.flops import attention_dims, causal_keys, window_attention_share
from autoshard.parallel import ParallelDims
from autoshard.specs.cluster import EfficiencySpec, GpuSpec
from autoshard.specs.model import ModelSpec

__all__ = [
    "BENCH_HEADS", "BENCH_HEAD_DIM", "FLASH_BACKWARD_FACTOR", "FP8_ATTENTION_DO_BYTES", "FP8_ATTENTION_GPUS",
    "FP8_ATTENTION_KERNELS", "FP8_ATTENTION_QKV_BYTES",
    "UNMASKED_ATTENTION_SPEEDUP", "UNMASKED_ROW_SHARE", "bench_flops", "check_fp8_attention_model",
    "flash_attention_efficiency", "flash_attention_kernels_s", "fp8_attention_kernel_s", "fp8_attention_s",
    "fp8_attention_table", "ring_attention_blocks",
]

UNMASKED_ATTENTION_SPEEDUP = 1.086
"""An unmasked fused-attention kernel over the causal one at long sequences: FlashAttention-3 on H100
SXM5 (Shah et al. 2024, arXiv:2407.08608, Figs. 5-6, head dim 128, BF16), forward + 2.5 x backward
blended, least-squares asymptotes of A * L / (L + L0) over 1k-16k tokens: non-causal 553 TFLOP/s,
causal 509 (the causal kernel's masked-tile skipping and uneven per-block work cost it even at 16k).
Hopper-measured, used for every GPU (tests/costmodel/test_ring_attention.py recomputes it)."""

FLASH_BACKWARD_FACTOR = 2.5
"""A fused attention kernel's backward over its forward: it recomputes the scores, then computes dV, dP, dQ
and dK (5 matmuls against the forward's 2). Layer costs, the FP8 kernels and the context-parallel ring's
overlap window all use it."""

UNMASKED_ROW_SHARE = 0.39
"""k0 / s0: the per-query-row fixed work of a fused attention kernel (Q load, softmax finalisation,
O and LSE write, the backward's dQ), counted in keys of main-loop work, over the causal ramp's
half-length s0. The same FA3 figures fit L0 = k0 = 240 keys for the non-causal kernel (its only
ramp: A * L / (L + k0)) and s0 = 610 for the causal one, whose rows average L/2 keys (per-row work
2 k0 / L = 480 / L of it, half-empty diagonal tiles the other 130 / L): 240 / 610 = 0.39. An
unmasked kernel over Lk keys pays UNMASKED_ROW_SHARE * s0 / Lk, so a GPU whose s0 is fitted scales
its k0 with it."""


def flash_attention_efficiency(eff: EfficiencySpec, length: float, *, causal: bool = True) -> float:
    """Fraction of the dense BF16 peak a fused attention kernel reaches, capped at 1. causal: `length`
    queries and keys, attention * r(length) / r(4096), r(s) = s / (s + attention_half_seq). Unmasked
    (a context-parallel ring's off-diagonal kernel): `length` keys per query row, no half-empty tiles,
    attention / r(4096) * UNMASKED_ATTENTION_SPEEDUP * length / (length + UNMASKED_ROW_SHARE * s0)."""
    s0 = eff.attention_half_seq
    at_4k = 4096 / (4096 + s0)
    if causal:
        return min(1.0, eff.attention * (length / (length + s0)) / at_4k)
    row_work = length / (length + UNMASKED_ROW_SHARE * s0)
    return min(1.0, eff.attention / at_4k * UNMASKED_ATTENTION_SPEEDUP * row_work)


def ring_attention_blocks(seq_len: int, cp: int) -> list[tuple[float, float, bool]]:
    """The fused kernels that gate one rank's causal attention of one sequence under Megatron-Core's
    context parallelism (Transformer Engine `AttnFuncWithCPAndKVP2P`, the default --cp-comm-type p2p),
    as (share of the rank's attention FLOPs, the kernel's length in keys, causal).

    Each rank holds 2 of the 2CP sequence chunks, c = s/(2CP) tokens each, chunks r and 2CP-1-r (load
    balancing), and runs CP steps as the KV ring turns (TE context_parallel.py, git d0067d0d:
    1784-1795 the step x rank table, 1797-1885 the forward branches, 2578-2620 the backward's): step 0
    "diagonal", its own 2c queries against its own 2c keys, causal (the kernel at length s/CP, 711-734
    and 854-870); steps 1..rank "lower-triangle", all 2c queries against the first chunk of the
    arriving keys, c (max_seqlen_kv // 2, 736-771 / 871-885); the other steps "upper-triangle", the
    second chunk of queries, c, against all 2c keys (773-806 / 886-915). Both off-diagonal kinds run
    attn_mask_type "no_mask" over a 2c x c rectangle, 2c^2 scores, and the diagonal computes the
    causal half of (2c)^2, 2c^2 as well: each kernel does 1/CP of the rank's s^2/(2CP) scores, together
    the causal half-square the unsplit kernel prices. The backward walks the same tiles in reverse and
    waits, every step, for the dKV the previous rank accumulated (2717-2719): the chain of the first
    chunk's dKV runs through CP - 1 lower-triangle kernels (c keys, the shorter rows, the slower
    kernel), and the last rank runs exactly those in its forward too, so they gate the step."""
    if cp <= 1:
        return [(1.0, float(seq_len), True)]
    return [(1.0 / cp, seq_len / cp, True)] + [(1.0 / cp, seq_len / (2 * cp), False)] * (cp - 1)


FP8_ATTENTION_KERNELS: dict[str, tuple[tuple[int, float, float, float, float], ...]] = {
    # (length, forward FP8 ms, forward BF16 ms, backward FP8 ms, backward BF16 ms)
    "B200": (
        (512, 0.044, 0.035, 0.126, 0.107), (1024, 0.067, 0.061, 0.228, 0.228),
        (2048, 0.141, 0.151, 0.618, 0.630), (4096, 0.447, 0.482, 1.414, 1.650),
        (8192, 1.464, 1.589, 4.382, 5.526), (16384, 5.197, 5.962, 14.964, 19.094),
        (32768, 19.751, 23.228, 55.593, 74.527), (65536, 77.531, 94.215, 216.304, 284.695),
        (131072, 307.690, 395.922, 870.832, 1248.042),
    ),
    "GB300": (
        (512, 0.063, 0.049, 0.147, 0.123), (1024, 0.081, 0.070, 0.233, 0.235),
        (2048, 0.133, 0.137, 0.599, 0.631), (4096, 0.328, 0.380, 1.189, 1.459),
        (8192, 1.060, 1.281, 3.632, 4.778), (16384, 3.881, 4.791, 12.595, 17.037),
        (32768, 14.961, 18.680, 46.779, 65.150), (65536, 58.975, 76.825, 180.145, 251.544),
        (131072, 236.917, 323.592, 715.422, 1044.691),
    ),
}
"""cuDNN's fused attention in FP8 and in BF16 on the same GPU, as NVIDIA measured it with cuDNN 9.13.1 (the
25.09 container, the cuDNN MLPerf Training v5.1's Llama 3.1 8B image pins, 9.13.1.26):
NVIDIA/cudnn-frontend `benchmark/sdpa_benchmark_training/artifacts/sdpa_fp8_benchmark_results_NVIDIA_{B200,
GB300}.csv` and `sample_*_fp8_run.txt` at git 0b1577c8: batch 1, 128 query heads, 8 KV heads, head dim 128
(Llama 3.1 405B's attention), causal, forward and backward milliseconds per precision from one run of the
benchmark (its forward FLOPs, 4 s^2 x heads x head dim / 2, are `bench_flops`, the CSV's TFLOP/s convention). Transformer
Engine's FP8 dot-product attention runs this cuDNN FP8 kernel. At 8,192 tokens FP8 takes 0.92 / 0.79 (B200)
and 0.83 / 0.76 (GB300) of the BF16 forward / backward time; at 512 tokens it is slower than BF16. Later
cuDNN narrowed the gap: cuDNN 9.17 (the 25.11 container, the same repository at d48a60eb) measured 0.84 /
0.96 on GB200 and, replacing the GB300 file, 0.74 / 0.92 on GB300; those are not the kernels the MLPerf runs
had."""

BENCH_HEADS = 128
BENCH_HEAD_DIM = 128

_FP8_ATTENTION_GPUS = (("GB300", "GB300"), ("GB200", "B200"), ("B300", "GB300"), ("B200", "B200"))
"""GPU name prefix -> the measured table it runs: GB200's GPU is B200's (Blackwell), B300 is GB300's (Blackwell
Ultra)."""

FP8_ATTENTION_GPUS = tuple(sorted(prefix for prefix, _ in _FP8_ATTENTION_GPUS))
"""The GPUs FP8 attention is priced on ("B200", "B300", "GB200", "GB300"), for messages."""


def fp8_attention_table(gpu_name: str) -> tuple[tuple[int, float, float, float, float], ...] | None:
    """The measured FP8 and BF16 attention kernel table for a GPU name, None where none was measured."""
    upper = gpu_name.upper().replace("NVIDIA ", "").strip()
    for prefix, table in _FP8_ATTENTION_GPUS:
        if upper.startswith(prefix):
            return FP8_ATTENTION_KERNELS[table]
    return None


def bench_flops(length: float) -> float:
    """Forward FLOPs of the benchmark's causal kernel at `length` tokens (the CSV's TFLOP/s convention)."""
    return 4.0 * length * length * BENCH_HEADS * BENCH_HEAD_DIM / 2


def fp8_attention_kernel_s(gpu_name: str, length: float) -> tuple[float, float, float, float]:
    """Seconds per forward FLOP of cuDNN's (FP8 forward, BF16 forward, FP8 backward, BF16 backward) causal
    kernel at `length` keys, interpolated linearly in log(length) between the measured lengths and held at
    the end points beyond them. Raises ValueError for a GPU without a measurement (FP8_ATTENTION_KERNELS)."""
    table = fp8_attention_table(gpu_name)
    if table is None:
        raise ValueError(f"FP8 attention has no kernel measurement on {gpu_name} "
                         f"(measured: {', '.join(FP8_ATTENTION_GPUS)})")

    def per_flop(row: tuple[int, float, float, float, float]) -> tuple[float, float, float, float]:
        n = bench_flops(row[0])
        return row[1] * 1e-3 / n, row[2] * 1e-3 / n, row[3] * 1e-3 / n, row[4] * 1e-3 / n

    if length <= table[0][0]:
        return per_flop(table[0])
    for lo, hi in zip(table, table[1:]):
        if length <= hi[0]:
            w = math.log(length / lo[0]) / math.log(hi[0] / lo[0])
            (a0, a1, a2, a3), (b0, b1, b2, b3) = per_flop(lo), per_flop(hi)
            return a0 + w * (b0 - a0), a1 + w * (b1 - a1), a2 + w * (b2 - a2), a3 + w * (b3 - a3)
    return per_flop(table[-1])


def flash_attention_kernels_s(model: ModelSpec, *, tokens: int, seq_len: int, dims: ParallelDims,
                              gpu: GpuSpec) -> list[tuple[float, float, float]]:
    """(BF16 forward seconds, length in keys, forward FLOPs) of each fused attention kernel one rank runs for
    `tokens` queries, per decoder layer on the model's mean: one causal kernel over the sequence, or a
    context-parallel ring's (ring_attention_blocks). Sliding-window layers (`LayerGroup.attention_window` w < s)
    are their own kernel, weighted by their share of the layers: FLOPs over min(position, w) keys
    (`flops.causal_keys`), at the causal ramp of length w, their rows' keys (FlashAttention's window kernel was
    not measured: its rows carry a leading masked edge beside the diagonal one, so it is priced no faster than a
    causal kernel over w tokens). Under context parallelism the ring's kernels carry the window's share of the
    FLOPs (`flops.window_attention_share`) at the ring's lengths. The fused kernel's memory (Q, K, V, O and the
    softmax statistics per row) does not depend on the window."""
    qk_dim, v_dim = attention_dims(model)
    heads = model.num_attention_heads / dims.tp
    flops = 2.0 * tokens * seq_len * heads * (qk_dim + v_dim) * 0.5
    eff = gpu.efficiency
    if dims.cp > 1:
        peak = gpu.bf16_tflops * 1e12
        flops *= window_attention_share(model, seq_len)
        return [(flops * share / (peak * flash_attention_efficiency(eff, length, causal=causal)), length, flops * share)
                for share, length, causal in ring_attention_blocks(seq_len, dims.cp)]
    s0 = eff.attention_half_seq
    kinds = Counter(None if w is None or w >= seq_len else w for w in model.decoder_windows)
    out = []
    for window, count in sorted(kinds.items(), key=lambda kv: kv[0] or 0):
        length = float(seq_len if window is None else window)
        ratio = 1.0 if window is None else causal_keys(seq_len, window) / (seq_len / 2)
        work = flops * (count / model.num_layers) * ratio
        attn_eff = min(1.0, eff.attention * (length / (length + s0)) / (4096 / (4096 + s0)))
        out.append((work / (gpu.bf16_tflops * 1e12 * attn_eff), length, work))
    return out


FP8_ATTENTION_QKV_BYTES = 9.0
"""HBM bytes per Q, K and V element Transformer Engine spends before an FP8 attention kernel under current
scaling (NVTE_DPA_FP8_RECIPE=Float8CurrentScaling): Megatron passes q, k and v apart (layout sbhd_sbhd_sbhd),
so `combine_and_quantize` first concatenates them (`torch.cat`, read 2 + write 2; TransformerEngine d0067d0da
`dot_product_attention/utils.py`, its case 3), then quantizes the copy: the amax read (2), the cast's read (2)
and the FP8 write (1)."""

FP8_ATTENTION_DO_BYTES = 5.0
"""HBM bytes per output-gradient element the backward quantizes (dO: amax read 2, cast read 2, FP8 write 1)."""


def check_fp8_attention_model(model: ModelSpec) -> None:
    """The kernels were measured at head dimension 128 for queries, keys and values: refuse anything else
    (MLA's 192 / 128 heads, 64- or 256-wide heads) rather than extrapolate."""
    qk_dim, v_dim = attention_dims(model)
    if model.mla is not None or (qk_dim, v_dim) != (BENCH_HEAD_DIM, BENCH_HEAD_DIM):
        raise ValueError(f"FP8 attention was measured at head dimension {BENCH_HEAD_DIM} only; {model.name} has "
                         f"{qk_dim} / {v_dim}{' (MLA)' if model.mla is not None else ''}")


def fp8_attention_s(model: ModelSpec, *, tokens: int, seq_len: int, dims: ParallelDims, gpu: GpuSpec) -> tuple[float, float]:
    """(forward, backward) seconds of one rank's attention core in FP8: Transformer Engine's
    fp8_dot_product_attention under current scaling (FusedAttnFunc with the cuDNN FP8 backend; TransformerEngine
    d0067d0da `pytorch/attention/dot_product_attention/backends.py`).

    Each fused kernel is the BF16 price (forward, and FLASH_BACKWARD_FACTOR x forward backward, as
    layer_compute_time prices BF16) less the time cuDNN's FP8 kernel saved over its BF16 kernel in NVIDIA's
    measurement at that length, per FLOP (fp8_attention_kernel_s) times the kernel's FLOPs: the measured
    difference, not a ratio of the fitted price, since the fitted BF16 attention (train_attention) carries
    more than the kernel, which FP8 does not speed up. Never below the measured FP8 kernel's own time for those FLOPs. Around the kernels:
    forward, Q, K and V are concatenated and quantized (FP8_ATTENTION_QKV_BYTES; the output stays BF16,
    NVTE_DPA_FP8CS_O_in_F16 defaults to 1, and dQ/dK/dV come back in BF16); backward, dO is quantized
    (FP8_ATTENTION_DO_BYTES). Raises ValueError on a GPU without a kernel measurement or a model whose
    head dimension was not measured."""
    check_fp8_attention_model(model)
    qk_dim, v_dim = attention_dims(model)
    heads, kv = model.num_attention_heads / dims.tp, max(1.0, model.kv_heads / dims.tp)
    fwd = bwd = 0.0
    for s, length, flops in flash_attention_kernels_s(model, tokens=tokens, seq_len=seq_len, dims=dims, gpu=gpu):
        f8, f16, b8, b16 = fp8_attention_kernel_s(gpu.name, length)
        fwd += max(s - flops * (f16 - f8), flops * f8)
        bwd += max(FLASH_BACKWARD_FACTOR * s - flops * (b16 - b8), flops * b8)
    hbm = gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm
    qkv = tokens * (heads * qk_dim + kv * qk_dim + kv * v_dim)
    d_out = tokens * heads * v_dim
    return fwd + FP8_ATTENTION_QKV_BYTES * qkv / hbm, bwd + FP8_ATTENTION_DO_BYTES * d_out / hbm
