"""Training step prediction for a full plan: per-layer costs, per-stage sums, the pipeline schedule,
data-parallel traffic and the optimizer step, each with its breakdown.

Layers are indexed as the model lists them, embedding first (0) and output last. A stage is a
contiguous run of layers; stage i is model chunk i, hosted by pipeline rank i % pp.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from autoshard.costmodel.comm import Collective, collective_time_s, group_links, pool_link
from autoshard.costmodel.compute import layer_compute_time, layer_flops, model_flops_per_step
from autoshard.costmodel.efficiency import efficiency_source, is_borrowed, training_gpu
from autoshard.costmodel.train.memory import (
    BF16,
    FP32,
    TrainFramework,
    layer_activation_bytes,
    layer_param_shards,
    model_state_bytes,
    overhead_bytes,
    torchtitan_layer_activation_bytes,
    torchtitan_loss_bytes,
)
from autoshard.costmodel.train.memory import in_flight_microbatches as _in_flight
from autoshard.costmodel.moe import dispatch_time_s
from autoshard.costmodel.train.pipeline import schedule_time
from autoshard.parallel import Fp8Recipe, MoeDispatcher, ParallelDims, Recompute
from autoshard.specs.cluster import ClusterSpec, GpuSpec, PoolSpec
from autoshard.specs.job import Optimizer, Precision
from autoshard.specs.model import LayerKind, ModelSpec
from autoshard.units import GIB

__all__ = [
    "TrainConfig", "Stage", "LayerCost", "layer_cost", "StageCost", "stage_cost",
    "TimeBreakdown", "MemoryBreakdown", "TrainPrediction", "predict_train", "optimizer_bytes_per_param",
]

# Adam step traffic per locally-owned parameter: read FP32 param, grad, m, v (16 B); write FP32
# param, m, v (12 B) and the BF16 copy (2 B).
ADAM_STEP_BYTES = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """Everything about a training plan except the layer layout."""

    dims: ParallelDims
    micro_batch_size: int
    global_batch_size: int
    seq_len: int
    precision: Precision = Precision.BF16
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = True
    zero_stage: int = 1
    optimizer: Optimizer = Optimizer.ADAM
    overlap_grad_reduce: bool = True
    """Overlap DP gradient reduction (and, with a sharded optimizer, the parameter all-gather) with
    backward/forward compute (Megatron --overlap-grad-reduce / --overlap-param-gather)."""
    tp_comm_overlap: bool = False
    """Overlap TP collectives with GEMMs (Megatron --tp-comm-overlap; needs sequence parallelism)."""
    flash_attention: bool = True
    """Fused attention kernels (every current framework); False models pre-2022 Megatron-LM, which
    stored the s x s attention scores."""
    framework: TrainFramework = TrainFramework.MEGATRON
    """Whose memory behaviour to model (model states, loss, selective recompute, allocator); see
    autoshard.costmodel.train.memory. Step time is modelled the same for every framework."""
    moe_dispatcher: MoeDispatcher = MoeDispatcher.ALLTOALL
    """MoE token dispatcher (Megatron --moe-token-dispatcher-type); ignored for dense models."""
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED
    """FP8 scaling recipe (Megatron --fp8-recipe); ignored unless precision is FP8."""
    recompute_modules: tuple[str, ...] = ()
    """Selective recompute by module (Megatron --recompute-modules; see costmodel.train.recompute);
    () is Megatron's default, the attention core. Ignored unless recompute is selective."""

    grad_reduce_fp32: bool = True
    """FP32 gradient buffer and reduction (Megatron-LM's default for BF16, --accumulate-allreduce-
    grads-in-fp32); False: BF16 gradients (Megatron-Core grad_reduce_in_fp32=False, NeMo's
    performance recipes): half the gradient memory and half the DP reduce-scatter bytes."""
    fp8_param_gather: bool = False
    """Keep the weights in FP8 and all-gather them in FP8 (Megatron --fp8-param-gather; FP8 only)."""

    def __post_init__(self) -> None:
        per_step = self.micro_batch_size * self.dims.dp
        if self.global_batch_size % per_step:
            raise ValueError(
                f"global batch {self.global_batch_size} is not a multiple of micro-batch x DP = "
                f"{self.micro_batch_size} x {self.dims.dp} = {per_step}"
            )
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dims.dp)

    @property
    def sp(self) -> bool:
        """Sequence parallelism is only real with TP > 1 (Megatron turns it off otherwise)."""
        return self.sequence_parallel and self.dims.tp > 1


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One layer on one GPU of `pool`, per micro-batch (times) and in total (memory)."""

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    fwd_bwd_compute_s: float
    """Forward + backward compute, the window DP traffic can hide behind."""
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    """Saved for backward per in-flight micro-batch."""
    full_activation_bytes: float
    """What the layer would save without full recomputation (its working set during recompute)."""
    dense_params: float
    expert_params: float

    @property
    def time_s(self) -> float:
        return self.compute_s + self.recompute_s + self.tp_comm_s + self.cp_comm_s + self.ep_comm_s

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


def layer_cost(model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: TrainConfig, recompute: Recompute) -> LayerCost:
    """Cost of one layer under `cfg`, with `recompute` for this layer (a stage may fully recompute
    only some of its layers). A layer does not depend on the pipeline depth beyond "more than one
    stage" (tied output weights), nor on interleaving, so those are normalized out of the cache key.
    The output layer carries the model's MTP modules (Megatron places them on the last stage)."""
    cost = _module_layer_cost(model, kind, pool, _layer_key(cfg), recompute)
    if kind is LayerKind.OUTPUT and model.mtp_num_layers:
        cost = _with_mtp(cost, model, pool, _layer_key(cfg), recompute)
    return cost


def _module_layer_cost(model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: TrainConfig,
                       recompute: Recompute) -> LayerCost:
    """One layer (without the MTP modules) with Megatron's --recompute-modules applied."""
    cost = _layer_cost(model, kind, pool, cfg, recompute)
    if recompute is Recompute.SELECTIVE and cfg.recompute_modules and kind in (LayerKind.DENSE, LayerKind.MOE):
        cost = _with_modules(cost, model, kind, pool, cfg)
    return cost


@lru_cache(maxsize=4096)
def _with_modules(cost: LayerCost, model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: TrainConfig) -> LayerCost:
    """`cost` (selective recompute of the attention core) with Megatron's --recompute-modules instead."""
    from autoshard.costmodel.train.recompute import module_recompute

    dims = cfg.dims
    r = module_recompute(model, kind, cfg.recompute_modules, gpu=training_gpu(pool.gpu), dims=dims,
                         micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len, sequence_parallel=cfg.sp,
                         precision=cfg.precision)
    tokens = cfg.micro_batch_size * cfg.seq_len // dims.cp
    floor = tokens * BF16 * model.hidden_size / (dims.tp if cfg.sp else 1)  # the layer input stays
    return dataclasses.replace(
        cost,
        recompute_s=max(0.0, cost.recompute_s + r.extra_s),
        ep_comm_s=cost.ep_comm_s * (1 + r.extra_comm_s_fraction),
        activation_bytes=max(floor, cost.activation_bytes - r.saved_bytes),
    )


@lru_cache(maxsize=4096)
def _with_mtp(out: LayerCost, model: ModelSpec, pool: PoolSpec, cfg: TrainConfig, recompute: Recompute) -> LayerCost:
    """The output layer plus `model.mtp_num_layers` MTP modules (DeepSeek-V3 Section 2.2): each runs one
    decoder layer like the model's last (plus a 2h -> h projection, scaled in by parameter count) and
    the shared output head again (logits and loss: compute and activations, no extra weights)."""
    n = model.mtp_num_layers
    kind = model.mtp_layer_kind
    dec = _module_layer_cost(model, kind, pool, cfg, recompute)  # recomputed as the decoder (_recompute_flops)
    scale = model.mtp_module_params() / model.layer_params(kind)
    active = model.mtp_module_params(active_only=True) / model.layer_params(kind, active_only=True)
    return dataclasses.replace(
        out,
        compute_s=out.compute_s + n * (active * dec.compute_s + out.compute_s),
        recompute_s=out.recompute_s + n * (active * dec.recompute_s + out.recompute_s),
        tp_comm_s=out.tp_comm_s + n * (dec.tp_comm_s + out.tp_comm_s),
        cp_comm_s=out.cp_comm_s + n * dec.cp_comm_s,
        ep_comm_s=out.ep_comm_s + n * dec.ep_comm_s,
        fwd_bwd_compute_s=out.fwd_bwd_compute_s + n * (active * dec.fwd_bwd_compute_s + out.fwd_bwd_compute_s),
        weights_bytes=out.weights_bytes + n * scale * dec.weights_bytes,
        grads_bytes=out.grads_bytes + n * scale * dec.grads_bytes,
        optimizer_bytes=out.optimizer_bytes + n * scale * dec.optimizer_bytes,
        activation_bytes=out.activation_bytes + n * (dec.activation_bytes + out.activation_bytes),
        full_activation_bytes=out.full_activation_bytes + n * (dec.full_activation_bytes + out.full_activation_bytes),
        dense_params=out.dense_params + n * (dec.dense_params * scale if not dec.expert_params else dec.dense_params),
        expert_params=out.expert_params + n * dec.expert_params,
    )


@lru_cache(maxsize=65536)
def _layer_key(cfg: TrainConfig) -> TrainConfig:
    dims = cfg.dims
    if dims.vpp == 1 and dims.pp <= 2:
        return cfg
    norm = dataclasses.replace(dims, pp=min(dims.pp, 2), vpp=1)
    per_step = cfg.micro_batch_size * dims.dp
    return dataclasses.replace(cfg, dims=norm, global_batch_size=per_step * cfg.num_microbatches)


@lru_cache(maxsize=65536)
def _layer_cost(model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: TrainConfig, recompute: Recompute) -> LayerCost:
    dims, gpu = cfg.dims, pool.gpu
    ct = layer_compute_time(
        model, kind, gpu=gpu, dims=dims, micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len,
        precision=cfg.precision, recompute=recompute, sequence_parallel=cfg.sp, flash_attention=cfg.flash_attention,
        fp8_recipe=cfg.fp8_recipe, tp_comm_overlap=cfg.tp_comm_overlap,
    )
    links = group_links(pool, dims)
    tokens = cfg.micro_batch_size * cfg.seq_len // dims.cp
    h = model.hidden_size
    is_decoder = kind in (LayerKind.DENSE, LayerKind.MOE)
    fwd_passes = 2 if recompute is Recompute.FULL and is_decoder else 1

    # Tensor parallel: per block (attention, MLP) one all-reduce forward and one backward of the
    # b*s*h activations; with SP an all-gather + reduce-scatter pair of the same total volume.
    tp_s = 0.0
    if dims.tp > 1:
        act = tokens * h * BF16
        if cfg.sp:
            one = collective_time_s(Collective.ALL_GATHER, act, dims.tp, links.tp) + collective_time_s(
                Collective.REDUCE_SCATTER, act, dims.tp, links.tp)
        else:
            one = collective_time_s(Collective.ALL_REDUCE, act, dims.tp, links.tp)
        blocks = {LayerKind.DENSE: 2, LayerKind.MOE: 1, LayerKind.EMBEDDING: 1, LayerKind.OUTPUT: 1}[kind]
        if kind is LayerKind.MOE and model.moe is not None and model.moe.shared_expert_ffn_hidden_size:
            blocks += 1
        tp_s = blocks * one * (fwd_passes + 1)
        if cfg.tp_comm_overlap and cfg.sp:
            tp_s *= 1 - gpu.efficiency.tp_overlap

    # Context parallel: ring exchange of the K/V chunks (forward) and their gradients (backward, 2x),
    # overlapped with the attention computation of the other chunks.
    cp_s = 0.0
    if dims.cp > 1 and is_decoder:
        kv_bytes = 2 * tokens * model.kv_heads * model.kv_channels * BF16 / min(dims.tp, model.kv_heads)
        if model.mla is not None:
            kv_bytes = 2 * tokens * model.num_attention_heads * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim) * BF16 / dims.tp
        ring = (dims.cp - 1) * collective_time_s(Collective.P2P, kv_bytes, 2, links.cp)
        attn_window = 0.25 * ct.forward_s  # the attention core is roughly a quarter of a layer at long context
        cp_s = max(0.0, ring - attn_window) * fwd_passes + max(0.0, 2 * ring - 2.5 * attn_window)

    # Expert parallel: token dispatch and combine per MoE layer, forward (and recompute) and backward,
    # priced per dispatcher on the links it crosses (autoshard.costmodel.moe).
    ep_s = 0.0
    if kind is LayerKind.MOE and model.moe is not None:
        local_tokens = tokens / dims.tp if cfg.sp else tokens
        one = dispatch_time_s(
            cfg.moe_dispatcher, tokens=local_tokens, hidden=h, top_k=model.moe.top_k, num_experts=model.moe.num_experts,
            ep=dims.ep, etp=dims.expert_tp, pool=pool,
        )
        ep_s = (fwd_passes + 1) * one

    shards = layer_param_shards(model, kind, dims)
    states = model_state_bytes(
        shards, dims=dims, zero_stage=cfg.zero_stage, optimizer=cfg.optimizer, framework=cfg.framework,
        grad_fp32=cfg.grad_reduce_fp32, fp8_params=cfg.fp8_param_gather and cfg.precision is Precision.FP8)
    act_kwargs = dict(
        dims=dims, micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len, sequence_parallel=cfg.sp,
        flash_attention=cfg.flash_attention, fp8=cfg.precision is Precision.FP8 and gpu.fp8_tflops is not None,
    )
    if cfg.framework is TrainFramework.TORCHTITAN:
        tt_kwargs = dict(dims=dims, micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len, sequence_parallel=cfg.sp)
        act = torchtitan_layer_activation_bytes(model, kind, recompute=recompute, **tt_kwargs)
        full_act = act
        if is_decoder and recompute is not Recompute.NONE:
            # Working set while the block is recomputed: what it would save without checkpointing.
            full_act = max(act, layer_activation_bytes(model, kind, recompute=Recompute.NONE, **act_kwargs))
    else:
        act = layer_activation_bytes(model, kind, recompute=recompute, **act_kwargs)
        full_act = act
        if recompute is Recompute.FULL:
            full_act = layer_activation_bytes(model, kind, recompute=Recompute.NONE, **act_kwargs)
    return LayerCost(
        compute_s=ct.forward_s + ct.backward_s,
        recompute_s=ct.recompute_s,
        tp_comm_s=tp_s,
        cp_comm_s=cp_s,
        ep_comm_s=ep_s,
        fwd_bwd_compute_s=ct.forward_s + ct.backward_s,
        weights_bytes=states.weights,
        grads_bytes=states.grads,
        optimizer_bytes=states.optimizer,
        activation_bytes=act,
        full_activation_bytes=full_act,
        dense_params=shards.dense,
        expert_params=shards.expert,
    )


@dataclass(frozen=True, slots=True)
class Stage:
    """One model chunk: layers [start, stop) of the model, on `pool`, with the first
    `full_recompute_layers` decoder layers fully recomputed (Megatron's block method)."""

    start: int
    stop: int
    pool: int = 0
    full_recompute_layers: int = 0


@dataclass(frozen=True, slots=True)
class StageCost:
    time_s: float
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    fwd_bwd_compute_s: float
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    """Per in-flight micro-batch."""
    working_bytes: float
    """Transient: the largest layer's full activations while it is recomputed."""
    dense_params: float
    expert_params: float
    largest_layer_params: float
    """Per-GPU parameters of the stage's largest layer (what ZeRO-3 gathers at once)."""


def stage_cost(model: ModelSpec, stage: Stage, pool: PoolSpec, cfg: TrainConfig) -> StageCost:
    kinds = model.layer_kinds[stage.start:stage.stop]
    costs: list[LayerCost] = []
    left = stage.full_recompute_layers
    for kind in kinds:
        mode = cfg.recompute
        if kind in (LayerKind.DENSE, LayerKind.MOE) and left > 0:
            mode, left = Recompute.FULL, left - 1
        costs.append(layer_cost(model, kind, pool, cfg, mode))
    working = max((c.full_activation_bytes - c.activation_bytes for c in costs), default=0.0)

    def total(attr: str) -> float:
        return sum(getattr(c, attr) for c in costs)

    return StageCost(
        time_s=total("time_s"), compute_s=total("compute_s"), recompute_s=total("recompute_s"),
        tp_comm_s=total("tp_comm_s"), cp_comm_s=total("cp_comm_s"), ep_comm_s=total("ep_comm_s"),
        fwd_bwd_compute_s=total("fwd_bwd_compute_s"), weights_bytes=total("weights_bytes"),
        grads_bytes=total("grads_bytes"), optimizer_bytes=total("optimizer_bytes"),
        activation_bytes=total("activation_bytes"), working_bytes=working,
        dense_params=total("dense_params"), expert_params=total("expert_params"),
        largest_layer_params=max(c.dense_params + c.expert_params for c in costs),
    )


def optimizer_bytes_per_param(optimizer: Optimizer) -> float:
    return ADAM_STEP_BYTES if optimizer is Optimizer.ADAM else ADAM_STEP_BYTES - 8


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    compute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    pp_comm: float
    dp_comm_exposed: float
    bubble: float
    optimizer: float
    recompute: float = 0.0
    """Part of `compute` spent recomputing activations (informational, already in compute)."""

    @property
    def total(self) -> float:
        return (self.compute + self.tp_comm + self.cp_comm + self.ep_comm + self.pp_comm
                + self.dp_comm_exposed + self.bubble + self.optimizer)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on the most loaded GPU."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    kv_cache: float
    overhead: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.kv_cache + self.overhead


@dataclass(frozen=True, slots=True)
class TrainPrediction:
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    hw_tflops_per_gpu: float
    mfu: float
    time: TimeBreakdown
    memory: MemoryBreakdown
    peak_memory_bytes: float
    capacity_bytes: float
    rank_memory_bytes: tuple[float, ...]
    rank_capacity_bytes: tuple[float, ...]
    rank_time_s: tuple[float, ...]
    num_gpus: int
    notes: tuple[str, ...] = field(default=())
    mfu_peak: str = "bf16 dense"
    """The peak MFU is measured against: "bf16 dense" or "fp8 dense" (no sparsity)."""

    @property
    def fits(self) -> bool:
        return all(m <= c for m, c in zip(self.rank_memory_bytes, self.rank_capacity_bytes, strict=True))


def _p2p_s(model: ModelSpec, cfg: TrainConfig, a: PoolSpec, b: PoolSpec, cluster: ClusterSpec) -> float:
    """One activation (or gradient) send across a stage boundary, per micro-batch."""
    tokens = cfg.micro_batch_size * cfg.seq_len // cfg.dims.cp
    size = tokens * model.hidden_size * BF16 / (cfg.dims.tp if cfg.sp else 1)
    link = group_links(a, cfg.dims).pp if a is b else pool_link(a, b, cluster.pool_link_gbps)
    return collective_time_s(Collective.P2P, size, 2, link)


def _dp_time_s(cfg: TrainConfig, pool: PoolSpec, dense_params: float, expert_params: float) -> float:
    """Data-parallel gradient reduction (+ parameter gather with a sharded optimizer) per step."""
    dims = cfg.dims
    links = group_links(pool, dims)
    t = 0.0
    for params, ranks, link in ((dense_params, dims.dp * dims.cp, links.dp), (expert_params, dims.expert_dp, links.edp)):
        if ranks <= 1 or params <= 0:
            continue
        # FP32 gradient reduction (Megatron-LM's default for BF16) or BF16 (grad_reduce_in_fp32=False)
        grads = params * (4 if cfg.grad_reduce_fp32 else BF16)
        # parameter all-gather in BF16, or in FP8 with --fp8-param-gather
        param_bytes = 1 if (cfg.fp8_param_gather and cfg.precision is Precision.FP8) else BF16
        if cfg.zero_stage == 0:
            t += collective_time_s(Collective.ALL_REDUCE, grads, ranks, link)
        else:
            t += collective_time_s(Collective.REDUCE_SCATTER, grads, ranks, link)
            gathers = 1 if cfg.zero_stage < 3 else 2 * cfg.num_microbatches
            t += gathers * collective_time_s(Collective.ALL_GATHER, params * param_bytes, ranks, link)
    return t


def _recompute_flops(model: ModelSpec, cfg: TrainConfig, stages: Sequence[Stage]) -> float:
    """Forward FLOPs re-executed per step: whole decoder layers under full recompute, the attention
    core under selective recompute."""
    tokens = cfg.global_batch_size * cfg.seq_len
    total = 0.0
    for st in stages:
        left = st.full_recompute_layers
        for kind in model.layer_kinds[st.start:st.stop]:
            if kind not in (LayerKind.DENSE, LayerKind.MOE):
                continue
            f = layer_flops(model, kind, tokens=tokens, seq_len=cfg.seq_len)
            if cfg.recompute is Recompute.FULL or left > 0:
                total += f.total
            elif cfg.recompute is Recompute.SELECTIVE:
                total += _selective_flops(model, kind, cfg, tokens, f.attention)
            left -= 1
    if model.mtp_num_layers and cfg.recompute is not Recompute.NONE:
        # the MTP modules' decoder layer follows the base mode (costmodel: _with_mtp)
        kind = model.mtp_layer_kind
        f = layer_flops(model, kind, tokens=tokens, seq_len=cfg.seq_len)
        one = f.total if cfg.recompute is Recompute.FULL else _selective_flops(model, kind, cfg, tokens, f.attention)
        total += model.mtp_num_layers * one
    return total


def _selective_flops(model: ModelSpec, kind: LayerKind, cfg: TrainConfig, tokens: int, attention: float) -> float:
    if not cfg.recompute_modules:
        return attention
    from autoshard.costmodel.train.recompute import module_recompute_flops

    return module_recompute_flops(model, kind, cfg.recompute_modules, tokens=tokens, seq_len=cfg.seq_len)


def _torchtitan_rank_memory(
    model: ModelSpec, cfg: TrainConfig, stages: Sequence[Stage], rank: int, mine: Sequence[StageCost],
    in_flight: float, weights: float, grads: float, gpu: GpuSpec,
) -> tuple[float, float, float, float]:
    """torchtitan's peak on one pipeline rank: weights, grads, activations and overhead bytes.

    Persistent: sharded states, the saved activations and, under FSDP (ZeRO-3), the root group's
    unsharded BF16 weights (embedding, final norm, output projection: not resharded after forward).
    On top, the larger of two transients that never coexist: the loss in backward (the output
    layer's working set), or a block's backward (current + prefetched gathered BF16 weights, its
    unsharded BF16 gradients and their FP32 reduce-scatter copy, the root's unsharded BF16 gradients
    held until the end of backward, and the block's recomputed activations)."""
    dims = cfg.dims
    act = in_flight * sum(c.activation_bytes for c in mine)
    kinds = [k for i, st in enumerate(stages) if i % dims.pp == rank for k in model.layer_kinds[st.start:st.stop]]
    decoder = [layer_param_shards(model, k, dims).total for k in kinds if k in (LayerKind.DENSE, LayerKind.MOE)]
    root = sum(layer_param_shards(model, k, dims).total for k in kinds if k in (LayerKind.EMBEDDING, LayerKind.OUTPUT))
    largest = max(decoder, default=0.0)
    loss_phase = 0.0
    if LayerKind.OUTPUT in kinds:
        loss_phase = torchtitan_loss_bytes(model, dims=dims, micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len)
    block_w = block_g = 0.0
    if cfg.zero_stage == 3:
        weights += BF16 * root
        block_w, block_g = 2 * BF16 * largest, (BF16 + FP32) * largest + BF16 * root
    block_act = max(c.working_bytes for c in mine)  # a block's recomputed activations
    if block_w + block_g + block_act > loss_phase:
        weights += block_w
        grads += block_g
        act += block_act
    else:
        act += loss_phase
    allocated = weights + grads + sum(c.optimizer_bytes for c in mine) + act
    over = overhead_bytes(gpu, allocated)  # context + NCCL outside the allocator, fragmentation inside
    return weights, grads, act, over


def predict_train(model: ModelSpec, cluster: ClusterSpec, cfg: TrainConfig, stages: Sequence[Stage]) -> TrainPrediction:
    """Predict a training step. `stages` lists pp x vpp chunks in order."""
    dims = cfg.dims
    if len(stages) != dims.num_stages:
        raise ValueError(f"{len(stages)} stages given for PP {dims.pp} x VPP {dims.vpp}")
    pools = cluster.pools
    costs = [stage_cost(model, st, pools[st.pool], cfg) for st in stages]
    m = cfg.num_microbatches

    # Per pipeline rank: sum its chunks, plus the p2p of each chunk boundary it sends across.
    pp = dims.pp
    rank_time = [0.0] * pp
    rank_parts: list[dict[str, float]] = [dict.fromkeys(("compute", "recompute", "tp", "cp", "ep", "pp"), 0.0) for _ in range(pp)]
    for i, (st, c) in enumerate(zip(stages, costs, strict=True)):
        r = i % pp
        p2p = 0.0  # this chunk sends its activations forward and its input gradients backward
        if i + 1 < len(stages):
            p2p += _p2p_s(model, cfg, pools[st.pool], pools[stages[i + 1].pool], cluster)
        if i > 0:
            p2p += _p2p_s(model, cfg, pools[stages[i - 1].pool], pools[st.pool], cluster)
        rank_time[r] += c.time_s + p2p
        parts = rank_parts[r]
        parts["compute"] += c.compute_s + c.recompute_s
        parts["recompute"] += c.recompute_s
        parts["tp"] += c.tp_comm_s
        parts["cp"] += c.cp_comm_s
        parts["ep"] += c.ep_comm_s
        parts["pp"] += p2p
    sched = schedule_time(rank_time, num_microbatches=m, vpp=dims.vpp)

    # After the pipeline drains: exposed DP traffic and the optimizer step, slowest rank.
    tail = []
    for r in range(pp):
        mine = [(stages[i], costs[i]) for i in range(len(stages)) if i % pp == r]
        pool = pools[mine[0][0].pool]
        dense = sum(c.dense_params for _, c in mine)
        expert = sum(c.expert_params for _, c in mine)
        dp_s = _dp_time_s(cfg, pool, dense, expert)
        window = sum(c.fwd_bwd_compute_s for _, c in mine) * (m if cfg.zero_stage == 3 else 1)
        overlap = pool.gpu.efficiency.dp_overlap
        exposed = max((1 - overlap) * dp_s, dp_s - window) if cfg.overlap_grad_reduce else dp_s
        local = dense / (dims.dp * dims.cp if cfg.zero_stage >= 1 else 1) + expert / (
            dims.expert_dp if cfg.zero_stage >= 1 else 1)
        opt_s = local * optimizer_bytes_per_param(cfg.optimizer) / (pool.gpu.hbm_tbps * 1e12 * pool.gpu.efficiency.hbm)
        tail.append((exposed + opt_s, exposed, opt_s))
    _, dp_exposed, opt_s = max(tail)

    b = sched.bottleneck_rank
    parts = rank_parts[b]
    time = TimeBreakdown(
        compute=m * parts["compute"], tp_comm=m * parts["tp"], cp_comm=m * parts["cp"], ep_comm=m * parts["ep"],
        pp_comm=m * parts["pp"], dp_comm_exposed=dp_exposed, bubble=sched.bubble_s, optimizer=opt_s,
        recompute=m * parts["recompute"],
    )
    step = time.total

    # Memory per rank: model states of its chunks, in-flight activations, transient working set.
    rank_mem: list[float] = []
    rank_cap: list[float] = []
    rank_breakdowns: list[MemoryBreakdown] = []
    for r in range(pp):
        mine = [costs[i] for i in range(len(stages)) if i % pp == r]
        gpu = pools[stages[r].pool].gpu
        in_flight = _in_flight(rank=r, pp=pp, vpp=dims.vpp, num_microbatches=m)
        w = sum(c.weights_bytes for c in mine)
        g = sum(c.grads_bytes for c in mine)
        o = sum(c.optimizer_bytes for c in mine)
        if cfg.framework is TrainFramework.TORCHTITAN:
            w, g, act, over = _torchtitan_rank_memory(model, cfg, stages, r, mine, in_flight, w, g, gpu)
            bd = MemoryBreakdown(weights=w, grads=g, optimizer=o, activations=act, kv_cache=0.0, overhead=over)
            rank_breakdowns.append(bd)
            rank_mem.append(bd.total)
            rank_cap.append(gpu.hbm_gib * GIB)
            continue
        act = in_flight * sum(c.activation_bytes for c in mine) + max(c.working_bytes for c in mine)
        if cfg.zero_stage == 3:
            # ZeRO-3/FSDP gathers each layer's weights just in time (the current layer and the
            # prefetched next one) and holds that layer's full gradients until they are reduced.
            largest = max(c.largest_layer_params for c in mine)
            w += 2 * BF16 * largest
            g += 4 * largest
        allocated = w + g + o + act
        over = overhead_bytes(gpu, allocated)
        bd = MemoryBreakdown(weights=w, grads=g, optimizer=o, activations=act, kv_cache=0.0, overhead=over)
        rank_breakdowns.append(bd)
        rank_mem.append(bd.total)
        rank_cap.append(gpu.hbm_gib * GIB)
    worst = max(range(pp), key=lambda r: rank_mem[r] / rank_cap[r])

    num_gpus = dims.world_size
    tokens = cfg.global_batch_size * cfg.seq_len
    model_flops = model_flops_per_step(model, seq_len=cfg.seq_len, global_batch_size=cfg.global_batch_size)
    hw_flops = model_flops + _recompute_flops(model, cfg, stages)
    tflops = model_flops / step / num_gpus / 1e12
    # MFU against the dense peak of the GPUs the plan uses (each pipeline rank's pool), averaged
    stage_gpus = dims.tp * dims.cp * dims.dp
    peaks = []
    for r in range(pp):
        gpu = pools[stages[r].pool].gpu
        fp8 = cfg.precision is Precision.FP8 and gpu.fp8_tflops
        peaks.append((gpu.fp8_tflops if fp8 else gpu.bf16_tflops) * stage_gpus)
    peak = sum(peaks) / num_gpus
    used_gpus = {pools[st.pool].gpu for st in stages}
    fp8_peak = cfg.precision is Precision.FP8 and all(g.fp8_tflops for g in used_gpus)
    notes = tuple(
        f"{g.name}: efficiency {efficiency_source(g)} (no published run of this GPU: its speed is that fit "
        "scaled by datasheet peaks, less certain)"
        for g in sorted(used_gpus, key=lambda g: g.name) if is_borrowed(g)
    )
    return TrainPrediction(
        step_time_s=step,
        tokens_per_s=tokens / step,
        tokens_per_s_per_gpu=tokens / step / num_gpus,
        tflops_per_gpu=tflops,
        hw_tflops_per_gpu=hw_flops / step / num_gpus / 1e12,
        mfu=tflops / peak,
        time=time,
        memory=rank_breakdowns[worst],
        peak_memory_bytes=rank_mem[worst],
        capacity_bytes=rank_cap[worst],
        rank_memory_bytes=tuple(rank_mem),
        rank_capacity_bytes=tuple(rank_cap),
        rank_time_s=tuple(rank_time),
        num_gpus=num_gpus,
        notes=notes,
        mfu_peak="fp8 dense" if fp8_peak else "bf16 dense",
    )
