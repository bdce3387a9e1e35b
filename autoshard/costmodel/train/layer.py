"""Cost of one layer on one GPU under a training plan, per micro-batch: forward, backward and
recomputed compute, the TP, CP and EP communication it pays, and its model states and saved
activations. Megatron's --recompute-modules and the MTP modules (carried by the output layer) are
applied on top. Cached: the search prices the same layer many times.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from autoshard.costmodel.attention import FLASH_BACKWARD_FACTOR
from autoshard.costmodel.comm import Collective, collective_time_s, group_links
from autoshard.costmodel.compute import layer_compute_time
from autoshard.costmodel.efficiency import training_gpu, training_pool
from autoshard.costmodel.fp8 import NVFP4_CAST_BYTES, NVFP4_WEIGHT_CACHE_BYTES, fp8_recipe_gpu, fp8_weight_cast_bytes_per_param
from autoshard.costmodel.moe import GroupLimit, dispatch_time_s
from autoshard.costmodel.train.a2a_overlap import MoeLayerParts, paired_saving_s, routed_expert_s, sm_count
from autoshard.costmodel.train.memory import (
    BF16,
    TrainFramework,
    fp8_weight_cache_bytes,
    layer_activation_bytes,
    layer_param_shards,
    model_state_bytes,
)
from autoshard.costmodel.train.memory_torchtitan import torchtitan_layer_activation_bytes
from autoshard.costmodel.train.types import LayerCost, TrainConfig
from autoshard.parallel import Recompute
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.job import Precision
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = ["fp8_weight_cast_s", "layer_cost"]


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
    """One layer (without the MTP modules) with Megatron's --recompute-modules applied, no faster than
    the host issues its routed experts (_with_host_floor)."""
    cost = _gpu_layer_cost(model, kind, pool, cfg, recompute)
    if kind is LayerKind.MOE:
        cost = _with_host_floor(cost, model, kind, pool, cfg, recompute)
    return cost


def _gpu_layer_cost(model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: TrainConfig,
                    recompute: Recompute) -> LayerCost:
    """One layer with Megatron's --recompute-modules applied, as the GPU runs it (no host floor)."""
    cost = _layer_cost(model, kind, pool, cfg, recompute)
    if recompute is Recompute.SELECTIVE and cfg.recompute_modules and kind in (LayerKind.DENSE, LayerKind.MOE):
        cost = _with_modules(cost, model, kind, pool, cfg)
    return cost


def _gpu_scaled(cost: LayerCost, factor: float) -> LayerCost:
    """`cost` with the GPU's work (compute, recompute, the DP window) `factor` times as long: an MTP module's
    decoder layer at its active-parameter ratio (_with_mtp); the traffic stays."""
    if factor == 1.0:
        return cost
    return dataclasses.replace(cost, compute_s=factor * cost.compute_s, recompute_s=factor * cost.recompute_s,
                               fwd_bwd_compute_s=factor * cost.fwd_bwd_compute_s)


@lru_cache(maxsize=4096)
def _with_host_floor(cost: LayerCost, model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: TrainConfig,
                     recompute: Recompute, gpu_scale: float = 1.0) -> LayerCost:
    """`cost` waiting on the host where issuing the routed experts takes longer than the GPU's work on
    the layer (expert_host_s; any recompute of its forward adds a third of the host time): the layer
    lasts max(GPU, host), what the GPU lacks booked as idle compute. With the EP all-to-all overlap
    (ep_overlap_s, which the step takes off a paired micro-batch) the paired layer lasts max(GPU - hidden,
    host): a host-bound layer has no traffic left to hide. The window that hides DP traffic
    (fwd_bwd_compute_s) takes the wait of the layer without recompute, whatever this layer's recompute:
    the forward and backward it stands for are the same, and the solver's tables read one window per
    layer kind (search.train.tables). `gpu_scale`: the layer's compute is the decoder's times it (an MTP
    module, _with_mtp), and so is that of the layer without recompute the window reads."""
    host = expert_host_s(model, kind, pool, cfg)
    if host == 0.0:
        return cost
    cpu = _host_runs(host, cfg, recompute)
    wait = max(0.0, cpu - cost.time_s)
    if wait == 0.0 and cost.ep_overlap_s == 0.0:
        return cost
    paired = max(cost.time_s - cost.ep_overlap_s, cpu)
    if recompute is Recompute.NONE:
        plain_s = cost.time_s
    else:
        plain_s = _gpu_scaled(_layer_cost(model, kind, pool, cfg, Recompute.NONE), gpu_scale).time_s
    return dataclasses.replace(cost, compute_s=cost.compute_s + wait,
                               fwd_bwd_compute_s=cost.fwd_bwd_compute_s + max(0.0, host - plain_s),
                               ep_overlap_s=cost.time_s + wait - paired)


@lru_cache(maxsize=4096)
def _with_modules(cost: LayerCost, model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: TrainConfig) -> LayerCost:
    """`cost` (selective recompute of the attention core) with Megatron's --recompute-modules instead."""
    from autoshard.costmodel.train.recompute import module_recompute

    dims = cfg.dims
    gpu = fp8_recipe_gpu(training_gpu(pool.gpu), cfg.precision, cfg.fp8_recipe)
    r = module_recompute(model, kind, cfg.recompute_modules, gpu=gpu, dims=dims,
                         micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len, sequence_parallel=cfg.sp,
                         precision=cfg.precision, fp8_attention=cfg.fp8_attention)
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
    the shared output head again (logits and loss: compute and activations, no extra weights). The GPU's work
    scales with the active parameters; the host's time to issue the routed experts does not (the same local
    experts): the floor (_with_host_floor) applies to the scaled layer."""
    n = model.mtp_num_layers
    kind = model.mtp_layer_kind
    scale = model.mtp_module_params() / model.layer_params(kind)
    active = model.mtp_module_params(active_only=True) / model.layer_params(kind, active_only=True)
    # recomputed as the decoder (_recompute_flops)
    dec = _gpu_scaled(_gpu_layer_cost(model, kind, pool, cfg, recompute), active)
    if kind is LayerKind.MOE:
        dec = _with_host_floor(dec, model, kind, pool, cfg, recompute, active)
    return dataclasses.replace(
        out,
        compute_s=out.compute_s + n * (dec.compute_s + out.compute_s),
        recompute_s=out.recompute_s + n * (dec.recompute_s + out.recompute_s),
        tp_comm_s=out.tp_comm_s + n * (dec.tp_comm_s + out.tp_comm_s),
        cp_comm_s=out.cp_comm_s + n * dec.cp_comm_s,
        ep_comm_s=out.ep_comm_s + n * dec.ep_comm_s,
        fwd_bwd_compute_s=out.fwd_bwd_compute_s + n * (dec.fwd_bwd_compute_s + out.fwd_bwd_compute_s),
        weights_bytes=out.weights_bytes + n * scale * dec.weights_bytes,
        grads_bytes=out.grads_bytes + n * scale * dec.grads_bytes,
        optimizer_bytes=out.optimizer_bytes + n * scale * dec.optimizer_bytes,
        activation_bytes=out.activation_bytes + n * (dec.activation_bytes + out.activation_bytes),
        full_activation_bytes=out.full_activation_bytes + n * (dec.full_activation_bytes + out.full_activation_bytes),
        dense_params=out.dense_params + n * (dec.dense_params * scale if not dec.expert_params else dec.dense_params),
        expert_params=out.expert_params + n * dec.expert_params,
        weight_cast_s=out.weight_cast_s + n * scale * dec.weight_cast_s,
        ep_overlap_s=out.ep_overlap_s + n * dec.ep_overlap_s,
    )


def fp8_weight_cast_s(kind: LayerKind, params: float, pool: PoolSpec, cfg: TrainConfig) -> float:
    """Seconds of Transformer Engine's once-per-step FP8 (or NVFP4) cast of a decoder layer's GEMM weights
    (`params` per GPU) into the copies it caches for the step (fp8_weight_cache_bytes; NVFP4: from the
    BF16 weights, an amax pass, the cast's read and both layouts written, fp8.NVFP4_CAST_BYTES), on its
    chunk's first micro-batch: an HBM-bound kernel at the training step's `hbm` knob. Megatron-Core and
    NeMo only (the frameworks that cache the cast across micro-batches); 0 for BF16 plans."""
    if kind not in (LayerKind.DENSE, LayerKind.MOE) or not cfg.precision.quantized or cfg.framework not in (
            TrainFramework.MEGATRON, TrainFramework.NEMO):
        return 0.0
    gpu = pool.gpu
    if cfg.precision is Precision.FP4:
        per = NVFP4_CAST_BYTES if gpu.fp4_tflops else 0.0
    else:
        cached = fp8_weight_cache_bytes(gpu, cfg.fp8_recipe, fp8_params=cfg.fp8_param_gather)
        per = fp8_weight_cast_bytes_per_param(gpu, cfg.fp8_recipe, fp8_params=cfg.fp8_param_gather, cached=cached)
    return params * per / (gpu.hbm_tbps * 1e12 * training_gpu(gpu).efficiency.hbm)


def host_wait(model: ModelSpec, pool: PoolSpec, cfg: TrainConfig) -> tuple[float, float]:
    """(host seconds, GPU seconds) of one MoE layer's forward and backward for one micro-batch under
    `cfg`'s recompute, before _with_host_floor: the layer waits on the host when the first is larger.
    (0, 0) for a model without MoE layers."""
    if model.moe is None or LayerKind.MOE not in model.layer_kinds:
        return 0.0, 0.0
    key, recompute = _layer_key(cfg), cfg.recompute
    cost = _gpu_layer_cost(model, LayerKind.MOE, pool, key, recompute)
    return _host_runs(expert_host_s(model, LayerKind.MOE, pool, key), key, recompute), cost.time_s


def _host_runs(host: float, cfg: TrainConfig, recompute: Recompute) -> float:
    """`host` (one forward and backward) with a third more for each forward run again: a full recompute,
    or Megatron's MoE module recompute."""
    forwards = (2 if recompute is Recompute.FULL else 1) + (
        recompute is Recompute.SELECTIVE and "moe" in cfg.recompute_modules)
    return host * (forwards + 2) / 3


def expert_host_s(model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: TrainConfig) -> float:
    """Host seconds to issue one MoE layer's forward and backward for one micro-batch: the local routed
    experts (num_experts / EP) times EfficiencySpec.expert_host_us of the training knobs. Transformer
    Engine's GroupedLinear quantizes, splits and launches per expert (forward: fc1 and fc2; backward:
    their dgrad and wgrad, the gradient hooks), and Megatron-Core's dropless MoE syncs each layer's
    per-expert token counts to the host before its routed experts run (tokens_per_expert .cpu(), or the
    count DeepEP/HybridEP return on the host), so the host cannot run ahead across layers: a layer whose
    GPU work is shorter than this waits for the host (_with_host_floor). "The biggest performance issue"
    of the MXFP8 DeepSeek-V3 baseline on GB200, which partial CUDA graphs (attention, router, preprocess)
    cut down to the routed experts (Megatron-LM docs/discussions/deepseek-v3-gb200-optimization, eb0783b6d3,
    sections 1 and 2.3). Megatron-Core and NeMo; 0 for dense layers, torchtitan and full-iteration CUDA
    graphs (TrainConfig.full_cuda_graph). A third forward, two thirds backward."""
    if kind is not LayerKind.MOE or model.moe is None or cfg.full_cuda_graph or cfg.framework not in (
            TrainFramework.MEGATRON, TrainFramework.NEMO):
        return 0.0
    return training_gpu(pool.gpu).efficiency.expert_host_us * 1e-6 * local_experts(model, cfg)


def local_experts(model: ModelSpec, cfg: TrainConfig) -> int:
    """Routed experts each rank holds: num_experts / EP (parallel.check_dims refuses an EP that does not
    divide them)."""
    return model.moe.num_experts // cfg.dims.ep


@lru_cache(maxsize=65536)
def _layer_key(cfg: TrainConfig) -> TrainConfig:
    dims = cfg.dims
    if dims.vpp == 1 and dims.pp <= 2:
        return cfg
    norm = dataclasses.replace(dims, pp=min(dims.pp, 2), vpp=1)
    per_step = cfg.micro_batch_size * dims.dp
    return dataclasses.replace(cfg, dims=norm, global_batch_size=per_step * cfg.num_microbatches)


def _main_grad_bytes(cfg: TrainConfig) -> int | None:
    """Megatron-Core and NeMo accumulate weight gradients into the main-gradient buffer inside the
    wgrad GEMM (FP32 with --accumulate-allreduce-grads-in-fp32, Megatron's default for BF16; else
    the BF16 reduce dtype); PyTorch FSDP and torchtitan write a fresh BF16 gradient."""
    if cfg.framework in (TrainFramework.MEGATRON, TrainFramework.NEMO):
        return 4 if cfg.grad_reduce_fp32 else 2
    return None


@lru_cache(maxsize=65536)
def _layer_cost(model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: TrainConfig, recompute: Recompute) -> LayerCost:
    pool = training_pool(pool)  # the training knobs, the collectives' included
    dims, gpu = cfg.dims, pool.gpu
    ct = layer_compute_time(
        model, kind, gpu=gpu, dims=dims, micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len,
        precision=cfg.precision, recompute=recompute, sequence_parallel=cfg.sp, flash_attention=cfg.flash_attention,
        fp8_recipe=cfg.fp8_recipe, tp_comm_overlap=cfg.tp_comm_overlap, cross_entropy=cfg.cross_entropy,
        main_grad_bytes=_main_grad_bytes(cfg), fp8_attention=cfg.fp8_attention,
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
        cp_s = max(0.0, ring - attn_window) * fwd_passes + max(0.0, 2 * ring - FLASH_BACKWARD_FACTOR * attn_window)

    # Expert parallel: token dispatch and combine per MoE layer, forward (and recompute) and backward,
    # priced per dispatcher on the links it crosses (autoshard.costmodel.moe).
    ep_s = 0.0
    if kind is LayerKind.MOE and model.moe is not None:
        local_tokens = tokens / dims.tp if cfg.sp else tokens
        one = dispatch_time_s(
            cfg.moe_dispatcher, tokens=local_tokens, hidden=h, top_k=model.moe.top_k, num_experts=model.moe.num_experts,
            ep=dims.ep, etp=dims.expert_tp, pool=pool, limit=GroupLimit.of(model.moe),
        )
        ep_s = (fwd_passes + 1) * one
    ep_overlap_s = 0.0
    if cfg.moe_a2a_overlap and ep_s > 0 and model.moe is not None:
        passes = fwd_passes + 1
        expert_fwd, expert_dgrad, expert_wgrad = routed_expert_s(
            model, gpu=gpu, dims=dims, micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len,
            precision=cfg.precision, fp8_recipe=cfg.fp8_recipe, main_grad_bytes=_main_grad_bytes(cfg))
        if not cfg.moe_a2a_delay_wgrad:  # the expert wgrad inside the backward: the dispatch backward waits for it
            expert_dgrad, expert_wgrad = expert_dgrad + expert_wgrad, 0.0
        parts = MoeLayerParts(
            attention_fwd=ct.forward_s - expert_fwd + (tp_s + cp_s) / passes,
            attention_bwd=ct.backward_s - expert_dgrad - expert_wgrad + (tp_s + cp_s) * fwd_passes / passes
            + ct.recompute_s,
            expert_fwd=expert_fwd, expert_dgrad=expert_dgrad, expert_wgrad=expert_wgrad,
            dispatch=one / 2, combine=one / 2,
        )
        ep_overlap_s = min(ep_s, paired_saving_s(parts, sm_count(gpu.name)))

    shards = layer_param_shards(model, kind, dims)
    # --fp8-param-gather keeps Transformer Engine's linear weights in FP8; the embedding and the output
    # layer are not TE FP8 modules and stay BF16
    fp8_params = cfg.fp8_param_gather and cfg.precision is Precision.FP8 and is_decoder
    fp8_cache = 0.0  # Transformer Engine's FP8 (NVFP4) copies of the decoder GEMM weights
    if is_decoder and cfg.precision.quantized and cfg.framework in (TrainFramework.MEGATRON, TrainFramework.NEMO):
        if cfg.precision is Precision.FP4:
            fp8_cache = NVFP4_WEIGHT_CACHE_BYTES if gpu.fp4_tflops else 0.0
        else:
            fp8_cache = fp8_weight_cache_bytes(gpu, cfg.fp8_recipe, fp8_params=fp8_params)
    states = model_state_bytes(
        shards, dims=dims, zero_stage=cfg.zero_stage, optimizer=cfg.optimizer, framework=cfg.framework,
        grad_fp32=cfg.grad_reduce_fp32, fp8_params=fp8_params, moments_bf16=cfg.optimizer_moments_bf16,
        fp8_cache=fp8_cache)
    act_kwargs = dict(
        dims=dims, micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len, sequence_parallel=cfg.sp,
        flash_attention=cfg.flash_attention, fp8=cfg.precision is Precision.FP8 and gpu.fp8_tflops is not None,
        fp4=cfg.precision is Precision.FP4 and gpu.fp4_tflops is not None, cross_entropy=cfg.cross_entropy,
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
        weight_cast_s=fp8_weight_cast_s(kind, shards.dense + shards.expert, pool, cfg),
        ep_overlap_s=ep_overlap_s,
    )
