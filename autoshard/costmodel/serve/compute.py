"""Per-GPU compute and HBM terms of one serving step: the linear layers (BF16, FP8, FP4 and
weight-only GEMMs), the routed experts as grouped GEMMs and the memory-bound elementwise kernels.
Priced on the GPU as an inference engine sees it (`serving_gpu`). Attention lives in
`autoshard.costmodel.serve.attention`, communication in `autoshard.costmodel.serve.sharding` (and the
collectives in `comm`).

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import functools
import math

from autoshard.costmodel.compute import elementwise_bytes_per_token, gemm_time_s
from autoshard.costmodel.flops import Gemm, mlp_gemms
from autoshard.costmodel.moe import busiest_rank_factor
from autoshard.costmodel.serve import fused_moe
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import BF16
from autoshard.costmodel.serve.weights import weight_bytes_per_param
from autoshard.parallel import ParallelDims
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.job import Precision, WeightDtype
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = [
    "ELEMENTWISE_KERNELS",
    "HOPPER_NAMES",
    "MOE_ROW_BLOCK",
    "MOE_DP_CHUNK",
    "moe_dp_chunks",
    "BLOCK_FP8_GEMM_HOPPER",
    "block_scaled_fp8",
    "MLA_EXTRA_KERNELS",
    "extra_kernels_s",
    "serving_gpu",
    "model_serving_gpu",
]

ELEMENTWISE_KERNELS = {LayerKind.DENSE: 4, LayerKind.MOE: 7}
"""Memory-bound kernels one decoder layer launches besides its GEMMs, attention and collectives: the
two fused add+RMSNorms, rotary embedding and the MLP activation (vLLM `fused_add_rms_norm`,
`rotary_embedding`, `silu_and_mul`); an MoE layer adds top-k softmax, the align/permute of tokens to
experts and the weighted un-permute (vLLM `topk_softmax`, `moe_align_block_size`, `moe_sum`). Each
costs the GPU's `kernel_overhead_us` however few bytes it moves (what sets decode at small batch)."""
HOPPER_NAMES = ("H100", "H200", "GH200")
MOE_ROW_BLOCK = 16
"""Rows of one grouped-GEMM tile at decode sizes: each expert's tokens are padded to a multiple
(vLLM `moe_align_block_size`; the smallest BLOCK_SIZE_M of its fused_moe configs)."""


MOE_DP_CHUNK = 256
"""Tokens per DP rank one pass of an attention-DP + EP MoE layer took in vLLM 0.11.0
(VLLM_MOE_DP_CHUNK_SIZE, default 256): with its batched all-to-all backends (DeepEP low-latency, pplx,
MORI: `FusedMoE.use_dp_chunking`, fused_moe/layer.py lines 1093 and 1951-1970 there) the layer looped
over the busiest DP rank's tokens in chunks of this size, every rank in step, each chunk routing,
dispatching, running the grouped expert GEMMs and combining on its own. vLLM 0.33.0 has no DP chunking
(no VLLM_MOE_DP_CHUNK_SIZE, `dp_chunk` nowhere in vllm/): a step's MoE runs in one pass through a
low-latency buffer sized at the step budget. Priced only where `ServeConfig.moe_dp_chunk` says the
engine chunks (the validation rows measured on older vLLM), on decode-only steps as before."""


def moe_dp_chunks(cfg: ServeConfig, tokens: float) -> int:
    """Sequential MoE passes of one step: ceil(tokens of the busiest DP rank / cfg.moe_dp_chunk) for an
    attention-DP + EP engine that chunks (`ServeConfig.moe_dp_chunk`, vLLM 0.11.0), else one (vLLM
    0.33.0, SGLang)."""
    if cfg.moe_dp_chunk is None or not (cfg.expert_parallel and cfg.dp_attention > 1):
        return 1
    return max(1, math.ceil(tokens / cfg.moe_dp_chunk - 1e-9))


BLOCK_FP8_GEMM_HOPPER = 0.37
"""Fraction of the dense FP8 peak a block-scaled FP8 GEMM (weights in 128 x 128 blocks, activations in
1 x 128 groups, each with its own FP32 scale) reaches on Hopper, in place of the per-tensor FP8
`gemm_fp8`. Hopper's FP8 tensor cores take no block scales: every 128-deep slice of K is accumulated
on the tensor cores and then rescaled and added on the CUDA cores (DeepGEMM's "two-level
accumulation"), which costs issue slots and registers the per-tensor kernels spend on math. Measured
by vLLM's own kernel benchmark (vllm-project/vllm benchmarks/kernels/deepgemm/README.md, H100 SXM,
the kernels as vLLM calls them, activations pre-quantized): at the compute-bound shapes (M = 1,024 to
4,096; N x K = 4096 x 7168 and 18432 x 7168) vLLM's CUTLASS block kernel 603 / 817 / 607 / 613
TFLOP/s and DeepGEMM 670 / 970 / 687 / 717, i.e. 0.32-0.55 of 1,979 after the shape fall-off of
`gemm_time_s`, median 0.37 (CUTLASS alone 0.34, DeepGEMM alone 0.38). DeepGEMM's own README (H800,
its own harness) reports more, 1,025-1,358 TFLOP/s at M = 4,096 (0.54-0.71): the two measurements
disagree, and this value takes the one made through the engine's code. Blackwell's tensor cores
scale blocks natively (MXFP8 / UE8M0), so B200/GB200 keep `gemm_fp8`; MI300X has no published
measurement of its block-scaled kernels and keeps its defaults. Only the math side changes: a
memory-bound decode GEMM still reads its FP8 weights at the HBM roofline."""
BLOCK_FP8_GPUS = (*HOPPER_NAMES, "H800")


def block_scaled_fp8(model: ModelSpec, dtype: WeightDtype) -> bool:
    """Whether serving `model` with `dtype` weights loads a block-scaled FP8 checkpoint: the first
    FP8 entry of the model file's `checkpoints:` (the one the launchers load) says `block_scaled`."""
    if dtype is not WeightDtype.FP8:
        return False
    loaded = next((c for c in model.checkpoints if c.weights is dtype), None)
    return loaded is not None and loaded.block_scaled


def model_serving_gpu(model: ModelSpec, gpu: GpuSpec, dtype: WeightDtype) -> GpuSpec:
    """`serving_gpu`, with the block-scaled FP8 GEMM efficiency on Hopper when the model's FP8
    checkpoint is block-scaled (`BLOCK_FP8_GEMM_HOPPER`)."""
    engine = serving_gpu(gpu)
    if _block_fp8_hopper(model, gpu, dtype):
        return _block_fp8_gpu(engine)
    return engine


def _block_fp8_hopper(model: ModelSpec, gpu: GpuSpec, dtype: WeightDtype) -> bool:
    return block_scaled_fp8(model, dtype) and any(tag in gpu.name for tag in BLOCK_FP8_GPUS)


@functools.lru_cache(maxsize=64)
def _block_fp8_gpu(gpu: GpuSpec) -> GpuSpec:
    eff = gpu.efficiency.model_copy(update={"gemm_fp8": BLOCK_FP8_GEMM_HOPPER})
    return gpu.model_copy(update={"efficiency": eff})


@functools.lru_cache(maxsize=64)
def serving_gpu(gpu: GpuSpec) -> GpuSpec:
    """The GPU as an inference engine's GEMMs see it: the efficiency field `serve_gemm` (fitted per
    GPU type on published serving runs) in place of the training-fitted `gemm`, FP8 GEMMs at the
    FP8/BF16 ratio of `fp8_gemm_ratio`. A GPU type without it keeps its training
    values (no serving run of it to learn from)."""
    eff = gpu.efficiency
    if eff.serve_gemm is None:
        return gpu
    update = {"gemm": eff.serve_gemm, "gemm_fp8": min(1.0, fp8_gemm_ratio(gpu) * eff.serve_gemm)}
    return gpu.model_copy(update={"efficiency": eff.model_copy(update=update)})


def fp8_gemm_ratio(gpu: GpuSpec) -> float:
    """Fraction of its FP8 peak an FP8 GEMM reaches in an inference engine over the fraction of BF16
    peak a BF16 GEMM reaches: `serve_fp8_ratio` (1.0 by default: the serving knobs `serve_gemm` and
    `serve_attention_hbm` of H100, H200 and L40S were fitted with it), else the training fit's
    `train_gemm_fp8 / train_gemm` (the untrained `gemm_fp8 / gemm` where a type has no training
    fit). cuBLAS measured on an H100 (autoshard/costmodel/gemm_shape.py) runs large FP8 GEMMs at
    0.71 of 1,979 and BF16 at 0.78 of 989 TFLOP/s, 0.91; refitting the serving knobs with that
    ratio left 45 instead of 35 of 829 serving figures beyond 20 % out of source (TensorRT-LLM's own
    FP8 GEMMs are the kernels there), so serving keeps its fitted 1.0 and training its own knobs.
    The 0.55 / 0.70 defaults would price an FP16 GEMM 27 % nearer its peak than an FP8 one."""
    eff = gpu.efficiency
    if eff.serve_fp8_ratio is not None:
        return eff.serve_fp8_ratio
    fp8 = eff.train_gemm_fp8 if eff.train_gemm_fp8 is not None else eff.gemm_fp8
    bf16 = eff.train_gemm if eff.train_gemm is not None else eff.gemm
    return fp8 / bf16


def _weight_only_gemm_s(g: Gemm, gpu: GpuSpec, wbytes: float) -> float:
    """A W8A16/W4A16 (Marlin-style) GEMM: BF16 math on weights read at their storage size. Same
    roofline and shape fall-off as `gemm_time_s`."""
    eff = gpu.efficiency
    smallest = min(g.m, g.n, g.k)
    math_s = (
        2.0
        * g.m
        * g.n
        * g.k
        / (gpu.bf16_tflops * 1e12 * eff.gemm * smallest / (smallest + eff.gemm_half_dim))
    )
    traffic = g.k * g.n * wbytes + (g.m * g.k + g.m * g.n) * BF16
    mem_s = traffic / (gpu.hbm_tbps * 1e12 * eff.hbm)
    return g.count * (max(math_s, mem_s) + eff.kernel_overhead_us * 1e-6)


def _gemm_s(g: Gemm, gpu: GpuSpec, dtype: WeightDtype) -> float:
    """Linear layers in vLLM: BF16 GEMMs; FP8 weights use FP8 GEMMs on GPUs with FP8 tensor cores
    (W8A8, dynamic activation scales) and weight-only kernels elsewhere; NVFP4/MXFP4 weights use FP4
    GEMMs on GPUs with FP4 tensor cores (Blackwell) and weight-only (Marlin) kernels elsewhere;
    int8/int4 are weight-only."""
    if dtype is WeightDtype.BF16 or not g.fp8_capable:
        return gemm_time_s(g, gpu, Precision.BF16)
    if dtype is WeightDtype.FP8 and gpu.fp8_tflops:
        return gemm_time_s(g, gpu, Precision.FP8)
    if dtype.is_fp4 and gpu.fp4_tflops:
        return _fp4_gemm_s(g, gpu, weight_bytes_per_param(dtype))
    return _weight_only_gemm_s(g, gpu, weight_bytes_per_param(dtype))


def _fp4_gemm_s(g: Gemm, gpu: GpuSpec, wbytes: float) -> float:
    """A W4A4 GEMM on FP4 tensor cores (Blackwell; activations quantized to the same format on the fly):
    math at the dense FP4 peak with the FP8 GEMM efficiency (no measured FP4 fit yet), weights and
    activations read at their FP4 size, BF16 output."""
    eff = gpu.efficiency
    assert gpu.fp4_tflops is not None
    smallest = min(g.m, g.n, g.k)
    math_s = 2.0 * g.m * g.n * g.k / (gpu.fp4_tflops * 1e12 * eff.gemm_fp8 * smallest / (smallest + eff.gemm_half_dim))
    traffic = (g.k * g.n + g.m * g.k) * wbytes + g.m * g.n * BF16
    mem_s = traffic / (gpu.hbm_tbps * 1e12 * eff.hbm)
    return g.count * (max(math_s, mem_s) + eff.kernel_overhead_us * 1e-6)


def _rows(x: float) -> int:
    return max(1, math.ceil(x - 1e-9))


def _expert_routing(model: ModelSpec, cfg: ServeConfig, tokens: float) -> tuple[float, float, int]:
    """(local experts hit, token-expert pairs on this GPU, TP shards of each expert) for `tokens`
    tokens of one DP rank. Only the experts the batch hits are read: E * (1 - (1 - k/E)^n) of them for
    n tokens routed at random. With expert parallelism the layer waits for the busiest EP rank: its
    pairs are the mean times `moe.busiest_rank_factor` (uniform, group-limited where the model is)."""
    assert model.moe is not None
    moe = model.moe
    e, k = moe.num_experts, moe.top_k
    if cfg.expert_parallel:
        n = tokens * cfg.dp_attention  # tokens of every DP rank meet in the MoE layer
        local = e / cfg.ep
        pairs = n * k / cfg.ep  # token-expert pairs landing on a GPU, on average
        pairs *= busiest_rank_factor(cfg.ep, pairs, e, k, moe.num_groups, moe.topk_groups)  # the busiest
        shards = 1
    else:
        n, local, pairs, shards = tokens, float(e), tokens * k, cfg.tp
    hit = local * (1.0 - (1.0 - k / e) ** n)
    return max(hit, 1e-9), pairs, shards


def _grouped_experts_s(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig, tokens: float) -> float:
    """Routed experts of one MoE layer on one GPU as grouped GEMMs (one kernel per weight matrix):
    the slower of the math over every hit expert's rows, padded to MOE_ROW_BLOCK, at the GEMM
    efficiency and shape fall-off of `gemm_time_s`, and the HBM traffic (hit experts' weights once,
    plus the activations in and out); one launch per matrix. fused_moe engines: `serve.fused_moe`."""
    assert model.moe is not None
    hit, pairs, shards = _expert_routing(model, cfg, tokens)
    rows = max(pairs / hit, 1.0)
    padded = MOE_ROW_BLOCK * math.ceil(rows / MOE_ROW_BLOCK - 1e-9)
    eff = gpu.efficiency
    dtype = cfg.weight_dtype
    fp8_math = dtype is WeightDtype.FP8 and bool(gpu.fp8_tflops)
    peak, gemm_eff = (gpu.fp8_tflops * 1e12, eff.gemm_fp8) if fp8_math else (gpu.bf16_tflops * 1e12, eff.gemm)
    if fused_moe.runs_fused_moe(cfg):  # Poisson-padded tiles; prefill tiles of block FP8 at Triton's rate
        tile = fused_moe.fused_moe_tile_rows(tokens, bf16=not fp8_math)
        if _block_fp8_hopper(model, gpu, dtype) and fused_moe.deep_gemm_experts(model, cfg, tokens):
            tile = fused_moe.DEEP_GEMM_ROWS
        elif tile > MOE_ROW_BLOCK and _block_fp8_hopper(model, gpu, dtype):
            gemm_eff = fused_moe.TRITON_BLOCK_FP8_HOPPER
        padded = fused_moe.expected_padded_rows(pairs * cfg.ep / model.moe.num_experts, tile)
    wbytes = weight_bytes_per_param(dtype)
    act = 1 if fp8_math else BF16
    total = 0.0
    for g in mlp_gemms(model, 1, model.moe.expert_ffn_hidden_size, shards):
        smallest = min(padded, g.n, g.k)
        shape_eff = gemm_eff * smallest / (smallest + eff.gemm_half_dim)
        math_s = 2.0 * hit * padded * g.n * g.k / (peak * shape_eff)
        traffic = hit * g.n * g.k * wbytes + pairs * (g.k * act + g.n * BF16)
        mem_s = traffic / (gpu.hbm_tbps * 1e12 * eff.hbm)
        total += max(math_s, mem_s) + eff.kernel_overhead_us * 1e-6
    return total


MLA_EXTRA_KERNELS = 4
"""Kernels an MLA layer launches in vLLM beyond those of a GQA layer (vllm/model_executor/layers/mla.py
and the MLA attention backends' absorbed decode): the RMSNorms of the compressed query and of the KV
latent (q_a_layernorm, kv_a_layernorm), the second absorbed batched GEMM (W_UK before the attention,
W_UV after it; the one kv_b GEMM of `attention_gemms` stands for the first) and the concatenation of
the absorbed query with its rotary part that the decode kernel reads."""
GROUP_QUANT_BYTES = 3.0
"""HBM bytes per element of a 1 x 128 group quantization: the BF16 input read, the FP8 output written
(one FP32 scale per 128 elements is left out)."""


def extra_kernels_s(
    model: ModelSpec, kind: LayerKind, cfg: ServeConfig, gpu: GpuSpec, gemms: list[Gemm], *, tokens: float,
    routed: float,
) -> float:
    """Memory-bound kernels of MLA and block-scaled FP8 layers that ELEMENTWISE_KERNELS leaves out,
    each at the GPU's kernel overhead plus its HBM traffic: MLA_EXTRA_KERNELS; and, for a block-scaled
    FP8 checkpoint on FP8 tensor cores, one 1 x 128 group quantization of the activations per FP8
    GEMM input of `gemms` (vLLM's per_token_group_quant_fp8 ahead of W8A8BlockFp8LinearOp; MLA's
    query and KV down-projections read one input, fused as fused_qkv_a_proj) and two for
    the routed experts (fused_moe quantizes the tokens before its first grouped GEMM, the experts'
    intermediate before the second). `tokens`: this GPU's rows in the layer's GEMMs (each rank
    quantizes its own tokens, before any dispatch); `routed`: the DP rank's mean tokens entering the
    MoE layer, which set the expert pairs on this GPU (as `_grouped_experts_s` takes them)."""
    eff = gpu.efficiency
    kernels = MLA_EXTRA_KERNELS if model.mla is not None else 0
    traffic = 0.0
    if block_scaled_fp8(model, cfg.weight_dtype) and gpu.fp8_tflops:
        fp8 = [g for g in gemms if g.fp8_capable]
        shared = 1 if model.mla is not None and model.mla.q_lora_rank else 0  # fused_qkv_a_proj
        kernels += len(fp8) - shared
        traffic += tokens * (sum(g.k for g in fp8) - shared * model.hidden_size) * GROUP_QUANT_BYTES
        if kind is LayerKind.MOE:
            assert model.moe is not None
            _, pairs, shards = _expert_routing(model, cfg, routed)
            kernels += 2
            ffn = model.moe.expert_ffn_hidden_size / shards
            traffic += (tokens * model.hidden_size + pairs * ffn) * GROUP_QUANT_BYTES
    return traffic / (gpu.hbm_tbps * 1e12 * eff.hbm) + kernels * eff.kernel_overhead_us * 1e-6


def _elementwise_bytes(model: ModelSpec, kind: LayerKind, cfg: ServeConfig) -> float:
    """HBM bytes of memory-bound kernels per token of the DP rank on one GPU: the dense layer's norms,
    residual adds and rotary embedding (`elementwise_bytes_per_token`, no sequence parallelism); for
    MoE layers the activation of the routed and shared experts this GPU runs (1/TP of the token's top-k
    expert intermediates either way) and the routed rows' copies outside the GEMMs (`serve.fused_moe`)."""
    dense = elementwise_bytes_per_token(
        model, LayerKind.DENSE, dims=ParallelDims(tp=cfg.tp), sequence_parallel=False
    )
    if kind is not LayerKind.MOE:
        return dense
    assert model.moe is not None
    moe = model.moe
    gates = model.mlp.num_matrices  # activation reads gate (and up), writes one output
    dense_act = gates * model.ffn_hidden_size / cfg.tp * BF16
    act = gates * (moe.top_k * moe.expert_ffn_hidden_size + moe.shared_expert_ffn_hidden_size) / cfg.tp * BF16
    rows = fused_moe.moe_sum_rows(moe.top_k) if fused_moe.runs_fused_moe(cfg) else 2 * 2 * moe.top_k
    return dense - dense_act + act + rows / (cfg.tp if cfg.expert_parallel else 1) * model.hidden_size * BF16
