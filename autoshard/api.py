"""The public Python API: build jobs, solve for the best plans, evaluate a given plan.

    import autoshard
    model = autoshard.load_model("llama-3.1-70b")
    cluster = autoshard.load_cluster("dgx-h100").with_gpus(64)
    plans = autoshard.solve(model, cluster, autoshard.train_job(model, seq_len=8192))
    print(plans[0].to_json()["predicted"]["mfu"])
"""

from __future__ import annotations

import dataclasses
import functools

from autoshard.costmodel.bands import band_for, mark_ties
from autoshard.costmodel.train.step import Stage, TrainConfig, predict_train
from autoshard.emit.megatron.script import megatron_command
from autoshard.emit.megatron.parse import LayoutFlags, default_stages, layout_stages, predict_layout
from autoshard.errors import SpecError
from autoshard.parallel import Fp8Recipe, MoeDispatcher, ParallelDims, Recompute, check_dims
from autoshard.plans.train import Plan, SolverStats
from autoshard.search.train.solve import SolverOptions, solve_train
from autoshard.search.train.space import Pins, check_moe_fp8_knobs, dispatcher_for, expert_grid_hint, fp8_recipe_for
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import Precision, TrainJob
from autoshard.specs.loader import validate
from autoshard.specs.model import ModelSpec, PositionKind

__all__ = ["train_job", "solve", "evaluate", "even_stages", "megatron_layout", "expert_grid_hint", "with_launch", "resize",
           "check_precision"]


def train_job(
    model: ModelSpec,
    *,
    seq_len: int | None = None,
    global_batch_size: int | None = None,
    precision: str | Precision | None = None,
    tokens: float | None = None,
) -> TrainJob:
    """A TrainJob from the model's `training:` defaults, overridden by the given values."""
    defaults = model.training
    data: dict = {}
    if defaults is not None:
        for key in ("seq_len", "global_batch_size", "precision", "tokens"):
            value = getattr(defaults, key)
            if value is not None:
                data[key] = value
    for key, value in (("seq_len", seq_len), ("global_batch_size", global_batch_size),
                       ("precision", precision), ("tokens", tokens)):
        if value is not None:
            data[key] = value
    job = validate(TrainJob, data, source=f"training job for {model.name}")
    if model.position_embedding is PositionKind.LEARNED and job.seq_len > model.max_position_embeddings:
        raise SpecError(f"sequence length {job.seq_len} is longer than the {model.max_position_embeddings} learned "
                        f"position embeddings of {model.name}: use --seq-len {model.max_position_embeddings} or less, or "
                        "raise max_position_embeddings in the model file", source="--seq-len")
    return job


def resize(cluster: ClusterSpec, gpus: int | None) -> ClusterSpec:
    if gpus is None:
        return cluster
    try:
        return cluster.with_gpus(gpus)
    except ValueError as exc:
        raise SpecError(f"{exc}", source="--gpus", field=None) from None


def with_launch(plan: Plan) -> Plan:
    """The plan with its Megatron-LM launch command attached (training plans). A plan that does not fit
    gets none: a command that would run out of memory is not printed as runnable."""
    if not plan.prediction.fits:
        return dataclasses.replace(plan, launch={k: v for k, v in plan.launch.items() if k != "megatron"})
    return dataclasses.replace(plan, launch={**plan.launch, "megatron": megatron_command(plan)})


def check_precision(cluster: ClusterSpec, precision: Precision, *, source: str = "--precision") -> None:
    """FP8 training needs FP8 tensor cores (Hopper, Ada, Blackwell, MI300): refuse it where a pool has none."""
    if precision is not Precision.FP8:
        return
    lacking = [p.gpu.name for p in cluster.pools if p.gpu.fp8_tflops is None]
    if lacking:
        raise SpecError(f"FP8 needs FP8 tensor cores and {', '.join(dict.fromkeys(lacking))} has none (no fp8_tflops "
                        f"in {cluster.name}): train in bf16", source=source)


def solve(
    model: ModelSpec, cluster: ClusterSpec, job: TrainJob, *, pins: Pins = Pins(), options: SolverOptions = SolverOptions()
) -> list[Plan]:
    """The best training plans (best first), each with its launch command and prediction band
    (runner-ups marked statistically tied with the best or not)."""
    check_precision(cluster, job.precision)
    return mark_ties([with_launch(p) for p in solve_train(model, cluster, job, pins=pins, options=options)])


def even_stages(model: ModelSpec, *, pp: int, vpp: int = 1, recompute_num_layers: int = 0) -> tuple[Stage, ...]:
    """Megatron-LM's default layout: decoder layers split evenly over pp*vpp chunks, the embedding
    with the first chunk and the output layer with the last. SpecError when they do not divide."""
    chunks = pp * vpp
    if model.num_layers % chunks:
        raise SpecError(
            f"{model.num_layers} decoder layers do not split evenly over PP {pp} x VPP {vpp} = {chunks} chunks "
            "(Megatron's default layout needs num_layers divisible by PP x VPP): pick a PP/VPP that divides "
            "it, or let `autoshard solve` choose an uneven layout",
            source="--pp",
        )
    return default_stages(model, pp=pp, vpp=vpp, recompute_num_layers=recompute_num_layers)


def megatron_layout(
    model: ModelSpec, *, pp: int, vpp: int = 1, flags: LayoutFlags | None = None, recompute_num_layers: int = 0
) -> tuple[tuple[Stage, ...], int, str | None]:
    """(stages, VPP, note) of the layout Megatron-LM builds from these flags. Without flags, when the
    decoder layers do not split evenly over PP x VPP, the layout Megatron-LM would need (see
    `predict_layout`), with a note naming the flags that produce it."""
    note = None
    if flags is None or not flags.given():
        if model.num_layers % (pp * vpp):
            flags = predict_layout(model, pp=pp, vpp=vpp)
            note = (f"{model.num_layers} decoder layers do not split evenly over PP {pp} x VPP {vpp}: Megatron-LM "
                    f"needs a layout flag; predicted with {flags.describe()}")
        else:
            flags = LayoutFlags()
    stages, vpp = layout_stages(model, pp=pp, vpp=vpp, flags=flags, recompute_num_layers=recompute_num_layers)
    return stages, vpp, note


def evaluate(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: TrainJob,
    *,
    tp: int,
    pp: int,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    vpp: int = 1,
    dp: int | None = None,
    micro_batch_size: int = 1,
    recompute: Recompute = Recompute.NONE,
    recompute_num_layers: int = 0,
    sequence_parallel: bool = True,
    zero_stage: int = 1,
    stages: tuple[Stage, ...] | None = None,
    layout: LayoutFlags | None = None,
    recompute_modules: tuple[str, ...] = (),
    tp_comm_overlap: bool | None = None,
    overlap_grad_reduce: bool = True,
    moe_dispatcher: MoeDispatcher | None = None,
    fp8_recipe: Fp8Recipe | None = None,
) -> Plan:
    """Predict a plan the user already has: `stages`, else the layout Megatron-LM builds from `layout`
    (its layout flags), else its even split, else (layers that do not divide) the layout it would need.
    `tp_comm_overlap` defaults to on wherever sequence parallelism makes it possible. The MoE dispatcher
    and FP8 recipe default to what the solver would pick (search.space.dispatcher_for, fp8_recipe_for)."""
    check_precision(cluster, job.precision)
    if recompute is Recompute.SELECTIVE and recompute_num_layers:
        from autoshard.search.train.space import SELECTIVE_AND_BLOCK

        raise SpecError(SELECTIVE_AND_BLOCK, source="--recompute-num-layers")
    if stages is None:
        stages, vpp, _ = megatron_layout(model, pp=pp, vpp=vpp, flags=layout,
                                         recompute_num_layers=recompute_num_layers)
    gpus = cluster.num_gpus
    if gpus % (tp * cp * pp):
        raise SpecError(f"TP x CP x PP = {tp * cp * pp} does not divide the {gpus} GPUs: change the degrees or --gpus",
                        source="--tp/--cp/--pp")
    world_dp = gpus // (tp * cp * pp)
    if dp is not None and dp != world_dp:
        raise SpecError(f"DP {dp} x TP {tp} x CP {cp} x PP {pp} = {dp * tp * cp * pp} but the cluster has {gpus} GPUs: "
                        f"use --dp {world_dp} or --gpus {dp * tp * cp * pp}", source="--dp")
    try:
        dims = ParallelDims(tp=tp, pp=pp, dp=world_dp, cp=cp, ep=ep, etp=etp, vpp=vpp)
    except ValueError as exc:
        hint = expert_grid_hint(model, tp=tp, cp=cp, dp=world_dp, ep=ep, etp=etp) if "expert grid" in str(exc) else ""
        raise SpecError(f"{exc}{hint}", source="parallel degrees") from None
    problems = check_dims(dims, model, seq_len=job.seq_len, precision=job.precision)
    if problems:
        raise SpecError("; ".join(problems), source="parallel degrees")
    if zero_stage >= 2 and pp > 1:
        raise SpecError("ZeRO-2/3 (Megatron-FSDP) needs PP 1 (it shards over DP, with or without EP)",
                        source="--zero-stage")
    check_moe_fp8_knobs(model, cluster, job, moe_dispatcher, fp8_recipe)
    try:
        cfg = TrainConfig(
            dims=dims, micro_batch_size=micro_batch_size, global_batch_size=job.global_batch_size, seq_len=job.seq_len,
            precision=job.precision, recompute=recompute, sequence_parallel=sequence_parallel, zero_stage=zero_stage,
            optimizer=job.optimizer,
            tp_comm_overlap=(sequence_parallel and tp > 1) if tp_comm_overlap is None else tp_comm_overlap,
            overlap_grad_reduce=overlap_grad_reduce,
            recompute_modules=recompute_modules if recompute is Recompute.SELECTIVE else (),
            moe_dispatcher=moe_dispatcher or dispatcher_for(model, cluster, dims, job.seq_len),
            fp8_recipe=fp8_recipe_for(model, cluster, fp8_recipe),
        )
    except ValueError as exc:
        raise SpecError(f"{exc}: change --mbs or --global-batch-size", source="--mbs/--global-batch-size") from None
    prediction = predict_train(model, cluster, cfg, stages)
    stats = SolverStats(status="EVALUATED", wall_s=0.0, objective=prediction.step_time_s, bound=prediction.step_time_s)
    plan = Plan(model=model, cluster=cluster, config=cfg, stages=stages, prediction=prediction, solver=stats)
    return with_launch(dataclasses.replace(plan, band=band_for(plan)))


def solve_with_layout(
    model: ModelSpec, cluster: ClusterSpec, job: TrainJob, flags: LayoutFlags, *, pins: Pins = Pins(),
    options: SolverOptions = SolverOptions(),
) -> list[Plan]:
    """The best plans whose pipeline layout is the one Megatron-LM builds from `flags` (a layout string,
    first/last-stage layer counts or the account-for flags). The layout fixes PP (pinned) and VPP, so
    each candidate is predicted exactly on that layout, cheapest lower bound (`search.bounds.
    quick_lower_bound`) first, until no remaining bound can beat the top_k-th plan found: status
    OPTIMAL, or FEASIBLE with that bound when the time limit stops it first."""
    from autoshard.search.train.layout import solve_on_layout

    plans = solve_on_layout(model, cluster, job, functools.partial(megatron_layout, model, flags=flags), pins=pins,
                            options=options)
    plans = [with_launch(p) for p in plans]
    return mark_ties(plans)
