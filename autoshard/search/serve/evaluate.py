"""Predict a serving plan the user already has (`evaluate`): one engine, its replicas and its
configuration, checked against vLLM's rules and the pool's GPUs, at a given concurrency or at as many
requests as max_num_seqs and the KV cache admit -- and, for a vLLM line, as its step budget
(--max-num-batched-tokens) carries: a DeepEP low-latency buffer sized at a budget that does not fit is
refused with the largest budget that does (`ll_budget_problem`), and a budget too small for the
running requests' decode and prompt tokens is priced at the requests it carries, with a warning
(`budget_carry`)."""

from __future__ import annotations

import dataclasses
import math

from autoshard.costmodel.serve.config import AGRS_BACKEND, ServeConfig
from autoshard.costmodel.serve.engines import DEFAULT_ENGINE
from autoshard.costmodel.serve.ep_buffers import VLLM_MOE_DP_CHUNK_SIZE, vllm_deepep_ll_budget
from autoshard.costmodel.serve.memory import default_max_num_batched_tokens, serve_memory
from autoshard.costmodel.serve.predict import ServePrediction, kv_limited_concurrency, predict_serve
from autoshard.costmodel.serve.vllm_dp_moe import agrs_ep_engine, tp_experts_problem, vllm_dp_one_engine
from autoshard.errors import InfeasibleError, SpecError
from autoshard.plans.base import SolverStats
from autoshard.search.serve.budget import vllm_ll_engine
from autoshard.search.serve.space import GPU_MEMORY_UTILIZATION, Engine, Row, _config, _engine_rules
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec
from autoshard.specs.cluster import PoolSpec
from autoshard.units import GIB, time_to_us

__all__ = ["evaluated_row", "budget_carry", "ll_budget_problem", "batched_dp_backend", "VLLM_BATCHED_DP_BACKENDS",
           "VLLM_AGRS_BACKENDS"]


def evaluated_row(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: ServeJob,
    *,
    tp: int,
    pp: int = 1,
    dp: int = 1,
    expert_parallel: bool = False,
    attention_dp: bool = False,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    pool: int = 0,
    warnings: tuple[str, ...] = (),
    concurrency: int | None = None,
    nccl_nvls: bool | None = None,
    deep_gemm: bool | None = None,
    framework: str = DEFAULT_ENGINE,
    role: str = "aggregated",
    carry: bool = False,
    all2all_backend: str | None = None,
    hybrid_kv_cache: bool | None = None,
) -> tuple[Row, SolverStats, tuple[str, ...]]:
    """(the plan's table row, its EVALUATED certificate, the warnings) for `search.serve.solve.
    evaluate_serve`, which documents the arguments. `carry`: a user's line, checked against what its
    vLLM step budget carries (`ll_budget_problem`, `budget_carry`); the planner's own rows are not.
    `all2all_backend`: a vLLM line's --all2all-backend (None: autoshard's own lines, which pass
    deepep_low_latency to these engines); vLLM's 256-token defaults and the buffer sized at the budget
    hold only on a batched-DP backend (`batched_dp_backend`); allgather_reducescatter (vLLM's default,
    `VLLM_AGRS_BACKENDS`) is priced as it runs (`ServeConfig.all2all_backend`), any other backend on
    DeepEP's low-latency kernels in 256-token passes (`ServeConfig.moe_dp_chunk`), with a note."""
    if not 0 <= pool < len(cluster.pools):
        raise SpecError(f"pool index {pool} out of range: the cluster has {len(cluster.pools)} pools")
    spec = cluster.pools[pool]
    warn = list(warnings)
    if expert_parallel and not model.is_moe:
        warn.append("--enable-expert-parallel has no effect on a dense model; ignored")
        expert_parallel = False
    if attention_dp and (framework != "sglang" or expert_parallel):
        raise SpecError("attention DP with tensor-parallel experts is SGLang's (--attn-dp-size without --ep-size)")
    # vLLM's DP on an MoE model without EP: one engine, its experts over all TP x DP GPUs (`serve.vllm_dp_moe`)
    vllm_tp_moe = vllm_dp_one_engine(model, framework) and dp > 1 and not expert_parallel
    lockstep = expert_parallel or vllm_tp_moe or (attention_dp and dp > 1)  # one engine of attention-DP ranks
    e = Engine(pool, tp, pp, dp if lockstep else 1, expert_parallel, framework)
    replicas = 1 if lockstep else dp
    if tp > spec.node.domain_size:  # legal for SGLang (--tp 16 --nnodes 2) and vLLM alike: priced over the network
        dom, hops = spec.node.domain_size, -(-tp // spec.node.domain_size)
        warn.append(
            f"TP {tp} spans {hops} NVLink domains of {dom} GPUs ({spec.name}): its all-reduces, two a layer, run "
            f"over the inter-node network and are priced there (slow: autoshard's own plans keep TP inside a "
            f"domain); the same GPUs as TP {dom} x PP {hops * pp}"
            + (f", or TP {dom} with {hops * dp} attention data-parallel ranks and expert parallelism "
               f"(EP {dom * hops * dp})," if model.is_moe else "") + " avoid it")
    reason = _engine_rules(model, spec, e, check_size=False, cross_node_tp=True) or tp_experts_problem(
        model, job.weight_dtype, tp=tp, dp=e.dp_attention, expert_parallel=expert_parallel)
    if reason:
        legal = [t for t in range(1, spec.node.domain_size + 1)
                 if _engine_rules(model, spec, Engine(pool, t, 1, 1, False, framework), check_size=False) is None]
        fix = (f"; pass {'--tp-size' if framework == 'sglang' else '--tensor-parallel-size'} "
               f"one of {', '.join(map(str, legal))}" if reason.startswith("TP ") and legal else "")
        raise SpecError(f"{e.label()} is not an engine autoshard can run for {model.name}: {reason}{fix}")
    if e.gpus * replicas > spec.num_gpus:
        raise InfeasibleError(
            f"TP{tp} x PP{pp} x DP{dp} needs {e.gpus * replicas} GPUs; pool '{spec.name}' has "
            f"{spec.num_gpus}: use fewer replicas or a larger --gpus"
        )
    seqs = max_num_seqs or (1024 if spec.gpu.hbm_gib >= 70 and "A100" not in spec.gpu.name.upper() else 256)
    batched = batched_dp_backend(all2all_backend)
    cfg = _config(
        model,
        spec,
        job,
        e,
        max_num_seqs=seqs,
        util=gpu_memory_utilization,  # another backend: vLLM's default budget, not the planner's LL ladder
        max_num_batched_tokens=max_num_batched_tokens or (None if batched else default_max_num_batched_tokens(spec.gpu)),
        role=role,
    )
    if all2all_backend in VLLM_AGRS_BACKENDS and framework == "vllm" and model.is_moe and expert_parallel and dp > 1:
        cfg = dataclasses.replace(cfg, all2all_backend=AGRS_BACKEND)  # gathered rows, no DeepEP: `serve.vllm_dp_moe`
    if vllm_ll_engine(model, spec.gpu, cfg):
        if not batched:  # another backend's all-to-all: DeepEP's kernels priced in vLLM 0.11.0's 256-token passes
            cfg = dataclasses.replace(cfg, moe_dp_chunk=VLLM_MOE_DP_CHUNK_SIZE)
        elif max_num_batched_tokens is None:
            cfg = _vllm_ll_defaults(cfg, seqs_given=max_num_seqs is not None)
    given = {k: v for k, v in (("nccl_nvls", nccl_nvls), ("deep_gemm", deep_gemm), ("hybrid_kv_cache", hybrid_kv_cache))
             if v is not None}
    if given:  # what the command itself sets, over the engine's launch defaults (`serve.engines`)
        cfg = dataclasses.replace(cfg, **given)
    if (carry and (batched and max_num_batched_tokens is not None or agrs_ep_engine(cfg))
            and (problem := ll_budget_problem(model, spec, job, cfg))):
        raise InfeasibleError(problem)
    ranks = dp  # DP ranks: replicas, or attention-DP ranks of one expert-parallel engine
    per_rank = None if concurrency is None else max(1, -(-concurrency // ranks))
    if per_rank is not None and per_rank * ranks != concurrency:
        warn.append(f"concurrency {concurrency} over {ranks} DP ranks: predicted at {per_rank} per rank")
    if carry and cfg.engine == "sglang" and (capped := sglang_context_cap(model, spec, job, cfg)) is not None:
        job, note = capped
        warn.append(note)
    pred = predict_serve(model, spec, job, cfg, concurrency=per_rank)
    if per_rank is not None and pred.concurrency < per_rank:
        warn.append(f"concurrency {concurrency} exceeds what max-num-seqs and the KV cache admit: "
                    f"predicted at {pred.concurrency} running requests per DP rank (the rest queue)")
    if carry and cfg.engine == "vllm" and (short := budget_carry(job, cfg, pred)) is not None:
        carried, note = short
        warn.append(note)
        pred = predict_serve(model, spec, job, cfg, concurrency=carried)
    stats = SolverStats(
        status="EVALUATED",
        stop_reason="evaluated",
        wall_s=0.0,
        objective=pred.tokens_per_s_per_gpu,
        bound=pred.tokens_per_s_per_gpu,
        candidates=1,
        candidates_in_model=0,
    )
    row = Row(e, cfg, pred, replicas, 0, time_to_us(pred.tpot_s), time_to_us(pred.ttft_s))
    return row, stats, tuple(warn)


VLLM_BATCHED_DP_BACKENDS = ("deepep_low_latency", "nixl_ep")
"""vLLM 0.33.0's backends of `ParallelConfig.use_batched_dp_moe` (config/parallel.py:795-805, with
--enable-expert-parallel and DP > 1): only on these does a line without --max-num-batched-tokens get
DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP = 256 (engine/arg_utils.py:3166-3170); any other backend,
the default allgather_reducescatter (config/parallel.py:220; VLLM_ALL2ALL_BACKEND is no longer read),
gets `vllm serve`'s usual default (8,192 on an H100)."""


VLLM_AGRS_BACKENDS = (AGRS_BACKEND, "pplx", "naive")
"""--all2all-backend values vLLM 0.33.0 runs as allgather_reducescatter (its default, config/parallel.py:220;
"pplx" and "naive" were removed and fall back to it, :537-543): priced as `ServeConfig.all2all_backend`
AGRS_BACKEND on an expert-parallel engine over DP ranks."""


def batched_dp_backend(backend: str | None) -> bool:
    """Whether a vLLM line's --all2all-backend is one whose engines take vLLM's batched-DP budget and
    size a DeepEP low-latency buffer at it (None: autoshard's own lines, deepep_low_latency)."""
    return backend is None or backend in VLLM_BATCHED_DP_BACKENDS


def _vllm_ll_defaults(cfg: ServeConfig, *, seqs_given: bool) -> ServeConfig:
    """A vLLM 0.33.0 line on `--all2all-backend deepep_low_latency` without --max-num-batched-tokens:
    vLLM's own budget for it, 256 (`DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP`, config/scheduler.py:42,
    engine/arg_utils.py:3166-3170), and --max-num-seqs at most that when not given (arg_utils.py:3232-3234);
    a larger --max-num-seqs is refused, as vLLM refuses it (config/scheduler.py:331-336)."""
    budget = VLLM_MOE_DP_CHUNK_SIZE
    if cfg.max_num_seqs > budget and seqs_given:
        raise SpecError(
            f"vLLM sets --max-num-batched-tokens to {budget} for --all2all-backend deepep_low_latency when the "
            f"line passes none, and refuses --max-num-seqs {cfg.max_num_seqs} above it (max_num_batched_tokens "
            f"must be >= max_num_seqs): pass --max-num-batched-tokens "
            f"{vllm_deepep_ll_budget(cfg.max_num_seqs, cfg.speculative_tokens)} (its DeepEP buffer grows with it) "
            f"or --max-num-seqs <= {budget}", field="--max-num-batched-tokens")
    return dataclasses.replace(cfg, max_num_seqs=min(cfg.max_num_seqs, budget), max_num_batched_tokens=budget)


def sglang_context_cap(model: ModelSpec, pool: PoolSpec, job: ServeJob, cfg: ServeConfig) -> tuple[ServeJob, str] | None:
    """(the job at the context an SGLang engine serves, the note) when its KV pool holds fewer tokens than
    one request of --context-length but the requests' shape: SGLang 0.5.23 starts anyway, warns, and
    caps a request at the pool (`max_req_len = min(context_len - 1, kv_capacity - 1)`,
    srt/managers/tp_worker.py:555-571), where vLLM refuses to start; None otherwise (the memory check
    refuses a pool that cannot hold the shape)."""
    held = serve_memory(model, pool, cfg, context_len=job.context_len).kv_cache_tokens
    if held >= job.context_len or held < job.input_len + job.output_len:
        return None
    return job.model_copy(update={"max_model_len": held}), (
        f"--context-length {job.context_len:,}: the KV pool holds {held:,} tokens, fewer than one request of it; "
        f"SGLang starts, warns and refuses or truncates requests past {held - 1:,} tokens "
        f"(srt/managers/tp_worker.py:555-571): checked at the pool, priced at the request shape")


def step_tokens(job: ServeJob, cfg: ServeConfig, running: int) -> float:
    """Tokens one scheduler step of a DP rank must hold to keep `running` requests decoding: per pipeline
    micro-batch, each request's decode tokens (1 + MTP drafts) plus the prompt tokens it brings per
    decode step (input_len / output_len: its prompt is prefilled once over its output_len steps)."""
    return running / cfg.pp * (1 + cfg.speculative_tokens + job.input_len / job.output_len)


def budget_carry(job: ServeJob, cfg: ServeConfig, pred: ServePrediction) -> tuple[int, str] | None:
    """(the running requests per DP rank the step budget carries, the warning saying so) when vLLM's
    --max-num-batched-tokens cannot hold the decode and prompt tokens of the `pred.concurrency` requests
    it would run, else None. vLLM's scheduler gives a step's budget to the running requests' decode
    tokens first and the waiting prompts the rest (chunked prefill), so prompts are admitted at most as
    fast as the budget left over allows: in steady state R running requests need `step_tokens(R)` per
    step and the engine settles at the largest R whose step fits the budget; the others wait for their
    prompt (the engine still starts: a warning, not a refusal)."""
    budget, running = cfg.max_num_batched_tokens, pred.concurrency
    need = step_tokens(job, cfg, running)
    if need <= budget:
        return None
    carried = max(1, int(budget * cfg.pp / (1 + cfg.speculative_tokens + job.input_len / job.output_len)))
    if carried >= running:
        return None
    fix = math.ceil(need - 1e-9)
    return carried, (
        f"--max-num-batched-tokens {budget:,} cannot carry {running:,} running requests per DP rank: each step "
        f"must hold their decode tokens plus the prompt tokens they bring ({job.input_len:,} in / {job.output_len:,} "
        f"out: {need:,.0f} tokens per step{'' if cfg.pp == 1 else f' per micro-batch of PP {cfg.pp}'}), so prompts "
        f"wait for room and about {carried:,} requests run: predicted at {carried:,} running requests per DP rank "
        f"(the rest wait for their prompt, a wait the TTFT does not include); pass --max-num-batched-tokens "
        f"{fix:,} or more to run all {running:,}")


def ll_budget_problem(model: ModelSpec, pool: PoolSpec, job: ServeJob, cfg: ServeConfig) -> str | None:
    """Why a vLLM engine on DeepEP's low-latency kernels would not start with the line's
    --max-num-batched-tokens, naming the buffer it sizes and the largest budget that fits (at least
    --max-num-seqs, as vLLM requires), or None when it fits or is no such engine. vLLM 0.33.0 sizes that
    buffer at the budget (`search.serve.budget`). An engine on allgather_reducescatter (`ServeConfig.
    all2all_backend`) holds no such buffer, but its profiling forward runs the experts on every DP rank's
    budget at once (`serve.memory.serve_memory`): the same search, over its activations."""
    agrs = agrs_ep_engine(cfg)  # allgather_reducescatter: the experts' workspace grows with the budget x DP
    if not (agrs or vllm_ll_engine(model, pool.gpu, cfg)):
        return None
    mem = serve_memory(model, pool, cfg, context_len=job.context_len)
    if (problem := mem.problem()) is None:
        return None

    def at(b: int):  # noqa: ANN202
        return serve_memory(model, pool, dataclasses.replace(cfg, max_num_batched_tokens=b), context_len=job.context_len)

    low, high = cfg.max_num_seqs, cfg.max_num_batched_tokens  # the largest b in [low, high) that fits
    head = (f"vLLM sizes its DeepEP low-latency buffer at --max-num-batched-tokens {high:,}: "
            f"{mem.ep_buffer_bytes / GIB:.1f} GiB per GPU; {problem}") if not agrs else (
        f"on --all2all-backend allgather_reducescatter each MoE layer all-gathers the {cfg.dp_attention} DP ranks' "
        f"tokens and runs its experts on them in one pass: at --max-num-batched-tokens {high:,} vLLM's profiling "
        f"forward takes {mem.activation_bytes / GIB:.1f} GiB of activations per GPU; {problem}")
    if low >= high or (least := at(low)).problem() is not None:
        worst = least if low < high else mem
        took = (f"{'the activations take' if agrs else 'the buffer takes'} "
                f"{(worst.activation_bytes if agrs else worst.ep_buffer_bytes) / GIB:.1f} GiB")
        if worst.short_of_one_request:  # vLLM's start check (vllm/v1/core/kv_cache_planning.py:151-185)
            block = worst.kv_block_tokens or 1
            fit = worst.kv_cache_tokens // block * block
            return (f"{head}; at {low:,} (vLLM's least since it must be >= --max-num-seqs) {took} and the KV cache "
                    f"holds {worst.kv_cache_tokens:,} tokens, less than one request of max_model_len "
                    f"{worst.context_len:,}: pass --max-num-batched-tokens {low} with --max-model-len {fit} or less, "
                    "or use more GPUs per engine")
        return (f"{head}; no smaller budget fits either (at {low:,}, vLLM's least since it must be >= --max-num-seqs, "
                f"{took}): lower --max-num-seqs or use more GPUs per engine")
    while high - low > 1:  # `low` fits, `high` does not
        mid = (low + high) // 2
        low, high = (mid, high) if at(mid).problem() is None else (low, mid)
    best = at(low)
    took = f"its activations take {best.activation_bytes / GIB:.1f} GiB" if agrs else (
        f"its buffer takes {best.ep_buffer_bytes / GIB:.1f} GiB")
    return (f"{head}: pass --max-num-batched-tokens {low} or less (the largest that fits: {took} and leaves a KV cache for {kv_limited_concurrency(best, job):,} "
            f"request(s) of {job.context_len:,} tokens per DP rank)")
