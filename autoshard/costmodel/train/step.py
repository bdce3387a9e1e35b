"""Training step prediction for a full plan: per-stage sums of the layer costs
(`autoshard.costmodel.train.layer`), the pipeline schedule, data-parallel traffic and the optimizer
step, each with its breakdown. The dataclasses are in `autoshard.costmodel.train.types`.

Layers are indexed as the model lists them, embedding first (0) and output last. A stage is a
contiguous run of layers; stage i is model chunk i, hosted by pipeline rank i % pp.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoshard.costmodel.comm import Collective, collective_time_s, group_links, pool_link
from autoshard.costmodel.efficiency import efficiency_source, is_borrowed, training_gpu, training_pool
from autoshard.costmodel.flops import layer_flops, model_flops_per_step
from autoshard.costmodel.fp8 import quantized_peak_tflops
from autoshard.costmodel.train.a2a_overlap import rank_hidden_s
from autoshard.costmodel.train.deferral import apply_deferral
from autoshard.costmodel.train.layer import layer_cost
from autoshard.costmodel.train.memory import (
    BF16,
    FP32,
    TrainFramework,
    layer_param_shards,
    overhead_bytes,
    static_bytes,
)
from autoshard.costmodel.train.memory import in_flight_microbatches as _in_flight
from autoshard.costmodel.train.notes import a2a_overlap_note, host_bound_note, moe_stage, odd_pipeline_note
from autoshard.costmodel.train.notes import small_expert_note
from autoshard.costmodel.train.memory_torchtitan import torchtitan_loss_bytes, torchtitan_loss_hole_bytes
from autoshard.costmodel.train.pipeline import lopsided, schedule_time, simulated_schedule
from autoshard.costmodel.train.types import (
    LayerCost,
    MemoryBreakdown,
    Stage,
    StageCost,
    TimeBreakdown,
    TrainConfig,
    TrainPrediction,
)
from autoshard.parallel import Recompute
from autoshard.specs.cluster import ClusterSpec, GpuSpec, PoolSpec
from autoshard.specs.job import Optimizer, Precision
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = ["stage_cost", "predict_train", "optimizer_bytes_per_param", "optimizer_hbm_bps"]

# Adam step traffic per locally-owned parameter: read FP32 param, grad, m, v (16 B); write FP32
# param, m, v (12 B) and the BF16 copy (2 B).
ADAM_STEP_BYTES = 30.0
# PyTorch FSDP outside Megatron (TrainFramework.FSDP: Composer / llm-foundry) steps with an eager,
# per-tensor AdamW on the FP32 shards (composer/optim/decoupled_weight_decay.py, DecoupledAdamW.adamw,
# 2023): param.mul_ (4 + 4), exp_avg.mul_ (4 + 4) and .add_(grad) (8 + 4), exp_avg_sq.mul_ (4 + 4)
# and .addcmul_(grad, grad) (8 + 4), sqrt (4 + 4), / sqrt(bias correction) (4 + 4), .add_(eps)
# (4 + 4), param.addcdiv_(exp_avg, denom) (12 + 4) = 88 B; gradient clipping by norm (FSDP
# clip_grad_norm_: read every gradient for the norm, then scale them in place, 4 + 8) = 100 B. SGD
# with momentum: param.mul_ (8), buf.mul_(m).add_(grad) (8 + 12), param.add_(buf) (12), clipping 12.
EAGER_ADAM_STEP_BYTES = 100.0
EAGER_SGD_STEP_BYTES = 52.0


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
        weight_cast_s=total("weight_cast_s"),
        layer_overlaps=tuple(c.ep_overlap_s for k, c in zip(kinds, costs, strict=True)
                             if k in (LayerKind.DENSE, LayerKind.MOE) or (k is LayerKind.OUTPUT and c.ep_overlap_s)),
    )


def optimizer_bytes_per_param(optimizer: Optimizer, framework: TrainFramework = TrainFramework.MEGATRON) -> float:
    """HBM bytes of the optimizer step per locally owned parameter: Megatron's fused Adam, or the
    eager per-tensor optimizer of PyTorch FSDP frameworks (EAGER_ADAM_STEP_BYTES)."""
    if framework is TrainFramework.FSDP:
        return EAGER_ADAM_STEP_BYTES if optimizer is Optimizer.ADAM else EAGER_SGD_STEP_BYTES
    return ADAM_STEP_BYTES if optimizer is Optimizer.ADAM else ADAM_STEP_BYTES - 8


def optimizer_hbm_bps(gpu: GpuSpec) -> float:
    """HBM bytes per second the optimizer step streams at: a training-time memory-bound kernel, so
    the training step's `hbm` (EfficiencySpec.train_hbm), the value fit_efficiency.py fits it with;
    the solver's tables price it with this same function."""
    return gpu.hbm_tbps * 1e12 * training_gpu(gpu).efficiency.hbm


def _p2p_s(model: ModelSpec, cfg: TrainConfig, a: PoolSpec, b: PoolSpec, cluster: ClusterSpec) -> float:
    """One activation (or gradient) send across a stage boundary, per micro-batch."""
    tokens = cfg.micro_batch_size * cfg.seq_len // cfg.dims.cp
    size = tokens * model.hidden_size * BF16 / (cfg.dims.tp if cfg.sp else 1)
    same = a is b
    a, b = training_pool(a), training_pool(b)
    link = group_links(a, cfg.dims).pp if same else pool_link(a, b, cluster.pool_link_gbps)
    return collective_time_s(Collective.P2P, size, 2, link)


def _dp_time_s(cfg: TrainConfig, pool: PoolSpec, dense_params: float, expert_params: float) -> float:
    """Data-parallel gradient reduction (+ parameter gather with a sharded optimizer) per step."""
    dims = cfg.dims
    links = group_links(training_pool(pool), dims)
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


def dp_exposed_share(cfg: TrainConfig) -> float:
    """Share of a rank's unhidden DP traffic (traffic beyond one micro-batch's fwd+bwd compute) that
    stays on the critical path. With the interleaved schedule Megatron-Core keeps one DDP (bucket
    group) per model chunk: a chunk's gradients are reduced as soon as its last micro-batch's backward
    is done (`is_last_microbatch_for_model_chunk` in `schedules.py`), while the rank still runs the
    later chunks' backwards, and a chunk's parameters are gathered just before its first forward
    (`param_sync_func`); only the chunk that finishes last (model chunk 0) has nothing after it, so
    about 1/VPP of the excess is exposed. ZeRO-3 gathers every micro-batch (no such split)."""
    vpp = cfg.dims.vpp
    return 1.0 / vpp if vpp > 1 and cfg.overlap_grad_reduce and cfg.zero_stage < 3 else 1.0


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
    loss_phase = hole = 0.0
    if LayerKind.OUTPUT in kinds:
        kw = dict(dims=dims, micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len, compiled=cfg.compiled_loss)
        loss_phase = torchtitan_loss_bytes(model, **kw)
        hole = torchtitan_loss_hole_bytes(model, **kw)  # reserved, not allocated, at the loss peak
    block_w = block_g = 0.0
    # fragmentation spares the sharded FP32 parameters and the moments (allocated once, never freed)
    static = static_bytes(cfg.framework, weights=weights, grads=grads, optimizer=sum(c.optimizer_bytes for c in mine))
    if cfg.zero_stage == 3:
        weights += BF16 * root
        block_w, block_g = 2 * BF16 * largest, (BF16 + FP32) * largest + BF16 * root
    block_act = max(c.working_bytes for c in mine)  # a block's recomputed activations
    base = weights + grads + sum(c.optimizer_bytes for c in mine) + act
    block_total = (base + block_w + block_g + block_act) + overhead_bytes(gpu, base + block_w + block_g + block_act - static)
    loss_total = (base + loss_phase) + overhead_bytes(gpu, base + loss_phase - static) + hole
    if block_total > loss_total:
        weights += block_w
        grads += block_g
        act += block_act
        hole = 0.0
    else:
        act += loss_phase
    allocated = weights + grads + sum(c.optimizer_bytes for c in mine) + act
    # context + NCCL outside the allocator; fragmentation (dynamic bytes) and the loss's hole inside
    over = overhead_bytes(gpu, allocated - static) + hole
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
    chunk_time: list[float] = []
    rank_parts: list[dict[str, float]] = [dict.fromkeys(("compute", "recompute", "tp", "cp", "ep", "pp"), 0.0) for _ in range(pp)]
    for i, (st, c) in enumerate(zip(stages, costs, strict=True)):
        r = i % pp
        p2p = 0.0  # this chunk sends its activations forward and its input gradients backward
        if i + 1 < len(stages):
            p2p += _p2p_s(model, cfg, pools[st.pool], pools[stages[i + 1].pool], cluster)
        if i > 0:
            p2p += _p2p_s(model, cfg, pools[stages[i - 1].pool], pools[st.pool], cluster)
        rank_time[r] += c.time_s + p2p
        chunk_time.append(c.time_s + p2p)
        parts = rank_parts[r]
        parts["compute"] += c.compute_s + c.recompute_s
        parts["recompute"] += c.recompute_s
        parts["tp"] += c.tp_comm_s
        parts["cp"] += c.cp_comm_s
        parts["ep"] += c.ep_comm_s
        parts["pp"] += p2p
    # Megatron's deferred output-layer wgrad: off the last rank's steady state, into the flush
    saved_s, flush_s, deferred_bytes = apply_deferral(model, pools[stages[-1].pool], cfg, rank_time)
    rank_time[-1] -= saved_s
    rank_parts[-1]["compute"] -= saved_s
    # EP all-to-all overlap: the EP traffic a rank's paired forwards and backwards hide, per micro-batch
    steady = list(rank_time)
    if cfg.moe_a2a_overlap:
        for r in range(pp):
            chunks = [costs[i].layer_overlaps for i in range(len(stages)) if i % pp == r]
            steady[r] -= rank_hidden_s(chunks, rank=r, pp=pp, num_microbatches=m) / m
    sched = schedule_time(rank_time, num_microbatches=m, vpp=dims.vpp, steady_times_s=steady)
    if dims.vpp > 1 and not cfg.moe_a2a_overlap:  # the overlap pairs on the closed form (pipeline.RANK_CHUNK_SPREAD)
        decoders = [model.decoders_between(st.start, st.stop) for st in stages]
        if lopsided(decoders, pp=pp, vpp=dims.vpp):
            sched = simulated_schedule(sched, chunk_time, pp=pp, vpp=dims.vpp, num_microbatches=m)

    # After the pipeline drains: exposed DP traffic and the optimizer step, slowest rank. With it the
    # once-per-step work of the fill: Transformer Engine casts the FP8 weights on each chunk's first
    # micro-batch (LayerCost.weight_cast_s), and the schedule's fill runs the chunks' first forwards
    # one after another through all P ranks with no slack to absorb it (an event model of
    # Megatron-Core's schedules reproduces schedule_time's closed form without it), so a rank's casts
    # reach the step P times over: once as its own compute, P - 1 times as fill it waits through.
    tail = []
    for r in range(pp):
        mine = [(stages[i], costs[i]) for i in range(len(stages)) if i % pp == r]
        pool = pools[mine[0][0].pool]
        dense = sum(c.dense_params for _, c in mine)
        expert = sum(c.expert_params for _, c in mine)
        dp_s = _dp_time_s(cfg, pool, dense, expert)
        window = sum(c.fwd_bwd_compute_s for _, c in mine) * (m if cfg.zero_stage == 3 else 1)
        overlap = pool.gpu.efficiency.dp_overlap
        share = dp_exposed_share(cfg)
        exposed = max((1 - overlap) * dp_s, (dp_s - window) * share) if cfg.overlap_grad_reduce else dp_s
        local = dense / (dims.dp * dims.cp if cfg.zero_stage >= 1 else 1) + expert / (
            dims.expert_dp if cfg.zero_stage >= 1 else 1)
        opt_s = local * optimizer_bytes_per_param(cfg.optimizer, cfg.framework) / optimizer_hbm_bps(pool.gpu)
        cast_s = sum(c.weight_cast_s for _, c in mine)
        tail.append((exposed + opt_s + pp * cast_s, exposed, opt_s, cast_s))
    _, dp_exposed, opt_s, cast_s = max(tail)

    b = sched.bottleneck_rank
    parts = rank_parts[b]
    hidden = rank_time[b] - steady[b]  # per micro-batch, on average
    time = TimeBreakdown(
        compute=m * parts["compute"] + cast_s, tp_comm=m * parts["tp"], cp_comm=m * parts["cp"],
        ep_comm=m * (parts["ep"] - hidden), pp_comm=m * parts["pp"], dp_comm_exposed=dp_exposed,
        bubble=sched.bubble_s + flush_s + (pp - 1) * cast_s, optimizer=opt_s, recompute=m * parts["recompute"],
        ep_comm_hidden=m * hidden,
    )
    step = time.total

    # Memory per rank: model states of its chunks, in-flight activations, transient working set.
    rank_mem: list[float] = []
    rank_cap: list[float] = []
    rank_breakdowns: list[MemoryBreakdown] = []
    for r in range(pp):
        mine = [costs[i] for i in range(len(stages)) if i % pp == r]
        gpu = pools[stages[r].pool].gpu
        in_flight = _in_flight(rank=r, pp=pp, vpp=dims.vpp, num_microbatches=m, a2a_overlap=cfg.moe_a2a_overlap)
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
        act += deferred_bytes if r == pp - 1 else 0.0  # deferred wgrad buffers (costmodel.train.deferral)
        static = static_bytes(cfg.framework, weights=w, grads=g, optimizer=o)  # before ZeRO-3's transients
        if cfg.zero_stage == 3:
            # ZeRO-3/FSDP gathers each layer's weights just in time (the current layer and the
            # prefetched next one) and holds that layer's full gradients until they are reduced.
            largest = max(c.largest_layer_params for c in mine)
            w += 2 * BF16 * largest
            g += 4 * largest
        allocated = w + g + o + act
        over = overhead_bytes(gpu, allocated - static)  # fragmentation on the dynamic allocations only
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
        peaks.append((quantized_peak_tflops(gpu, cfg.precision) or gpu.bf16_tflops) * stage_gpus)
    peak = sum(peaks) / num_gpus
    used_gpus = {pools[st.pool].gpu for st in stages}
    quantized = all(quantized_peak_tflops(g, cfg.precision) for g in used_gpus)
    peak_name = f"{cfg.precision.value} dense" if quantized else "bf16 dense"
    notes = tuple(
        f"{g.name}: efficiency {efficiency_source(g)} (too few published runs of this GPU for a fit of its "
        "own: its speed is that fit scaled by datasheet peaks, less certain)"
        for g in sorted(used_gpus, key=lambda g: g.name) if is_borrowed(g)
    )
    if (regime := small_expert_note(model, cfg)) is not None:
        notes += (regime,)
    moe_pools = [pools[st.pool] for st in stages if moe_stage(model, st)]
    if (host := host_bound_note(model, moe_pools, cfg)) is not None:
        notes += (host,)
    if cfg.moe_a2a_overlap:
        notes += (a2a_overlap_note(),)
    if (odd := odd_pipeline_note(cfg, time.bubble, step)) is not None:
        notes += (odd,)
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
        mfu_peak=peak_name,
    )
