"""Notes a training prediction carries where it stands outside the measured regimes.

Small expert GEMMs. The held MoE runs of the validation set (tests/validation/residuals_train.json,
leave-one-source-out) split by the rows each local expert's grouped GEMM runs per micro-batch (`flops.expert_rows`):
the two with fewer than 2,048 (Megatron-MoE-ModelZoo Qwen3-235B-A22B on H100, intra-node EP 8 with 16 local experts:
512 rows at TP 4, 1,024 at TP 2 / PP 32) took 12 % and 8 % longer per step than predicted (12 % and 8 % at README
item AF, whose refit raised H100's BF16 level, and 10 % at item AG, whose 88 H100 runs of one release set its
element-wise and FP8 levels until item AH weighed each source by the root of its run count; 11 % and 5 % before item
AF; 39 % and 3 % until README item AC priced the host floor under their MoE layers,
costmodel.train.layer.expert_host_s, which closed most of the TP 4 row's gap; 46 % and 21 % until the validation
rows priced the unfused loss they ran, README item Z; not the grouped GEMM's tile padding: measured on an H100,
autoshard/costmodel/gemm_shape.py, 512 rows per expert run at 0.92 of the kernel's speed at 4,096); every held MoE
run at 2,048 rows or more is within 20 % either way, except three whose errors do not follow the expert rows:
Qwen3-30B-A3B from Megatron-LM's MoE recipes on GB200, MXFP8 37 % and BF16 21 % faster predicted than measured (41
and 23 % at README item AG; the MXFP8 run measured 3 % slower than BF16; GB200's GEMM levels, from NeMo 25.04's
dense runs since item AF, price MXFP8 8 % faster) and NeMo 25.02's Mixtral 8x22B on B200 (26 % faster, at 65,536
tokens, CP 8; its 8x7B twin, 21 % fast at item AG, is 7 % fast since item AH). Inside: Grok-1 BF16 on 512 H100 from
NeMo 25.04's DGX Cloud Benchmarking runs (15 % slower; 21 % at README item AF, before the same benchmark's 18 NeMo
24.09 Grok-1 runs on H100, within 4 % in BF16, joined the fit: it measured 1.19x its FP8 twin's step, where H100
runs FP8 GEMMs at 1.8x the BF16 rate), Qwen3-235B-A22B BF16 on GB200 (11 % slower; 20 % before README item AF gave
GB200's BF16 level dense runs to learn from), Qwen3-235B-A22B MXFP8 on 64 GB300 with the EP all-to-all overlap (19 %
faster, the overlap priced optimistic, README item W), DeepSeek-V3 on 256 B200 with DeepEP across four nodes (8 %
slower; 23 % until README item AB priced its group-limited routing) and the Grok-1 runs on GB200 (within 5.2 %). A
plan in the small-expert regime is told so rather than silently priced as if the gap were not there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import expert_rows
from autoshard.costmodel.train.layer import host_wait, local_experts
from autoshard.costmodel.train.types import Stage, TrainConfig
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = [
    "SMALL_EXPERT_ROWS", "a2a_overlap_note", "host_bound_note", "moe_stage", "odd_pipeline_note",
    "small_expert_note",
]

SMALL_EXPERT_ROWS = 2048
"""Rows per local expert per micro-batch below which no published run was predicted within 20 %."""


def small_expert_note(model: ModelSpec, cfg: TrainConfig) -> str | None:
    """The note for a plan whose routed-expert GEMMs run fewer than SMALL_EXPERT_ROWS rows per local
    expert per micro-batch; None for dense models and larger expert GEMMs."""
    if not model.is_moe:
        return None
    dims = cfg.dims
    rows, local = expert_rows(model, tokens=cfg.micro_batch_size * cfg.seq_len // dims.cp, dims=dims)
    if rows >= SMALL_EXPERT_ROWS:
        return None
    return (f"expert GEMMs run {rows:,} rows per local expert per micro-batch ({local} local experts): the "
            f"published runs below {SMALL_EXPERT_ROWS:,} rows (Qwen3-235B-A22B on H100, 512 and 1,024 rows) "
            "took 12 % and 8 % longer per step than predicted, so this prediction may be optimistic; "
            "a larger micro-batch, less TP or more EP raises the rows")


def moe_stage(model: ModelSpec, stage: Stage) -> bool:
    """The stage runs routed experts: a MoE decoder layer, or the output layer with MoE MTP modules."""
    kinds = model.layer_kinds[stage.start:stage.stop]
    return LayerKind.MOE in kinds or (LayerKind.OUTPUT in kinds and model.mtp_num_layers > 0
                                      and model.mtp_layer_kind is LayerKind.MOE)


def host_bound_note(model: ModelSpec, pools: Sequence[PoolSpec], cfg: TrainConfig) -> str | None:
    """The note for a plan whose MoE layers wait on the host (costmodel.train.layer.host_wait: issuing the
    routed experts takes longer than the GPU's work on the layer) on any of the `pools` its MoE stages run on
    (moe_stage), with the figures of the pool whose layers wait longest (its GPU named where those pools hold
    more than one GPU type); None where none waits."""
    if not pools:
        return None
    waits = [(pool, *host_wait(model, pool, cfg)) for pool in dict.fromkeys(pools)]
    pool, host, gpu = max(waits, key=lambda w: w[1] - w[2])
    if host <= gpu:
        return None
    local = local_experts(model, cfg)
    us = training_gpu(pool.gpu).efficiency.expert_host_us
    where = f" on {pool.gpu.name}" if len({p.gpu.name for p in pools}) > 1 else ""
    return (f"host-bound MoE layers{where}: issuing a layer's {local} local experts takes {host * 1e3:.1f} ms per "
            f"micro-batch ({us:.0f} us each, fitted on published Megatron runs on H100 and lent to every GPU), "
            f"the GPU's work {gpu * 1e3:.1f} ms, so the GPUs wait {(host - gpu) * 1e3:.1f} ms a layer; "
            "more EP (fewer local experts), a larger micro-batch or a full-iteration CUDA graph shortens it")


def a2a_overlap_note() -> str:
    """The note for a plan that runs Megatron's EP all-to-all overlap (TrainConfig.moe_a2a_overlap): the
    published measurements of it say the priced saving is optimistic (README, "EP all-to-all overlap")."""
    return ("EP all-to-all overlap: priced as Megatron schedules it (two streams, 24 SMs kept by the traffic), "
            "but the one published pair that measures it (Qwen3-235B-A22B on 256 H100, Megatron-MoE-ModelZoo) "
            "saved 2.1 s of a 19.7 s step where this model saves 4.8 s, and Megatron-LM's DeepSeek-V3 GB200 "
            "guide found it a net loss there (host synchronization between its phases, not priced): the "
            "saving may be optimistic")


def odd_pipeline_note(cfg: TrainConfig, bubble_s: float, step_s: float) -> str | None:
    """The note for a plan whose GPU count carries an odd factor the global batch does not: data
    parallelism must divide the batch, so the factor lands on PP, whose micro-batches per replica (a power
    of two) are then never a multiple of it, so no interleaving either (NVL72 sizes: 576 = 64 x 9 GPUs, a
    batch of 512 gives PP 9 with 20 % of the step in the bubble). None when no such factor, or a bubble
    under 5 % of the step."""
    world, odd = cfg.dims.world_size, cfg.dims.world_size
    while odd % 2 == 0:
        odd //= 2
    if odd == 1 or cfg.global_batch_size % odd == 0 or cfg.dims.pp % odd or bubble_s < 0.05 * step_s:
        return None
    fewer = world // odd * (1 << (odd.bit_length() - 1))  # the odd factor replaced by the powers of two around it
    return (f"{world:,} GPUs = {world // odd:,} x {odd}: data parallelism must divide the global batch of "
            f"{cfg.global_batch_size:,} sequences, so the factor {odd} falls to PP {cfg.dims.pp}"
            f"{' without interleaving' if cfg.dims.vpp == 1 else ''}, and the pipeline bubble takes "
            f"{bubble_s / step_s:.0%} of the step; a global batch of {odd} x a power of two (e.g. "
            f"{odd << max(0, math.ceil(math.log2(cfg.global_batch_size / odd))):,}) or {fewer:,} or {2 * fewer:,} GPUs "
            "avoids it")
