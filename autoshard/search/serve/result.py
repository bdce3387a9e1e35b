"""Serving plans from what the solver chose: the xPyD plan with its figures recomputed in floats
(each role at the load it is planned to take), and the one sentence on why aggregated or
disaggregated serving won."""

from __future__ import annotations

import dataclasses

from autoshard.costmodel.serve.compute import BLOCK_FP8_GPUS, block_scaled_fp8
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.disagg import disagg_ttft_s
from autoshard.costmodel.serve.fused_moe import DEEP_GEMM_ROWS, deep_gemm_shape, runs_fused_moe
from autoshard.costmodel.serve.predict import ServePrediction
from autoshard.plans.base import SolverStats
from autoshard.plans.disagg import Disaggregation, Role
from autoshard.plans.serve import ServePlan
from autoshard.search.serve.disagg import DecodeRow, PrefillRow, transfer_for
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec

__all__ = ["choice", "with_choice", "disagg_serve_plan", "reconcile_interactive"]


def with_choice(job: ServeJob, best: ServePlan, other: ServePlan | None) -> ServePlan:
    """`best` (the auto mode's pick) with its `choice` sentence. When the time limit cut its search short
    (not OPTIMAL) and `other`, the best plan of the other kind, beats it, `other` is the plan: with
    `best`'s certificate (FEASIBLE, its bound, what was cut) and `other`'s objective."""
    sign = 1 if job.request_rate is None else -1
    if (other is not None and best.solver.status != "OPTIMAL"
            and sign * other.solver.objective > sign * best.solver.objective):
        stats = dataclasses.replace(best.solver, objective=other.solver.objective)
        best, other = dataclasses.replace(other, solver=stats), best
    return dataclasses.replace(best, choice=choice(job, best, other))


def reconcile_interactive(plans: list[ServePlan], alternative: ServePlan, interactive: ServeJob,
                          note: str) -> tuple[list[ServePlan], ServePlan, str]:
    """The interactive plan and the throughput-optimal alternative compared, for when the time limit cut one
    of their solves short: an alternative that meets the interactive TPOT with more throughput is the
    answer (a cut interactive solve printed a 1P1D at 22,571 tokens/s beside an 'alternative' at 90,284
    that met the SLA), and an interactive plan faster than the alternative is the throughput-optimal one
    too."""
    best = plans[0]
    sla_ok = dataclasses.replace(alternative, job=interactive)
    if sla_ok.meets_targets() and alternative.throughput_tokens_per_s > best.throughput_tokens_per_s:
        return ([sla_ok, *plans[:-1]] if len(plans) > 1 else [sla_ok]), alternative, (
            note + "; the throughput-optimal plan meets it with more throughput than the interactive solve found "
            "within the time limit: it is the answer")
    if best.throughput_tokens_per_s > alternative.throughput_tokens_per_s:
        return plans, best, note  # the throughput-optimal solve was cut short: the interactive plan beats it
    return plans, alternative, note


def choice(job: ServeJob, best: ServePlan, other: ServePlan | None) -> str:
    """One sentence: which kind won and by how much, or why the other kind had no plan."""
    kind = "disaggregated" if best.disaggregated else "aggregated"
    other_kind, verb = ("aggregated replicas", "need") if best.disaggregated else ("a prefill/decode split", "needs")
    if other is None:
        return f"{kind}: no plan with {other_kind} meets the targets on these GPUs"

    def figures(p: ServePlan) -> str:
        return f"TPOT {1e3 * p.prediction.tpot_s:.1f} ms, TTFT {p.ttft_s:.2f} s"

    if job.request_rate is not None:
        return (
            f"{kind}: {best.num_gpus} GPUs sustain {job.request_rate:g} req/s ({figures(best)}); "
            f"{other_kind} {verb} {other.num_gpus} ({other.describe()}; {figures(other)})"
        )
    a = best.throughput_tokens_per_s / best.cluster.num_gpus
    b = other.throughput_tokens_per_s / other.cluster.num_gpus
    split = best if best.disaggregated else other
    pre = split.role("prefill")
    idle = split.cluster.num_gpus - split.num_gpus
    cost = (
        f"the split gives {pre.gpus} of {split.num_gpus} GPUs to prefill ({100 * pre.utilization:.0f}% busy)"
        + (f" and leaves {idle} idle" if idle else "")
    )
    if best.disaggregated:
        reason = f"its decode steps carry no prefill chunks, which outweighs the cost: {cost}"
    else:
        reason = f"chunked prefill inside each engine costs less than the split: {cost}"
    return (
        f"{kind}: {a:,.0f} output tokens/s per GPU ({figures(best)}) vs {b:,.0f} for the best plan with "
        f"{other_kind} ({other.describe()}; {figures(other)}); {reason}"
    )



def deep_gemm_warning(model: ModelSpec, cfg: ServeConfig, gpu_name: str, *, role: str = "") -> str | None:
    """The warning for an engine whose block-FP8 experts are priced on DeepGEMM (vLLM 0.33.0's expert-
    parallel engines, whose FlashInfer CUTLASS kernel is priced so, or SGLang's DeepGEMM runner: Hopper,
    shapes it takes), which vLLM's TP-sharded experts and SGLang's default TP MoE path do not run; None
    for every other engine."""
    if not (model.moe is not None and cfg.deep_gemm and runs_fused_moe(cfg) and deep_gemm_shape(model, cfg)
            and block_scaled_fp8(model, cfg.weight_dtype) and any(t in gpu_name for t in BLOCK_FP8_GPUS)):
        return None
    whose = f"the {role} instances' " if role else "the "
    if cfg.engine == "sglang":
        return (f"{whose}block-FP8 experts' steps of {DEEP_GEMM_ROWS}+ tokens are priced on DeepGEMM (SGLang's "
                "DeepGEMM MoE runner, as its launch line selects it); its default runner is Triton's fused_moe")
    return (f"{whose}block-FP8 experts' steps of {DEEP_GEMM_ROWS}+ tokens are priced on DeepGEMM, the nearest "
            "kernel modelled to the FlashInfer CUTLASS grouped GEMM vLLM 0.33.0 runs for expert-parallel block-FP8 "
            "experts on Hopper (no measurement of it is at hand); its TP-sharded experts and SGLang's TP MoE path "
            "run Triton's fused_moe (--target sglang and evaluate --from-sglang price that)")


def _decode_at_load(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, drow: DecodeRow, rate: float):
    """The decode instance at the fewest running requests that sustain `rate` requests/s (Little's
    law with TPOT growing with the batch): below capacity it runs a smaller batch, so a lower TPOT
    than at its max_num_seqs. Its config (max_num_seqs) stays the planned cap."""
    from autoshard.costmodel.serve.disagg import decode_instance

    full = drow.instance
    if rate >= full.requests_per_s * (1 - 1e-9):
        return full
    pool = cluster.pools[drow.engine.pool]
    lo, hi = 1, full.concurrency  # hi sustains the rate
    while lo < hi:
        mid = (lo + hi) // 2
        if (
            decode_instance(model, pool, job, full.config, full.memory, concurrency=mid).requests_per_s
            >= rate
        ):
            hi = mid
        else:
            lo = mid + 1
    return decode_instance(model, pool, job, full.config, full.memory, concurrency=lo)



def disagg_serve_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    prow: PrefillRow,
    drow: DecodeRow,
    x: int,
    y: int,
    same_domain: bool,
    stats: SolverStats,
    served: float,
    warnings: tuple[str, ...] = (),
) -> ServePlan:
    """The ServePlan of a chosen xPyD deployment, its figures recomputed in floats. `served`: the
    requests/s it is planned to take (at most what either role sustains at its planned load). No
    launch commands: the caller attaches them."""
    pi, di = prow.instance, drow.instance
    transfer = transfer_for(model, cluster, job, prow, drow, same_domain=same_domain)
    load = min(served, y * di.requests_per_s, x * pi.requests_per_s * prow.utilization)
    if job.request_rate is not None:
        load = min(load, job.request_rate)
    util = load / (x * pi.requests_per_s)
    di = _decode_at_load(model, cluster, job, drow, load / y)
    ttft = disagg_ttft_s(pi, transfer, di.tpot_s, util)
    prefill_pred = ServePrediction(
        config=pi.config,
        concurrency=pi.config.max_num_seqs,
        memory=pi.memory,
        decode=pi.step,
        prefill=pi.prompt,
        tpot_s=pi.step.total_s,
        ttft_s=ttft,
        throughput_tokens_per_s=pi.requests_per_s,
        input_len=job.input_len,
        output_len=job.output_len,
    )
    decode_pred = ServePrediction(
        config=di.config,
        concurrency=di.concurrency,
        memory=di.memory,
        # per output token: an MTP step keeps several tokens, its breakdown is shared among them
        decode=di.step.scaled(di.tpot_s / di.step.total_s) if di.config.speculative_tokens else di.step,
        prefill=pi.prompt,
        tpot_s=di.tpot_s,
        ttft_s=ttft,
        throughput_tokens_per_s=di.throughput_tokens_per_s,
        input_len=job.input_len,
        output_len=job.output_len,
    )
    roles = tuple(
        Role(
            role=name,
            instances=n,
            tp=e.tp,
            pp=e.pp,
            ep=e.ep,
            attention_dp=e.dp_attention,
            max_num_seqs=pred.config.max_num_seqs,
            max_num_batched_tokens=pred.config.max_num_batched_tokens,
            gpu_memory_utilization=pred.config.gpu_memory_utilization,
            prediction=pred,
            requests_per_s=rate,
            utilization=u,
            pool_index=e.pool,
        )
        for name, n, e, pred, rate, u in (
            ("prefill", x, prow.engine, prefill_pred, pi.requests_per_s, util),
            (
                "decode",
                y,
                drow.engine,
                decode_pred,
                drow.instance.requests_per_s,
                load / (y * drow.instance.requests_per_s),
            ),
        )
    )
    for name, row, cfg in (("prefill", prow, pi.config), ("decode", drow, di.config)):
        note = deep_gemm_warning(model, cfg, cluster.pools[row.engine.pool].gpu.name, role=name)
        if note is not None:
            warnings = (*warnings, note)
    e = drow.engine
    return ServePlan(
        model=model,
        cluster=cluster,
        job=job,
        tp=e.tp,
        pp=e.pp,
        dp=e.dp_attention if e.expert_parallel else 1,
        ep=e.ep,
        gpu_memory_utilization=di.config.gpu_memory_utilization,
        max_num_seqs=di.config.max_num_seqs,
        max_num_batched_tokens=di.config.max_num_batched_tokens,
        prediction=decode_pred,
        solver=stats,
        pool_index=e.pool,
        warnings=warnings,
        roles=roles,
        disaggregation=Disaggregation(
            throughput_tokens_per_s=load * job.output_len,
            ttft_s=ttft,
            transfer=transfer,
            ttft_p90_s=disagg_ttft_s(pi, transfer, di.tpot_s, util, q=0.9),
        ),
    )
