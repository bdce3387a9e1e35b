"""The MoE and FP8 knobs of a training plan that are chosen, not searched: the token dispatcher (the
cheapest one the cluster can run, per expert grid) and the FP8 recipe (the pinned one, else the model's,
else the cluster's default), and the checks of pinned ones against the model and the GPUs
(`costmodel.train.rules`)."""

from __future__ import annotations

import re
from functools import lru_cache

from autoshard.costmodel.train.rules import flex_dispatcher_problem, fp8_recipe_problem
from autoshard.parallel import Fp8Recipe, MoeDispatcher, ParallelDims
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import TrainJob
from autoshard.specs.model import ModelSpec

__all__ = ["check_moe_fp8_knobs", "default_fp8_recipe", "fp8_recipe_for", "dispatcher_for", "moe_fp8_knobs"]


def check_moe_fp8_knobs(
    model: ModelSpec, cluster: ClusterSpec, job: TrainJob, dispatcher: MoeDispatcher | None, recipe: Fp8Recipe | None,
) -> None:
    """--moe-dispatcher needs an MoE model, flex NVIDIA GPUs on NVLink; --fp8-recipe needs --precision fp8,
    blockwise Hopper or newer, mxfp8 Blackwell."""
    from autoshard.errors import SpecError
    from autoshard.specs.job import Precision

    if dispatcher is not None and model.moe is None:
        raise SpecError(f"--moe-dispatcher {dispatcher.value}: {model.name} has no experts (dense model): drop the option",
                        source="--moe-dispatcher")
    if recipe is not None and job.precision is not Precision.FP8:
        raise SpecError(f"--fp8-recipe {recipe.value} needs --precision fp8 (the plan trains in {job.precision.value})",
                        source="--fp8-recipe")
    if dispatcher is MoeDispatcher.FLEX and (problem := flex_dispatcher_problem(cluster)):
        raise SpecError(f"--moe-dispatcher flex: {problem}", source="--moe-dispatcher")
    if recipe is not None and (problem := fp8_recipe_problem(cluster, recipe)):
        raise SpecError(problem, source="--fp8-recipe")
    if recipe is Fp8Recipe.MXFP8 and default_fp8_recipe(cluster) is not Fp8Recipe.MXFP8:
        gpus = ", ".join(sorted({p.gpu.name for p in cluster.pools}))
        raise SpecError(f"--fp8-recipe mxfp8 needs Blackwell GPUs (block scaling in hardware), the cluster has {gpus}: "
                        "use delayed, tensorwise or blockwise", source="--fp8-recipe")


def default_fp8_recipe(cluster: ClusterSpec) -> Fp8Recipe:
    """MXFP8 where every pool is Blackwell or newer (hardware block scaling), delayed scaling elsewhere."""
    blackwell = all(re.match(r"^G?B[1-9]\d\d(?![0-9])", p.gpu.name.upper()) for p in cluster.pools)
    return Fp8Recipe.MXFP8 if blackwell else Fp8Recipe.DELAYED


def fp8_recipe_for(model: ModelSpec, cluster: ClusterSpec, pinned: Fp8Recipe | None = None) -> Fp8Recipe:
    """The FP8 recipe of a plan: the pinned one, else the one the model trains with (its `training.fp8_recipe`,
    e.g. DeepSeek-V3's blockwise), else the cluster's default (default_fp8_recipe)."""
    if pinned is not None:
        return pinned
    recipe = model.training.fp8_recipe if model.training is not None else None
    if recipe and fp8_recipe_problem(cluster, Fp8Recipe(recipe)) is None:
        return Fp8Recipe(recipe)
    return default_fp8_recipe(cluster)  # the model's recipe where the GPUs run it


def dispatcher_for(model: ModelSpec, cluster: ClusterSpec, dims: ParallelDims, seq_len: int, *,
                   a2a_overlap: bool = False) -> MoeDispatcher:
    """The cheapest MoE dispatcher for this expert grid. The dispatchers differ only in the bytes they
    move (memory and compute are the same), so the cheapest one dominates: pick it per plan instead
    of multiplying the candidates. Ties go to alltoall (no extra library needed). `a2a_overlap`: the
    EP all-to-all overlap runs with alltoall or flex only, so allgather is not a choice."""
    if model.moe is None or dims.ep * dims.expert_tp <= 1:
        return MoeDispatcher.ALLTOALL
    return _cheapest_dispatcher(model, cluster, seq_len / dims.cp / dims.tp, dims.ep, dims.expert_tp, a2a_overlap)


@lru_cache(maxsize=4096)
def _cheapest_dispatcher(model: ModelSpec, cluster: ClusterSpec, tokens: float, ep: int, etp: int,
                         a2a_overlap: bool = False) -> MoeDispatcher:
    """`dispatcher_for` on what it reads of the grid (the candidates of one solve share a few)."""
    from autoshard.costmodel.efficiency import training_pool
    from autoshard.costmodel.moe import GroupLimit, dispatch_time_s

    assert model.moe is not None
    pool = training_pool(min(cluster.pools, key=lambda p: p.node.domain_size))
    costs = {
        d: dispatch_time_s(d, tokens=tokens, hidden=model.hidden_size, top_k=model.moe.top_k,
                           num_experts=model.moe.num_experts, ep=ep, etp=etp, pool=pool,
                           limit=GroupLimit.of(model.moe))
        for d in (MoeDispatcher.ALLTOALL, MoeDispatcher.FLEX, MoeDispatcher.ALLGATHER)
        if not (a2a_overlap and d is MoeDispatcher.ALLGATHER)
        and not (d is MoeDispatcher.FLEX and flex_dispatcher_problem(cluster))  # DeepEP/HybridEP: NVLink only
    }
    return min(costs, key=costs.__getitem__)  # first of equals: alltoall


def moe_fp8_knobs(model: ModelSpec, cluster: ClusterSpec, dims: ParallelDims, job: TrainJob, *,
                  dispatcher: MoeDispatcher | None, recipe: Fp8Recipe | None, a2a_overlap: bool) -> dict:
    """The TrainConfig fields of these knobs: the pinned values, else the chosen ones."""
    return {
        "moe_dispatcher": dispatcher or dispatcher_for(model, cluster, dims, job.seq_len, a2a_overlap=a2a_overlap),
        "fp8_recipe": fp8_recipe_for(model, cluster, recipe),
        "moe_a2a_overlap": a2a_overlap,
    }
