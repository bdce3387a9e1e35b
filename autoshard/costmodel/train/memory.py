"""Per-GPU memory: weights, gradients, optimizer state, activations and fixed overheads.

Model states follow Megatron-LM's `theoretical_memory_usage`: BF16 weights (2 B), FP32 gradient
buffer (4 B), FP32 master weights + Adam m and v (12 B) = 18 B/param; the distributed optimizer
(ZeRO-1) shards the 12 B of optimizer state over DP: 6 + 12/DP. ZeRO-2 also shards gradients and
ZeRO-3/FSDP shards the weights, keeping a gathered copy of the layers in flight.

Activations follow Korthikanti et al. 2022 (Table 2), derived tensor by tensor so that GQA, SwiGLU,
MoE and CP fall out of the same count; `dropout=True` reproduces the paper's GPT numbers.

`TrainFramework.TORCHTITAN` swaps in what torchtitan does instead (sources: pytorch/torchtitan at
9dec370, the commit of its Dec 2024 H100 benchmarks; PyTorch's FSDP2 and loss-parallel code):

* FSDP2 mixed precision (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`) keeps FP32
  sharded parameters (4 B), FP32 sharded gradients (4 B) and Adam m, v (8 B): 16 B/param / DP.
  Each transformer block is its own FSDP group, all-gathered in BF16 just in time (the current
  block and the prefetched next one) and resharded after forward; its unsharded BF16 gradients and
  their FP32 copy for the reduce-scatter are transient. The root group (embedding, final norm,
  output projection) is not resharded after forward, so it stays unsharded in BF16 all step.
* The loss (`train.py: cross_entropy(pred.flatten(0, 1).float(), labels)`, `del pred` before
  backward) peaks in backward at the saved FP32 log-softmax output, the FP32 nll-loss gradient and
  the FP32 log-softmax gradient (12 B x V per token); with TP, loss parallel
  (`torch.distributed.tensor.parallel.loss`) shards V and its fused backward
  `(grad_input + exp(x)) * grad_output` holds four FP32 tensors (16 B x V/tp).
* "selective" activation checkpointing in torchtitan's Llama configs is op-level SAC
  (`selective_ac_option = 'op'`, `parallelize_llama.py: _save_list`): each block saves its input and
  the outputs of every other `aten.mm` (wq, wv, w1, w2 in the block's mm order), of flash attention
  (output + FP32 logsumexp) and of TP reduce-scatters; everything else is recomputed.
* torchtitan logs `torch.cuda.memory_stats()["reserved_bytes.all.peak"]` (`metrics.py:
  DeviceMemoryMonitor.get_peak_stats`, `train.py` "memory:" line): the caching allocator's peak
  reservation, which excludes the CUDA context and NCCL buffers (see `allocator_reported_bytes`);
  its gap over the peak allocation is the GPU's `fragmentation` fraction of the dynamic allocations
  (`static_bytes`: all but the FP32 parameter shards and the Adam moments), as for Megatron, plus the
  freed BF16 logits the loss leaves inside the expandable segment (`torchtitan_loss_hole_bytes`).
  These torchtitan terms live in `memory_torchtitan.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from autoshard.costmodel.band_table import gpu_generation
from autoshard.parallel import CrossEntropyImpl, Fp8Recipe, ParallelDims, Recompute
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.job import Optimizer
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = [
    "TrainFramework", "fp8_weight_cache_bytes",
    "ParamShards", "layer_param_shards", "model_state_bytes", "ModelStateBytes",
    "layer_activation_bytes", "in_flight_microbatches", "usable_bytes", "overhead_bytes", "static_bytes",
]

BF16 = 2
FP32 = 4


class TrainFramework(StrEnum):
    """The training framework whose memory behaviour the model follows (time is modelled the same)."""

    MEGATRON = "megatron"
    """Megatron-LM / Megatron-Core: 18 B/param states, distributed optimizer, Korthikanti activations."""
    TORCHTITAN = "torchtitan"
    """torchtitan: FSDP2 mixed-precision states, unfused FP32 loss, op-level selective checkpointing."""
    FSDP = "fsdp"
    """PyTorch FSDP outside torchtitan (e.g. MosaicML Composer / llm-foundry, FSDP1 FULL_SHARD with a
    MixedPrecision policy): the sharded FP32 parameters are the master copy and the BF16 compute
    copy exists only while a unit is gathered (torch.distributed.fsdp docs, MixedPrecision: "the
    sharded parameters are kept in full precision"; the low-precision shard is freed after the
    all-gather), gradients are cast back to the FP32 parameter dtype after the reduce-scatter.
    States as torchtitan's; activations, loss and transients as Megatron's accounting."""
    NEMO = "nemo"
    """NeMo 1.x (NeMo-Framework-Launcher, containers through 24.07) with Apex's DistributedFusedAdam
    (optim.name distributed_fused_adam, megatron_amp_O2): BF16 parameters in a contiguous buffer that
    the all-gather fills in place, a contiguous gradient buffer in optim.grad_sync_dtype, and the FP32
    master weights kept as the 16-bit remainders of the BF16 parameters (NeMo
    megatron_base_model.setup_optimization sets store_param_remainders=True when the optimizer dtype
    is FP32 and the model BF16): Adam holds 2 + 4 + 4 = 10 B/param over DP instead of 12. With
    optim.dtype bf16 (`optimizer_moments_bf16`) the BF16 parameters are the master copy
    (store_params=False) and Adam holds 2 + 2 B. Activations, loss and transients as Megatron's."""


@dataclass(frozen=True, slots=True)
class ParamShards:
    """Parameters of one layer held by one GPU, split by which data-parallel group reduces them."""

    dense: float
    """Replicated over DP (attention, dense MLP, shared experts, router, norms, embeddings)."""
    expert: float
    """Routed-expert weights, replicated over expert-DP."""

    @property
    def total(self) -> float:
        return self.dense + self.expert


def layer_param_shards(model: ModelSpec, kind: LayerKind, dims: ParallelDims) -> ParamShards:
    tp = dims.tp
    match kind:
        case LayerKind.EMBEDDING:
            return ParamShards(model.embedding_params() / tp, 0.0)
        case LayerKind.OUTPUT:
            # With tied embeddings Megatron still keeps a copy of the word embedding on the last stage
            # (synchronised with the first); a single-stage model shares it.
            proj = model.vocab_size * model.hidden_size
            extra = proj if model.tied_embeddings and dims.pp > 1 else 0
            return ParamShards((model.output_params() + extra) / tp, 0.0)
        case LayerKind.DENSE:
            return ParamShards(model.dense_layer_params() / tp, 0.0)
        case LayerKind.MOE:
            assert model.moe is not None
            moe = model.moe
            routed = moe.num_experts * model.expert_params()
            dense = model.moe_layer_params() - routed
            return ParamShards(dense / tp, routed / (dims.ep * dims.expert_tp))
    raise AssertionError(kind)


@dataclass(frozen=True, slots=True)
class ModelStateBytes:
    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def fp8_weight_cache_bytes(gpu: GpuSpec, recipe: Fp8Recipe, *, fp8_params: bool = False) -> float:
    """Bytes per GEMM weight parameter that Transformer Engine keeps in FP8 beside the primary
    weights while a step runs (0 on a GPU without FP8 tensor cores).

    Megatron-Core passes `is_first_microbatch` to TE's linear layers, so TE casts each weight to FP8
    once per step into a named workspace (`get_fp8_workspace(..., cache_name="weight")`) that lives
    on the module and is reused by every micro-batch and by the backward pass. The backward's dgrad
    GEMM needs the weight transposed; Hopper's FP8 tensor cores take only the TN layout, so TE keeps
    a transposed FP8 copy too (`with_transpose` / columnwise usage): 1 + 1 B. Blackwell (TE's
    `is_non_tn_fp8_gemm_supported`, compute capability 10+) runs FP8 GEMMs in any layout and keeps the rowwise copy alone (1 B), except
    for MXFP8, whose 1x32 scaling blocks differ along rows and columns: rowwise and columnwise data
    each with one E8M0 scale per 32 values (2 + 2/32 B); blockwise keeps both layouts of 128x128
    tiles (2 B). With FP8 primary weights (`fp8_params`, --fp8-param-gather) the rowwise copy is the
    weight itself (counted as 1 B in `model_state_bytes`), so only the other layout is extra."""
    if gpu.fp8_tflops is None:
        return 0.0
    match recipe:
        case Fp8Recipe.MXFP8:
            copies = 2 + 2 / 32
        case Fp8Recipe.BLOCKWISE:
            copies = 2.0
        case _:
            copies = 1.0 if gpu_generation(gpu.name) == "blackwell" else 2.0
    return copies - (1 if fp8_params else 0)


def model_state_bytes(
    shards: ParamShards, *, dims: ParallelDims, zero_stage: int, optimizer: Optimizer = Optimizer.ADAM,
    framework: TrainFramework = TrainFramework.MEGATRON, grad_fp32: bool = True, fp8_params: bool = False,
    moments_bf16: bool = False, fp8_cache: float = 0.0,
) -> ModelStateBytes:
    """Bytes of weights, gradients and optimizer state for the given per-GPU parameter shards.

    Megatron: BF16 weights, FP32 gradient buffer, FP32 master + moments. `grad_fp32=False` is
    Megatron-Core's grad_reduce_in_fp32=False (BF16 gradient buffer, what NeMo's performance recipes
    run); `fp8_params=True` is --fp8-param-gather (the model weights are held in FP8, 1 B, the FP32
    master copy stays in the optimizer). torchtitan (FSDP2 mixed precision) and PyTorch FSDP: the FP32
    parameters are the master copy (4 B), gradients are FP32 (4 B) and the optimizer holds only its
    moments; the BF16 compute copies are transient (see training.py). NeMo 1.x (Apex
    DistributedFusedAdam): the master weights are 16-bit remainders of the BF16 parameters (2 B).

    moments_bf16: the optimizer's moments in BF16 (NeMo optim.dtype=bf16, whose BF16 parameters
    then are the master copy; Megatron-Core --use-precision-aware-optimizer --exp-avg-dtype bf16
    --exp-avg-sq-dtype bf16, FP32 master kept). fp8_cache: bytes per parameter of FP8 weight copies
    Transformer Engine keeps for the step (`fp8_weight_cache_bytes`; decoder GEMM weights only, the
    caller decides); never sharded over DP, absent under ZeRO-3 (gathered weights are transient)."""
    state = optimizer.state_bytes_per_param
    w_bytes = 1 if fp8_params else BF16
    g_bytes = FP32 if grad_fp32 else BF16
    master, moments = FP32, state - FP32
    if moments_bf16:
        moments /= 2
    if framework is TrainFramework.NEMO and not fp8_params:  # NeMo stores FP32 masters with FP8 params
        master = 0 if moments_bf16 else BF16
    if framework in (TrainFramework.TORCHTITAN, TrainFramework.FSDP):
        w_bytes, g_bytes, master = FP32, FP32, 0  # FP32 params are the master weights
    state = master + moments
    weights = grads = opt = 0.0
    for params, dp in ((shards.dense, dims.dp * dims.cp), (shards.expert, dims.expert_dp)):
        # Megatron's distributed optimizer shards over the DP x CP group (both replicate weights).
        w, g, o = w_bytes * params, g_bytes * params, state * params
        if zero_stage >= 1:
            o /= dp
        if zero_stage >= 2:
            g /= dp
        if zero_stage >= 3:
            w /= dp
        weights += w + (fp8_cache * params if zero_stage < 3 else 0.0)
        grads += g
        opt += o
    return ModelStateBytes(weights=weights, grads=grads, optimizer=opt)


def _attention_saved_per_token(model: ModelSpec, tp: int) -> float:
    """Bytes per token the attention block saves inside the TP-split region (Q, K, V and the
    attention output feeding the output projection), with flash attention (no s x s scores)."""
    if model.mla is not None:
        m = model.mla
        heads = model.num_attention_heads / tp
        q = heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        kv_up = heads * (m.qk_nope_head_dim + m.v_head_dim)
        latent = (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim  # replicated inputs of the up-projections
        return BF16 * (q + q + kv_up + heads * m.v_head_dim + latent)  # Q, K (nope+rope), K_nope/V, output
    d = model.kv_channels
    heads = model.num_attention_heads / tp
    kv = max(model.kv_heads / tp, 1)
    return BF16 * (heads * d + 2 * kv * d + heads * d)


def _mlp_saved_per_token(model: ModelSpec, ffn_local: float) -> float:
    # Inputs of the activation function (gate and up for SwiGLU) and its output (down-proj input).
    return BF16 * model.mlp.num_matrices * ffn_local


def layer_activation_bytes(
    model: ModelSpec,
    kind: LayerKind,
    *,
    dims: ParallelDims,
    micro_batch_size: int,
    seq_len: int,
    recompute: Recompute,
    sequence_parallel: bool,
    flash_attention: bool = True,
    dropout: bool = False,
    fp8: bool = False,
    recompute_moe: bool = False,
    cross_entropy: CrossEntropyImpl = CrossEntropyImpl.NATIVE,
    fp4: bool = False,
) -> float:
    """Bytes one micro-batch leaves saved for backward in one layer on one GPU.

    cross_entropy: what the loss keeps for backward per logit: Megatron-Core's unfused and native
    fused losses the FP32 softmax (4 B), Transformer Engine's and xentropy the BF16 logits or the
    gradient written over them (2 B).

    recompute_moe (Megatron --recompute-modules moe): an MoE layer keeps only the MoE block's input
    (already counted with the norm outputs); router, permuted tokens and expert intermediates are
    recomputed.

    Korthikanti's GPT layer (MHA, 4h GeLU MLP, dropout) gives sbh(34 + 5as/h) without parallelism;
    this function reproduces that with `flash_attention=False, dropout=True`.

    fp8: Transformer Engine keeps the input of every FP8 GEMM for its weight gradient in FP8 (1 B,
    the cast it already made) instead of BF16: the QKV and MLP inputs (norm outputs), the attention
    output feeding the output projection, the down-projection input and the routed experts'
    permuted inputs. Norm inputs, Q/K/V and the activation-function inputs stay BF16.

    fp4: the same tensors kept as the NVFP4 columnwise copy the weight-gradient GEMM reads (0.5 + 1/16 B)."""
    saved_gemm_input = 0.5 + 1 / 16 if fp4 else 1 if fp8 else BF16
    tp, s, b = dims.tp, seq_len // dims.cp, micro_batch_size
    tokens = s * b
    h = model.hidden_size
    rep = tp if sequence_parallel else 1  # tensors outside the TP region are split only with SP
    if kind is LayerKind.EMBEDDING:
        return tokens * h * (1 if dropout else 0) / rep
    if kind is LayerKind.OUTPUT:
        # final norm input + output-layer input (2 B each), the loss's saved logits (x vocab / tp)
        loss = FP32 if cross_entropy in (CrossEntropyImpl.UNFUSED, CrossEntropyImpl.NATIVE) else BF16
        return tokens * (2 * BF16 * h / rep + loss * model.vocab_size / tp)
    if recompute is Recompute.FULL:
        return tokens * BF16 * h / rep
    # Outside the TP region: two norm inputs and the inputs of QKV and of the MLP (4 x 2 B x h),
    # plus two 1-byte dropout masks.
    outside = (2 * BF16 + 2 * saved_gemm_input + (2 if dropout else 0)) * h / rep
    inside = _attention_saved_per_token(model, tp)
    if fp8 or fp4:
        # the attention output (input of the output projection) is kept in FP8 (NVFP4)
        _, v_dim = (model.mla.v_head_dim, model.mla.v_head_dim) if model.mla is not None else (0, model.kv_channels)
        inside -= (BF16 - saved_gemm_input) * model.num_attention_heads / tp * v_dim
    if not flash_attention and recompute is Recompute.NONE:
        heads = model.num_attention_heads / tp
        scores = 2 + 2 if dropout else 2  # softmax output (+ dropout output); mask below
        inside += heads * seq_len * (scores + (1 if dropout else 0))
    def mlp(ffn_local: float) -> float:  # the down-projection input is one of the num_matrices saved tensors
        return _mlp_saved_per_token(model, ffn_local) - (BF16 - saved_gemm_input) * ffn_local

    if kind is LayerKind.DENSE:
        inside += mlp(model.ffn_hidden_size / tp)
    elif not recompute_moe:
        assert model.moe is not None
        moe = model.moe
        inside += mlp(moe.shared_expert_ffn_hidden_size / tp)
        inside += FP32 * moe.num_experts  # router logits / probabilities
        # token-expert pairs per token of this rank: top_k x ETP / TP (see compute.layer_gemms), each
        # saving its permuted input (h) and the expert MLP intermediates (1/ETP of the FFN)
        routed = moe.top_k * dims.expert_tp / tp
        inside += routed * (saved_gemm_input * h + mlp(moe.expert_ffn_hidden_size / dims.expert_tp))
    return tokens * (outside + inside)


def in_flight_microbatches(*, rank: int, pp: int, vpp: int, num_microbatches: int, a2a_overlap: bool = False) -> float:
    """Micro-batches (in units of a full rank's layers) whose activations pipeline rank `rank` holds
    at its peak under 1F1B, or interleaved 1F1B with `vpp` chunks (Megatron's warm-up counts).

    Rank 0 of a 1F1B pipeline holds p micro-batches; interleaving multiplies that by 1 + (p-1)/(p*v)
    (Korthikanti sec. 4.2.3). With the EP all-to-all overlap (`a2a_overlap`) the interleaved schedule
    warms up one chunk forward more (Megatron-LM `get_pp_rank_microbatches`); without a pipeline it
    adds nothing, as the paired forward saves a layer where the backward beside it frees one."""
    if vpp == 1:
        return float(min(num_microbatches, pp - rank))
    extra = 1 if a2a_overlap and pp > 1 else 0
    chunks = min(num_microbatches * vpp, (pp - rank - 1) * 2 + (vpp - 1) * pp + 1 + extra)
    return chunks / vpp


def static_bytes(framework: TrainFramework, *, weights: float, grads: float, optimizer: float) -> float:
    """Model-state bytes allocated once, as long-lived tensors, that the caching allocator's
    fragmentation does not touch (`overhead_bytes` charges it on the rest only).

    PyTorch's caching allocator serves a request of 1 MiB or more from the smallest cached free block
    that fits, splitting it, or with a cudaMalloc of its own (rounded up to 2 MiB); the gap between
    reserved and allocated bytes comes from freed blocks that the step's varying sizes cannot reuse.
    A tensor allocated at start-up and never freed has a segment of its own size (waste < 2 MiB) and
    is never split or freed. Megatron-Core keeps the BF16 parameters and the gradients in contiguous
    per-bucket buffers (`_ParamAndGradBuffer`: one `torch.zeros(numel)` each, zeroed in place every
    step), the distributed optimizer's FP32 master shards and Adam moments live all run, and so do
    Transformer Engine's FP8 weight copies (cached on the module); NeMo's Apex DistributedFusedAdam
    keeps contiguous parameter and gradient buffers as well. Under torchtitan (FSDP2) and PyTorch
    FSDP the sharded FP32 parameters and the moments stay, but the optimizer's `zero_grad()` frees
    the gradients (set_to_none, PyTorch's default), which the next backward allocates again,
    interleaved with activations: they count as dynamic. Activations, the recompute working set,
    ZeRO-3's gathered weights, the loss and the communication buffers are dynamic everywhere."""
    if framework in (TrainFramework.TORCHTITAN, TrainFramework.FSDP):
        return weights + optimizer
    return weights + grads + optimizer


def overhead_bytes(gpu: GpuSpec, dynamic_bytes: float) -> float:
    """CUDA context, NCCL and cuBLAS workspaces, plus allocator fragmentation on the dynamic
    allocations: everything allocated but the `static_bytes` model states."""
    eff = gpu.efficiency
    return eff.reserved_memory_gib * GIB + eff.fragmentation * dynamic_bytes


def usable_bytes(gpu: GpuSpec) -> float:
    return gpu.hbm_gib * GIB
