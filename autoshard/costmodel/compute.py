"""The time a GPU needs for a layer's work: GEMMs on the roofline with shape fall-off, flash
attention, memory-bound elementwise kernels, recompute, FP8 casts, MoE imbalance and the
TP-overlap GEMM split. The FLOPs themselves come from `autoshard.costmodel.flops`.

Conventions (the Megatron-LM paper's, so calibration rows compare like with like):
- A GEMM of (m x k) @ (k x n) is 2*m*n*k FLOPs. Backward is twice forward (dgrad + wgrad).
- *Model* FLOPs count attention scores over the full s x s square (no causal halving) and exclude
  recomputation; *executed* work halves the causal attention core, as flash attention skips the
  masked blocks, and includes recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.costmodel.attention import FLASH_BACKWARD_FACTOR, flash_attention_kernels_s, fp8_attention_s
from autoshard.costmodel.band_table import gpu_generation
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import Gemm, attention_dims, attention_gemms, layer_gemms
from autoshard.costmodel.fp8 import (
    fp8_quantize_s, fp8_recipe_gpu, gemm_operand_bytes, gemm_peak, nvfp4_quantize_s, quantized_gemm,
)
from autoshard.costmodel.gemm_shape import shape_table
from autoshard.costmodel.moe import imbalance_factor
from autoshard.parallel import CrossEntropyImpl, Fp8Recipe, ParallelDims, Recompute
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.job import Precision
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = [
    "gemm_time_s", "attention_time_s", "elementwise_bytes_per_token", "ComputeTime", "layer_compute_time",
    "tp_overlap_gemm_extra_s", "CROSS_ENTROPY_BYTES", "cross_entropy_bytes_per_token",
    "wgrad_time_s", "shape_efficiency", "dgrad_shape", "wgrad_shape", "backward_gemms_s", "expert_imbalance_s",
]

BF16_BYTES = 2

CROSS_ENTROPY_BYTES: dict[CrossEntropyImpl, tuple[float, float]] = {
    # HBM bytes per logit (one vocabulary element of one token on its TP rank), (forward, backward),
    # counted from each implementation's kernels with BF16 logits:
    # unfused (megatron/core/tensor_parallel/cross_entropy.py): .float() copy (read 2, write 4), max
    # (read 4), in-place subtract (4 + 4), in-place exp (4 + 4), sum (4), in-place divide by the sum
    # (4 + 4) = 38; backward: grad_input.mul_(grad_output) (4 + 4) and autograd's FP32 -> BF16 cast of
    # the gradient (4 + 2) = 14.
    CrossEntropyImpl.UNFUSED: (38.0, 14.0),
    # native (megatron/core/fusions/fused_cross_entropy.py, each step one jit_fuser kernel): cast + max
    # (2 + 4), subtract + exp + sum (4 + 4), divide (4 + 4) = 22; backward: scale and cast to BF16 in
    # one kernel (4 + 2) = 6.
    CrossEntropyImpl.NATIVE: (22.0, 6.0),
    # te (transformer_engine/pytorch/triton/cross_entropy.py, 2025 releases): online-softmax pass
    # (read 2), loss + gradient written over the BF16 logits (2 + 2) = 6; backward: element_mul_kernel
    # by grad_output (2 + 2), which Megatron's per-token loss mask makes != 1.
    CrossEntropyImpl.TE: (6.0, 4.0),
    # xentropy (flash-attention csrc/xentropy, from Apex): two reads of the BF16 logits (max and sum,
    # then sum of exp) = 4; backward: one kernel reads the logits and writes the gradient = 4.
    CrossEntropyImpl.XENTROPY: (4.0, 4.0),
}
"""HBM bytes per logit of each cross-entropy implementation (forward, backward); see
`cross_entropy_bytes_per_token`."""


# --------------------------------------------------------------------------- time


def shape_efficiency(gemm: Gemm, gpu: GpuSpec, precision: Precision) -> float:
    """Fraction of the precision's dense peak the GEMM reaches at its shape: the knob (a large GEMM's
    level) times the measured fall-off of the GPU's generation (gemm_shape.shape_table; grouped
    expert GEMMs by rows per expert) where `gemm_shape_measured` is set and one exists, else
    times d / (d + gemm_half_dim) of the smallest dimension d."""
    eff = gpu.efficiency
    _, gemm_eff = gemm_peak(gpu, precision, gemm.fp8_capable)
    fp8 = quantized_gemm(gemm, gpu, precision)  # FP4 takes the FP8 kernels' measured fall-off
    table = shape_table(gpu_generation(gpu.name)) if eff.gemm_shape_measured else None
    if table is not None:
        if gemm.grouped:
            return gemm_eff * table.grouped(gemm.m, gemm.count, gemm.n, gemm.k, fp8)
        return gemm_eff * table.dense(gemm.m, gemm.n, gemm.k, fp8)
    smallest = min(gemm.m, gemm.n, gemm.k)
    return gemm_eff * smallest / (smallest + eff.gemm_half_dim)


def gemm_time_s(gemm: Gemm, gpu: GpuSpec, precision: Precision) -> float:
    """Roofline time of a forward GEMM: the slower of math at a shape-dependent efficiency
    (shape_efficiency) and HBM traffic (read A and B, write C), plus a per-kernel overhead."""
    eff = gpu.efficiency
    peak, _ = gemm_peak(gpu, precision, gemm.fp8_capable)
    shape_eff = shape_efficiency(gemm, gpu, precision)
    elem = gemm_operand_bytes(gemm, gpu, precision)
    traffic = (gemm.m * gemm.k + gemm.k * gemm.n) * elem + gemm.m * gemm.n * BF16_BYTES
    math_s = 2.0 * gemm.m * gemm.n * gemm.k / (peak * shape_eff)
    mem_s = traffic / (gpu.hbm_tbps * 1e12 * eff.hbm)
    return gemm.count * (max(math_s, mem_s) + eff.kernel_overhead_us * 1e-6)


def _measured(gpu: GpuSpec) -> bool:
    return gpu.efficiency.gemm_shape_measured and shape_table(gpu_generation(gpu.name)) is not None


def dgrad_shape(gemm: Gemm, gpu: GpuSpec) -> Gemm:
    """The data-gradient GEMM of a forward (m x k) @ (k x n): dX (m x k) = dY (m x n) @ W (n x k),
    contraction over n. Where the shape fall-off is the smooth curve of the smallest dimension it
    is the forward's; grouped expert GEMMs keep their forward shape (rows per expert)."""
    if gemm.grouped or not _measured(gpu):
        return gemm
    return Gemm(gemm.m, gemm.k, gemm.n, gemm.count, gemm.fp8_capable)


def wgrad_shape(gemm: Gemm, gpu: GpuSpec) -> Gemm:
    """The weight-gradient GEMM of a forward (m x k) @ (k x n): dW (k x n) = X^T (k x m) @ dY (m x n),
    contraction over the m tokens (as dgrad_shape: the forward's where the measured table does not
    apply, and for grouped expert GEMMs)."""
    if gemm.grouped or not _measured(gpu):
        return gemm
    return Gemm(gemm.k, gemm.n, gemm.m, gemm.count, gemm.fp8_capable)


def backward_gemms_s(gemms: list[Gemm], gpu: GpuSpec, precision: Precision, main_grad_bytes: int | None) -> float:
    """Seconds of the data- and weight-gradient GEMMs of a layer's forward GEMMs: each at its own
    shape (dgrad_shape, wgrad_shape); the weight gradient accumulated into the main gradient when
    main_grad_bytes is set (wgrad_time_s), else written like a forward GEMM's output."""
    total = 0.0
    for g in gemms:
        total += gemm_time_s(dgrad_shape(g, gpu), gpu, precision)
        if main_grad_bytes:
            total += wgrad_time_s(g, gpu, precision, main_grad_bytes)
        else:
            total += gemm_time_s(wgrad_shape(g, gpu), gpu, precision)
    return total


def wgrad_time_s(gemm: Gemm, gpu: GpuSpec, precision: Precision, main_grad_bytes: int) -> float:
    """Roofline time of the weight-gradient GEMM of a forward GEMM (m x k) @ (k x n): dW (k x n) =
    X^T (k x m) @ dY (m x n), the forward's FLOPs at its own shape's efficiency (wgrad_shape),
    accumulated into the parameter's main gradient. Transformer Engine's fused wgrad accumulation (Megatron
    --gradient-accumulation-fusion, on by default: `accumulate=True`, `out=main_grad` in the backward
    of TE v2.4 `module/linear.py` and `module/grouped_linear.py`; Megatron-Core's
    `tensor_parallel/layers.py` `wgrad_gemm_accum_fp32` for the output layer) has
    cuBLAS read and write the k x n main gradient in its epilogue (beta = 1): 2 x main_grad_bytes per
    weight element, where the forward reads the weight once. At an FP32 main gradient that is about
    m/4 FLOP per byte: it binds when the contraction m (an expert's rows) is short."""
    eff = gpu.efficiency
    peak, _ = gemm_peak(gpu, precision, gemm.fp8_capable)
    shape_eff = shape_efficiency(wgrad_shape(gemm, gpu), gpu, precision)
    elem = gemm_operand_bytes(gemm, gpu, precision)
    traffic = (gemm.m * gemm.k + gemm.m * gemm.n) * elem + 2 * gemm.k * gemm.n * main_grad_bytes
    math_s = 2.0 * gemm.m * gemm.n * gemm.k / (peak * shape_eff)
    mem_s = traffic / (gpu.hbm_tbps * 1e12 * eff.hbm)
    return gemm.count * (max(math_s, mem_s) + eff.kernel_overhead_us * 1e-6)


def attention_time_s(
    model: ModelSpec, *, tokens: int, seq_len: int, dims: ParallelDims, gpu: GpuSpec, flash: bool = True,
    precision: Precision = Precision.BF16,
) -> float:
    """Forward attention core (scores, softmax, weighted values) on one GPU. With context
    parallelism each rank owns `tokens` queries but attends to the whole sequence.

    flash=True: one fused causal kernel, half the s x s square computed, at the attention efficiency.
    With context parallelism (dims.cp > 1) the ring runs CP kernels per rank instead
    (ring_attention_blocks): the causal diagonal one at the ramp of its own length s/CP, the CP - 1
    off-diagonal ones unmasked over s/(2CP) keys (flash_attention_efficiency); the same FLOPs in all.
    flash=False (pre-2022 Megatron): two batched GEMMs over the full square with a head_dim-sized
    inner dimension, plus memory-bound scale/mask/softmax/dropout passes over the stored scores."""
    qk_dim, v_dim = attention_dims(model)
    heads = model.num_attention_heads / dims.tp
    if flash:
        return sum(s for s, _, _ in flash_attention_kernels_s(model, tokens=tokens, seq_len=seq_len, dims=dims, gpu=gpu))
    batch = max(1, round(heads * tokens / seq_len))
    scores = Gemm(seq_len, seq_len, qk_dim, batch, fp8_capable=False)
    values = Gemm(seq_len, v_dim, seq_len, batch, fp8_capable=False)
    gemm_s = gemm_time_s(scores, gpu, precision) + gemm_time_s(values, gpu, precision)
    # scores written (2 B), fused scale-mask-softmax read+write (4 B), dropout read+write+mask (5 B),
    # probabilities read by the value GEMM (2 B)
    elements = heads * tokens * seq_len
    return gemm_s + 13.0 * elements / (gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm)


def elementwise_bytes_per_token(model: ModelSpec, kind: LayerKind, *, dims: ParallelDims, sequence_parallel: bool) -> float:
    """HBM bytes that memory-bound forward kernels move per token on one GPU: two norms and two
    residual adds on the hidden stream (split by TP only with sequence parallelism), rotary embedding
    on Q/K, the per-head Q/K RMSNorm where the model has one (Qwen3, OLMo 2: Megatron --qk-layernorm,
    one read and one write of the local Q and K heads, as rotary), and the MLP activation function on
    the intermediate (always split by TP)."""
    if kind in (LayerKind.EMBEDDING, LayerKind.OUTPUT):
        # Embedding lookup writes h; output norm reads/writes h (the loss: cross_entropy_bytes_per_token).
        split = dims.tp if sequence_parallel else 1
        return 2 * BF16_BYTES * model.hidden_size / split
    h = model.hidden_size
    split = dims.tp if sequence_parallel else 1
    stream = (2 * 2 * h + 2 * 3 * h) * BF16_BYTES / split  # norms (r+w), residual adds (2r+w)
    qk_dim, _ = attention_dims(model)
    rope = 2 * (model.num_attention_heads + model.kv_heads) * qk_dim * BF16_BYTES / dims.tp
    qk_norm = rope if model.qk_norm and model.mla is None else 0.0
    act_in = model.mlp.num_matrices - 1  # swiglu reads gate and up, others read one
    if kind is LayerKind.DENSE:
        ffn_local = model.ffn_hidden_size / dims.tp
        act = (act_in + 1) * ffn_local * BF16_BYTES
    else:
        assert model.moe is not None
        moe = model.moe
        # per token of this rank: top_k * ETP / TP pairs, each with 1/ETP of the expert intermediate
        routed_local = moe.top_k * moe.expert_ffn_hidden_size / dims.tp
        shared_local = moe.shared_expert_ffn_hidden_size / dims.tp
        # permute/unpermute copies of the routed hidden states, and the activation function
        permute = 2 * 2 * moe.top_k * h * BF16_BYTES * dims.expert_tp / dims.tp
        act = (act_in + 1) * (routed_local + shared_local) * BF16_BYTES + permute
    return stream + rope + qk_norm + act


def cross_entropy_bytes_per_token(model: ModelSpec, impl: CrossEntropyImpl, *, tp: int) -> tuple[float, float]:
    """HBM bytes the loss moves per token on one GPU, (forward, backward): the implementation's bytes
    per logit (CROSS_ENTROPY_BYTES) over this TP rank's vocabulary/TP logits. 52 B per logit unfused,
    28 with Megatron's native fusion, 10 with Transformer Engine's, 8 with xentropy."""
    fwd, bwd = CROSS_ENTROPY_BYTES[impl]
    logits = model.vocab_size / tp
    return fwd * logits, bwd * logits


@dataclass(frozen=True, slots=True)
class ComputeTime:
    """Seconds one GPU spends computing one layer for one micro-batch."""

    forward_s: float
    backward_s: float
    recompute_s: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s


def layer_compute_time(
    model: ModelSpec,
    kind: LayerKind,
    *,
    gpu: GpuSpec,
    dims: ParallelDims,
    micro_batch_size: int,
    seq_len: int,
    precision: Precision,
    recompute: Recompute,
    sequence_parallel: bool,
    flash_attention: bool = True,
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED,
    recompute_moe: bool = False,
    tp_comm_overlap: bool = False,
    cross_entropy: CrossEntropyImpl = CrossEntropyImpl.NATIVE,
    main_grad_bytes: int | None = None,
    fp8_attention: bool = False,
) -> ComputeTime:
    """Forward, backward and recompute seconds of one layer for one micro-batch on one GPU.

    recompute_moe: Megatron --recompute-modules moe: the MoE block (router, permutation, shared and
    routed experts) is run again in backward instead of keeping its activations (moe_block_recompute_s).
    tp_comm_overlap: Transformer Engine's userbuffer TP overlap (Megatron --tp-comm-overlap, with
    sequence parallelism) runs some linear GEMMs split into chunks (tp_overlap_gemm_extra_s).
    cross_entropy: the loss implementation, priced on the output layer's forward and backward
    (cross_entropy_bytes_per_token).
    main_grad_bytes: bytes per element of the main gradient the weight-gradient GEMMs accumulate into
    (wgrad_time_s: Megatron's fused accumulation, 4 for FP32 main grads); None prices each wgrad
    GEMM as its forward (frameworks whose wgrad writes a fresh BF16 gradient).
    fp8_attention: the attention core in FP8 (Transformer Engine fp8_dot_product_attention;
    costmodel.attention.fp8_attention_s)."""
    gpu = fp8_recipe_gpu(training_gpu(gpu), precision, fp8_recipe)  # the training step's knobs, the recipe's kernel
    tokens = micro_batch_size * seq_len // dims.cp
    attn_s = attn_bwd_s = 0.0
    if kind in (LayerKind.DENSE, LayerKind.MOE):
        if fp8_attention:
            attn_s, attn_bwd_s = fp8_attention_s(model, tokens=tokens, seq_len=seq_len, dims=dims, gpu=gpu)
        else:
            attn_s = attention_time_s(
                model, tokens=tokens, seq_len=seq_len, dims=dims, gpu=gpu, flash=flash_attention, precision=precision)
            attn_bwd_s = FLASH_BACKWARD_FACTOR * attn_s
    gemms = layer_gemms(model, kind, tokens=tokens, dims=dims)
    ew_bytes = tokens * elementwise_bytes_per_token(model, kind, dims=dims, sequence_parallel=sequence_parallel)
    ew_s = ew_bytes / (gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm)
    cast_fwd_s = cast_bwd_s = 0.0
    if precision is Precision.FP8 and gpu.fp8_tflops:
        cast_fwd_s, cast_bwd_s = fp8_quantize_s(gemms, gpu, fp8_recipe)
    elif precision is Precision.FP4 and gpu.fp4_tflops:
        cast_fwd_s, cast_bwd_s = nvfp4_quantize_s(gemms, gpu)
    gemm_s = sum(gemm_time_s(g, gpu, precision) for g in gemms)
    imbalance_s = 0.0
    if kind is LayerKind.MOE and model.moe is not None:
        imbalance_s = expert_imbalance_s(model, gemms, tokens=tokens, dims=dims, gpu=gpu, precision=precision)
    gemm_s += imbalance_s
    ub_fwd = ub_bwd = 0.0
    if tp_comm_overlap and sequence_parallel and dims.tp > 1:
        ub_fwd, ub_bwd = tp_overlap_gemm_extra_s(model, kind, gemms, gpu=gpu, tp=dims.tp, precision=precision)
    forward = gemm_s + attn_s + ew_s + ub_fwd + cast_fwd_s
    # Backward: dgrad + wgrad GEMMs at their own shapes (backward_gemms_s; the busiest EP rank's
    # imbalance twice), flash-attention backward (FLASH_BACKWARD_FACTOR: it recomputes the scores), element-wise
    # backward reads saved inputs and gradients (2x), FP8 quantization of the output gradients.
    backward_gemm_s = backward_gemms_s(gemms, gpu, precision, main_grad_bytes) + 2.0 * imbalance_s
    backward = backward_gemm_s + attn_bwd_s + 2.0 * ew_s + ub_bwd + cast_bwd_s
    if kind is LayerKind.OUTPUT:
        loss_fwd, loss_bwd = cross_entropy_bytes_per_token(model, cross_entropy, tp=dims.tp)
        hbm = gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm
        forward += tokens * loss_fwd / hbm
        backward += tokens * loss_bwd / hbm
    match recompute:
        case Recompute.NONE:
            re = 0.0
        case Recompute.SELECTIVE:
            re = attn_s
        case Recompute.FULL:
            re = forward if kind in (LayerKind.DENSE, LayerKind.MOE) else 0.0
    if recompute_moe and kind is LayerKind.MOE and recompute is not Recompute.FULL and model.moe is not None:
        re += moe_block_recompute_s(model, gemms, tokens=tokens, dims=dims, gpu=gpu, precision=precision)
    return ComputeTime(forward_s=forward, backward_s=backward, recompute_s=re)


def expert_imbalance_s(
    model: ModelSpec, gemms: list[Gemm], *, tokens: int, dims: ParallelDims, gpu: GpuSpec, precision: Precision,
) -> float:
    """The busiest EP rank gates an MoE layer: its expert GEMMs carry the sampling imbalance of
    uniform routing (autoshard.costmodel.moe.imbalance_factor); the FLOPs stay the mean. Seconds over
    the balanced expert GEMMs of `gemms` (layer_gemms: the last two, grouped up and down projections)."""
    assert model.moe is not None
    if dims.ep <= 1:
        return 0.0
    expert = gemms[-2:]
    pairs = tokens * model.moe.top_k * dims.expert_tp / dims.tp
    extra = imbalance_factor(dims.ep, pairs) - 1.0
    return extra * sum(gemm_time_s(g, gpu, precision) for g in expert)


def moe_block_recompute_s(
    model: ModelSpec, gemms: list[Gemm], *, tokens: int, dims: ParallelDims, gpu: GpuSpec, precision: Precision,
) -> float:
    """Seconds Megatron's `--recompute-modules moe` adds to one MoE layer's backward on one GPU: the
    MoE block's forward runs once more -- router, shared experts and expert GEMMs (with the busiest
    EP rank's imbalance) and the permutation copies. `gemms` are the layer's (layer_gemms); `gpu`
    carries the training knobs already. The token dispatch's extra pass is priced with the EP traffic."""
    assert model.moe is not None
    moe_gemms = gemms[len(attention_gemms(model, tokens, dims.tp)):]  # router, shared experts, experts
    moe_s = sum(gemm_time_s(g, gpu, precision) for g in moe_gemms)
    moe_s += expert_imbalance_s(model, gemms, tokens=tokens, dims=dims, gpu=gpu, precision=precision)
    permute = 2 * 2 * model.moe.top_k * model.hidden_size * BF16_BYTES * dims.expert_tp / dims.tp
    return moe_s + tokens * permute / (gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm)


# Transformer Engine userbuffer overlap as NeMo / Megatron-Bridge configure it on Hopper and Blackwell
# (nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py, every H100/B200 config): QKV and
# FC1 forward and proj/FC2 dgrad use "ring_exchange" (the all-gather or reduce-scatter is a ring of
# TP point-to-point copies by the copy engines; the GEMM runs as TP chunks of m/TP rows, one per
# step); proj/FC2 forward use "pipeline" with num_splits 4 and 16-24 of the H100's 132 SMs reserved
# for the reduce-scatter kernels (set_sm_margin): four m/4-row GEMMs on ~85 % of the SMs. QKV/FC1
# dgrad and wgrad overlap in "bulk" (unsplit GEMMs, 2-16 SMs shared, not reserved).
UB_PIPELINE_SPLITS = 4
UB_PIPELINE_SM_FRACTION = 1.0 - 20.0 / 132.0


UB_MAX_STREAMS = 3
"""Transformer Engine issues the chunk GEMMs of a userbuffer overlap round-robin on
NVTE_COMM_OVERLAP_MAX_STREAMS = 3 compute streams (comm_gemm_overlap.h), so up to three consecutive
chunks run at once and fill the SMs one m/chunks-row GEMM leaves idle."""


def _chunked_s(g: Gemm, chunks: int, gpu: GpuSpec, precision: Precision) -> float:
    """`chunks` GEMMs of m/chunks rows, UB_MAX_STREAMS at a time: while the streams are full the
    device runs them as one GEMM of UB_MAX_STREAMS times the rows, chunks/streams times."""
    rows = max(1, g.m // chunks)
    streams = min(UB_MAX_STREAMS, chunks)
    return chunks / streams * gemm_time_s(Gemm(rows * streams, g.n, g.k, g.count, g.fp8_capable), gpu, precision)


def tp_overlap_gemm_extra_s(
    model: ModelSpec, kind: LayerKind, gemms: list[Gemm], *, gpu: GpuSpec, tp: int, precision: Precision,
) -> tuple[float, float]:
    """Extra (forward, backward) seconds the userbuffer TP overlap costs one layer's GEMMs over
    running them whole: the split GEMMs see m/TP (ring exchange) or m/4 rows on fewer SMs (pipeline),
    so they fall down the small-shape curve and pay a kernel launch per chunk. The communication
    itself is priced (mostly hidden) in the training step's TP term. Applies to the attention QKV/proj
    GEMMs of every decoder layer (not MLA, whose projections Megatron does not overlap this way) and
    to the dense MLP's FC1/FC2; routed expert GEMMs are not TP-overlapped."""
    if kind not in (LayerKind.DENSE, LayerKind.MOE) or model.mla is not None:
        return 0.0, 0.0
    pairs = [(gemms[0], gemms[1])]  # attention: (column-parallel QKV, row-parallel proj)
    if kind is LayerKind.DENSE:
        pairs.append((gemms[2], gemms[3]))  # MLP: (FC1, FC2)
    fwd = bwd = 0.0
    for col, row in pairs:
        whole_col = gemm_time_s(col, gpu, precision)
        whole_row = gemm_time_s(row, gpu, precision)
        fwd += _chunked_s(col, tp, gpu, precision) - whole_col
        fwd += _chunked_s(row, UB_PIPELINE_SPLITS, gpu, precision) / UB_PIPELINE_SM_FRACTION - whole_row
        # dgrad of the row-parallel GEMM (same FLOPs as its forward) runs ring exchange
        bwd += _chunked_s(row, tp, gpu, precision) - whole_row
    return max(0.0, fwd), max(0.0, bwd)
