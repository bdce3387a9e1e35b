"""Serving candidate space: enumerate vLLM-legal engines (TP, PP, expert parallelism, attention DP)
with a reason for every candidate dropped, and tabulate each at a ladder of concurrencies with the
serving cost model, one `Row` per engine and concurrency with the replicas the objective implies.

`autoshard.search.serve.solve` solves the CP-SAT model (`search.serve.model`) over these rows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from autoshard.costmodel.serve.config import ServeConfig, stage_layers
from autoshard.costmodel.serve.engines import (
    DEFAULT_ENGINE, ENGINES, SGLANG_UNPRICED, engine_config, sglang_deepep_seqs, sglang_priced)
from autoshard.costmodel.serve.ep_buffers import VLLM_MOE_DP_CHUNK_SIZE
from autoshard.costmodel.serve.memory import ServeMemory, default_max_num_batched_tokens, serve_memory
from autoshard.costmodel.serve.predict import (
    ServePrediction, concurrency_ladder, kv_limited_concurrency, predict_serve)
from autoshard.costmodel.serve.step import StepTime, prefill_time
from autoshard.costmodel.serve.vllm_dp_moe import VLLM_DP_MOE_SPLIT, tp_experts_problem, vllm_dp_one_engine
from autoshard.costmodel.serve.weights import kv_cache_bytes_per_token_per_gpu
from autoshard.search.serve.budget import ll_budget_choices, ll_budgeted, vllm_ll_engine
from autoshard.search.deadline import Deadline
from autoshard.search.serve.ladder import (
    ENUM_TIME_CUT, ROWS_TIME_CUT, best_row, bisect_ladder, may_stop, row_objective, time_cut)
from autoshard.errors import SpecError
from autoshard.specs.cluster import ClusterSpec, PoolSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.layers import AttentionKind
from autoshard.specs.model import ModelSpec
from autoshard.units import time_to_us

__all__ = ["Engine", "ServeSpace", "Row", "enumerate_serve", "tabulate", "GPU_MEMORY_UTILIZATION", "MAX_CONCURRENCY",
           "TIE_SCALE", "SPLIT_DECODE_PP", "split_decode_rule", "promise_order"]

GPU_MEMORY_UTILIZATION = 0.90
"""The planner's vLLM --gpu-memory-utilization: vLLM's default is 0.92 (0.90 before); 0.90 leaves room
for the CUDA context and allocator slack outside vLLM's budget."""
MAX_CONCURRENCY = 1024
"""Largest --max-num-seqs tabulated (vLLM's default on 70+ GiB GPUs)."""
PP_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
DP_ATTENTION_CHOICES = (1, 2, 4, 8, 16, 32, 64)
TIE_SCALE = 1_000_000
PINNABLE = ("tp", "pp", "dp", "ep")


@dataclass(frozen=True, slots=True)
class Engine:
    pool: int
    tp: int
    pp: int
    dp_attention: int = 1
    expert_parallel: bool = False
    framework: str = "vllm"
    """The engine it is launched with and priced for (`costmodel.serve.engines`)."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp_attention

    @property
    def ep(self) -> int:
        return self.tp * self.dp_attention if self.expert_parallel else 1

    def label(self) -> str:
        ep = f" EP{self.ep} (attention DP{self.dp_attention})" if self.expert_parallel else ""
        ep = ep or (f" attention DP{self.dp_attention}, MoE TP{self.tp * self.dp_attention}" if self.dp_attention > 1 else "")
        return f"TP{self.tp} PP{self.pp}{ep}"


@dataclass(slots=True)
class ServeSpace:
    engines: list[Engine] = field(default_factory=list)
    pruned: list[tuple[str, str]] = field(default_factory=list)
    """(candidate, reason) for every candidate dropped."""
    enumerated: int = 0
    framework: str = DEFAULT_ENGINE
    """The engine every candidate is priced for."""
    closest: tuple[Engine, float, float, float] | None = None
    """The memory-pruned engine nearest to fitting: (engine, bytes per GPU it needs, bytes it has,
    KV-cache bytes per token per GPU)."""

    def reasons(self) -> Counter[str]:
        return Counter(reason for _, reason in self.pruned)


@dataclass(frozen=True, slots=True)
class Row:
    """One engine at one concurrency, deployed `replicas` times."""

    engine: Engine
    config: ServeConfig
    prediction: ServePrediction
    replicas: int
    objective: int
    tpot_us: int
    ttft_us: int

    @property
    def gpus(self) -> int:
        return self.engine.gpus * self.replicas

    @property
    def throughput(self) -> float:
        return self.prediction.throughput_tokens_per_s * self.replicas


# --------------------------------------------------------------------------- candidate space


def _tp_choices(domain: int) -> list[int]:
    powers = {2**k for k in range(8) if 2**k <= 2 * domain}
    return sorted(powers | {d for d in range(1, domain + 1) if domain % d == 0})


def _engine_rules(model: ModelSpec, pool: PoolSpec, e: Engine, *, check_size: bool = True,
                  cross_node_tp: bool = False) -> str | None:
    """vLLM's rules for one engine on one pool; the reason it is illegal, or None (`cross_node_tp`: TP past a domain is legal)."""
    heads, node = model.num_attention_heads, pool.node
    if heads % e.tp:
        return f"TP {e.tp} does not divide the {heads} attention heads"
    if model.attention is AttentionKind.GQA and model.kv_heads % e.tp and e.tp % model.kv_heads:
        return f"TP {e.tp} and the {model.kv_heads} KV heads must divide one another"
    if e.tp > node.domain_size and not cross_node_tp:
        return f"TP {e.tp} would leave the {node.domain_size}-GPU NVLink domain (TP stays inside one)"
    if e.pp > model.num_layers:
        return f"PP {e.pp} exceeds the {model.num_layers} decoder layers"
    if e.expert_parallel:
        assert model.moe is not None
        if e.ep < 2:
            return "expert parallelism needs TP x DP >= 2"
        if model.moe.num_experts % e.ep:
            return f"EP {e.ep} does not divide the {model.moe.num_experts} experts"
    if check_size and e.gpus > pool.num_gpus:
        return f"the engine needs {e.gpus} GPUs; pool '{pool.name}' has {pool.num_gpus}"
    per_node = node.gpus_per_node
    if pool.num_nodes > 1 and (
        (e.gpus < per_node and per_node % e.gpus) or (e.gpus > per_node and e.gpus % per_node)
    ):
        return f"an engine of {e.gpus} GPUs does not pack into {per_node}-GPU nodes"
    rank = e.tp * e.pp
    if e.gpus > per_node and e.dp_attention > 1 and per_node % rank and rank % per_node:
        return f"data-parallel ranks of TP x PP = {rank} GPUs do not pack into {per_node}-GPU nodes"
    return None


def _unpriced(pool: PoolSpec, e: Engine, *, split: bool | None) -> str | None:
    """Why `e` is left out for its framework: an SGLang engine whose launch line runs a path autoshard
    does not price (`costmodel.serve.engines.sglang_priced`), as an aggregated engine (`split` False), a
    prefill/decode instance (True) or both (None: left out only where neither is priced)."""
    if e.framework != "sglang":  # vLLM's DP with TP experts (`serve.vllm_dp_moe`): aggregated engines only
        return VLLM_DP_MOE_SPLIT if split and e.dp_attention > 1 and not e.expert_parallel else None
    cfg = ServeConfig(tp=e.tp, pp=e.pp, dp_attention=e.dp_attention, expert_parallel=e.expert_parallel,
                      engine=e.framework)
    per_node = pool.node.gpus_per_node
    if any(sglang_priced(cfg, per_node, split=s, gpu=pool.gpu) for s in ((False, True) if split is None else (split,))):
        return None
    return SGLANG_UNPRICED


SPLIT_DECODE_PP = ("a decode instance of a prefill/decode split runs without PP: vLLM's NixlConnector refuses "
                   "kv_consumer with pipeline parallelism and SGLang needs the decode PP to be 1 or the prefill's")


def split_decode_rule(e: Engine) -> str | None:
    """Why `e` cannot decode in a split (vLLM 0.33.0 nixl/base_worker.py:884-890; SGLang 0.5.23 conn.py:1515)."""
    return SPLIT_DECODE_PP if e.pp > 1 else None


def _pinned_out(e: Engine, pins: dict[str, int], one_engine: bool = False) -> str | None:
    if "tp" in pins and e.tp != pins["tp"]:
        return f"pinned tp={pins['tp']}"
    if "pp" in pins and e.pp != pins["pp"]:
        return f"pinned pp={pins['pp']}"
    if "ep" in pins and e.ep != pins["ep"]:
        return f"pinned ep={pins['ep']}"
    if "dp" in pins and (e.expert_parallel or e.dp_attention > 1 or one_engine) and e.dp_attention != pins["dp"]:
        return f"pinned dp={pins['dp']}"
    return None


def enumerate_serve(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    *,
    pins: dict[str, int] | None = None,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    framework: str = DEFAULT_ENGINE,
    deadline: Deadline | None = None,
) -> ServeSpace:
    """Every engine the framework rules allow, memory checked at the smallest batch; the rest with reasons (past
    `deadline`, once one engine exists: `ENUM_TIME_CUT`). Each is priced for `framework` (`costmodel.serve.engines`)."""
    if framework not in ENGINES:
        raise SpecError(f"the serving engine must be one of {', '.join(ENGINES)}, got {framework!r}",
                        field="--target")
    pins = dict(pins or {})
    bad = set(pins) - set(PINNABLE)
    if bad:
        raise SpecError(f"cannot pin {sorted(bad)} for serving; pin one of {', '.join(PINNABLE)}")
    space = ServeSpace(framework=framework)
    for pi, pool in enumerate(cluster.pools):
        for tp in _tp_choices(pool.node.domain_size):
            for pp in PP_CHOICES:
                options: list[tuple[int, bool]] = [(1, False)]
                if model.is_moe:
                    options += [(d, True) for d in DP_ATTENTION_CHOICES]
                    options += [(d, False) for d in DP_ATTENTION_CHOICES[1:]]  # TP experts over TP x DP
                for dpa, ep_on in options:
                    e = Engine(pi, tp, pp, dpa, ep_on, framework)
                    if e.gpus > 2 * pool.num_gpus and (tp > 1 or pp > 1 or dpa > 1):
                        continue  # far beyond the pool: not a candidate worth listing
                    space.enumerated += 1
                    label = f"{pool.name}: {e.label()}"
                    reason = (time_cut(deadline, ENUM_TIME_CUT, lambda: bool(space.engines))
                              or _engine_rules(model, pool, e) or _pinned_out(e, pins, vllm_dp_one_engine(model, framework))
                              or _unpriced(pool, e, split=None) or tp_experts_problem(
                                  model, job.weight_dtype, tp=e.tp, dp=e.dp_attention, expert_parallel=e.expert_parallel))
                    if reason is None:
                        cfg = _config(model, pool, job, e, max_num_seqs=1, util=gpu_memory_utilization)
                        mem = serve_memory(model, pool, cfg, context_len=job.context_len)
                        reason = mem.problem()
                        if reason is None and kv_limited_concurrency(mem, job) < 1:
                            reason = f"the KV cache holds {mem.kv_cache_tokens} tokens, less than one request"
                        if reason is not None:
                            per_token = max(
                                kv_cache_bytes_per_token_per_gpu(
                                    model, tp=tp, layers=st.decoders, dtype=job.kv_cache_dtype
                                )
                                for st in stage_layers(model, pp)
                            )
                            need = mem.non_kv_bytes + job.context_len * per_token
                            if (
                                space.closest is None
                                or need - mem.budget_bytes < space.closest[1] - space.closest[2]
                            ):
                                space.closest = (e, need, mem.budget_bytes, per_token)
                    if reason is None:
                        space.engines.append(e)
                    else:
                        space.pruned.append((label, reason))
    return space


def _config(
    model: ModelSpec,
    pool: PoolSpec,
    job: ServeJob,
    e: Engine,
    *,
    max_num_seqs: int,
    util: float = GPU_MEMORY_UTILIZATION,
    max_num_batched_tokens: int | None = None,
    split: bool = False,
    role: str = "aggregated",
) -> ServeConfig:
    """The engine's settings as `e.framework` runs them (`split`: an instance of a prefill/decode
    deployment, whose launch lines differ; `role`: which; the budget of vLLM DeepEP low-latency engines:
    `search.serve.budget`)."""
    gathered = 1 if e.expert_parallel or e.framework != "sglang" else e.dp_attention  # SGLang TP experts: 1/DP
    budget = max_num_batched_tokens or default_max_num_batched_tokens(pool.gpu) // gathered
    cfg = ServeConfig(
        tp=e.tp, pp=e.pp,
        dp_attention=e.dp_attention, expert_parallel=e.expert_parallel,
        weight_dtype=job.weight_dtype,
        kv_cache_dtype=job.kv_cache_dtype,
        gpu_memory_utilization=util,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs),
        role=role, engine=e.framework,
    )
    cfg = engine_config(cfg, e.framework, gpus_per_node=pool.node.gpus_per_node, split=split, gpu=pool.gpu)
    return ll_budgeted(model, pool.gpu, cfg, job, given=max_num_batched_tokens)


# --------------------------------------------------------------------------- tables


def tabulate(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    space: ServeSpace,
    *,
    pins: dict[str, int] | None = None,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    deadline: Deadline | None = None,
    grace: Deadline | None = None,
) -> tuple[list[Row], Counter[str]]:
    """Rows of each legal engine at the concurrencies its KV cache allows, with the replicas the
    objective implies. Throughput, TPOT and TTFT all grow with concurrency, so a row is dominated by
    any higher concurrency of the same engine that still meets the targets: the ladder is bisected
    for the highest such concurrency and only the rows evaluated on the way are kept (the solver still
    checks every target itself). Rows that cannot be deployed are counted by reason. Past `deadline` the
    engines left are not tabulated (`ROWS_TIME_CUT`), unless no row meets the targets yet and `grace` has not."""
    pins = pins or {}
    dropped: Counter[str] = Counter()
    done: dict[int, list[Row]] = {}  # by index in `space.engines`: the rows come back in that order, cut or not
    rows: list[Row] = []  # the same rows in the order tabulated (what a cut has so far)
    tops = [_top_memory(model, cluster.pools[e.pool], job, e, gpu_memory_utilization) for e in space.engines]
    for n, i in enumerate(promise_order(model, cluster, job, space, gpu_memory_utilization, tops=tops)):
        e = space.engines[i]
        if time_cut(deadline, ROWS_TIME_CUT, lambda: may_stop(job, rows, grace)):
            dropped[ROWS_TIME_CUT] += len(space.engines) - n
            break
        pool = cluster.pools[e.pool]
        if _unpriced(pool, e, split=False):
            dropped[SGLANG_UNPRICED] += 1
            continue
        cap = sglang_deepep_seqs(model, pool.gpu, _config(model, pool, job, e, max_num_seqs=1)) or 1 << 30  # DeepEP buffer
        ladder = concurrency_ladder(max(1, min(MAX_CONCURRENCY, kv_limited_concurrency(tops[i], job), cap)))
        alone = _config(model, pool, job, e, max_num_seqs=1, util=gpu_memory_utilization)
        prefill = {alone.max_num_batched_tokens: prefill_time(model, pool, alone, prompt_len=job.input_len)}
        make = partial(_row, model=model, cluster=cluster, job=job, engine=e, pool=pool, prefill=prefill, pins=pins,
                       dropped=dropped, util=gpu_memory_utilization)
        evaluated = bisect_ladder(job, ladder, make)
        dropped["dominated by a higher concurrency of the same engine"] += len(set(ladder) - set(evaluated))
        done[i] = [r for _, r in sorted(evaluated.items()) if r is not None]
        rows += done[i]
    return [r for i in sorted(done) for r in done[i]], dropped


def promise_order(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, space: ServeSpace,
                  util: float = GPU_MEMORY_UTILIZATION, *, tops: Sequence[ServeMemory] | None = None) -> list[int]:
    """Indices of `space.engines`, the most promising first: the order the tables are built in, so that what a
    time limit cuts off is the least promising (a ranking, not a bound: the rows come back in `space.engines`
    order and a complete table is the same whatever the order). The score is the requests the KV cache admits
    (at most `MAX_CONCURRENCY` per DP rank) over the replicas that fit the pool, divided by the PP degree (a
    request waits on every stage of a pipeline); ties keep the listed order. Memory only: one
    `serve_memory` per engine (`tops`, when the caller has them already), no step priced."""
    def score(e: Engine, top: ServeMemory) -> float:
        pool = cluster.pools[e.pool]
        ranks = min(MAX_CONCURRENCY, kv_limited_concurrency(top, job)) * e.dp_attention
        replicas = 1 if e.expert_parallel or e.dp_attention > 1 else pool.num_gpus // e.gpus
        return ranks * replicas / e.pp
    tops = tops if tops is not None else [_top_memory(model, cluster.pools[e.pool], job, e, util) for e in space.engines]
    scores = [score(e, top) for e, top in zip(space.engines, tops, strict=True)]
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def _row(batch: int, *, model: ModelSpec, cluster: ClusterSpec, job: ServeJob, engine: Engine, pool: PoolSpec,
         prefill: StepTime, pins: dict[str, int], dropped: Counter[str], util: float) -> Row | None:
    lost, first = Counter[str](), _config(model, pool, job, engine, max_num_seqs=batch, util=util)
    best = best_row(job, [_budget_row(cfg, model=model, cluster=cluster, job=job, engine=engine, pool=pool,
                                      prefill=prefill, pins=pins, dropped=lost)
                          for cfg in ll_budget_choices(model, pool.gpu, first)])
    if best is None:  # one row dropped, whatever the budgets tried
        dropped[next(iter(lost))] += 1
    return best


def _top_memory(model: ModelSpec, pool: PoolSpec, job: ServeJob, e: Engine, util: float) -> ServeMemory:
    """The engine's memory at the top of its ladder (`_ladder_top`)."""
    cfg = _ladder_top(model, pool, _config(model, pool, job, e, max_num_seqs=MAX_CONCURRENCY, util=util))
    return serve_memory(model, pool, cfg, context_len=job.context_len)


def _ladder_top(model: ModelSpec, pool: PoolSpec, cfg: ServeConfig) -> ServeConfig:
    """The engine at the top concurrency, its KV cache an upper bound of the rows' (a vLLM DeepEP
    low-latency engine's rows run smaller budgets, so smaller buffers, than this one would)."""
    return replace(cfg, max_num_batched_tokens=VLLM_MOE_DP_CHUNK_SIZE) if vllm_ll_engine(model, pool.gpu, cfg) else cfg


def _budget_row(cfg: ServeConfig, *, model, cluster, job, engine, pool, prefill, pins, dropped) -> Row | None:
    """The row of `engine` at `cfg` (one step budget; `prefill`: the prompt alone by budget, filled in)."""
    mem = serve_memory(model, pool, cfg, context_len=job.context_len)
    if mem.problem() or kv_limited_concurrency(mem, job) < cfg.max_num_seqs:
        dropped["concurrency beyond the KV cache"] += 1
        return None
    budget = cfg.max_num_batched_tokens
    if budget not in prefill:
        prefill[budget] = prefill_time(model, pool, cfg, prompt_len=job.input_len)
    pred = predict_serve(model, pool, job, cfg, concurrency=cfg.max_num_seqs, memory=mem, prefill=prefill[budget])
    replicas = _replicas(engine, pool, job, pred, pins, one_engine=vllm_dp_one_engine(model, engine.framework))
    if replicas is None:
        dropped["the request rate needs more GPUs than the pool has"] += 1
        return None
    throughput = pred.throughput_tokens_per_s * replicas
    gpus = engine.gpus * replicas
    objective = row_objective(job, cluster.num_gpus, gpus, throughput, TIE_SCALE)
    return Row(engine, cfg, pred, replicas, objective, time_to_us(pred.tpot_s), time_to_us(pred.ttft_s))


def _replicas(e: Engine, pool: PoolSpec, job: ServeJob, pred: ServePrediction, pins: dict[str, int], *,
              one_engine: bool = False) -> int | None:
    if e.expert_parallel or e.dp_attention > 1 or one_engine:  # one engine (vLLM's DP on MoE: serve.vllm_dp_moe)
        if job.request_rate is not None and pred.requests_per_s < job.request_rate:
            return None
        return 1
    most = pool.num_gpus // e.gpus
    if "dp" in pins:
        return pins["dp"] if pins["dp"] <= most else None
    if job.request_rate is None:
        return most
    need = math.ceil(job.request_rate / pred.requests_per_s - 1e-9)
    return need if need <= most else None
