"""Serving predictions of one vLLM-style engine in steady state: throughput, TTFT and TPOT (p50/p90)
under continuous batching at a fixed concurrency (closed loop) or at an open-loop request rate,
built on the step times of `autoshard.costmodel.serve.step` and the queueing of
`autoshard.costmodel.serve.latency`.

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.latency import NO_WAIT, LatencyQuantiles, Wait, mdc_wait
from autoshard.costmodel.serve.memory import ServeMemory, serve_memory
from autoshard.costmodel.serve.step import StepTime, mean_step_time, prefill_time, step_time
from autoshard.errors import InfeasibleError
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec

__all__ = [
    "ServePrediction",
    "predict_serve",
    "decode_context_len",
    "kv_limited_concurrency",
    "request_kv_tokens",
    "concurrency_ladder",
    "latency_at_rate",
]


def decode_context_len(job: ServeJob) -> float:
    """Mean context a decode step attends to: the prompt plus half the output."""
    return job.input_len + job.output_len / 2


@dataclass(frozen=True, slots=True)
class ServePrediction:
    """One engine at a fixed concurrency, in steady state."""

    config: ServeConfig
    concurrency: int
    """Running requests per DP rank."""
    memory: ServeMemory
    decode: StepTime
    """Breakdown of one TPOT (PP ticks of the slowest stage, prefill share included)."""
    prefill: StepTime
    """The prompt's own prefill work (the TTFT floor)."""
    tpot_s: float
    """Mean TPOT at this concurrency (also its p50: a request's TPOT averages hundreds of steps)."""
    ttft_s: float
    """p50 TTFT at this concurrency: the prompt's own prefill chunks riding the running decodes and the
    wait behind other prompts in the step's token budget (closed loop: a request arrives as another
    leaves, at a step boundary; `at_rate` adds the alignment of random arrivals)."""
    throughput_tokens_per_s: float
    """Output tokens/s of the engine (all its DP ranks)."""
    input_len: int
    output_len: int
    ttft_p90_s: float | None = None
    """p90 of TTFT at this concurrency (closed loop: chunked-prefill interference, no slot queue);
    `ttft_s` is the p50. None only when built by hand."""
    tpot_p90_s: float | None = None
    """p90 of one request's mean TPOT at this concurrency; `tpot_s` is the mean."""
    latency: LatencyQuantiles | None = None
    """p50/p90 breakdown at this concurrency (closed loop)."""
    at_rate: LatencyQuantiles | None = None
    """TTFT/TPOT at the open-loop request rate passed as `arrival_rate` (Poisson arrivals)."""

    @property
    def gpus(self) -> int:
        return self.config.gpus

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.throughput_tokens_per_s / self.gpus

    @property
    def requests_per_s(self) -> float:
        return self.throughput_tokens_per_s / self.output_len

    @property
    def max_concurrency(self) -> float:
        return self.memory.max_concurrency


def request_kv_tokens(memory: ServeMemory, tokens: int) -> int:
    """Cache tokens one request of `tokens` (prompt + output) holds at its end, and what TensorRT-LLM
    reserves at admission: whole blocks of the engine's `kv_block_tokens` (`ServeMemory.request_tokens`;
    SGLang's default page of 1: the tokens themselves)."""
    return memory.request_tokens(tokens)


def kv_limited_concurrency(memory: ServeMemory, job: ServeJob) -> int:
    """Requests whose whole prompt + output fit in the KV cache at once (no preemption), each
    reserving `request_kv_tokens`."""
    return memory.kv_cache_tokens // request_kv_tokens(memory, job.input_len + job.output_len)


def predict_serve(
    model: ModelSpec,
    pool: PoolSpec,
    job: ServeJob,
    cfg: ServeConfig,
    *,
    concurrency: int | None = None,
    memory: ServeMemory | None = None,
    prefill: StepTime | None = None,
    arrival_rate: float | None = None,
) -> ServePrediction:
    """Throughput, TPOT and TTFT of one engine running `concurrency` requests per DP rank (default: as
    many as max_num_seqs and the KV cache allow), with p90s (closed loop at that concurrency); with
    `arrival_rate` (requests/s into the engine) also the latencies at that open-loop load (`at_rate`).
    Raises InfeasibleError when the engine cannot start."""
    mem = memory or serve_memory(model, pool, cfg, context_len=job.context_len)
    problem = mem.problem()
    if problem:
        raise InfeasibleError(
            f"{model.name} on {cfg.gpus}x {pool.gpu.name} (TP{cfg.tp} PP{cfg.pp}): {problem}"
        )
    limit = min(cfg.max_num_seqs, kv_limited_concurrency(mem, job))
    if limit < 1:
        raise InfeasibleError(
            f"the KV cache holds {mem.kv_cache_tokens} tokens, less than one request of "
            f"{job.input_len + job.output_len} tokens"
        )
    batch = limit if concurrency is None else max(1, min(concurrency, limit))
    per_mb = batch / cfg.pp
    ctx = decode_context_len(job)
    tick = mean_step_time(
        model,
        pool,
        cfg,
        decode_seqs=per_mb,
        prefill_tokens=per_mb * job.input_len / job.output_len,
        prefill_len=job.input_len,
        context_len=ctx,
    )
    decode = tick.scaled(cfg.pp)
    tpot = decode.total_s
    if prefill is None:
        prefill = prefill_time(model, pool, cfg, prompt_len=job.input_len)
    # TTFT: the prompt's own chunks, each riding one step of the other running requests' decodes.
    chunks = math.ceil(job.input_len / cfg.max_num_batched_tokens)
    others = (batch - 1) / cfg.pp
    ride = 0.0
    if others > 0:
        ride = (
            chunks
            * cfg.pp
            * step_time(
                model,
                pool,
                cfg,
                decode_seqs=others,
                prefill_tokens=0,
                prefills=0,
                prefill_len=job.input_len,
                context_len=ctx,
            ).total_s
        )
    ttft = prefill.total_s + ride
    decode_only = _decode_tpot_s(model, pool, cfg, per_mb=per_mb, ctx=ctx)
    closed = _latency(
        job,
        cfg,
        running=batch,
        tpot_s=tpot,
        tpot_decode_s=decode_only,
        ttft_s=ttft,
        step_s=tick.total_s,
        align_s=0.0,
        rate=batch / (job.output_len * tpot),
        slot_wait=NO_WAIT,
        utilization=1.0,
        closed_loop=True,
    )
    at_rate = None
    if arrival_rate is not None:
        at_rate = latency_at_rate(
            model, pool, job, cfg, concurrency=batch, arrival_rate=arrival_rate, prefill=prefill
        )
    return ServePrediction(
        config=cfg,
        concurrency=batch,
        memory=mem,
        decode=decode,
        prefill=prefill,
        tpot_s=tpot,
        ttft_s=closed.ttft_p50_s,
        throughput_tokens_per_s=batch * cfg.dp_attention / tpot,
        input_len=job.input_len,
        output_len=job.output_len,
        ttft_p90_s=closed.ttft_p90_s,
        tpot_p90_s=closed.tpot_p90_s,
        latency=closed,
        at_rate=at_rate,
    )


def _decode_tpot_s(model: ModelSpec, pool: PoolSpec, cfg: ServeConfig, *, per_mb: float, ctx: float) -> float:
    """TPOT of pure decode steps (no prefill chunk in them)."""
    return cfg.pp * step_time(
        model, pool, cfg, decode_seqs=per_mb, prefill_tokens=0, prefills=0, prefill_len=1, context_len=ctx
    ).total_s


def _latency(
    job: ServeJob,
    cfg: ServeConfig,
    *,
    running: float,
    tpot_s: float,
    tpot_decode_s: float,
    ttft_s: float,
    step_s: float,
    align_s: float,
    rate: float,
    slot_wait: Wait,
    utilization: float,
    closed_loop: bool = False,
) -> LatencyQuantiles:
    """p50/p90 of TTFT and TPOT for one DP rank running `running` requests that arrive at `rate`
    requests/s. The prefill lane: one step's token budget left after the decode tokens holds
    `budget // input_len` prompts (or one prompt's chunk), each prompt taking `chunks` steps."""
    per_mb = running / cfg.pp
    free = cfg.max_num_batched_tokens - per_mb
    if free <= 0:
        free = cfg.max_num_batched_tokens
    if free >= job.input_len:
        lanes, chunks = int(free // job.input_len), 1
    else:
        lanes, chunks = 1, math.ceil(job.input_len / free)
    prefill_wait = mdc_wait(rate, chunks * step_s, lanes)
    if closed_loop:
        # A closed loop holds `running` requests: at worst a prompt waits behind all the others'
        # prefills. When the budget cannot keep up (the engine is prefill-bound), or the open-queue
        # wait exceeds that, the wait is exponential with half that worst case as its mean.
        worst = max(running - 1, 0.0) * chunks * step_s / lanes
        if prefill_wait.unstable or prefill_wait.mean_s > worst / 2:
            prefill_wait = Wait(1.0, 2.0 / worst) if worst > 0 else NO_WAIT
    extra = max(tpot_s - tpot_decode_s, 0.0)
    return LatencyQuantiles.combine(
        prefill_s=ttft_s,
        align_s=align_s,
        slot_wait=slot_wait,
        prefill_wait=prefill_wait,
        tpot_decode_s=min(tpot_decode_s, tpot_s),
        tpot_per_prompt_s=extra / running if running > 0 else 0.0,
        prompts_per_life=running,
        running=running,
        utilization=utilization,
    )


def latency_at_rate(
    model: ModelSpec,
    pool: PoolSpec,
    job: ServeJob,
    cfg: ServeConfig,
    *,
    concurrency: int,
    arrival_rate: float,
    prefill: StepTime | None = None,
) -> LatencyQuantiles:
    """TTFT and TPOT (p50, p90, mean) of one engine fed `arrival_rate` requests/s (Poisson, open
    loop), spread evenly over its DP ranks, with at most `concurrency` running per DP rank.

    The running count N per DP rank solves Little's law N = lambda x (TTFT(N) + output_len x TPOT(N))
    by bisection (step times at N running requests, prefill share lambda x input_len per second);
    requests beyond `concurrency` wait for a slot (M/D/c over the slots). Above capacity the waits
    are infinite and `utilization` >= 1."""
    if arrival_rate <= 0:
        raise ValueError(f"arrival_rate must be positive, got {arrival_rate}")
    lam = arrival_rate / cfg.dp_attention
    ctx = decode_context_len(job)
    if prefill is None:
        prefill = prefill_time(model, pool, cfg, prompt_len=job.input_len)
    chunks = math.ceil(job.input_len / cfg.max_num_batched_tokens)

    def step(decode_seqs: float, prompts: float) -> float:
        return mean_step_time(
            model,
            pool,
            cfg,
            decode_seqs=decode_seqs,
            prefill_tokens=prompts * job.input_len,
            prefill_len=job.input_len,
            context_len=ctx,
        ).total_s

    def times(n: float) -> tuple[float, float, float, float]:
        """(TPOT, own prefill + ride, tick, pure-decode TPOT) at n running requests per DP rank."""
        per_mb = n / cfg.pp
        tick = step(per_mb, 0.0)
        for _ in range(3):  # prompts admitted per tick (lam x tick) add their prefill to the tick
            tick = step(per_mb, lam * tick)
        others = max(n - 1, 0.0) / cfg.pp
        ride = chunks * cfg.pp * step(others, 0.0) if others > 0 else 0.0
        decode_only = _decode_tpot_s(model, pool, cfg, per_mb=per_mb, ctx=ctx)
        return cfg.pp * tick, prefill.total_s + ride, tick, decode_only

    n = float(concurrency)
    tpot, ttft, tick, dec = times(n)
    saturated = lam * (ttft + job.output_len * tpot) >= concurrency
    if not saturated:
        lo, hi = 0.0, float(concurrency)
        for _ in range(30):  # N - lam * stay(N) is increasing in N: bisect its root
            mid = (lo + hi) / 2
            t_mid, f_mid, _, _ = times(max(mid, 1e-6))
            if mid - lam * (f_mid + job.output_len * t_mid) < 0:
                lo = mid
            else:
                hi = mid
        n = max(hi, 1e-6)
        tpot, ttft, tick, dec = times(n)
    stay = ttft + job.output_len * tpot
    slot_wait = mdc_wait(lam, stay, concurrency)
    return _latency(
        job,
        cfg,
        running=n,
        tpot_s=tpot,
        tpot_decode_s=dec,
        ttft_s=ttft,
        step_s=tick,
        align_s=tick,
        rate=lam,
        slot_wait=slot_wait,
        utilization=lam * stay / concurrency,
    )


def concurrency_ladder(limit: int) -> list[int]:
    """Concurrencies worth tabulating up to `limit`: powers of two, their 1.5x, and the limit itself."""
    out = set()
    b = 1
    while b <= limit:
        out.add(b)
        if b * 3 // 2 <= limit and b >= 2:
            out.add(b * 3 // 2)
        b *= 2
    out.add(limit)
    return sorted(x for x in out if x >= 1)
