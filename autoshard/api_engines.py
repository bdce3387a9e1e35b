"""The other engine's figures of a serving plan (`api_serve.with_engine_check`): the same deployment
priced as the other engine's own launch line runs it, and the plan as each engine's lines run it
(`launched_by`: an SGLang plan's vLLM lines on DeepEP's low-latency kernels run the step budget the
vLLM planner would choose, `search.serve.budget`)."""

from __future__ import annotations

import dataclasses

from autoshard.costmodel.serve.disagg import decode_instance, prefill_instance
from autoshard.costmodel.serve.engines import engine_config, sglang_priced
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.predict import ServePrediction
from autoshard.emit.sglang import runs_deepep, sglang_deepep_seqs
from autoshard.errors import InfeasibleError
from autoshard.plans.serve import ServePlan
from autoshard.search.serve.budget import ll_budget_choices, ll_budgeted
from autoshard.search.serve.evaluate import evaluated_row
from autoshard.search.serve.ladder import best_row, row_objective
from autoshard.search.serve.space import TIE_SCALE, Row

__all__ = ["ENGINE_SAME_REL", "launched_by", "vllm_budget_row", "sglang_priced_plan", "pct", "engine_figures",
           "aggregated_on", "split_figures", "split_on"]


ENGINE_SAME_REL = 0.005
"""Figures within 0.5 % of each other are reported as the same under both engines."""


def launched_by(plan: ServePlan, engine: str) -> ServePlan:
    """The plan as `engine`'s launch lines run it: an aggregated plan priced for the other engine with
    the vLLM budget `with_engine_check` chose (`engine_other["max_num_batched_tokens"]`), else itself."""
    other = plan.engine_other or {}
    budget = other.get("max_num_batched_tokens")
    if plan.disaggregated or other.get("engine") != engine or budget is None:
        return plan
    return dataclasses.replace(plan, max_num_batched_tokens=budget)


def vllm_budget_row(plan: ServePlan) -> Row | None:
    """For an aggregated plan priced for SGLang whose vLLM line runs DeepEP's low-latency kernels: the
    vLLM row of the same deployment (degrees, batch cap, running requests) at the budget the vLLM
    planner keeps: of the budgets tabulated for it (`ll_budget_choices`), the rows whose KV cache holds
    the batch and that sustain the request rate, chosen as the planner's rows choose theirs
    (`search.serve.ladder.best_row` over `row_objective`: first those that meet the targets, then the
    highest throughput); None for any other plan, or where no budget holds the batch (then
    `aggregated_on` prices the plan's own budget)."""
    if plan.disaggregated or plan.prediction.config.engine != "sglang":
        return None
    pool = plan.pool
    cfg = engine_config(dataclasses.replace(plan.prediction.config, role="aggregated"), "vllm",
                        gpus_per_node=pool.node.gpus_per_node, gpu=pool.gpu)
    choices = ll_budget_choices(plan.model, pool.gpu, ll_budgeted(plan.model, pool.gpu, cfg, plan.job))
    if choices == [cfg]:
        return None  # not a vLLM DeepEP low-latency engine: its line runs the plan's budget
    seqs = plan.max_num_seqs
    per_rank = min(plan.prediction.concurrency, seqs)
    rows: list[Row | None] = []
    for c in choices:
        try:
            row, _, _ = evaluated_row(
                plan.model, plan.cluster, plan.job, tp=plan.tp, pp=plan.pp, dp=plan.dp,
                expert_parallel=plan.expert_parallel, gpu_memory_utilization=plan.gpu_memory_utilization,
                max_num_seqs=seqs, max_num_batched_tokens=c.max_num_batched_tokens, pool=plan.pool_index,
                concurrency=per_rank * plan.dp, framework="vllm")
        except InfeasibleError:
            continue
        rate = plan.job.request_rate
        if row.prediction.concurrency < per_rank or (rate is not None and row.prediction.requests_per_s < rate):
            continue
        rows.append(dataclasses.replace(row, objective=row_objective(
            plan.job, plan.cluster.num_gpus, row.gpus, row.throughput, TIE_SCALE)))
    return best_row(plan.job, rows)


def sglang_priced_plan(plan: ServePlan) -> bool:
    """Whether SGLang's launch lines of this deployment run paths autoshard prices (`sglang_priced`)."""
    if plan.disaggregated:
        pools = plan.cluster.pools
        return all(sglang_priced(r.prediction.config, pools[r.pool_index].node.gpus_per_node, split=True,
                                 gpu=pools[r.pool_index].gpu)
                   for r in plan.roles)
    return sglang_priced(plan.prediction.config, plan.pool.node.gpus_per_node, gpu=plan.pool.gpu)


def pct(figures: dict[str, float], ours: dict[str, float], key: str) -> str:
    return f"{100 * (figures[key] / ours[key] - 1):+.1f} %"


def engine_figures(tokens_per_s: float, pred: ServePrediction) -> dict[str, float]:
    return {"tokens_per_s": tokens_per_s, "tpot_s": pred.tpot_s, "ttft_s": pred.ttft_s}


def aggregated_on(plan: ServePlan, engine: str) -> dict[str, float]:
    """Throughput, TPOT and TTFT of an aggregated plan's deployment launched with `engine` (SGLang's
    DeepEP line runs at most the requests its low-latency buffer holds: `sglang_deepep_seqs`)."""
    seqs = sglang_deepep_seqs(plan) if engine == "sglang" and runs_deepep(plan) else plan.max_num_seqs
    row, _, _ = evaluated_row(
        plan.model, plan.cluster, plan.job, tp=plan.tp, pp=plan.pp, dp=plan.dp, expert_parallel=plan.expert_parallel,
        attention_dp=engine == "sglang" and plan.dp_attention > 1 and not plan.expert_parallel,  # TP experts
        gpu_memory_utilization=plan.gpu_memory_utilization, max_num_seqs=seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens, pool=plan.pool_index,
        concurrency=min(plan.prediction.concurrency, seqs) * plan.dp, framework=engine)
    return engine_figures(row.throughput, row.prediction)


def split_figures(plan: ServePlan) -> dict[str, float]:
    return {"prefill_requests_per_s": plan.role("prefill").requests_per_s,
            "decode_tpot_s": plan.role("decode").prediction.tpot_s}


def split_on(plan: ServePlan, engine: str) -> dict[str, float]:
    """A prefill/decode plan's prefill rate per instance and decode TPOT at its running requests, each
    role's instance launched with `engine`."""
    out = {}
    for role in plan.roles:
        pool = plan.cluster.pools[role.pool_index]
        cfg = engine_config(role.prediction.config, engine, gpus_per_node=pool.node.gpus_per_node, split=True,
                            gpu=pool.gpu)
        if engine == "vllm" and role.prediction.config.engine != "vllm":  # a vLLM decode instance's own budget
            cfg = ll_budgeted(plan.model, pool.gpu, cfg, plan.job)  # (emit.pd.vllm_role_plan: its line)
        mem = serve_memory(plan.model, pool, cfg, context_len=plan.job.context_len)
        if (problem := mem.problem()) is not None:
            raise InfeasibleError(f"the {role.role} instances: {problem}")
        if role.role == "prefill":
            out["prefill_requests_per_s"] = prefill_instance(plan.model, pool, plan.job, cfg, mem).requests_per_s
        else:
            out["decode_tpot_s"] = decode_instance(plan.model, pool, plan.job, cfg, mem,
                                                   concurrency=role.prediction.concurrency).tpot_s
    return out
