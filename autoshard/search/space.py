"""The candidate space for training: every legal degree tuple, with the reason each discarded one
was discarded.

A candidate fixes everything but the layout (layer -> stage, per-stage full-recompute count and
per-stage pool): TP, CP, PP, VPP, DP, EP, ETP, micro-batch, base recompute and ZeRO stage. The
rules are Megatron-LM's (arguments.py validate_args, TransformerConfig, parallel_state).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

from autoshard.costmodel.training import TrainConfig
from autoshard.parallel import ParallelDims, Recompute, check_dims
from autoshard.search.deadline import Deadline
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import TrainJob
from autoshard.specs.model import ModelSpec

__all__ = ["Pins", "SpaceOptions", "Space", "enumerate_train", "divisors"]

PIN_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "recompute", "zero_stage", "sequence_parallel")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pins:
    """Choices the user fixed (`solve --tp 8 …`); None leaves a knob to the solver."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    vpp: int | None = None
    mbs: int | None = None
    recompute: Recompute | None = None
    zero_stage: int | None = None
    sequence_parallel: bool | None = None
    recompute_num_layers: int | None = None

    def describe(self) -> str:
        items = [f"{k}={getattr(self, k)}" for k in (*PIN_FIELDS, "recompute_num_layers") if getattr(self, k) is not None]
        return ", ".join(items) or "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceOptions:
    max_micro_batch: int = 8
    max_vpp: int = 8
    max_cp: int = 32
    zero_stages: tuple[int, ...] = (0, 1)
    """ZeRO-3/FSDP is opt-in (pin --zero-stage 3): the calibration set has no measured Megatron-FSDP run, and
    the cost model over-predicts the FSDP runs it has (torchtitan), so it is not offered unasked."""
    tp_across_nodes: bool = False
    """Allow a TP group to leave its NVLink domain (almost always a bad idea; off by default)."""
    uniform_recompute: bool = True
    """Same number of fully recomputed layers on every stage (Megatron's --recompute-num-layers)."""
    per_stage_recompute: bool = True
    """Let the solver fully recompute some layers of a stage on top of the base mode."""
    even_layout_only: bool = False
    """Restrict layouts to Megatron-LM's default even split (for comparisons with uneven layouts)."""


@dataclass(slots=True)
class Space:
    candidates: list[TrainConfig]
    pruned: Counter[str] = field(default_factory=Counter)
    enumerated: int = 0
    complete: bool = True
    """False when the deadline stopped the enumeration: the candidates are then a subset."""

    def prune(self, reason: str) -> None:
        self.pruned[reason] += 1
        self.enumerated += 1


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def _world_sizes(cluster: ClusterSpec) -> list[int]:
    """GPU counts a plan may use: all of a homogeneous cluster; on a heterogeneous one any count
    that a pipeline can fill (checked per pool by the solver)."""
    if not cluster.is_heterogeneous:
        return [cluster.num_gpus]
    # whole pools: every non-empty subset of them (a plan leaves no pool partly idle)
    sizes = {sum(p.num_gpus for p, used in zip(cluster.pools, mask, strict=True) if used)
             for mask in itertools.product((0, 1), repeat=len(cluster.pools)) if any(mask)}
    return sorted(sizes, reverse=True)


def check_pins(model: ModelSpec, cluster: ClusterSpec, job: TrainJob, pins: Pins) -> None:
    """Reject pinned degrees that break a framework rule before searching, naming the flag (SpecError)."""
    from autoshard.errors import SpecError

    heads = model.num_attention_heads
    if pins.tp and heads % pins.tp:
        raise SpecError(f"TP {pins.tp} must divide the {heads} attention heads: use one of "
                        f"{', '.join(str(d) for d in divisors(heads) if d <= 64)}", source="--tp")
    if pins.tp and model.mla is None and model.kv_heads % pins.tp and pins.tp % model.kv_heads:
        raise SpecError(f"TP {pins.tp} and the {model.kv_heads} KV heads must divide one another", source="--tp")
    if pins.cp and pins.cp > 1 and job.seq_len % (2 * pins.cp):
        raise SpecError(f"CP {pins.cp} needs the sequence length ({job.seq_len}) divisible by 2 x CP", source="--cp")
    if pins.ep and pins.ep > 1:
        if model.moe is None:
            raise SpecError("expert parallelism needs a mixture-of-experts model", source="--ep")
        if model.moe.num_experts % pins.ep:
            raise SpecError(f"EP {pins.ep} must divide the {model.moe.num_experts} experts", source="--ep")
    if pins.pp and pins.pp > model.num_layers + 2:
        raise SpecError(f"PP {pins.pp} exceeds the {model.num_layers} decoder layers", source="--pp")
    product = (pins.tp or 1) * (pins.cp or 1) * (pins.pp or 1) * (pins.dp or 1)
    if not cluster.is_heterogeneous and cluster.num_gpus % product:
        raise SpecError(f"the pinned degrees multiply to {product}, which does not divide the {cluster.num_gpus} GPUs: "
                        "change them or --gpus", source="--tp/--cp/--pp/--dp")


def enumerate_train(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: TrainJob,
    *,
    pins: Pins = Pins(),
    options: SpaceOptions = SpaceOptions(),
    deadline: Deadline | None = None,
) -> Space:
    space = Space(candidates=[])
    seq, gbs = job.seq_len, job.global_batch_size
    domain = min(p.node.domain_size for p in cluster.pools)
    heads = model.num_attention_heads
    num_layers = model.num_layers
    hetero = cluster.is_heterogeneous
    largest_pool = max(p.num_gpus for p in cluster.pools)

    tps = [pins.tp] if pins.tp else [t for t in _powers_of_two(heads) if heads % t == 0]
    cps = [pins.cp] if pins.cp else _powers_of_two(options.max_cp)
    mbss = [pins.mbs] if pins.mbs else _powers_of_two(options.max_micro_batch)
    recomputes = [pins.recompute] if pins.recompute else list(Recompute)
    zeros = [pins.zero_stage] if pins.zero_stage is not None else list(options.zero_stages)
    experts = model.moe.num_experts if model.moe else 1

    for world in _world_sizes(cluster):
        for tp in tps:
            if tp > domain and not options.tp_across_nodes:
                space.prune(f"TP > NVLink domain ({domain} GPUs)")
                continue
            for cp in cps:
                if world % (tp * cp):
                    continue
                if cp > 1 and seq % (2 * cp):
                    space.prune("sequence length not divisible by 2*CP")
                    continue
                if cp > 1 and seq // cp < 512:
                    space.prune("CP shard shorter than 512 tokens")
                    continue
                rest = world // (tp * cp)
                pps = [pins.pp] if pins.pp else divisors(rest)
                for pp in pps:
                    if deadline is not None and deadline.expired():
                        space.complete = False
                        return space
                    if rest % pp:
                        continue
                    dp = rest // pp
                    if pins.dp and dp != pins.dp:
                        continue
                    if pp > num_layers + 2:
                        space.prune("more pipeline stages than layers")
                        continue
                    stage_gpus = tp * cp * dp
                    if hetero and stage_gpus > largest_pool:
                        space.prune("a pipeline stage needs more GPUs than any pool has")
                        continue
                    vpps = [pins.vpp] if pins.vpp else [v for v in range(1, options.max_vpp + 1) if pp > 1 or v == 1]
                    eps = [pins.ep] if pins.ep else ([e for e in divisors(experts)] if model.moe else [1])
                    # expert TP: Megatron's default (same as TP) or 1; dense models have no expert grid
                    etps: list[int | None] = [pins.etp] if pins.etp else ([None, 1] if model.moe and tp > 1 else [None])
                    for vpp in vpps:
                        if vpp > 1 and pp == 1:
                            space.prune("interleaving needs PP > 1")
                            continue
                        if pp * vpp > num_layers + 2:
                            space.prune("more model chunks than layers")
                            continue
                        for ep in eps:
                            for etp in etps:
                                if (tp * cp * dp) % ((etp or tp) * ep):
                                    space.prune("ETP x EP does not divide TP x CP x DP")
                                    continue
                                try:
                                    dims = ParallelDims(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp)
                                except ValueError:
                                    space.prune("degrees violate the expert-grid folding rule")
                                    continue
                                problems = check_dims(dims, model, seq_len=seq, precision=job.precision)
                                if problems:
                                    space.prune(problems[0].split(";")[0])
                                    continue
                                _add_batch_variants(space, dims, job, mbss, recomputes, zeros, pins, gbs)
    return space


def _add_batch_variants(
    space: Space, dims: ParallelDims, job: TrainJob, mbss: list[int], recomputes: list[Recompute],
    zeros: list[int], pins: Pins, gbs: int,
) -> None:
    for mbs in mbss:
        if gbs % (mbs * dims.dp):
            space.prune("global batch not divisible by micro-batch x DP")
            continue
        m = gbs // (mbs * dims.dp)
        if dims.vpp > 1 and m < dims.pp:
            space.prune("interleaving needs at least PP micro-batches")
            continue
        for rc in recomputes:
            for zero in zeros:
                if dims.dp * dims.cp == 1 and zero > 0 and pins.zero_stage is None:
                    space.prune("ZeRO needs data parallelism")  # (a pinned ZeRO-1 at DP 1 is harmless)
                    continue
                if zero >= 2 and (dims.pp > 1 or dims.ep > 1):
                    space.prune("ZeRO-2/3 (Megatron FSDP) supports neither PP nor EP here")
                    continue
                sp = dims.tp > 1 if pins.sequence_parallel is None else (pins.sequence_parallel and dims.tp > 1)
                space.candidates.append(
                    TrainConfig(
                        dims=dims, micro_batch_size=mbs, global_batch_size=gbs, seq_len=job.seq_len,
                        precision=job.precision, recompute=rc, sequence_parallel=sp, zero_stage=zero,
                        optimizer=job.optimizer, tp_comm_overlap=sp, overlap_grad_reduce=True,
                    )
                )
                space.enumerated += 1
