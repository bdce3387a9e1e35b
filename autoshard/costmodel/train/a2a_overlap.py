"""Megatron-Core's EP all-to-all overlap: what one MoE layer's dispatch and combine cost when the layer's
forward for one micro-batch runs beside its backward for another.

With --overlap-moe-expert-parallel-comm (and --delay-wgrad-compute, which Megatron-MoE-ModelZoo's
A2A_OVERLAP=1 sets with it), every 1F1B step of the schedule runs one micro-batch's forward and another's
backward layer by layer on two CUDA streams (Megatron-LM `pipeline_parallel/combined_1f1b.py`;
`models/common/model_chunk_schedule_plan.py` `TransformerLayerSchedulePlan.run`, dev d98e8a64dd):

    comm stream:     combine bwd      | dispatch fwd -> dispatch bwd           | combine fwd
    compute stream:  attention fwd    | expert dgrad -> expert wgrad -> experts fwd | attention bwd

The three phases are separated by their data dependencies (the next phase's work needs this phase's
results on both streams), and inside the middle one the expert backward must produce the gradient before
the dispatch backward sends it, and the dispatch forward must deliver the tokens before the experts'
forward runs; the delayed weight gradient is what fills the gap between them. `paired_saving_s` runs that
schedule on one layer's priced parts and returns the seconds it saves over running them one after another.

While both streams run, the communication kernels hold SMs the compute no longer has. How many is not
published per kernel; ModelZoo's A2A_OVERLAP=1 leaves COMM_SMS = 24 of them to the dispatcher in the
normalization kernels (NVTE_FWD/BWD_LAYERNORM_SM_MARGIN=24; the GEMMs take no margin), and the model takes
that as what the traffic holds while it runs: the compute beside it runs on (SMs - COMM_SMS) / SMs of the
GPU (`sm_count`), and the saving shrinks by that share (a modelling choice, not a measurement).

Where the pairing happens: every micro-batch's forward but the warm-up ones (PP = 1: the first; under the
interleaved schedule Megatron's warm-up count plus the one extra forward this mode schedules), each with
the backward the schedule pairs it with, on min(layers) of the two chunks (`rank_hidden_s`); the rest run
unpaired at the full price.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoshard.costmodel.band_table import gpu_name_key
from autoshard.costmodel.compute import (
    dgrad_shape,
    expert_imbalance_s,
    gemm_time_s,
    wgrad_shape,
    wgrad_time_s,
)
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import layer_gemms
from autoshard.costmodel.fp8 import fp8_recipe_gpu
from autoshard.parallel import Fp8Recipe, MoeDispatcher, ParallelDims, Recompute
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.job import Precision
from autoshard.specs.layers import LayerKind

if TYPE_CHECKING:
    from autoshard.costmodel.train.types import Stage, TrainConfig
    from autoshard.specs.model import ModelSpec

__all__ = ["COMM_SMS", "DEFAULT_SM_COUNT", "MoeLayerParts", "a2a_overlap_problems", "ideal_paired_s", "paired_chunks",
           "paired_saving_s", "rank_hidden_s", "routed_expert_s", "schedule_chunks", "sm_count"]

COMM_SMS = 24
"""SMs the EP communication kernels keep while the other micro-batch computes: Megatron-MoE-ModelZoo
`sbatch_benchmarking.sh` (A2A_OVERLAP=1 exports NVTE_FWD_LAYERNORM_SM_MARGIN=24 and
NVTE_BWD_LAYERNORM_SM_MARGIN=24 so that the normalization kernels leave them to the dispatcher)."""

_SM_COUNTS = (
    ("GB300", 160), ("B300", 160), ("GB200", 148), ("B200", 148),
    ("H100-PCIE", 114), ("GH200", 132), ("H200", 132), ("H100", 132), ("H800", 132),
    ("A100", 108), ("A800", 108),
    ("MI355X", 256), ("MI350X", 256), ("MI325X", 304), ("MI300X", 304),
)
"""Streaming multiprocessors (AMD: compute units) per GPU, from the datasheets: A100 108, H100 SXM / H200 132,
H100 PCIe 114, B200 148 (74 of 80 per die enabled), Blackwell Ultra (B300, GB300) 160, MI300X / MI325X 304,
MI350X / MI355X 256. Longest name prefix first."""

DEFAULT_SM_COUNT = 132
"""A GPU the table does not name: counted as an H100's SMs (the contention then takes 24 / 132 = 18 %)."""


def sm_count(gpu_name: str) -> int:
    """SMs of a GPU by name (_SM_COUNTS; DEFAULT_SM_COUNT for one it does not name)."""
    upper = gpu_name_key(gpu_name)
    for prefix, sms in _SM_COUNTS:
        if upper.startswith(prefix):
            return sms
    return DEFAULT_SM_COUNT


@dataclass(frozen=True, slots=True)
class MoeLayerParts:
    """One MoE layer's priced parts for one micro-batch on one GPU, in seconds.

    attention_fwd / attention_bwd: everything the compute stream runs outside the routed experts (the
    attention block with its TP and CP traffic, router, permutation, shared experts, norms, casts;
    backward includes the selective recompute). expert_fwd / expert_dgrad / expert_wgrad: the routed
    expert GEMMs with the busiest rank's imbalance. dispatch / combine: one pass's token all-to-all each
    way (the backward moves the same bytes)."""

    attention_fwd: float
    attention_bwd: float
    expert_fwd: float
    expert_dgrad: float
    expert_wgrad: float
    dispatch: float
    combine: float

    @property
    def unpaired_s(self) -> float:
        """The layer's forward and backward one after another, traffic exposed."""
        return (self.attention_fwd + self.attention_bwd + self.expert_fwd + self.expert_dgrad + self.expert_wgrad
                + 2 * (self.dispatch + self.combine))


def routed_expert_s(
    model: ModelSpec, *, gpu: GpuSpec, dims: ParallelDims, micro_batch_size: int, seq_len: int, precision: Precision,
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED, main_grad_bytes: int | None = None,
) -> tuple[float, float, float]:
    """(forward, data-gradient, weight-gradient) seconds of one MoE layer's routed expert GEMMs for one
    micro-batch on one GPU, each with the busiest EP rank's imbalance: the parts of layer_compute_time's
    MoE layer that the EP all-to-all overlap schedules apart (costmodel.train.a2a_overlap)."""
    assert model.moe is not None
    gpu = fp8_recipe_gpu(training_gpu(gpu), precision, fp8_recipe)
    tokens = micro_batch_size * seq_len // dims.cp
    gemms = layer_gemms(model, LayerKind.MOE, tokens=tokens, dims=dims)
    expert = gemms[-2:]
    imbalance = expert_imbalance_s(model, gemms, tokens=tokens, dims=dims, gpu=gpu, precision=precision)
    forward = sum(gemm_time_s(g, gpu, precision) for g in expert) + imbalance
    dgrad = sum(gemm_time_s(dgrad_shape(g, gpu), gpu, precision) for g in expert) + imbalance
    if main_grad_bytes:
        wgrad = sum(wgrad_time_s(g, gpu, precision, main_grad_bytes) for g in expert)
    else:
        wgrad = sum(gemm_time_s(wgrad_shape(g, gpu), gpu, precision) for g in expert)
    return forward, dgrad, wgrad + imbalance


def ideal_paired_s(p: MoeLayerParts) -> float:
    """The three phases of TransformerLayerSchedulePlan.run, both streams at full speed."""
    first = max(p.combine, p.attention_fwd)  # combine bwd || attention fwd
    # middle: dispatch fwd then dispatch bwd (after the expert dgrad); dgrad, wgrad, then the experts'
    # forward (after the dispatch fwd delivered their tokens)
    dispatch_bwd_end = max(p.dispatch, p.expert_dgrad) + p.dispatch
    expert_fwd_end = max(p.expert_dgrad + p.expert_wgrad, p.dispatch) + p.expert_fwd
    middle = max(dispatch_bwd_end, expert_fwd_end)
    last = max(p.combine, p.attention_bwd)  # combine fwd || attention bwd
    return first + middle + last


def paired_saving_s(p: MoeLayerParts, sms: int) -> float:
    """Seconds one paired forward + backward of this layer saves over running them unpaired: the time the
    two streams overlap, less what the compute loses to the COMM_SMS SMs the traffic holds meanwhile."""
    hidden = p.unpaired_s - ideal_paired_s(p)
    return max(0.0, hidden * (1.0 - COMM_SMS / sms))


def schedule_chunks(num_microbatches: int, vpp: int, group: int) -> list[int]:
    """The model chunk of each virtual micro-batch (forward order) of the interleaved schedule: groups of
    `group` micro-batches (Megatron's default microbatch_group_size_per_vp_stage is PP) run chunk 0, then
    chunk 1, ...; the last group holds what is left (Megatron-LM `get_schedule_table`)."""
    table: list[int] = []
    for start in range(0, num_microbatches, group):
        size = num_microbatches - start if start + group >= num_microbatches else group
        table += [chunk for chunk in range(vpp) for _ in range(size)]
    return table


def _pair_saving_s(forward: Sequence[float], backward: Sequence[float]) -> float:
    """Seconds one chunk's forward beside another chunk's backward hides: Megatron overlaps
    min(layers) of them, forward layer i beside backward layer n_b - 1 - i
    (`TransformerModelChunkSchedulePlan.run`), the rest run alone; a pair hides the smaller of its two
    layers' savings (a dense layer beside an MoE layer is counted as hiding nothing)."""
    n = min(len(forward), len(backward))
    return sum(min(forward[i], backward[len(backward) - 1 - i]) for i in range(n))


def rank_hidden_s(chunk_savings: Sequence[Sequence[float]], *, rank: int, pp: int, num_microbatches: int) -> float:
    """EP seconds a pipeline rank hides per step. `chunk_savings[c]`: the paired saving of each decoder
    layer of the rank's chunk c, in order (LayerCost.ep_overlap_s). Every forward after the warm-up
    (`paired_chunks`) runs beside the backward the schedule pairs it with: virtual micro-batch k's
    forward chunk and k - warm-up's backward chunk (v - 1 - its table entry; PP = 1: one chunk, m - 1
    pairs)."""
    vpp, m = len(chunk_savings), num_microbatches
    total = m * vpp
    warmup = total - paired_chunks(rank=rank, pp=pp, vpp=vpp, num_microbatches=m)
    if pp == 1:
        return (total - warmup) * _pair_saving_s(chunk_savings[0], chunk_savings[0])
    table = schedule_chunks(m, vpp, pp)
    pairs = Counter((table[k], vpp - 1 - table[k - warmup]) for k in range(warmup, total))
    return sum(n * _pair_saving_s(chunk_savings[f], chunk_savings[b]) for (f, b), n in pairs.items())


def paired_chunks(*, rank: int, pp: int, vpp: int, num_microbatches: int) -> int:
    """How many of a pipeline rank's m x v chunk forwards run paired with a backward: all but the
    warm-up ones (Megatron-LM `get_pp_rank_microbatches` with overlap_moe_expert_parallel_comm: PP = 1
    runs the first forward alone; the interleaved schedule warms up (p - r - 1) x 2 + (v - 1) x p chunk
    forwards plus one more in this mode, capped at m x v). Each warm-up forward leaves one backward of the
    cool-down unpaired."""
    total = num_microbatches * vpp
    if pp == 1:
        return max(0, total - 1)
    warmup = min(total, (pp - rank - 1) * 2 + (vpp - 1) * pp + 1)
    return total - warmup


def a2a_overlap_problems(model: ModelSpec, cfg: TrainConfig, stages: Sequence[Stage] = ()) -> list[str]:
    """Why Megatron-Core would refuse the EP all-to-all overlap for this plan (empty: it runs): the
    assertions of `TransformerConfig.__post_init__` for overlap_moe_expert_parallel_comm (Megatron-LM dev
    d98e8a64dd) that a plan can break, each with its fix."""
    from autoshard.costmodel.train.memory import TrainFramework

    out = []
    if cfg.framework not in (TrainFramework.MEGATRON, TrainFramework.NEMO):
        out.append("it is a Megatron-Core schedule (Megatron-LM, NeMo)")
    if model.moe is None:
        out.append("it overlaps the token dispatch of a mixture-of-experts model, and this model has no experts")
        return out
    if cfg.dims.ep <= 1:
        out.append("it needs expert parallelism: set EP > 1 (--ep)")
    if cfg.moe_dispatcher not in (MoeDispatcher.ALLTOALL, MoeDispatcher.FLEX):
        out.append(f"it runs with the alltoall or flex dispatcher, not {cfg.moe_dispatcher.value}: set "
                   "--moe-dispatcher alltoall or flex (Megatron: --moe-token-dispatcher-type)")
    if cfg.dims.pp > 1 and cfg.dims.vpp == 1:
        out.append("with PP > 1 it needs the interleaved schedule: set VPP > 1 (--vpp, or a --layout with "
                   "more chunks than PP)")
    if cfg.recompute is Recompute.FULL or any(st.full_recompute_layers for st in stages):
        out.append("it runs with no full recompute: use --recompute selective or none, no --recompute-num-layers")
    if cfg.recompute is Recompute.SELECTIVE and "moe" in cfg.recompute_modules:
        out.append("it cannot recompute the moe module: drop moe from --recompute-modules (moe_act is allowed)")
    if model.mtp_num_layers > 1:
        out.append(f"it takes at most one MTP layer, the model has {model.mtp_num_layers}")
    return out
