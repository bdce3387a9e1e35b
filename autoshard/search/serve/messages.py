"""What to say when no serving plan exists: what is needed, what the GPUs have, the nearest fix."""

from __future__ import annotations

import math

from autoshard.costmodel.serve.predict import predict_serve
from autoshard.costmodel.serve.weights import total_weight_bytes
from autoshard.errors import InfeasibleError, SpecError
from autoshard.search.serve.disagg import TIME_CUT
from autoshard.search.serve.ladder import ENUM_TIME_CUT, ROWS_TIME_CUT
from autoshard.search.serve.space import GPU_MEMORY_UTILIZATION, MAX_CONCURRENCY, Row, ServeSpace, _config
from autoshard.specs.base import MAX_GPUS
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB, time_to_us

__all__ = ["check_context_len", "no_engine_message", "rate_message", "target_message", "disagg_message",
           "time_cut_text"]


def time_cut_text(pruned: dict[str, int], engines: int | None = None) -> str:
    """What the time limit left out of a serving solve ("" when nothing): "12 engine(s) not tabulated as
    aggregated replicas and 30 engine(s) not tabulated as prefill/decode instances" ("12 of 40 engines
    ..." with the number of `engines`)."""
    of = "engine(s)" if engines is None else f"of {engines} engines"
    parts = [f"{pruned[k]} {what}" for k, what in (
        (ENUM_TIME_CUT, "candidate engine(s) not examined"),
        (ROWS_TIME_CUT, f"{of} not tabulated as aggregated replicas"),
        (TIME_CUT, f"{of} not tabulated as prefill/decode instances")) if pruned.get(k)]
    return " and ".join(parts)


def _gib(x: float) -> str:
    return f"{x / GIB:,.0f} GiB" if x >= 10 * GIB else f"{x / GIB:.1f} GiB"


LONG_CONTEXT_ENV = {"vllm": "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "sglang": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"}
"""The environment variable that lets each engine start past the model's context (`ParsedServe.
allow_long_context`)."""


def check_context_len(model: ModelSpec, job: ServeJob, *, flag: str = "--max-model-len",
                      engine: str | None = None, allow_long: bool = False) -> str | None:
    """Refuse (SpecError naming the flag to change and the model's limit) a context longer than the
    model's max_position_embeddings: vLLM and SGLang refuse to start with such a max model length unless
    an environment variable overrides their check, and positions past the trained range give wrong outputs.
    Returns None, or with `allow_long` (a line whose environment sets that variable: the engine starts,
    with a warning) the note saying what was priced and what the planner cannot promise.

    `flag`: the option that set the max model length (vLLM's --max-model-len, SGLang's --context-length);
    `engine`: the launcher a command was read from ("vllm", "sglang"), whose own refusal is named."""
    limit = model.max_position_embeddings
    if job.context_len <= limit:
        return None
    if job.max_model_len is None:
        raise SpecError(
            f"--input-len {job.input_len:,} + --output-len {job.output_len:,} = {job.context_len:,} tokens "
            f"is longer than {model.name}'s {limit:,}-token context (max_position_embeddings); vLLM and "
            f"SGLang reject longer requests: shorten --input-len / --output-len to at most {limit} tokens together",
            field="--input-len",
        )
    if allow_long and engine in LONG_CONTEXT_ENV:
        name = "vLLM" if engine == "vllm" else "SGLang"
        return (f"{flag} {job.max_model_len:,} is longer than {model.name}'s {limit:,}-token context "
                f"(max_position_embeddings): the line sets {LONG_CONTEXT_ENV[engine]}=1, so {name} starts with it "
                f"(with a warning) and it is priced as given; whether the model's outputs hold up past the "
                f"{limit:,} positions it was trained for (RoPE positions past them can give NaNs or garbage, "
                f"{name} warns) is not the planner's to promise")
    why = {
        "vllm": "vLLM refuses to start with it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set",
        "sglang": "SGLang refuses to start with it unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 is set",
    }.get(engine or "", "vLLM and SGLang refuse to start with it unless an environment variable "
                        "overrides their check (VLLM_ALLOW_LONG_MAX_MODEL_LEN, "
                        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN)")
    raise SpecError(
        f"{flag} {job.max_model_len:,} is longer than {model.name}'s {limit:,}-token context "
        f"(max_position_embeddings); {why}, and positions past the trained range give wrong outputs: "
        f"use {flag} {limit} or less",
        field=flag,
    )


def no_engine_message(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, space: ServeSpace) -> str:
    reasons = space.reasons()
    if space.closest is None:
        top = "; ".join(f"{r} ({n}x)" for r, n in reasons.most_common(3))
        name = "SGLang" if space.framework == "sglang" else "vLLM"
        return f"no {name} engine is legal for {model.name} on {cluster.name}: {top}"
    engine, need, has, per_token = space.closest
    pool = cluster.pools[engine.pool]
    where = "this node has" if pool.num_nodes == 1 else f"these {pool.num_gpus} GPUs have"
    hbm = pool.num_gpus * pool.gpu.hbm_gib * GIB
    usable = hbm * GPU_MEMORY_UTILIZATION
    weights = total_weight_bytes(model, job.weight_dtype)
    fixes: list[str] = []
    if weights > usable:
        head = (
            f"weights alone need {_gib(weights)} at {job.weight_dtype.value}; {where} {_gib(hbm)} "
            f"({_gib(usable)} at gpu_memory_utilization {GPU_MEMORY_UTILIZATION:.2f}; {pool.gpu.name})"
        )
    else:
        head = (
            f"the closest engine for {model.name}, {engine.label()} on {engine.gpus} GPUs, needs "
            f"{_gib(need)} per GPU "
            f"(weights, activations, CUDA graphs and one {job.context_len}-token request's KV cache); "
            f"gpu_memory_utilization {GPU_MEMORY_UTILIZATION:.2f} leaves {_gib(has)} of {pool.gpu.name}'s "
            f"{pool.gpu.hbm_gib:g} GiB"
        )
        room = has - (need - job.context_len * per_token)
        if room > 0 and any("KV cache holds" in r for r in reasons):
            fixes.append(f"shorten max_model_len to at most {int(room // per_token)} tokens")
            if job.kv_cache_dtype is WeightDtype.BF16:
                fixes.append("use an fp8 KV cache")
    for dtype in (WeightDtype.FP8, WeightDtype.INT4):
        # vLLM and SGLang quantize BF16 weights online only to fp8: int4 needs a published checkpoint
        ckpt = next((c for c in model.checkpoints if c.weights is dtype), None)
        if dtype is not WeightDtype.FP8 and ckpt is None:
            continue
        w = total_weight_bytes(model, dtype)
        if w < weights and w < usable * 0.85:
            fixes.append(f"quantize the weights to {dtype.value} ({_gib(w)}"
                         + (f", {ckpt.repo})" if ckpt is not None else ")"))
            break
    per_gpu = pool.gpu.hbm_gib * GIB * GPU_MEMORY_UTILIZATION * 0.85
    count = math.ceil(weights / per_gpu)
    per_node = pool.node.gpus_per_node
    # whole 8-GPU nodes past one node; else a power of two (--gpus below a node shrinks the node to it)
    count = per_node * math.ceil(count / per_node) if count > per_node >= 8 else 1 << (count - 1).bit_length()
    if count <= pool.num_gpus:
        count = pool.num_gpus + per_node if pool.num_gpus >= per_node else 2 * pool.num_gpus
    fixes.append(f"use at least {count} GPUs (--gpus {count})")
    return head + ": nearest fix: " + "; or ".join(fixes)


def rate_message(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, space: ServeSpace) -> str:
    """GPUs in whole engines: the fewest over the engines of ceil(rate / engine rate) x its GPUs; past the
    largest cluster autoshard plans (MAX_GPUS), the rate that one sustains instead."""
    rate = job.request_rate or 0.0
    best = 0.0
    need = 0
    most = 0.0  # requests/s the largest cluster sustains in whole engines
    for e in space.engines:
        pool = cluster.pools[e.pool]
        cfg = _config(model, pool, job, e, max_num_seqs=MAX_CONCURRENCY)
        try:
            pred = predict_serve(model, pool, job, cfg)
        except InfeasibleError:
            continue
        best = max(best, pred.requests_per_s / e.gpus)
        most = max(most, MAX_GPUS // e.gpus * pred.requests_per_s)
        if pred.requests_per_s > 0:
            whole = math.ceil(rate / pred.requests_per_s) * e.gpus
            need = whole if not need else min(need, whole)
    per_node = cluster.primary.node.gpus_per_node
    if need > per_node:
        need = per_node * math.ceil(need / per_node)
    what = f"sustaining {rate:g} requests/s of {job.input_len}+{job.output_len} tokens"
    if need > MAX_GPUS and most > 0:
        split = math.ceil(rate / most)
        return (
            f"{what} needs about {need:,} GPUs in whole engines (the best rate per GPU is {best:.3g} req/s), "
            f"more than the {MAX_GPUS:,} GPUs of the largest cluster autoshard plans, which sustains about "
            f"{math.floor(most):,} requests/s: nearest fix: split the traffic over {split} deployments and "
            f"plan each for its share (--request-rate {math.floor(rate / split)}), or shorten the requests"
        )
    return (
        f"{what} needs about {need} "
        f"GPUs in whole engines (the best rate per GPU is {best:.3g} req/s); {cluster.name} has "
        f"{cluster.num_gpus}: "
        f"nearest fix: use at least {need} GPUs (--gpus), or lower the request rate"
    )


def target_message(job: ServeJob, rows: list[Row]) -> str:
    parts = []
    fastest = min(rows, key=lambda r: r.tpot_us)
    quickest = min(rows, key=lambda r: r.ttft_us)
    if job.tpot_target_s is not None and fastest.tpot_us > time_to_us(job.tpot_target_s):
        parts.append(
            f"TPOT <= {job.tpot_target_s * 1e3:g} ms (the fastest plan, {fastest.engine.label()} at "
            f"concurrency {fastest.prediction.concurrency}, reaches {fastest.prediction.tpot_s * 1e3:.1f} ms)"
        )
    if job.ttft_target_s is not None and quickest.ttft_us > time_to_us(job.ttft_target_s):
        parts.append(
            f"TTFT <= {job.ttft_target_s * 1e3:g} ms (the quickest plan, {quickest.engine.label()}, "
            f"reaches {quickest.prediction.ttft_s * 1e3:.1f} ms)"
        )
    if not parts:
        parts.append("the TPOT and TTFT targets together (each alone is reachable, not both with one plan)")
    quantized = job.weight_dtype.value != "bf16"  # a quantized checkpoint already: no further fix of that kind
    return (
        "no plan meets "
        + " and ".join(parts)
        + (": nearest fix: relax the target or use faster GPUs" if quantized
           else ": nearest fix: relax the target, quantize the weights, or use faster GPUs")
    )


def disagg_message(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, space: ServeSpace) -> str:
    """Why no xPyD deployment exists: too few GPUs for two instances, or the targets out of reach."""
    from autoshard.costmodel.serve.disagg import decode_instance
    from autoshard.costmodel.serve.memory import serve_memory

    smallest = min(e.gpus for e in space.engines)
    if 2 * smallest > max(p.num_gpus for p in cluster.pools):
        return (
            f"a prefill/decode split of {model.name} needs at least {2 * smallest} GPUs (one prefill and "
            f"one decode instance of {smallest}, the smallest legal engine); {cluster.name} has "
            f"{cluster.num_gpus}: nearest fix: --gpus {2 * smallest}, or --disaggregate auto/off"
        )
    parts = []
    if job.tpot_target_s is not None:
        best = math.inf
        for e in space.engines:
            pool = cluster.pools[e.pool]
            cfg = _config(model, pool, job, e, max_num_seqs=1, split=True)
            mem = serve_memory(model, pool, cfg, context_len=job.context_len)
            best = min(best, decode_instance(model, pool, job, cfg, mem, concurrency=1).tpot_s)
        parts.append(
            f"TPOT <= {job.tpot_target_s * 1e3:g} ms "
            f"(the fastest decode instance reaches {best * 1e3:.1f} ms)"
        )
    if job.ttft_target_s is not None:
        parts.append(f"TTFT <= {job.ttft_target_s * 1e3:g} ms")
    if job.request_rate is not None:
        parts.append(f"{job.request_rate:g} requests/s")
    need = " and ".join(parts) or "the job"
    return (
        f"no prefill/decode deployment of {model.name} on {cluster.name} ({cluster.num_gpus} GPUs) "
        f"meets {need}: nearest fix: relax the targets, use more or faster GPUs (--gpus), "
        "or --disaggregate auto"
    )
