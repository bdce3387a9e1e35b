"""The step budget (--max-num-batched-tokens) of vLLM engines on DeepEP's low-latency all-to-all.

vLLM 0.33.0 sizes that backend's buffer at the budget, per rank, and runs a step's MoE in one pass
through it (`costmodel.serve.ep_buffers.vllm_deepep_ll_cap`): DeepSeek-V3 holds 3.55 GiB at 256 tokens
and 113.8 GiB at 8,192. The budget is therefore a plan choice for these engines (aggregated engines and
decode instances; prefill instances run the high-throughput backend, whose buffer does not grow with
it): a decode instance takes the smallest budget its decode tokens allow (`vllm_deepep_ll_budget`); an
aggregated engine is tabulated at each budget of `LL_BUDGETS` (from vLLM's own default of 256 up to
8,192) that carries its steady-state step (`steady_step_tokens`: its decode tokens plus the prompt
tokens its requests bring per step; a smaller budget cannot keep the batch running), each priced with its buffer, its activation peak, its prefill chunks (TTFT) and the room
it leaves decode batches for prompt tokens, and the row keeps the best that meets the targets.

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import dataclasses
import math

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.disagg import MAX_PREFILL_UTILIZATION
from autoshard.costmodel.serve.ep_buffers import uses_deepep_low_latency, vllm_deepep_ll_budget
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec

__all__ = ["LL_BUDGETS", "ll_budget_choices", "ll_budgeted", "steady_step_tokens", "vllm_ll_engine"]

LL_BUDGETS = (256, 512, 1024, 2048, 4096, 8192)
"""Budgets tabulated for an aggregated vLLM DeepEP low-latency engine: 256 is vLLM's default for the
backend, 8,192 the `vllm serve` default on 70+ GiB GPUs that the other engines run."""


def vllm_ll_engine(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig) -> bool:
    """Whether `cfg` is a vLLM engine whose line passes `--all2all-backend deepep_low_latency` (an
    aggregated engine or a decode instance with expert parallelism over attention-DP ranks)."""
    return cfg.engine == "vllm" and cfg.role != "prefill" and uses_deepep_low_latency(model, gpu, cfg)


def steady_step_tokens(cfg: ServeConfig, job: ServeJob) -> int:
    """Tokens per DP rank one step of an aggregated engine must have room for at its full batch: each
    running request's decode tokens (1 + MTP drafts) plus the prompt tokens a request brings per step
    of its life (input_len / output_len each; `predict.predict_serve`'s mixed step), per pipeline
    micro-batch, the prompt share at most MAX_PREFILL_UTILIZATION of the room left for it (the
    split's prefill rule: a prompt lane run at 100 % queues without bound, and a budget sized exactly
    at the steady step priced TTFTs of tens of seconds)."""
    per_mb = cfg.max_num_seqs / cfg.pp
    prompts = per_mb * job.input_len / job.output_len / MAX_PREFILL_UTILIZATION
    return math.ceil(per_mb * (1 + cfg.speculative_tokens) + prompts - 1e-9)


def ll_budgeted(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig, job: ServeJob, *,
                given: int | None = None) -> ServeConfig:
    """`cfg` with the smallest budget it is tabulated at where it is a vLLM DeepEP low-latency engine and
    no budget was `given` (a decode instance: `vllm_deepep_ll_budget` of its decode tokens; an aggregated
    engine: the first of `LL_BUDGETS` that carries `steady_step_tokens`, past 8,192 that rounded up to
    256); else unchanged."""
    if given is not None or not vllm_ll_engine(model, gpu, cfg):
        return cfg
    budget = vllm_deepep_ll_budget(cfg.max_num_seqs, cfg.speculative_tokens)
    if cfg.role == "aggregated":
        need = steady_step_tokens(cfg, job)
        budget = next((b for b in LL_BUDGETS if b >= max(need, cfg.max_num_seqs)), vllm_deepep_ll_budget(need))
    return dataclasses.replace(cfg, max_num_batched_tokens=budget)


def ll_budget_choices(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig) -> list[ServeConfig]:
    """The budgets tabulated for `cfg` (as `ll_budgeted` set it): an aggregated vLLM DeepEP low-latency
    engine at that budget and every larger one of `LL_BUDGETS`; any other engine as it is."""
    if cfg.role != "aggregated" or not vllm_ll_engine(model, gpu, cfg):
        return [cfg]
    low = cfg.max_num_batched_tokens
    return [cfg] + [dataclasses.replace(cfg, max_num_batched_tokens=b) for b in LL_BUDGETS if b > low]
