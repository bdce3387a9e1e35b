"""torchtitan's memory terms (TrainFramework.TORCHTITAN; see autoshard.costmodel.train.memory for the
framework's states): op-level selective checkpointing, the FP32 (or compiled) loss, the hole the loss
leaves in the allocator's reservation, and what torchtitan's memory log reports."""

from __future__ import annotations

from autoshard.costmodel.train.memory import BF16, FP32, layer_activation_bytes
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = ["torchtitan_layer_activation_bytes", "torchtitan_loss_bytes", "torchtitan_loss_hole_bytes",
           "allocator_reported_bytes"]


def torchtitan_layer_activation_bytes(
    model: ModelSpec,
    kind: LayerKind,
    *,
    dims: ParallelDims,
    micro_batch_size: int,
    seq_len: int,
    recompute: Recompute,
    sequence_parallel: bool,
) -> float:
    """Bytes one micro-batch leaves saved for backward in one layer under torchtitan.

    Decoder layers: full AC saves the block input; op-level selective AC saves the block input and
    the outputs of ops in torchtitan's `_save_list` (every other mm, flash attention, TP
    reduce-scatters). No AC (and MoE layers, whose torchtitan op order is not modelled) falls back
    to the Korthikanti count. The output layer saves the final norm's input and the output
    projection's input (all-gathered over the sequence when TP shards it); its loss is transient
    (`torchtitan_loss_bytes`)."""
    tp, s, b = dims.tp, seq_len // dims.cp, micro_batch_size
    tokens = s * b
    h = model.hidden_size
    rep = tp if sequence_parallel else 1
    if kind is LayerKind.EMBEDDING:
        return 0.0
    if kind is LayerKind.OUTPUT:
        return tokens * (BF16 * h / rep + BF16 * h)
    if recompute is Recompute.FULL:
        return tokens * BF16 * h / rep
    if recompute is Recompute.NONE or kind is not LayerKind.DENSE or model.mla is not None:
        return layer_activation_bytes(
            model, kind, dims=dims, micro_batch_size=micro_batch_size, seq_len=seq_len,
            recompute=recompute, sequence_parallel=sequence_parallel,
        )
    d = model.kv_channels
    heads = model.num_attention_heads / tp
    kv = max(model.kv_heads / tp, 1)
    ffn = model.ffn_hidden_size / tp
    # Block mm order: wq, wk, wv, wo, w1, w3, w2 (gated MLP) or w1, w2; odd-numbered ones are saved.
    mm_out = [heads * d, kv * d, kv * d, h]  # rowwise outputs (wo, w2) are the full-width partial sums
    mm_out += [ffn, ffn, h] if model.mlp.num_matrices == 3 else [ffn, h]
    saved = BF16 * h / rep  # the block input (checkpoint wrapper)
    saved += BF16 * sum(mm_out[0::2])
    saved += BF16 * heads * d + FP32 * heads  # flash attention output and logsumexp
    if tp > 1 and sequence_parallel:
        saved += 2 * BF16 * h / tp  # reduce-scatter outputs after wo and w2
    return tokens * saved


def torchtitan_loss_bytes(model: ModelSpec, *, dims: ParallelDims, micro_batch_size: int, seq_len: int,
                          compiled: bool = False) -> float:
    """Peak bytes of torchtitan's loss (FP32 cross-entropy on the logits), one micro-batch.

    compiled: torchtitan compiles the loss with --training.compile (components/loss.py
    build_cross_entropy_loss since 2025-04, bbb1b616; off in the Dec 2024 benchmarks, e8977b0).
    Inductor fuses the FP32 cast, log-softmax and nll into kernels that materialize no vocabulary-
    sized FP32 tensor; backward needs only the BF16 logits (kept for it) and the per-token
    log-sum-exp, and writes the BF16 gradient: 2 + 2 B x V/tp per token.

    Without TP: the fused CUDA log_softmax saves its FP32 output; in backward nll_loss_backward
    allocates an FP32 gradient and log_softmax_backward another: 3 x 4 B x V per token (the forward
    peak, BF16 logits + FP32 copy + FP32 output = 10 B, is lower). With TP, loss parallel keeps the
    vocabulary sharded and its fused backward holds the saved output, zeros_like, exp(x) and their
    sum: 4 x 4 B x V/tp per token of the full (gathered) sequence."""
    tokens = micro_batch_size * seq_len // dims.cp
    if compiled:
        per_vocab = 2 * BF16
    else:
        per_vocab = 3 * FP32 if dims.tp == 1 else 4 * FP32
    return tokens * per_vocab * model.vocab_size / dims.tp


def torchtitan_loss_hole_bytes(model: ModelSpec, *, dims: ParallelDims, micro_batch_size: int, seq_len: int,
                               compiled: bool = False) -> float:
    """Bytes torchtitan's allocator holds reserved but unallocated at the loss peak: the BF16 logits.

    torchtitan runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (run_llama_train.sh), so
    the default stream's memory is one segment that grows at its end, and the logged figure is its
    peak reservation. The loss allocates, in order, the BF16 logits (2 B x V/tp per token), their
    FP32 copy and the FP32 log-softmax intermediates, each at the end of the segment; the logits
    and the copy are freed before backward (`del pred`), leaving a hole of 2 + 4 B below the saved
    log-softmax output. Backward's first FP32 tensor (nll_loss's zeros) takes 4 B of it; the next
    FP32 tensor does not fit the 2 B left and extends the segment. So the reservation peaks one
    BF16 logits tensor above the allocation (with TP and loss parallel the same: shifted logits and
    exp fill the hole up to the same 2 B). Megatron's fused vocab-parallel cross-entropy keeps no
    such sequence of vocabulary-sized tensors, nor does a compiled loss (its gradient follows the
    kept BF16 logits): 0."""
    if compiled:
        return 0.0
    tokens = micro_batch_size * seq_len // dims.cp
    return tokens * BF16 * model.vocab_size / dims.tp


def allocator_reported_bytes(gpu: GpuSpec, total_bytes: float) -> float:
    """What `torch.cuda.memory_stats()["reserved_bytes.all.peak"]` reports for a predicted per-GPU
    total: everything but the CUDA context and NCCL buffers, which live outside the allocator."""
    return total_bytes - gpu.efficiency.reserved_memory_gib * GIB
