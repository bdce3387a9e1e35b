"""Transformer Engine's low-precision GEMMs in a training step (FP8 recipes and NVFP4): which GEMMs run in
them, at which peak and bytes per operand, the quantization bytes per element by recipe, and the seconds
one layer's casts take."""

from __future__ import annotations

from functools import lru_cache

from autoshard.costmodel.band_table import gpu_generation
from autoshard.costmodel.flops import Gemm
from autoshard.costmodel.gemm_shape import shape_table
from autoshard.parallel import Fp8Recipe
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.job import Precision

__all__ = ["NVFP4_CAST_BYTES", "NVFP4_WEIGHT_CACHE_BYTES", "SPLIT_QUANTIZE_KERNELS",
           "fp8_cast_bytes_per_element", "fp8_quantize_s", "fp8_recipe_gpu", "fp8_weight_cast_bytes_per_param",
           "gemm_operand_bytes", "gemm_peak",
           "nvfp4_quantize_s", "quantized_gemm", "quantized_peak_tflops"]

NVFP4_WEIGHT_CACHE_BYTES = 2 * (0.5 + 1 / 16)
"""Bytes per GEMM weight parameter of Transformer Engine's NVFP4 weight copies for the step: the rowwise
(forward) and columnwise (data gradient) E2M1 data, each with one E4M3 scale per 16 values. TE's 2D (16 x 16)
weight quantization makes the two share their scales, not their data: the same bytes."""

NVFP4_CAST_BYTES = 2.0 + 2.0 + NVFP4_WEIGHT_CACHE_BYTES
"""HBM bytes per element to quantize one NVFP4 GEMM operand (TE's NVFP4BlockScaling): a read pass for the
tensor's amax (the FP32 second-level scale needs it before any block is cast: 2 B), the cast's read (2 B), and
both layouts it writes (rowwise for this GEMM, columnwise for the weight-gradient GEMM: 2 x (0.5 + 1/16) B).
TransformerEngine d0067d0da `pytorch/csrc/quantizer.cpp` `NVFP4Quantizer::quantize_impl`: without RHT it runs
`nvte_compute_amax_with_config` over the input, then the cast.
With the random Hadamard transform of the weight-gradient operands (on by default, off in the "vanilla" recipe
MLPerf's NVFP4 submissions run) the amax pass is `nvte_hadamard_transform_amax`, still one read, and the cast
fuses the transform: the same bytes; the transform's own math is not priced."""


def quantized_peak_tflops(gpu: GpuSpec, precision: Precision) -> float | None:
    """The GPU's dense peak (TFLOP/s) in the plan's FP8 or FP4 precision; None for BF16 plans or where the
    GPU has no such tensor cores (its GEMMs then run at the BF16 peak)."""
    if precision is Precision.FP8:
        return gpu.fp8_tflops
    return gpu.fp4_tflops if precision is Precision.FP4 else None


def quantized_gemm(gemm: Gemm, gpu: GpuSpec, precision: Precision) -> bool:
    """The GEMM runs in the plan's FP8 or FP4 recipe: a GEMM Transformer Engine quantizes
    (`fp8_capable`: not the router or the output layer) on a GPU with that precision's tensor cores."""
    return gemm.fp8_capable and bool(quantized_peak_tflops(gpu, precision))


def gemm_peak(gpu: GpuSpec, precision: Precision, fp8_capable: bool) -> tuple[float, float]:
    """(dense peak FLOP/s, the knob's fraction of it) for a GEMM: FP8 GEMMs at the FP8 peak and
    `gemm_fp8`; NVFP4 GEMMs at the FP4 peak and the same `gemm_fp8` (one Transformer Engine block-scaled
    kernel family on Blackwell's tensor cores: the FP4 rows of tests/validation test that fraction out
    of sample, no knob of its own is fitted); everything else at the BF16 peak and `gemm`."""
    peak = quantized_peak_tflops(gpu, precision) if fp8_capable else None
    if peak:
        return peak * 1e12, gpu.efficiency.gemm_fp8
    return gpu.bf16_tflops * 1e12, gpu.efficiency.gemm


def gemm_operand_bytes(gemm: Gemm, gpu: GpuSpec, precision: Precision) -> float:
    """Bytes per element of the GEMM's input operands: the quantized format's where it runs in one, else BF16."""
    return (precision if quantized_gemm(gemm, gpu, precision) else Precision.BF16).gemm_operand_bytes


@lru_cache(maxsize=1024)
def fp8_recipe_gpu(gpu: GpuSpec, precision: Precision, recipe: Fp8Recipe) -> GpuSpec:
    """`gpu` (with its training knobs) as the recipe's FP8 GEMMs see it. Block scales (recipe
    blockwise: activations 1 x 128, weights 128 x 128) run cuBLAS's block-scaled kernel, measured on
    an H100 at 0.861 of the per-tensor kernel's speed (median of 48 shapes, 0.67-1.23;
    tests/validation/gemm_bench.py --blockwise, gemm_h100_blockwise_raw.json): where the GPU's
    generation has that measurement, `gemm_fp8` is scaled by it. Per-tensor recipes run the kernel the
    knob was fitted on; MXFP8 is native to Blackwell's tensor cores (no measurement here)."""
    if precision is not Precision.FP8 or recipe is not Fp8Recipe.BLOCKWISE:
        return gpu
    table = shape_table(gpu_generation(gpu.name))
    if table is None or table.fp8_blockwise is None:
        return gpu
    eff = gpu.efficiency
    return gpu.model_copy(update={"efficiency": eff.model_copy(update={"gemm_fp8": eff.gemm_fp8 * table.fp8_blockwise})})


def fp8_cast_bytes_per_element(recipe: Fp8Recipe, *, transpose: bool = False) -> float:
    """HBM bytes per element to quantize one FP8 GEMM operand in Transformer Engine.

    delayed: read BF16 (2) and write FP8 (1), the scale comes from the amax history.
    tensorwise (current scaling): an extra read pass for the tensor's amax before the cast (+2).
    blockwise (1x128 / 128x128 scales): one fused amax-and-cast pass, but the column-wise
    (transposed) copy the weight gradient needs is written as well (+1).
    mxfp8 (Blackwell, 1x32 E8M0 scales in hardware): row-wise and column-wise copies (+1) and their
    scales (1/32 each).
    transpose: the GPU's FP8 GEMMs take only the TN layout (Hopper and Ada; TE's
    `is_non_tn_fp8_gemm_supported` is true from compute capability 10, Blackwell), so a per-tensor
    recipe (delayed, tensorwise) writes the transposed FP8 copy the weight-gradient GEMM reads as
    well, in the same fused kernel (TE's cast-transpose: +1). Blockwise and MXFP8 write both
    layouts on every GPU."""
    match recipe:
        case Fp8Recipe.DELAYED:
            return 3.0 + (1.0 if transpose else 0.0)
        case Fp8Recipe.TENSORWISE:
            return 5.0 + (1.0 if transpose else 0.0)
        case Fp8Recipe.BLOCKWISE:
            return 4.0
        case Fp8Recipe.MXFP8:
            return 4.0 + 2.0 / 32
    raise AssertionError(recipe)


SPLIT_QUANTIZE_KERNELS = {
    Fp8Recipe.DELAYED: 0, Fp8Recipe.TENSORWISE: 3, Fp8Recipe.BLOCKWISE: 1, Fp8Recipe.MXFP8: 1}
"""Kernels Transformer Engine launches per local expert to quantize one operand of a grouped expert GEMM,
beyond one fused pass over all experts. GroupedLinear quantizes its input (forward) and output gradient
(backward) with `tex.split_quantize` (TransformerEngine release_v2.14, pytorch/csrc/extensions/cast.cpp
`split_quantize` -> `multi_tensor_quantize_impl`): the one fused multi-tensor kernel
(`nvte_multi_cast_transpose`, "Currently only have fused kernel for FP8 delayed scaling") serves only delayed
scaling's Float8Quantizer; the blockwise (Float8BlockQuantizer) and MXFP8 quantizers, bulk-allocated, still
"Quantize kernels individually": one `nvte_quantize_v2` each; current scaling
(Float8CurrentScalingQuantizer, pytorch/csrc/quantizer.cpp) runs three per tensor: the amax, the scale from
it, the cast. NVFP4's split-quantize with the random Hadamard transform (TE's default NVFP4 recipe) runs
grouped amax and cast kernels: no extra launches (without it, MLPerf's "vanilla" recipe, the casts run per
expert after one grouped amax: not priced, no NVFP4 MoE run is measured). Each
launch costs the GPU's `kernel_overhead_us`, as each per-expert GEMM does (compute.gemm_time_s); the bytes
are `fp8_cast_bytes_per_element`'s either way."""


def fp8_quantize_s(gemms: list[Gemm], gpu: GpuSpec, recipe: Fp8Recipe) -> tuple[float, float]:
    """(forward, backward) seconds Transformer Engine spends quantizing the activation operands of
    one layer's FP8 GEMMs (`gpu` carries the training knobs): for each forward GEMM (m x k) @ (k x n),
    the forward quantizes its input X (m x k elements), the backward its output gradient dY
    (m x n), which both the dgrad (dY W^T) and the wgrad (X^T dY) GEMM read; each at
    `fp8_cast_bytes_per_element` (with the transposed copy on GPUs before Blackwell). The weights
    are cast once per step (`is_first_microbatch`): not here, per micro-batch, but in
    costmodel.train.layer.fp8_weight_cast_s, once per step. BF16 GEMMs
    (router, output layer) quantize nothing. A grouped expert GEMM's operands are quantized expert by
    expert where the recipe has no fused multi-tensor kernel: SPLIT_QUANTIZE_KERNELS launches per extra
    expert, each at the GPU's `kernel_overhead_us`."""
    per = fp8_cast_bytes_per_element(recipe, transpose=gpu_generation(gpu.name) != "blackwell")
    return _quantize_s(gemms, gpu, per, SPLIT_QUANTIZE_KERNELS[recipe])


def _quantize_s(
    gemms: list[Gemm], gpu: GpuSpec, bytes_per_element: float, split_kernels: int = 0,
) -> tuple[float, float]:
    """(forward, backward) seconds to quantize the inputs X (m x k) and the output gradients dY (m x n) of
    the GEMMs Transformer Engine quantizes, at `bytes_per_element` of HBM traffic each, plus
    `split_kernels` launches per expert beyond the first for each operand of a grouped GEMM (one X forward,
    one dY backward)."""
    hbm = gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm
    x = sum(g.m * g.k * g.count for g in gemms if g.fp8_capable)
    dy = sum(g.m * g.n * g.count for g in gemms if g.fp8_capable)
    launches = split_kernels * sum(g.count - 1 for g in gemms if g.fp8_capable and g.grouped)
    launch_s = launches * gpu.efficiency.kernel_overhead_us * 1e-6
    return bytes_per_element * x / hbm + launch_s, bytes_per_element * dy / hbm + launch_s


def nvfp4_quantize_s(gemms: list[Gemm], gpu: GpuSpec) -> tuple[float, float]:
    """(forward, backward) seconds Transformer Engine spends quantizing the activation operands of one
    layer's NVFP4 GEMMs: the forward input X (m x k) and the output gradient dY (m x n) of each GEMM Transformer
    Engine quantizes, at NVFP4_CAST_BYTES each (as fp8_quantize_s for FP8); weights are cast once per step
    (costmodel.train.layer.fp8_weight_cast_s)."""
    return _quantize_s(gemms, gpu, NVFP4_CAST_BYTES)


def fp8_weight_cast_bytes_per_param(gpu: GpuSpec, recipe: Fp8Recipe, *, fp8_params: bool, cached: float) -> float:
    """HBM bytes per GEMM weight parameter of Transformer Engine's once-per-step weight cast: on each
    chunk's first micro-batch (Megatron-Core's `is_first_microbatch`) TE writes the FP8 copies it
    caches for the step (`cached` bytes per parameter, costmodel.train.memory.fp8_weight_cache_bytes).
    From BF16 weights the cast reads them (2 B; tensorwise current scaling reads them twice, the amax
    pass first: +2) and writes every copy it keeps (the rowwise one too, which `cached` counts then).
    With FP8 primary weights (--fp8-param-gather) the distributed optimizer casts its own shard before
    the all-gather (1/DP of the work, not charged); the step reads the gathered FP8 weight (1 B) only
    to write the other layout where the recipe and GPU need one (`cached` > 0), else nothing."""
    if gpu.fp8_tflops is None:
        return 0.0
    if fp8_params:
        return 1.0 + cached if cached > 0 else 0.0
    return 2.0 + (2.0 if recipe is Fp8Recipe.TENSORWISE else 0.0) + cached
