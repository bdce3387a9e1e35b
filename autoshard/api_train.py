"""Training helpers of the public API (re-exported by `autoshard.api`): pins, solver options, layout
flags and selective-recompute modules from plain values (what the command line hands over), and the
memory figures printed beside a plan (headroom left by --memory-fraction, the fixes for a plan that
does not fit)."""

from __future__ import annotations

import dataclasses
from typing import Any

from autoshard.costmodel.bands import band_of
from autoshard.costmodel.attention import FP8_ATTENTION_GPUS, check_fp8_attention_model, fp8_attention_table
from autoshard.costmodel.train.recompute import RECOMPUTE_MODULES
from autoshard.emit.megatron.layout import LayoutFlags
from autoshard.errors import SpecError
from autoshard.parallel import Fp8Recipe, MoeDispatcher, Recompute
from autoshard.plans.train import Plan
from autoshard.search.train.options import SolverOptions
from autoshard.search.train.space import Pins, SpaceOptions
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import Precision
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = ["train_pins", "recompute_modules", "layout_flags", "solver_options", "memory_headroom",
           "overflow_messages", "check_fp8_attention"]


def train_pins(tp: int | None = None, pp: int | None = None, dp: int | None = None, cp: int | None = None,
               ep: int | None = None, etp: int | None = None, vpp: int | None = None, mbs: int | None = None,
               recompute: str | None = None, recompute_num_layers: int | None = None, sp: bool | None = None,
               zero_stage: int | None = None, modules: tuple[str, ...] = (), moe_dispatcher: MoeDispatcher | None = None,
               fp8_recipe: Fp8Recipe | None = None, moe_a2a_overlap: bool | None = None) -> Pins:
    """Pins from the values given (None: the solver chooses); `recompute` by name (none/selective/full)."""
    return Pins(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs,
                recompute=Recompute(recompute) if recompute else None, zero_stage=zero_stage,
                sequence_parallel=sp, recompute_num_layers=recompute_num_layers, recompute_modules=modules or None,
                moe_dispatcher=moe_dispatcher, fp8_recipe=fp8_recipe, moe_a2a_overlap=moe_a2a_overlap)


def recompute_modules(text: str | None, recompute: str | None) -> tuple[tuple[str, ...], str | None]:
    """(modules, recompute mode by name) from --recompute-modules: selective recompute of those modules."""
    if text is None:
        return (), recompute
    modules = tuple(dict.fromkeys(m for m in text.replace(",", " ").split()))
    bad = [m for m in modules if m not in RECOMPUTE_MODULES]
    if bad or not modules:
        raise SpecError(f"--recompute-modules '{text}': unknown module(s) {', '.join(bad) or '(none given)'}; use "
                        f"a comma-separated list of {', '.join(RECOMPUTE_MODULES)}", source="--recompute-modules")
    if recompute is not None and recompute != "selective":
        raise SpecError(f"--recompute-modules is selective recompute; it contradicts --recompute {recompute}",
                        source="--recompute-modules")
    return (() if modules == ("core_attn",) else modules), "selective"


def layout_flags(layout: str | None = None, first: int | None = None, last: int | None = None,
                 account_embedding: bool = False, account_loss: bool = False) -> LayoutFlags:
    """Megatron-LM's pipeline layout flags (--pipeline-model-parallel-layout, first/last-stage layers,
    account-for-embedding/loss)."""
    return LayoutFlags(layout=layout, first=first, last=last, account_embedding=account_embedding,
                       account_loss=account_loss)


def solver_options(top: int, time_limit: float, workers: int, seed: int, verbose: bool, zero_stage: int | None,
                   started_at: float | None = None, *, memory_fraction: float | None = None) -> SolverOptions:
    """Solver options; ZeRO-2/3 (Megatron-FSDP) join the search only when a ZeRO stage is pinned;
    `memory_fraction` None keeps the default headroom."""
    zeros = (0, 1, 2, 3) if zero_stage is not None else (0, 1)
    options = SolverOptions(top_k=top, time_limit_s=time_limit, num_workers=workers, seed=seed, log=verbose,
                            space=SpaceOptions(zero_stages=zeros), started_at=started_at)
    if memory_fraction is not None:
        options = dataclasses.replace(options, memory_fraction=memory_fraction)
    return options


def memory_headroom(plan: Plan, fraction: float) -> dict[str, Any]:
    """How much of HBM the plan was allowed to fill, and what is left for the memory model's error."""
    pred = plan.prediction
    hbm, peak = pred.capacity_bytes / GIB, pred.peak_memory_bytes / GIB
    note = (f"planned to {fraction:.0%} of HBM: predicted peak {peak:.1f} of {hbm:.1f} GiB, {hbm - peak:.1f} GiB "
            f"headroom for the memory model's error (--memory-fraction changes it)")
    top = band_of(plan).memory_gib_peak[1]
    if top > hbm:  # the validated memory error reaches past HBM: the plan may not fit
        note += (f"; its likely peak reaches {top:.1f} GiB, more than the {hbm:.1f} GiB of HBM: it may run out of "
                 f"memory (a lower --memory-fraction keeps room)")
    return {"memory_fraction": fraction, "peak_gib": round(peak, 2), "hbm_gib": round(hbm, 2),
            "headroom_gib": round(hbm - peak, 2), "note": note}


def overflow_messages(plan: Plan) -> list[str]:
    """One line per pipeline rank over its GPU's memory: what it needs, has, and the fixes the plan
    does not already use."""
    pred = plan.prediction
    dims = plan.config.dims
    over = [(r, m, c) for r, (m, c) in enumerate(zip(pred.rank_memory_bytes, pred.rank_capacity_bytes, strict=True)) if m > c]
    # full recompute frees at most the activations: named only where that could cover the overflow (405B on 8
    # A100-40GB is 882 GiB over, nearly all model state, and was told to try --recompute full)
    worst = max((m - c for _, m, c in over), default=0.0)
    fixes = [] if plan.config.recompute.value == "full" or pred.memory.activations < worst else ["--recompute full"]
    if dims.dp > 1:  # PP from data-parallel replicas; without any, more PP needs more GPUs
        fixes.append("more PP")
    if dims.dp * dims.cp > 1:  # the optimizer state shards over DP x CP: nothing to shard over one replica
        if plan.config.zero_stage == 0:
            fixes.append("the distributed optimizer (--zero-stage 1)")
        elif plan.config.zero_stage < 3 and dims.pp == 1:
            fixes.append("Megatron-FSDP (--zero-stage 3)")
    fixes.append("more GPUs (--gpus)")
    tries = ", ".join(fixes[:-1]) + f" or {fixes[-1]}" if len(fixes) > 1 else fixes[0]
    return [f"pipeline rank {r} needs {m / GIB:.1f} GiB per GPU, has {c / GIB:.1f} GiB (over by {(m - c) / GIB:.1f} GiB); "
            f"try {tries}" for r, m, c in over]


def check_fp8_attention(model: ModelSpec, cluster: ClusterSpec, precision: Precision, *,
                        source: str = "fp8_attention") -> None:
    """FP8 attention (TrainConfig.fp8_attention: Transformer Engine's fp8_dot_product_attention under current
    scaling, NVTE_DPA_FP8_RECIPE=Float8CurrentScaling) runs inside an FP8 or FP4 recipe, and is priced only on
    GPUs whose cuDNN FP8 attention kernel NVIDIA measured, at the head dimension it was measured
    (costmodel.attention.FP8_ATTENTION_KERNELS)."""
    if not precision.quantized:
        raise SpecError("FP8 attention runs inside an FP8 or FP4 recipe: set the precision to fp8 or fp4, or keep "
                        "attention in BF16", source=source)
    lacking = [p.gpu.name for p in cluster.pools if fp8_attention_table(p.gpu.name) is None]
    if lacking:
        measured = f"{', '.join(FP8_ATTENTION_GPUS[:-1])} and {FP8_ATTENTION_GPUS[-1]}"
        raise SpecError(f"FP8 attention is priced from cuDNN's measured FP8 kernel, which exists for {measured} only, "
                        f"not {', '.join(dict.fromkeys(lacking))}: keep attention in BF16", source=source)
    try:
        check_fp8_attention_model(model)
    except ValueError as exc:
        raise SpecError(f"{exc}: keep attention in BF16", source=source) from None
