"""The memory story of a training plan: the four tenants of the fullest GPU (weights, gradients,
optimizer state, activations) with their bytes per parameter and the formula behind each, then the
reserve and fragmentation, the peak and the headroom left. Reads the plan's prediction; the only
figures computed here are the closed forms it is explained by."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from autoshard.costmodel.train.memory import (
    ParamShards,
    TrainFramework,
    in_flight_microbatches,
    layer_param_shards,
    model_state_bytes,
)
from autoshard.costmodel.train.step import stage_cost
from autoshard.plans.train import Plan
from autoshard.report.fit import add_columns, table
from autoshard.specs.job import Precision
from autoshard.specs.layers import LayerKind
from autoshard.units import GIB

__all__ = ["MemoryRow", "memory_rows", "memory_table", "fullest_rank", "nominal_bytes_per_param"]


@dataclass(frozen=True, slots=True)
class MemoryRow:
    name: str
    bytes: float
    per_param: float | None
    """Bytes per parameter held by this GPU (its TP x PP x EP shard); None where it means nothing."""
    formula: str


def fullest_rank(plan: Plan) -> int:
    """The pipeline rank whose memory the prediction reports (the fullest relative to its HBM)."""
    pred = plan.prediction
    ratios = [m / c for m, c in zip(pred.rank_memory_bytes, pred.rank_capacity_bytes, strict=True)]
    return max(range(len(ratios)), key=ratios.__getitem__)


def nominal_bytes_per_param(plan: Plan, *, expert: bool = False) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter held, sharded by the plan's ZeRO stage:
    Megatron 2 + 4 + 12 = 18 unsharded, 6 + 12/DP with the distributed optimizer, 2 + 16/DP with
    ZeRO-2 and 18/DP with ZeRO-3 (DP counts the data- and context-parallel replicas)."""
    cfg = plan.config
    s = model_state_bytes(ParamShards(0.0, 1.0) if expert else ParamShards(1.0, 0.0), dims=cfg.dims,
                          zero_stage=cfg.zero_stage, optimizer=cfg.optimizer, framework=cfg.framework,
                          grad_fp32=cfg.grad_reduce_fp32, moments_bf16=cfg.optimizer_moments_bf16,
                          fp8_params=_fp8_params(plan))
    return s.weights, s.grads, s.optimizer


def _params_held(plan: Plan, rank: int) -> tuple[float, float]:
    dims = plan.config.dims
    dense = expert = 0.0
    for i, stage in enumerate(plan.stages):
        if i % dims.pp != rank:
            continue
        for kind in plan.model.layer_kinds[stage.start:stage.stop]:
            shard = layer_param_shards(plan.model, kind, dims)
            dense += shard.dense
            expert += shard.expert
    return dense, expert


def _fp8_params(plan: Plan) -> bool:
    """--fp8-param-gather in effect: the primary weights held in FP8 (1 B), as the prediction counts them."""
    return plan.config.fp8_param_gather and plan.config.precision is Precision.FP8


def _copies(plan: Plan) -> str:
    return "NVFP4" if plan.config.precision is Precision.FP4 else "FP8"


def _state_weights(plan: Plan, rank: int) -> float:
    """Weight bytes of `rank` without Transformer Engine's FP8 copies (the same layers priced in BF16,
    or at 1 B under --fp8-param-gather), with ZeRO-3's gathered layers as the prediction counts them."""
    import dataclasses

    cfg = dataclasses.replace(plan.config, precision=Precision.BF16, fp8_attention=False)
    w = 0.0
    largest = 0.0
    for i, st in enumerate(plan.stages):
        if i % plan.config.dims.pp == rank:
            c = stage_cost(plan.model, st, plan.cluster.pools[st.pool], cfg)
            w += c.weights_bytes / (2 if _fp8_params(plan) else 1)
            largest = max(largest, c.largest_layer_params)
    if cfg.zero_stage == 3:
        w += 2 * 2 * largest
    return w


def _g(x: float) -> str:
    return f"{x:.4g}"


def memory_rows(plan: Plan) -> list[MemoryRow]:
    cfg, pred = plan.config, plan.prediction
    dims, m = cfg.dims, pred.memory
    rank = fullest_rank(plan)
    dense, expert = _params_held(plan, rank)
    held = dense + expert
    dp = dims.dp * dims.cp
    dp_name = "(DP x CP)" if dims.cp > 1 else "DP"  # the optimizer shards over the data- and context-parallel ranks
    z = cfg.zero_stage
    titan = cfg.framework is TrainFramework.TORCHTITAN
    full = model_state_bytes(ParamShards(1.0, 0.0), dims=dims, zero_stage=0, optimizer=cfg.optimizer,
                             framework=cfg.framework, grad_fp32=cfg.grad_reduce_fp32,
                             moments_bf16=cfg.optimizer_moments_bf16, fp8_params=_fp8_params(plan))
    full_w, full_g, full_o = full.weights, full.grads, full.optimizer

    edp = dims.expert_dp

    def sharded(full: float, from_stage: int) -> str:
        text = f"{_g(full)}/{dp_name} = {_g(full)}/{dp}" if z >= from_stage and dp > 1 else _g(full)
        if expert and z >= from_stage and edp != dp:  # routed experts shard over the expert-DP group
            text += f"; experts {_g(full)}/EDP = {_g(full)}/{edp}" if edp > 1 else f"; experts {_g(full)} (EDP 1)"
        return text

    w_kind = "FP32 master params (FSDP2)" if titan else "FP8 params" if full_w == 1 else "BF16 params"
    adam = cfg.optimizer.value == "adam"
    if adam:  # the master copy: FP32 (Megatron), BF16 remainders (NeMo), none (FSDP, NeMo BF16 moments)
        moment_b = 4 if cfg.optimizer_moments_bf16 else 8
        master = {4: "FP32 master + ", 2: "BF16 master remainders + "}.get(round(full_o - moment_b), "")
        o_kind = master + ("Adam m, v in BF16" if moment_b == 4 else "Adam m, v" if master else "Adam m, v in FP32")
    else:
        o_kind = "optimizer state in FP32"
    weights_f = f"{w_kind}: {sharded(full_w, 3)}"
    grads_f = f"{'FP32' if full_g == 4 else 'BF16'} grads: {sharded(full_g, 2)}"
    if z == 3:
        weights_f += " + 2 layers gathered in BF16"
        if not titan:
            grads_f += " + 1 layer unsharded"
    fp8_copies = m.weights - (_state_weights(plan, rank) if not titan else m.weights)
    if fp8_copies > 0:  # Transformer Engine's FP8 copies of the decoder GEMM weights (costmodel.train.memory)
        weights_f += f" + {fp8_copies / GIB:.2f} GiB {_copies(plan)} weight copies (Transformer Engine)"
    opt_f = f"{o_kind}: {sharded(full_o, 1)}"
    if z >= 1 and dp > 1:
        opt_f += " (distributed optimizer)" if z == 1 else f" (ZeRO-{z})"

    def states(w: float, g: float, o: float, group: str) -> str:
        stage = z if (dp if group == "DP" else edp) > 1 else 0
        return {0: f"{_g(full_w)} + {_g(full_g)} + {_g(full_o)} = {_g(full_w + full_g + full_o)}",
                1: f"{_g(full_w + full_g)} + {_g(full_o)}/{group} = {_g(w + g + o)}",
                2: f"{_g(full_w)} + {_g(full_g + full_o)}/{group} = {_g(w + g + o)}",
                3: f"{_g(full_w + full_g + full_o)}/{group} = {_g(w + g + o)}"}[stage]

    states_f = states(*nominal_bytes_per_param(plan), dp_name)
    if fp8_copies > 0:
        states_f += f", + {fp8_copies / held:.2f} {_copies(plan)} weight copies" if held else ""
    if expert:
        states_f = (f"dense {states_f}; experts {states(*nominal_bytes_per_param(plan, expert=True), 'EDP')}; "
                    f"{dense / held:.0%} of the parameters held are dense")

    # activations: Megatron holds each in-flight micro-batch's saved tensors, plus one layer's
    # recompute working set (Korthikanti et al. 2022); torchtitan's loss/backward transients differ
    mine = [stage_cost(plan.model, st, plan.cluster.pools[st.pool], cfg)
            for i, st in enumerate(plan.stages) if i % dims.pp == rank]
    in_flight = in_flight_microbatches(rank=rank, pp=dims.pp, vpp=dims.vpp, num_microbatches=cfg.num_microbatches,
                                     a2a_overlap=cfg.moe_a2a_overlap)
    per_mb = sum(c.activation_bytes for c in mine)
    dec = sum(1 for i, st in enumerate(plan.stages) if i % dims.pp == rank
              for k in plan.model.layer_kinds[st.start:st.stop] if k in (LayerKind.DENSE, LayerKind.MOE))
    if titan:
        act_f = (f"{_g(in_flight)} micro-batches in flight x {per_mb / GIB:.2f} GiB saved + the larger of the "
                 "loss or a block's backward")
    else:
        work = max(c.working_bytes for c in mine)
        act_f = (f"{_g(in_flight)} micro-batch{'es' if in_flight != 1 else ''} in flight x {per_mb / GIB:.2f} GiB "
                 f"({dec} layers, recompute {cfg.recompute.value})")
        if work > 0:
            act_f += f" + {work / GIB:.2f} GiB working set of a recomputed layer"
    gpu = plan.cluster.pools[plan.stages[rank].pool].gpu
    reserve = gpu.efficiency.reserved_memory_gib * GIB
    frag = m.overhead - reserve
    allocated = m.weights + m.grads + m.optimizer + m.activations + m.kv_cache

    def per(x: float) -> float | None:
        return x / held if held else None

    rows = [
        MemoryRow("weights", m.weights, per(m.weights), weights_f),
        MemoryRow("gradients", m.grads, per(m.grads), grads_f),
        MemoryRow("optimizer state", m.optimizer, per(m.optimizer), opt_f),
        MemoryRow("model states", m.weights + m.grads + m.optimizer, per(m.weights + m.grads + m.optimizer),
                  f"bytes/param {states_f}"),
        MemoryRow("activations", m.activations, None, act_f),
    ]
    if m.kv_cache:
        rows.append(MemoryRow("KV cache", m.kv_cache, None, "serving cache"))
    rows += [
        MemoryRow("allocated", allocated, None, "the four tenants"),
        MemoryRow("reserve", reserve, None, "CUDA context, NCCL and cuBLAS workspaces (outside the allocator)"),
        MemoryRow("fragmentation", frag, None,
                  f"{100 * gpu.efficiency.fragmentation:.0f} % of "
                  + ("gradients, activations and transients" if cfg.framework in (TrainFramework.TORCHTITAN,
                                                                                  TrainFramework.FSDP)
                     else "activations and transients, not states")
                  + (" + the BF16 logits the loss frees but keeps reserved" if titan else "")),
        MemoryRow("peak", pred.rank_memory_bytes[rank], None, "allocated + reserve + fragmentation"),
        MemoryRow("capacity", pred.rank_capacity_bytes[rank], None, f"HBM of one {gpu.name}"),
    ]
    head = pred.rank_capacity_bytes[rank] - pred.rank_memory_bytes[rank]
    rows.append(MemoryRow("headroom" if head >= 0 else "SHORT BY", abs(head), None,
                          "left for spikes" if head >= 0 else "does not fit: needs more than the GPU has"))
    return rows


def memory_table(plan: Plan) -> Table:
    pred = plan.prediction
    rank = fullest_rank(plan)
    dense, expert = _params_held(plan, rank)
    where = f"pipeline rank {rank}, " if plan.config.dims.pp > 1 else ""
    t = table(f"Memory of the fullest GPU ({where}{(dense + expert) / 1e9:.3g} B parameters held)")
    add_columns(t, "tenant|GiB:r|B/param:r|formula:w")
    for row in memory_rows(plan):
        bold = row.name in ("model states", "peak", "headroom", "SHORT BY")
        style = "bold red" if row.name == "SHORT BY" else ("bold" if bold else None)
        t.add_row(row.name, f"{row.bytes / GIB:.2f}", "" if row.per_param is None else f"{row.per_param:.2f}",
                  row.formula, style=style)
        if row.name in ("model states", "allocated", "capacity"):
            t.add_section()
    fit = "fits" if pred.fits else "does not fit"
    t.caption = f"B/param: bytes per parameter this GPU holds; {fit}"
    return t
