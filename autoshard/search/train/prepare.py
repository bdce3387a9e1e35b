"""Before CP-SAT: enumerate the candidates, stage them by a cheap lower bound, then best-first build
their tables, tighten their bounds and build incumbents only for those that could still beat the
best plan found so far, each candidate dropped with its reason (and a certified bound)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, fields
from operator import attrgetter

from autoshard.costmodel.train.memory import layer_param_shards, model_state_bytes
from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import ParallelDims
from autoshard.search.deadline import Deadline
from autoshard.search.train.assign import split_by_assignment
from autoshard.search.train.bounds import NO_MEMORY, NO_RANKS, QuickBounds, bounds
from autoshard.search.train.bounds_hetero_tail import hetero_joint_tail_bound, uniform_joint_tail_bound
from autoshard.search.train.incumbents import hetero_incumbent, improve, incumbent
from autoshard.search.train.options import SolverOptions
from autoshard.search.train.space import Pins, enumerate_train
from autoshard.search.train.tables import CandidateTables, Layout, build_tables, even_layout
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import TrainJob
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = ["Prepared", "prepare"]


@dataclass(slots=True)
class Prepared:
    """Everything before CP-SAT: candidates, their tables and bounds, and why others were dropped."""

    tables: list[CandidateTables]
    lower_bounds: list[int]
    tmax_bounds: list[int]
    incumbents: list[tuple[int, Layout] | None]
    """Best even-split layout per candidate that fits, with its integer objective."""
    pruned: Counter[str] = field(default_factory=Counter)
    enumerated: int = 0
    excluded_bound: int | None = None
    """Smallest lower bound among candidates left out of the CP-SAT model (None if none were)."""
    scale: int = 1
    min_memory_gib: float | None = None
    capacity_gib: float | None = None
    usable_gib: float | None = None
    """Largest per-GPU memory left for a rank (memory fraction of HBM less the runtime reserve)."""
    fixed_pools: list[tuple[int, ...] | None] = field(default_factory=list)
    """Per table: the pool of each pipeline rank when the candidate was split by pool assignment."""

_MIN_STAGED = 64
"""Candidates the cheap-bound pass stages before the soft deadline may stop it."""

_RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}


def _simplicity(cfg: TrainConfig) -> tuple:
    """Tie-break among equally fast candidates: fewer and smaller exotic knobs first."""
    d = cfg.dims
    return (d.cp, cfg.zero_stage, _RECOMPUTE_ORDER[cfg.recompute.value], d.vpp, d.etp is not None, d.ep, d.tp, d.pp,
            cfg.micro_batch_size)


_DIMS_BUT_VPP = attrgetter(*[f.name for f in fields(ParallelDims) if f.name != "vpp"])
"""The degrees `_quick_state_floor_bytes` reads: parameter shards and model states do not depend on
interleaving (the candidates that differ only in VPP share one floor)."""


def _quick_state_floor_bytes(model: ModelSpec, cfg: TrainConfig) -> float:
    """Average model-state bytes per pipeline rank, from parameter shards alone (no timing)."""
    total = 0.0
    for group in model.layers:
        shards = layer_param_shards(model, group.kind, cfg.dims)
        states = model_state_bytes(shards, dims=cfg.dims, zero_stage=cfg.zero_stage, optimizer=cfg.optimizer)
        total += states.total * group.count
    return total / cfg.dims.pp


def prepare(model: ModelSpec, cluster: ClusterSpec, job: TrainJob, *, pins: Pins, options: SolverOptions,
            deadline: Deadline | None = None, hard_deadline: Deadline | None = None) -> Prepared:
    """Enumerate, then best-first over cheap lower bounds: tighten the bound and build an
    incumbent only for candidates that could still beat the best plan found so far.

    Past `deadline` every phase stops early: candidates never looked at leave the certified bound
    at the smallest cheap bound among them, or at 0 when even their cheap bounds are unknown; the
    best-first pass still runs until it has one plan (the caller's overall limit caps that)."""
    deadline = deadline or Deadline.never()
    hard = hard_deadline or deadline
    # the space is enumerated within the grace: no candidate means no plan (--time-limit 0.5 spent on start-up
    # left none and answered "no plan found" where the README promises a first plan within the grace)
    space = enumerate_train(model, cluster, job, pins=pins, options=options.space, deadline=hard)
    configs = space.candidates
    prep = Prepared(tables=[], lower_bounds=[], tmax_bounds=[], incumbents=[], pruned=Counter(space.pruned),
                    enumerated=space.enumerated)
    if not space.complete:
        prep.excluded_bound = 0
        prep.pruned["time limit: enumeration stopped (bound 0)"] += 1
    if not configs:
        return prep
    scale = math.lcm(*{c.dims.vpp for c in configs})
    prep.scale = scale
    best_floor = math.inf
    prep.capacity_gib = max(p.gpu.hbm_gib for p in cluster.pools)
    # model states are static bytes (costmodel.train.memory.static_bytes): no fragmentation on them
    usable = max(options.memory_fraction * p.gpu.hbm_gib * GIB - p.gpu.efficiency.reserved_memory_gib * GIB
                 for p in cluster.pools)
    prep.usable_gib = usable / GIB
    uniform = (options.space.uniform_recompute or pins.recompute_num_layers is not None) and options.space.per_stage_recompute
    staged: list[tuple[int, tuple, TrainConfig]] = []
    pool_gpus = [p.num_gpus for p in cluster.pools]
    floors: dict[tuple, float] = {}
    quick = QuickBounds(model, cluster, scale=scale, memory_fraction=options.memory_fraction)
    for n_seen, cfg in enumerate(configs):
        # past the soft deadline, staging goes on (to the hard one) until a few candidates that
        # could fit are staged: stopping with none would leave no plan at all on a loaded machine
        if n_seen % 512 == 511 and deadline.expired() and (len(staged) >= _MIN_STAGED or hard.expired()):
            prep.excluded_bound = 0  # the rest have no bound at all
            prep.pruned["time limit: cheap bounds not computed (bound 0)"] += len(configs) - n_seen
            break
        if pins.recompute_num_layers and cfg.recompute.value == "full":
            prep.pruned["recompute-num-layers pinned with full recompute"] += 1
            continue
        key = (_DIMS_BUT_VPP(cfg.dims), cfg.zero_stage, cfg.optimizer)
        floor = floors.get(key)
        if floor is None:
            floor = floors[key] = _quick_state_floor_bytes(model, cfg)
        best_floor = min(best_floor, floor)
        if floor > usable:
            prep.pruned["model states alone exceed GPU memory"] += 1
            continue
        cheap = quick(cfg)
        if cheap == NO_MEMORY:
            prep.pruned["model states fit no assignment of the ranks to pools"] += 1
            continue
        if cheap == NO_RANKS:
            prep.pruned["the pools cannot host this many pipeline ranks"] += 1
            continue
        staged.append((cheap, _simplicity(cfg), cfg))
    if best_floor < math.inf:
        prep.min_memory_gib = best_floor / GIB
    staged.sort(key=lambda item: (item[0], item[1]))
    seen: set[bytes] = set()
    best_ub: int | None = None  # the top_k-th best incumbent objective so far
    incumbents: list[int] = []
    kept: list[tuple[int, int, tuple[int, Layout] | None, CandidateTables]] = []
    for n_done, (cheap_lb, _, cfg) in enumerate(staged):
        if best_ub is not None and cheap_lb > best_ub:
            prep.pruned["bound: cannot beat the best plan found"] += len(staged) - n_done
            break
        if (incumbents and deadline.expired()) or hard.expired():
            # certified: every candidate left has at least this cheap bound (sorted)
            prep.excluded_bound = cheap_lb if prep.excluded_bound is None else min(prep.excluded_bound, cheap_lb)
            prep.pruned["time limit: left out with their cheap bound"] += len(staged) - n_done
            break
        if best_ub is not None and cheap_lb + quick.tail(cfg) > best_ub:
            prep.pruned["bound: cannot beat the best plan found"] += 1
            continue
        tab = build_tables(model, cluster, cfg, scale=scale, memory_fraction=options.memory_fraction)
        if options.space.even_layout_only and even_layout(tab) is None:
            prep.pruned["even split impossible (layers not divisible by PP x VPP)"] += 1
            continue
        signature = tab.signature()
        if signature in seen:
            prep.pruned["same costs as a simpler candidate (e.g. CP x2 with micro-batch x2)"] += 1
            continue
        seen.add(signature)
        found = bounds(tab, uniform_recompute=uniform, pool_gpus=pool_gpus if cluster.is_heterogeneous else None,
                       cutoff=best_ub)
        if found is None:
            prep.pruned["states + in-flight activations exceed GPU memory in every layout"] += 1
            continue
        lb, tmax_lb = found
        if best_ub is not None and lb > best_ub:
            prep.pruned["bound: cannot beat the best plan found"] += 1
            continue
        if cluster.is_heterogeneous:
            inc = hetero_incumbent(cluster, tab, tmax_lb)
        else:
            inc = incumbent(tab, None, tmax_lb, uniform)
        if inc is not None and tab.num_chunks > 1 and (best_ub is None or inc[0] < best_ub + (best_ub >> 5)):
            inc = improve(tab, inc)  # promising (within ~3 % of the best): polish it
        if tab.num_chunks == 1 and not cluster.is_heterogeneous:
            # one stage: the only layout is the whole model; its recompute search was exhaustive
            if inc is None:
                prep.pruned["does not fit even with every layer recomputed"] += 1
                continue
            lb = inc[0]
        if inc is not None:
            incumbents = sorted([*incumbents, inc[0]])[: max(1, options.top_k)]
            if len(incumbents) >= max(1, options.top_k):
                best_ub = incumbents[-1]
        kept.append((lb, tmax_lb, inc, tab))
    if cluster.is_heterogeneous:
        kept, best_ub = split_by_assignment(kept, pool_gpus, best_ub, incumbents, options, prep.pruned, deadline)
    for lb, tmax_lb, inc, tab, *fixed in kept:
        if (cluster.is_heterogeneous and not (fixed and fixed[0] is not None) and not deadline.expired()
                and (best_ub is None or lb <= best_ub)):
            # still open on its pools chosen freely: one assignment for time, sends and tail at once
            lb = max(lb, _joint_over_assignments(tab, pool_gpus, tmax_lb, uniform))
        if best_ub is not None and lb > best_ub:
            prep.pruned["bound: cannot beat the best plan found"] += 1
            continue
        prep.tables.append(tab)
        prep.lower_bounds.append(lb)
        prep.tmax_bounds.append(tmax_lb)
        prep.incumbents.append(inc)
        prep.fixed_pools.append(fixed[0] if fixed else None)
    return prep


def _joint_over_assignments(tab: CandidateTables, pool_gpus: list[int], tmax_lb: int, uniform: bool) -> int:
    """`bounds_hetero_tail.hetero_joint_tail_bound` with the objective's weights of the candidate, at
    each recompute count every chunk may share when the layouts take one (`uniform_joint_tail_bound`)."""
    vpp, m, scale = tab.config.dims.vpp, tab.config.num_microbatches, tab.scale
    joint = uniform_joint_tail_bound if uniform else hetero_joint_tail_bound
    return joint(tab, pool_gpus, tmax_lb, (scale // vpp) * (m * vpp - 1), scale, scale // vpp)
