"""From a solved candidate to a plan: the stages CP-SAT (or an incumbent) chose, and the message when
no plan fits at all (what is needed, what the GPU has, the nearest fixes)."""

from __future__ import annotations

import math

from ortools.sat.python import cp_model

from autoshard.costmodel.train.types import Stage, TrainConfig
from autoshard.errors import InfeasibleError
from autoshard.parallel import Recompute
from autoshard.search.cpsat import value_of
from autoshard.search.train.build import BuiltModel
from autoshard.search.train.prepare import Prepared
from autoshard.search.train.space import Pins
from autoshard.search.train.tables import CandidateTables, Layout
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import TrainJob
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = ["decode", "layout_stages", "infeasible"]


def decode(built: BuiltModel, solver: cp_model.CpSolver, index: int) -> tuple[TrainConfig, tuple[Stage, ...]]:
    cand = built.candidates[index]
    tab = built.tables[index]
    pp = tab.config.dims.pp
    bounds = [value_of(solver, b) for b in cand.bounds]
    rcs = [value_of(solver, r) for r in cand.recompute]
    pools = [value_of(solver, q) for q in cand.rank_pools]
    stages = tuple(
        Stage(start=bounds[k], stop=bounds[k + 1], pool=pools[k % pp], full_recompute_layers=rcs[k])
        for k in range(tab.num_chunks)
    )
    return tab.config, stages


def layout_stages(tab: CandidateTables, layout: Layout) -> tuple[TrainConfig, tuple[Stage, ...]]:
    pp = tab.config.dims.pp
    stages = tuple(
        Stage(start=layout.bounds[k], stop=layout.bounds[k + 1], pool=layout.pools[k],
              full_recompute_layers=layout.recompute[k])
        for k in range(tab.num_chunks)
    )
    assert all(st.pool == stages[k % pp].pool for k, st in enumerate(stages))
    return tab.config, stages


def _layout_fixes(model: ModelSpec, cluster: ClusterSpec) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """(prune reason's start, the pins it concerns, the fix it calls for) for candidates no layout is
    legal for."""
    domain = min(p.node.domain_size for p in cluster.pools)
    return (
        ("TP > NVLink domain", ("tp",), f"TP within one {domain}-GPU NVLink domain (--tp {domain} or less)"),
        ("more model chunks than layers", ("pp", "vpp"), f"at most {model.num_layers} model chunks, one per decoder "
                                                         "layer (a smaller PP x VPP)"),
        ("CP shard shorter than", ("cp",), "a longer --seq-len or a smaller --cp (a CP rank needs at least 512 tokens)"),
        ("sequence length not divisible by 2*CP", ("cp",), "a --seq-len divisible by 2 x CP"),
        ("global batch not divisible", ("mbs", "dp"), "a global batch divisible by more micro-batch x DP sizes"),
        ("interleaving needs a multiple of PP micro-batches", ("vpp",),
         "a --global-batch-size giving a multiple of PP micro-batches per DP rank, or no --vpp"),
        ("interleaving needs PP > 1", ("vpp",), "--pp 2 or more with --vpp"),
        ("ZeRO needs data parallelism", ("zero_stage",), "DP > 1 for ZeRO (fewer model-parallel GPUs) or --zero-stage 0"),
        ("ETP x EP does not divide", ("ep", "etp"), "an expert grid ETP x EP dividing TP x CP x DP (e.g. --etp 1)"),
        ("ZeRO-2/3 (Megatron-FSDP) does not combine with PP", ("zero_stage",), "--pp 1 with ZeRO-2/3"),
        ("MoE with TP > 1 needs sequence parallelism", ("tp", "sequence_parallel"),
         "sequence parallelism on with --tp 2 or more (drop --no-sequence-parallel), or --tp 1"),
        ("sequence length not divisible by CP x TP", ("tp", "cp"),
         "a --seq-len divisible by CP x TP (sequence parallelism splits it over both), or --no-sequence-parallel "
         "(dense models)"),
        ("BF16 Adam moments need the distributed optimizer", ("zero_stage",), "--zero-stage 1 or more"),
    )


def infeasible(model: ModelSpec, cluster: ClusterSpec, job: TrainJob, prep: Prepared, pins: Pins) -> InfeasibleError:
    reasons = ", ".join(f"{n} x {r}" for r, n in prep.pruned.most_common(4))
    gpu = cluster.primary.gpu
    if not prep.enumerated or prep.min_memory_gib is None:
        # a fix for each reason that hit a pinned knob (the solver's own tries of unpinned ones say nothing)
        fixes = [fix for reason, _ in prep.pruned.most_common()
                 for prefix, knobs, fix in _layout_fixes(model, cluster)
                 if reason.startswith(prefix) and any(getattr(pins, k) is not None for k in knobs)]
        fixes = list(dict.fromkeys(fixes or ["a global batch divisible by more micro-batch x DP sizes"]))
        return InfeasibleError(
            f"no legal parallel layout for {model.name} on {cluster.num_gpus} GPUs (seq {job.seq_len}, global batch "
            f"{job.global_batch_size}) with pins ({pins.describe()}): {reasons or 'no candidate'}. Nearest fixes: "
            + "; ".join(fixes) + ("; fewer pinned knobs" if pins.describe() != "none" else "") + "; or "
            + ("other pool sizes (num_nodes in the cluster YAML)." if cluster.is_heterogeneous else "another --gpus.")
        )
    have = prep.capacity_gib or gpu.hbm_gib
    usable = prep.usable_gib if prep.usable_gib is not None else have
    need = prep.min_memory_gib
    if cluster.is_heterogeneous:
        gpus = " + ".join(f"{p.num_gpus} x {p.gpu.name} ({p.gpu.hbm_gib:.1f} GiB)" for p in cluster.pools)
    else:
        gpus = f"{cluster.num_gpus} x {gpu.name} ({have:.1f} GiB each)"
    lines = [f"no plan fits {model.name} ({model.num_params / 1e9:.1f} B params) on {gpus}."]
    if usable <= 0:  # the runtime reserve alone takes the memory fraction of HBM: no fix but bigger GPUs
        reserve = max(p.gpu.efficiency.reserved_memory_gib for p in cluster.pools)
        lines.append(f"The runtime reserve alone (CUDA context, NCCL and cuBLAS workspaces: {reserve:.1f} GiB per GPU, "
                     f"gpu.efficiency.reserved_memory_gib) is more than the {usable + reserve:.1f} GiB of its "
                     f"{have:.1f} GiB the memory fraction allows: nothing is left for a rank, whatever the layout.")
        lines.append("Nearest fixes: GPUs with more memory (gpu.hbm_gib in the cluster YAML), or a smaller "
                     "reserved_memory_gib if the runtime needs less.")
        return InfeasibleError("\n".join(lines))
    state = (f"Weights, gradients and optimizer state alone need at least {need:.1f} GiB per GPU in the best "
             f"layout; a GPU has {usable:.1f} GiB of its {have:.1f} GiB for a rank (memory fraction less the "
             f"runtime reserve)")
    if need < usable:
        state += (f", which leaves {usable - need:.1f} GiB for activations, buffers and fragmentation: no "
                  f"layout's fit in it")
    lines.append(state + ".")
    fixes = []
    total_state_gib = model.num_params * 18 / GIB
    per_node = cluster.primary.node.gpus_per_node
    min_gpus = per_node * math.ceil(math.ceil(total_state_gib / usable) / per_node)
    # fully sharded over every GPU (ZeRO-3 over all ranks), the states still overflow: only GPUs help
    sharded = total_state_gib / cluster.num_gpus >= usable
    if min_gpus > cluster.num_gpus:
        more = ("add nodes: num_nodes of the pools in the cluster YAML, --gpus cannot resize a heterogeneous "
                "cluster" if cluster.is_heterogeneous else f"try --gpus {2 ** math.ceil(math.log2(min_gpus))}")
        fully = (f", {total_state_gib / cluster.num_gpus:.1f} GiB per GPU even fully sharded over all "
                 f"{cluster.num_gpus}," if sharded else "")
        fixes.append(f"more GPUs: model states need about {total_state_gib:,.0f} GiB in total{fully} so at "
                     f"least ~{min_gpus} GPUs ({more})")
    if not sharded and need < usable:  # the states fit: activations are what overflows
        fixes.append("a shorter --seq-len or a smaller --global-batch-size (activations)")
        if pins.recompute is not Recompute.FULL:
            fixes.append("--recompute full")
    if not sharded and pins.zero_stage != 3:
        fixes.append("ZeRO-3/FSDP (--zero-stage 3, needs PP 1)")
    if pins.describe() != "none" and not sharded:
        fixes.append(f"fewer pinned knobs (pinned: {pins.describe()})")
    lines.append("Nearest fixes: " + "; ".join(fixes) + ".")
    if reasons:
        lines.append(f"Candidates dropped: {reasons}.")
    return InfeasibleError("\n".join(lines))
