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

from autoshard.costmodel.train.types import TrainConfig
from autoshard.costmodel.train.a2a_overlap import a2a_overlap_problems
from autoshard.parallel import Fp8Recipe, MoeDispatcher, ParallelDims, Recompute, check_dims
from autoshard.costmodel.train.rules import config_problems, recompute_module_problems
from autoshard.search.deadline import Deadline
from autoshard.search.train.knobs import check_moe_fp8_knobs, fp8_recipe_for, moe_fp8_knobs
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import TrainJob
from autoshard.specs.model import ModelSpec

__all__ = ["Pins", "SpaceOptions", "Space", "enumerate_train", "divisors", "expert_grid_hint"]

PIN_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "recompute", "zero_stage", "sequence_parallel")


SELECTIVE_AND_BLOCK = (
    "Megatron-LM takes one --recompute-granularity: selective recompute cannot be combined with "
    "--recompute-num-layers (block full recompute of N layers per stage); use --recompute none "
    "--recompute-num-layers N, or --recompute selective alone"
)


def expert_grid_hint(model: ModelSpec, *, tp: int, cp: int, dp: int, ep: int, etp: int | None) -> str:
    """A fix for an expert grid (ETP x EP) that does not divide TP x CP x DP: the expert-TP sizes that
    make it legal (Megatron's --expert-tensor-parallel-size is independent of TP)."""
    dense = tp * cp * dp
    fits = [e for e in (1, 2, 4, 8) if e != (etp or tp) and dense % (e * ep) == 0]
    if fits:
        return f"; expert TP is independent of TP in Megatron-Core: --etp {fits[0]} makes it legal"
    eps = [e for e in range(ep, 0, -1) if model.moe and model.moe.num_experts % e == 0 and dense % ((etp or tp) * e) == 0]
    return f"; use a smaller --ep (e.g. {eps[0]})" if eps else ""


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
    recompute_modules: tuple[str, ...] | None = None
    """Megatron --recompute-modules for selective recompute (None: the default, the attention core)."""
    moe_dispatcher: MoeDispatcher | None = None
    """MoE token dispatcher; None: the cheapest for each plan's expert grid (dispatcher_for)."""
    fp8_recipe: Fp8Recipe | None = None
    """FP8 scaling recipe; None: mxfp8 on Blackwell, delayed elsewhere (default_fp8_recipe)."""
    moe_a2a_overlap: bool | None = None
    """Megatron's EP all-to-all overlap on every candidate that can run it, others pruned (None/False: off)."""

    def describe(self) -> str:
        items = [f"{k}={getattr(self, k)}" for k in (*PIN_FIELDS, "recompute_num_layers", "moe_dispatcher", "fp8_recipe",
                                                     "moe_a2a_overlap")
                 if getattr(self, k) is not None]
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
    if pins.recompute is Recompute.SELECTIVE and pins.recompute_num_layers:
        raise SpecError(SELECTIVE_AND_BLOCK, source="--recompute-num-layers")
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
    if pins.ep and pins.tp and pins.pp and not cluster.is_heterogeneous:
        cp_dp = cluster.num_gpus // (pins.tp * pins.pp) if cluster.num_gpus % (pins.tp * pins.pp) == 0 else 0
        grid, dense = (pins.etp or pins.tp) * pins.ep, pins.tp * cp_dp
        if dense and dense % grid:
            hint = expert_grid_hint(model, tp=pins.tp, cp=1, dp=cp_dp, ep=pins.ep, etp=pins.etp)
            raise SpecError(f"expert grid ETP x EP = {grid} must divide TP x CP x DP = {dense} (Megatron folds expert "
                            f"layers onto the same ranks){hint}", source="--ep/--etp")
    check_moe_fp8_knobs(model, cluster, job, pins.moe_dispatcher, pins.fp8_recipe)
    if model.moe is not None and (pins.tp or 1) > 1 and pins.sequence_parallel is False:
        raise SpecError(f"--tp {pins.tp} with --no-sequence-parallel: an MoE model needs sequence parallelism at TP > 1 "
                        "(Megatron-Core's MoE layer raises without it): drop one of them", source="--tp")
    sp_tp = (pins.tp or 1) * (pins.cp or 1)
    if (pins.tp or 1) > 1 and pins.sequence_parallel is not False and job.seq_len % sp_tp:
        raise SpecError(f"--tp {pins.tp}: sequence parallelism splits the {job.seq_len}-token sequence over CP x TP = "
                        f"{sp_tp}, which does not divide it: a --seq-len divisible by {sp_tp}, another --tp, or "
                        "--no-sequence-parallel (dense models)", source="--tp")
    if pins.recompute_modules and (problems := recompute_module_problems(
            model, pins.recompute_modules, job.precision, fp8_recipe_for(model, cluster, pins.fp8_recipe))):
        raise SpecError("; ".join(problems), source="--recompute-modules")
    if pins.moe_a2a_overlap:
        check_a2a_overlap_pins(model, pins)
    # pins that contradict each other or the model: bad input (exit 2), not an infeasible search
    if pins.vpp and pins.vpp > 1 and pins.pp == 1:
        raise SpecError(f"--vpp {pins.vpp} interleaves pipeline stages but --pp 1 has one stage: drop --vpp or "
                        "use --pp 2 or more", source="--vpp")
    if pins.etp and pins.etp > 1 and model.moe is None:
        raise SpecError(f"expert tensor parallelism (--etp {pins.etp}) needs a mixture-of-experts model; "
                        f"{model.name} is dense: drop --etp", source="--etp")
    if (pins.zero_stage or 0) >= 2 and (pins.pp or 1) > 1:
        raise SpecError(f"ZeRO-{pins.zero_stage} (Megatron-FSDP) needs PP 1 (it shards over DP, with or without EP): "
                        "drop --zero-stage or the --pp pin", source="--zero-stage")
    if pins.recompute_num_layers:
        chunks = (pins.pp or 1) * (pins.vpp or 1)
        most = model.num_layers - (chunks - 1)
        if pins.recompute_num_layers > most:
            raise SpecError(f"--recompute-num-layers {pins.recompute_num_layers} is more than the decoder layers a "
                            f"pipeline stage can hold (at most {most} of {model.num_layers} over {chunks} chunks)",
                            source="--recompute-num-layers")
    product = (pins.tp or 1) * (pins.cp or 1) * (pins.pp or 1) * (pins.dp or 1)
    if not cluster.is_heterogeneous and cluster.num_gpus % product:
        raise SpecError(f"the pinned degrees multiply to {product}, which does not divide the {cluster.num_gpus} GPUs: "
                        "change them or --gpus", source="--tp/--cp/--pp/--dp")


def check_a2a_overlap_pins(model: ModelSpec, pins: Pins) -> None:
    """--moe-a2a-overlap against the other pins: what Megatron-Core would refuse whatever the solver picks
    (SpecError naming the flag; the candidates it could still refuse are pruned: a2a_overlap_problems)."""
    from autoshard.errors import SpecError

    rules = (
        (model.moe is None, f"{model.name} is dense, and the overlap hides the token dispatch of experts"),
        (pins.ep == 1, "--ep 1 leaves no expert-parallel traffic to overlap: drop --ep or pin EP > 1"),
        (pins.moe_dispatcher is MoeDispatcher.ALLGATHER, "it runs with the alltoall or flex dispatcher: drop "
                                                         "--moe-dispatcher allgather"),
        (pins.recompute is Recompute.FULL or bool(pins.recompute_num_layers), "Megatron refuses it with full "
         "recompute: use --recompute selective or none, no --recompute-num-layers"),
        ((pins.pp or 1) > 1 and pins.vpp == 1, f"with --pp {pins.pp} it needs the interleaved schedule: pin --vpp 2 "
                                               "or more, or drop --vpp"),
        ("moe" in (pins.recompute_modules or ()), "it cannot recompute the moe module: drop moe from "
                                                  "--recompute-modules (moe_act is allowed)"),
        (model.mtp_num_layers > 1, f"it takes at most one MTP layer, {model.name} has {model.mtp_num_layers}"),
    )
    for broken, problem in rules:
        if broken:
            raise SpecError(problem, source="--moe-a2a-overlap")


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
    domain = min(p.domain_fill_size for p in cluster.pools)
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
                                knobs = moe_fp8_knobs(model, cluster, dims, job, dispatcher=pins.moe_dispatcher,
                                                      recipe=pins.fp8_recipe, a2a_overlap=bool(pins.moe_a2a_overlap))
                                _add_batch_variants(space, dims, job, mbss, recomputes, zeros, pins, gbs, extra=knobs,
                                                    model=model)
    return space


def _add_batch_variants(
    space: Space, dims: ParallelDims, job: TrainJob, mbss: list[int], recomputes: list[Recompute],
    zeros: list[int], pins: Pins, gbs: int, extra: dict | None = None, model: ModelSpec | None = None,
) -> None:
    for mbs in mbss:
        if gbs % (mbs * dims.dp):
            space.prune("global batch not divisible by micro-batch x DP")
            continue
        m = gbs // (mbs * dims.dp)
        if dims.vpp > 1 and m % dims.pp:  # Megatron-Core refuses it (TrainConfig)
            space.prune("interleaving needs a multiple of PP micro-batches")
            continue
        for rc in recomputes:
            for zero in zeros:
                if dims.dp * dims.cp == 1 and zero > 0 and pins.zero_stage is None:
                    space.prune("ZeRO needs data parallelism")  # (a pinned ZeRO-1 at DP 1 is harmless)
                    continue
                if zero >= 2 and dims.pp > 1:
                    space.prune("ZeRO-2/3 (Megatron-FSDP) does not combine with PP")
                    continue
                sp = dims.tp > 1 if pins.sequence_parallel is None else (pins.sequence_parallel and dims.tp > 1)
                cfg = TrainConfig(
                    dims=dims, micro_batch_size=mbs, global_batch_size=gbs, seq_len=job.seq_len,
                    precision=job.precision, recompute=rc, sequence_parallel=sp, zero_stage=zero,
                    optimizer=job.optimizer, tp_comm_overlap=sp, overlap_grad_reduce=True, **(extra or {}),
                    recompute_modules=(pins.recompute_modules or ()) if rc is Recompute.SELECTIVE else (),
                )
                if cfg.moe_a2a_overlap and model is not None and (problems := a2a_overlap_problems(model, cfg)):
                    space.prune(f"the EP all-to-all overlap: {problems[0]}")  # pinned: Megatron refuses this plan
                    continue
                if model is not None and (rules := config_problems(model, cfg)):
                    space.prune(rules[0][0])  # Megatron refuses it at start-up (costmodel.train.rules)
                    continue
                space.candidates.append(cfg)
                space.enumerated += 1
