"""A deterministic step-by-step simulation of a continuous-batching scheduler serving a burst of
identical requests, the way `vllm bench serve --request-rate inf` (and SGLang's bench_serving, and
trtllm-bench's offline mode) measure an engine: every request arrives at t = 0 and the benchmark
ends when the last one finishes. Ramp-up (nothing decodes until prompts are prefilled) and drain
(the last requests decode alone) are part of what such benchmarks report, and a steady-state
formula cannot see them.

The scheduler follows vLLM's V1 scheduler: each step has a token budget (max_num_batched_tokens);
running requests go first (one token per decoding request, the next chunk of a partly prefilled
prompt), then waiting requests are admitted in arrival order while the budget, max_num_seqs and the
KV cache allow (a request is admitted only if its whole prompt + output fits in the free KV cache:
no preemption). A step's time is `serving.step_time` of its decode and prefill tokens.

`simulate_at_rate` replays the other benchmark the engines publish: a fixed number of requests sent
at a request rate (Poisson arrivals, a fixed seed), TTFT counted from each request's arrival. A
finite run near the engine's capacity is a transient (the queue builds while the requests last),
which no steady-state queue describes: at the rate the engine just absorbs, an M/D/c wait diverges
while the benchmark's 500 requests end long before.

Pure function of the specs; one engine, PP = 1, one attention-DP rank.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.predict import request_kv_tokens
from autoshard.costmodel.serve.step import StepTime, step_time
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec

__all__ = ["BurstResult", "simulate_burst", "simulate_at_rate"]

CONTEXT_BUCKET = 64
"""Decode contexts are rounded to this many tokens to reuse step times (a < 1 % effect)."""


@dataclass(frozen=True, slots=True)
class BurstResult:
    """What a burst benchmark prints, as the simulation predicts it."""

    requests: int
    duration_s: float
    mean_ttft_s: float
    mean_tpot_s: float
    steps: int
    max_running: int
    breakdown: StepTime = field(default_factory=StepTime)
    """The run's seconds by kind of work (the sum of its steps' `StepTime`s; `total_s` = duration,
    less any idle wait for arrivals)."""

    def output_tokens_per_s(self, output_len: int) -> float:
        return self.requests * output_len / self.duration_s

    def total_tokens_per_s(self, input_len: int, output_len: int) -> float:
        return self.requests * (input_len + output_len) / self.duration_s


def simulate_burst(
    model: ModelSpec, pool: PoolSpec, job: ServeJob, cfg: ServeConfig, *, requests: int
) -> BurstResult:
    """Simulate `requests` requests of job.input_len + job.output_len tokens arriving at once."""
    if requests < 1:
        raise ValueError(f"requests must be positive, got {requests}")
    return _simulate(model, pool, job, cfg, [0.0] * requests)


def simulate_at_rate(
    model: ModelSpec,
    pool: PoolSpec,
    job: ServeJob,
    cfg: ServeConfig,
    *,
    requests: int,
    rate: float,
    seed: int = 0,
) -> BurstResult:
    """Simulate `requests` requests arriving as a Poisson process of `rate` requests/s (exponential
    gaps from `random.Random(seed)`, the first at t = 0); TTFT from each arrival, duration to the
    last completion."""
    if requests < 1:
        raise ValueError(f"requests must be positive, got {requests}")
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(requests):
        arrivals.append(t)
        t += rng.expovariate(rate)
    return _simulate(model, pool, job, cfg, arrivals)


def _simulate(
    model: ModelSpec, pool: PoolSpec, job: ServeJob, cfg: ServeConfig, arrivals: list[float]
) -> BurstResult:
    """The scheduler loop over requests arriving at the sorted times `arrivals`: a step admits only
    requests that arrived by its start; an idle engine waits for the next arrival."""
    requests = len(arrivals)
    if cfg.pp != 1 or cfg.dp_attention != 1:
        raise ValueError("the burst simulation covers one PP stage and one attention-DP rank")
    isl, osl = job.input_len, job.output_len
    mem = serve_memory(model, pool, cfg, context_len=job.context_len)
    kv_tokens = mem.kv_cache_tokens
    per_request = request_kv_tokens(mem, isl + osl)  # what admission reserves (whole blocks in TensorRT-LLM)
    if kv_tokens < per_request:
        raise ValueError(f"the KV cache holds {kv_tokens} tokens, less than one request of {per_request}")
    budget = cfg.max_num_batched_tokens

    @lru_cache(maxsize=65536)
    def step_s(decodes: int, prefill_tokens: int, context: int) -> StepTime:
        return step_time(
            model,
            pool,
            cfg,
            decode_seqs=decodes,
            prefill_tokens=prefill_tokens,
            prefills=prefill_tokens / isl,
            prefill_len=isl,
            context_len=context,
        )

    pending = deque(arrivals)  # not yet arrived
    waiting: deque[float] = deque()  # arrived, not yet admitted: their arrival times
    # running requests: [prefilled tokens, generated tokens, first-token time, arrival time]
    running: list[list[float]] = []
    t = 0.0
    spent = StepTime()
    ttft_sum = tpot_sum = 0.0
    done = steps = max_running = 0
    while done < requests:
        if not running and not waiting:
            t = max(t, pending[0])  # idle: the next request's arrival
        while pending and pending[0] <= t:
            waiting.append(pending.popleft())
        tokens = 0
        decodes = 0
        context = 0.0
        prefill = 0
        chunks: list[tuple[list[float], int]] = []
        for r in running:  # running first: decodes, then the next chunk of partial prefills
            if r[0] >= isl:
                decodes += 1
                context += isl + r[1]
        tokens = decodes
        for r in running:
            if r[0] < isl and tokens < budget:
                take = int(min(isl - r[0], budget - tokens))
                chunks.append((r, take))
                tokens += take
                prefill += take
        reserved = len(running) * per_request
        while (
            waiting
            and tokens < budget
            and len(running) < cfg.max_num_seqs
            and reserved + per_request <= kv_tokens
        ):
            r = [0.0, 0.0, -1.0, waiting.popleft()]
            running.append(r)
            reserved += per_request
            take = int(min(isl, budget - tokens))
            chunks.append((r, take))
            tokens += take
            prefill += take
        if tokens == 0:  # nothing fits: cannot happen with the KV check above
            raise RuntimeError("the scheduler made no progress")
        mean_context = context / decodes if decodes else 0.0
        bucket = CONTEXT_BUCKET * round(mean_context / CONTEXT_BUCKET)
        step = step_s(decodes, prefill, int(bucket))
        t += step.total_s
        spent = spent + step
        steps += 1
        max_running = max(max_running, len(running))
        for r in running:
            if r[0] >= isl:
                r[1] += 1
        for r, take in chunks:
            r[0] += take
            if r[0] >= isl:  # the prompt's last chunk samples its first token
                r[1] = 1.0
                r[2] = t
        still = []
        for r in running:
            if r[1] >= osl:
                done += 1
                ttft_sum += r[2] - r[3]
                tpot_sum += (t - r[2]) / (osl - 1) if osl > 1 else 0.0
            else:
                still.append(r)
        running = still
    return BurstResult(
        requests=requests,
        duration_s=t,
        mean_ttft_s=ttft_sum / requests,
        mean_tpot_s=tpot_sum / requests,
        steps=steps,
        max_running=max_running,
        breakdown=spent,
    )

