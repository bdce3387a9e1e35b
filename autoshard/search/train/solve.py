"""Solve orchestration: enumerate, tabulate, prune by bounds, build one CP-SAT model, solve,
decode, re-check in floats, and return the best plans with their certificate."""

from __future__ import annotations

import itertools
import math
import sys
from collections import Counter
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from autoshard.costmodel.train.memory import layer_param_shards, model_state_bytes
from autoshard.costmodel.train.step import Stage, TrainConfig, predict_train
from autoshard.errors import InfeasibleError, SolverError
from autoshard.plans.train import Plan, SolverStats
from autoshard.search.train.bounds import assignment_bounds, bounds, pool_rank_limits, quick_lower_bound
from autoshard.search.train.build import BuiltModel, build_model
from autoshard.search.deadline import Deadline
from autoshard.search.train.incumbents import assignment_incumbent, hetero_incumbent, improve, incumbent
from autoshard.search.train.space import Pins, SpaceOptions, check_pins, enumerate_train
from autoshard.search.train.tables import CandidateTables, Layout, build_tables, even_layout
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import TrainJob
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB, US_PER_S

__all__ = ["SolverOptions", "solve_train", "prepare", "Prepared"]


DEFAULT_MEMORY_FRACTION = 0.87
"""Plans keep each GPU's predicted peak under 87 % of HBM by default: the memory model under-predicts
the published per-GPU peaks by up to 13.4 % (torchtitan Llama 3 70B on 256 H100s; median |error| 3.7 %,
`python tests/validation/validate_published.py`), and a true peak 1 / (1 - 0.134) = 1.155 x the
prediction still fits under 0.87 x 1.155 = 1.005 ~ 100 % of HBM. `--memory-fraction 1.0` plans to the brim."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverOptions:
    time_limit_s: float = 30.0
    num_workers: int = 8
    """CP-SAT portfolio workers. Results are deterministic for a fixed seed and worker count
    whenever the solve proves optimality (the optimum is unique up to ties, broken by candidate order)."""
    seed: int = 0
    relative_gap: float = 0.0
    top_k: int = 1
    max_candidates_in_model: int = 40
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    """Cap every GPU's predicted peak (context, NCCL and fragmentation included) at this fraction of
    its HBM: below 1 keeps headroom for what no model predicts (default: DEFAULT_MEMORY_FRACTION)."""
    log: bool = False
    space: SpaceOptions = SpaceOptions()
    started_at: float | None = None
    """`time.monotonic()` when the command started: the time limit counts from there (None: from the
    call to `solve_train`)."""


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
    fixed_pools: list[tuple[int, ...] | None] = field(default_factory=list)
    """Per table: the pool of each pipeline rank when the candidate was split by pool assignment."""


_PREPARE_SHARE = 0.7
"""Share of the time limit for enumeration, bounds and incumbents; CP-SAT gets the rest (and all
that the preparation leaves unused)."""
_FIRST_PLAN_GRACE_S = 0.8
"""How far past the limit the search may run while it has found no plan at all (the issue's bound
on overshooting the limit is 2 s)."""
_MIN_STAGED = 64
"""Candidates the cheap-bound pass stages before the soft deadline may stop it."""
_RECHECK_RESERVE_S = 0.3
"""Wall time kept back from CP-SAT for decoding and the float re-check of the plan."""

_RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}


def _simplicity(cfg: TrainConfig) -> tuple:
    """Tie-break among equally fast candidates: fewer and smaller exotic knobs first."""
    d = cfg.dims
    return (d.cp, cfg.zero_stage, _RECOMPUTE_ORDER[cfg.recompute.value], d.vpp, d.etp is not None, d.ep, d.tp, d.pp,
            cfg.micro_batch_size)


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
    space = enumerate_train(model, cluster, job, pins=pins, options=options.space, deadline=deadline)
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
    usable = max((options.memory_fraction * p.gpu.hbm_gib * GIB - p.gpu.efficiency.reserved_memory_gib * GIB)
                 / (1 + p.gpu.efficiency.fragmentation) for p in cluster.pools)
    uniform = (options.space.uniform_recompute or pins.recompute_num_layers is not None) and options.space.per_stage_recompute
    staged: list[tuple[int, tuple, TrainConfig]] = []
    pool_gpus = [p.num_gpus for p in cluster.pools]
    floors: dict[tuple, float] = {}
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
        key = (cfg.dims, cfg.zero_stage, cfg.optimizer)
        floor = floors.get(key)
        if floor is None:
            floor = floors[key] = _quick_state_floor_bytes(model, cfg)
        best_floor = min(best_floor, floor)
        if floor > usable:
            prep.pruned["model states alone exceed GPU memory"] += 1
            continue
        staged.append((quick_lower_bound(model, cluster, cfg, scale=scale), _simplicity(cfg), cfg))
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
        kept, best_ub = _split_by_assignment(kept, pool_gpus, best_ub, incumbents, options, prep, deadline)
    for lb, tmax_lb, inc, tab, *fixed in kept:
        if best_ub is not None and lb > best_ub:
            prep.pruned["bound: cannot beat the best plan found"] += 1
            continue
        prep.tables.append(tab)
        prep.lower_bounds.append(lb)
        prep.tmax_bounds.append(tmax_lb)
        prep.incumbents.append(inc)
        prep.fixed_pools.append(fixed[0] if fixed else None)
    return prep


def _kth(values: list[int], k: int) -> int | None:
    k = max(1, k)
    return values[k - 1] if len(values) >= k else None


_MAX_ASSIGNMENTS = 512
"""Largest number of rank -> pool assignments a heterogeneous candidate is split into; past it the
candidate keeps its pool variables (CP-SAT chooses the pools)."""


def _split_by_assignment(kept: list, pool_gpus: list[int], best_ub: int | None, incumbents: list[int],
                         options: SolverOptions, prep: Prepared, deadline: Deadline) -> tuple[list, int | None]:
    """On a heterogeneous cluster, one candidate per rank -> pool assignment that the pools can host:
    each gets its own (much tighter) bound and incumbent, and CP-SAT then only places layers. The
    assignments pruned by their bound carry a certificate like any candidate; a candidate with too
    many assignments (or when time runs short) stays whole, with CP-SAT choosing its pools."""
    out = []
    for lb, tmax_lb, inc, tab in sorted(kept, key=lambda item: item[0]):
        pp = tab.config.dims.pp
        k = len(tab.pools)
        limits = [min(pp, g) for g in pool_rank_limits(tab, pool_gpus)]
        if k ** pp > 8 * _MAX_ASSIGNMENTS or deadline.expired() or (best_ub is not None and lb > best_ub):
            out.append((lb, tmax_lb, inc, tab))
            continue
        vectors = [v for v in itertools.product(range(k), repeat=pp)
                   if all(v.count(q) <= limits[q] for q in range(k))]
        if len(vectors) > _MAX_ASSIGNMENTS:
            out.append((lb, tmax_lb, inc, tab))
            continue
        original = tuple(inc[1].pools[:pp]) if inc is not None else None
        split = []
        for v in vectors:
            if deadline.expired():
                break
            found = assignment_bounds(tab, v, pool_gpus, lb)
            if found is None:
                prep.pruned["pool assignment: does not fit in memory"] += 1
                continue
            lb_v, tmax_v = found
            if best_ub is not None and lb_v > best_ub:
                prep.pruned["pool assignment: bound cannot beat the best plan found"] += 1
                continue
            inc_v = assignment_incumbent(tab, v, tmax_v)
            if v == original and (inc_v is None or inc[0] < inc_v[0]):
                inc_v = inc  # the candidate's incumbent stays: the bounds already pruned against it
            if inc_v is not None:
                incumbents = sorted([*incumbents, inc_v[0]])[: max(1, options.top_k)]
                best_ub = _kth(incumbents, options.top_k)
            split.append((lb_v, tmax_v, inc_v, tab, v))
        if deadline.expired():  # not every assignment bounded: the candidate stays whole
            out.append((lb, tmax_lb, inc, tab))
            out.extend(item for item in split if item[2] is not None and (best_ub is None or item[2][0] <= best_ub))
            continue
        out.extend(item for item in split if best_ub is None or item[0] <= best_ub)
        prep.pruned["pool assignment: bound cannot beat the best plan found"] += sum(
            1 for item in split if best_ub is not None and item[0] > best_ub)
    return out, best_ub


def _stop_reason(optimal: bool, cp_status: int, open_in_model: bool, prep: Prepared, options: SolverOptions) -> str:
    """Why the search stopped short of a proof, from what it recorded: CP-SAT stopped before proving
    its model (FEASIBLE or UNKNOWN: only its time limit, the rest of the command's deadline, does
    that), candidates left out because a phase ran out of time, CP-SAT's own gap limit, or else
    candidates left out of the model by its size cap."""
    if optimal:
        return "optimal"
    if cp_status != cp_model.OPTIMAL or any(k.startswith("time limit") for k in prep.pruned):
        return "time_limit"
    if open_in_model and options.relative_gap > 0:
        return "gap_limit"
    return "model_cap"


def _select(prep: Prepared, options: SolverOptions) -> list[int]:
    """Candidates for the CP-SAT model: those whose lower bound beats the top_k-th best incumbent,
    lowest bound first, at most max_candidates_in_model of them."""
    found = sorted(inc[0] for inc in prep.incumbents if inc is not None)
    k = max(1, options.top_k)
    ub = found[k - 1] if len(found) >= k else None
    order = sorted(range(len(prep.tables)), key=lambda i: (prep.lower_bounds[i], i))
    keep = []
    for i in order:
        if ub is not None and prep.lower_bounds[i] > ub and (prep.incumbents[i] is None or prep.incumbents[i][0] > ub):
            prep.pruned["bound: cannot beat the best plan found"] += 1
            continue
        keep.append(i)
    # candidates with their pools fixed are light (no pool variables): twice as many fit the model
    cap = options.max_candidates_in_model * (2 if any(f is not None for f in prep.fixed_pools) else 1)
    if len(keep) > cap:
        best = min((i for i in keep if prep.incumbents[i]), key=lambda i: prep.incumbents[i][0], default=None)
        head = keep[:cap]
        if best is not None and best not in head:
            head[-1] = best  # the incumbent always stays in the model
        left = [i for i in keep if i not in head]
        left_bound = min(prep.lower_bounds[i] for i in left)
        prep.excluded_bound = left_bound if prep.excluded_bound is None else min(prep.excluded_bound, left_bound)
        prep.pruned["model size cap (bound still certified)"] += len(left)
        keep = head
    return keep


def _decode(built: BuiltModel, solver: cp_model.CpSolver, index: int) -> tuple[TrainConfig, tuple[Stage, ...]]:
    cand = built.candidates[index]
    tab = built.tables[index]
    pp = tab.config.dims.pp

    def val(v):
        return v if isinstance(v, int) else solver.value(v)

    bounds = [val(b) for b in cand.bounds]
    rcs = [val(r) for r in cand.recompute]
    pools = [val(q) for q in cand.rank_pools]
    stages = tuple(
        Stage(start=bounds[k], stop=bounds[k + 1], pool=pools[k % pp], full_recompute_layers=rcs[k])
        for k in range(tab.num_chunks)
    )
    return tab.config, stages


def _layout_stages(tab: CandidateTables, layout: Layout) -> tuple[TrainConfig, tuple[Stage, ...]]:
    pp = tab.config.dims.pp
    stages = tuple(
        Stage(start=layout.bounds[k], stop=layout.bounds[k + 1], pool=layout.pools[k],
              full_recompute_layers=layout.recompute[k])
        for k in range(tab.num_chunks)
    )
    assert all(st.pool == stages[k % pp].pool for k, st in enumerate(stages))
    return tab.config, stages


def _infeasible(model: ModelSpec, cluster: ClusterSpec, job: TrainJob, prep: Prepared, pins: Pins) -> InfeasibleError:
    reasons = ", ".join(f"{n} x {r}" for r, n in prep.pruned.most_common(4))
    gpu = cluster.primary.gpu
    if not prep.enumerated or prep.min_memory_gib is None:
        return InfeasibleError(
            f"no legal parallel layout for {model.name} on {cluster.num_gpus} GPUs (seq {job.seq_len}, global batch "
            f"{job.global_batch_size}) with pins ({pins.describe()}): {reasons or 'no candidate'}. Nearest fixes: a "
            f"global batch divisible by more micro-batch x DP sizes, fewer pinned knobs, or another --gpus."
        )
    have = prep.capacity_gib or gpu.hbm_gib
    need = prep.min_memory_gib
    lines = [f"no plan fits {model.name} ({model.num_params / 1e9:.1f} B params) on {cluster.num_gpus} x "
             f"{gpu.name} ({have:.0f} GiB each)."]
    lines.append(f"Weights, gradients and optimizer state alone need at least {need:.1f} GiB per GPU in the best "
                 f"layout; the GPU has {have:.1f} GiB before activations and overheads.")
    fixes = []
    total_state_gib = model.num_params * 18 / GIB
    usable = have * 0.85
    per_node = cluster.primary.node.gpus_per_node
    min_gpus = per_node * math.ceil(math.ceil(total_state_gib / usable) / per_node)
    if min_gpus > cluster.num_gpus:
        fixes.append(f"more GPUs: model states need about {total_state_gib:,.0f} GiB in total, so at least "
                     f"~{min_gpus} GPUs (try --gpus {2 ** math.ceil(math.log2(min_gpus))})")
    fixes.append("a shorter --seq-len or a smaller --global-batch-size (activations)")
    fixes.append("--recompute full")
    fixes.append("ZeRO-3/FSDP (--zero-stage 3, needs PP 1)")
    if pins.describe() != "none":
        fixes.append(f"fewer pinned knobs (pinned: {pins.describe()})")
    lines.append("Nearest fixes: " + "; ".join(fixes) + ".")
    if reasons:
        lines.append(f"Candidates dropped: {reasons}.")
    return InfeasibleError("\n".join(lines))


def solve_train(
    model: ModelSpec, cluster: ClusterSpec, job: TrainJob, *, pins: Pins = Pins(), options: SolverOptions = SolverOptions()
) -> list[Plan]:
    """The best `options.top_k` distinct training plans, best first.

    The whole solve honours `options.time_limit_s` (counted from `options.started_at` when given):
    enumeration and bounds get most of it, CP-SAT what is left; past the limit the best plan found so
    far comes back as FEASIBLE with the bound proven so far."""
    deadline = Deadline(options.time_limit_s, start=options.started_at)
    check_pins(model, cluster, job, pins)
    # past the limit the search only goes on while it has no plan at all, and never past the grace
    grace = Deadline(options.time_limit_s + _FIRST_PLAN_GRACE_S, start=deadline.start)
    prep = prepare(model, cluster, job, pins=pins, options=options, deadline=deadline.part(_PREPARE_SHARE),
                   hard_deadline=grace)
    if not prep.tables:
        # cut short by the clock (the preparation's share or the whole limit): the candidates left were
        # never looked at, so "nothing fits" would be a guess -- say the time ran out instead
        if (deadline.expired() or prep.excluded_bound is not None
                or any(reason.startswith("time limit") for reason in prep.pruned)):
            raise SolverError(f"no plan found within the {options.time_limit_s:g} s time limit ({prep.enumerated} "
                              "candidates enumerated): raise --time-limit or pin some knobs")
        raise _infeasible(model, cluster, job, prep, pins)
    if all(inc is None for inc in prep.incumbents) and deadline.remaining() <= _RECHECK_RESERVE_S:
        # the grace is spent and no plan exists: building a model CP-SAT gets no time to search would
        # only push the overrun past the limit + 2 s
        raise SolverError(f"no plan found within the {options.time_limit_s:g} s time limit ({len(prep.tables)} "
                          "candidates bounded, none with a layout found yet): raise --time-limit or pin some knobs")
    keep = _select(prep, options)
    tables = [prep.tables[i] for i in keep]
    best_inc = min(((prep.incumbents[i][0], j) for j, i in enumerate(keep) if prep.incumbents[i]), default=None)
    hint_index = best_inc[1] if best_inc else None
    hint = prep.incumbents[keep[hint_index]][1] if best_inc else None
    built = build_model(
        tables, pool_gpus=[p.num_gpus for p in cluster.pools],
        uniform_recompute=options.space.uniform_recompute or pins.recompute_num_layers is not None,
        per_stage_recompute=options.space.per_stage_recompute, hint_index=hint_index, hint=hint,
        even_layout_only=options.space.even_layout_only,
        lower_bounds=[prep.lower_bounds[i] for i in keep], tmax_lower_bounds=[prep.tmax_bounds[i] for i in keep],
        fixed_pools=[prep.fixed_pools[i] for i in keep],
    )
    if pins.recompute_num_layers is not None:
        for cand in built.candidates:
            for r in cand.recompute:
                if not isinstance(r, int):
                    built.model.add(r == pins.recompute_num_layers)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.num_workers = max(1, options.num_workers)
    params.random_seed = options.seed
    params.relative_gap_limit = options.relative_gap
    params.log_search_progress = options.log
    if options.log:  # the log goes to stderr: stdout may hold the one --json object
        params.log_to_stdout = False
        solver.log_callback = lambda line: print(line, file=sys.stderr)
    scale_s = prep.scale * US_PER_S
    plans: list[Plan] = []
    returned: set[int] = set()
    for _ in range(max(1, options.top_k)):
        # keep a moment for decoding and the float re-check; with no time left, CP-SAT only loads the
        # model and the best incumbent below stands in
        params.max_time_in_seconds = max(0.01, deadline.remaining() - _RECHECK_RESERVE_S)
        status = cp_status = solver.solve(built.model)
        if status == cp_model.INFEASIBLE:
            if plans:
                break
            if prep.excluded_bound == 0:
                raise SolverError(f"no plan found within the {options.time_limit_s:g} s time limit: raise "
                                  "--time-limit or pin some knobs")
            raise _infeasible(model, cluster, job, prep, pins)
        in_model = [prep.lower_bounds[i] for j, i in enumerate(keep) if j not in returned]
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            index = next(i for i, c in enumerate(built.candidates) if solver.value(c.selected))
            cfg, stages = _decode(built, solver, index)
            objective, solver_bound = solver.objective_value, solver.best_objective_bound
        else:
            # CP-SAT ran out of time before completing a solution: fall back on the best incumbent
            # the bounds search built (a real, memory-checked layout), with the proven bound.
            found = [(prep.incumbents[i][0], j) for j, i in enumerate(keep)
                     if j not in returned and prep.incumbents[i] is not None]
            if not found:
                if plans:
                    break
                raise SolverError(f"CP-SAT found no plan within {options.time_limit_s:.0f} s (status "
                                  f"{solver.status_name(status)}); raise --time-limit or pin some knobs")
            objective, index = min(found)
            cfg, stages = _layout_stages(tables[index], prep.incumbents[keep[index]][1])
            solver_bound = min(in_model)
            status = cp_model.FEASIBLE
        # CP-SAT's bound, never weaker than the bounds proven before the model was built (the model
        # holds only candidates whose bound is at least the smallest one still in it)
        bound = max(solver_bound, min(in_model, default=solver_bound))
        if prep.excluded_bound is not None:
            bound = min(bound, prep.excluded_bound)
        bound = min(bound, objective)
        optimal = status == cp_model.OPTIMAL and bound >= objective - 1e-6
        stats = SolverStats(
            status="OPTIMAL" if optimal else "FEASIBLE",
            stop_reason=_stop_reason(optimal, cp_status, solver_bound < objective - 1e-6, prep, options),
            gap_limit=options.relative_gap,
            wall_s=deadline.elapsed(),
            objective=objective / scale_s,
            bound=bound / scale_s,
            conflicts=solver.num_conflicts,
            branches=solver.num_branches,
            candidates=prep.enumerated,
            candidates_in_model=len(tables),
            pruned=dict(prep.pruned),
        )
        prediction = predict_train(model, cluster, cfg, stages)
        plans.append(Plan(model=model, cluster=cluster, config=cfg, stages=stages, prediction=prediction, solver=stats))
        built.model.add(built.candidates[index].selected == 0)
        returned.add(index)
        if len(plans) >= len(tables):
            break
    return plans
