"""Prefill/decode disaggregation physics: what one prefill instance and one decode instance deliver,
the KV-cache hand-off between them, and the queueing that balances them.

A disaggregated (xPyD) deployment runs x prefill instances and y decode instances. A prefill instance
runs prompts only, in steps of `max_num_batched_tokens` tokens; a decode instance runs decode steps
only (no prefill chunks riding its batch). After its prefill a request's KV cache moves to a decode
instance once: input_len x kv_cache_bytes_per_token bytes (vLLM NixlConnector / SGLang Mooncake
transfer engine), over NVLink when both instances sit in one NVLink domain, else over RDMA: every
GPU of the prefill instance that holds part of the request's cache sends its part through its own
NIC, so the transfer runs on min(sending, receiving) GPU links in parallel.

TTFT of a disaggregated request = its time in the prefill engine + the KV transfer + its first token
on the decode instance (`first_token_s`: the wait for the running decode step to end, then one step). A prefill engine (vLLM/SGLang with a prefill-only role) starts a step as soon as it is free and
prompts are waiting, and each step takes every prompt that has arrived (up to the token budget): at
partial load its steps hold only what arrived during the previous step, so they are much shorter than
a full-budget step. With the step time linear in its prompts, c(k) = a + b k (a: the part of a step
that does not grow with its prompts, from the prompt-alone time; b: the time per prompt, from the
full-budget step; attention-DP ranks step together, so k counts all ranks' prompts) and Poisson
arrivals at p per instance, the cycle lengths of a busy engine obey
C' = a + b N, N ~ Poisson(p C), whose stationary mean and variance are closed forms:
E[C] = a / (1 - p b) and Var C = b^2 p E[C] / (1 - p^2 b^2). A request arrives during a step with the
probability that the engine is busy (min(1, p c(1))), waits out the length-biased residual of that
step, E[C^2] / (2 E[C]), and then runs in the next one with the prompts that arrived with it (see
`prefill_cycle`). Idle, this is the prompt alone; at full load, a full-budget step and a half; within
12 % of a discrete-event simulation from 5 % to 90 % load (tests/costmodel/test_disagg_prefill.py).
Prefill instances are planned at a utilization no higher than `MAX_PREFILL_UTILIZATION`, or lower
when a TTFT target needs it.

The step times come from `autoshard.costmodel.serve.step` (`step_time`, `prefill_time`), so any
refinement there flows into these figures. Pure functions: no I/O, no solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from autoshard.costmodel.comm import Link, group_link, nic_link, pool_link, striped_send_s
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import ServeMemory
from autoshard.costmodel.serve.mtp import mtp_decode_step
from autoshard.costmodel.serve.predict import decode_context_len
from autoshard.costmodel.serve.step import StepTime, prefill_time, step_time
from autoshard.costmodel.serve.weights import kv_cache_bytes_per_token
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec

__all__ = [
    "MAX_PREFILL_UTILIZATION",
    "KvTransfer",
    "PrefillInstance",
    "DecodeInstance",
    "kv_transfer_bytes",
    "holders",
    "kv_link",
    "kv_transfer",
    "prefill_seqs",
    "prefill_instance",
    "decode_instance",
    "md1_wait_s",
    "md1_wait_quantile_s",
    "PrefillCycle",
    "prefill_cycle",
    "prefill_wait_s",
    "max_utilization_for_ttft",
    "disagg_ttft_s",
    "first_token_s",
]

MAX_PREFILL_UTILIZATION = 0.8
"""Highest planned utilization of the prefill instances: at 80 % the M/D/1 mean wait is two service
times; nearer to 1 the queue (and TTFT) grows without bound."""


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """One request's KV-cache hand-off from its prefill instance to its decode instance."""

    bytes_per_request: float
    link: str
    """"nvlink" (one NVLink domain) or "rdma" (across nodes)."""
    streams: int
    """GPU links that carry it in parallel."""
    bytes_per_s: float
    """Aggregate bandwidth of those streams."""
    seconds: float


@dataclass(frozen=True, slots=True)
class PrefillInstance:
    """A prefill-only engine at full step budget."""

    config: ServeConfig
    memory: ServeMemory
    prompt: StepTime
    """One prompt alone through the engine (its own prefill time)."""
    step: StepTime
    """One engine tick with `max_num_batched_tokens` prompt tokens per DP rank (pipelined over PP)."""
    requests_per_s: float
    """Prompts/s the instance sustains at 100 % utilization (all DP ranks)."""

    @property
    def gpus(self) -> int:
        return self.config.gpus


@dataclass(frozen=True, slots=True)
class DecodeInstance:
    """A decode-only engine running `concurrency` requests per DP rank."""

    config: ServeConfig
    memory: ServeMemory
    concurrency: int
    step: StepTime
    """One decode step (PP ticks of the slowest stage), no prefill chunks: one TPOT, or, with MTP
    drafts, the time of `tpot_s` x the tokens a step keeps."""
    tpot_s: float
    throughput_tokens_per_s: float
    """Output tokens/s of the instance (all DP ranks)."""
    output_len: int

    @property
    def gpus(self) -> int:
        return self.config.gpus

    @property
    def requests_per_s(self) -> float:
        return self.throughput_tokens_per_s / self.output_len


def kv_transfer_bytes(model: ModelSpec, job: ServeJob) -> float:
    """Bytes of KV cache one request hands over: its prompt's cache over all layers, once."""
    return job.input_len * kv_cache_bytes_per_token(model, job.kv_cache_dtype)


def holders(cfg: ServeConfig) -> int:
    """GPUs of one DP rank that hold a share of a request's cache and can send it in parallel: the
    PP stages each hold their layers; TP shards the KV heads (MLA's latent is replicated over TP,
    and the TP ranks then send disjoint slices of it)."""
    return cfg.tp * cfg.pp


def kv_link(
    pool: PoolSpec, *, same_domain: bool, other: PoolSpec | None = None, inter_pool_gbps: float = 0.0
) -> Link:
    """Per-GPU link of the hand-off: NVLink inside one domain, the GPU's NIC across nodes, the
    inter-pool network between pools."""
    if other is not None and other is not pool:
        return pool_link(pool, other, inter_pool_gbps)
    if same_domain:
        return group_link(pool, ranks=1)
    return nic_link(pool)


def kv_transfer(
    model: ModelSpec, job: ServeJob, prefill: ServeConfig, decode: ServeConfig, link: Link
) -> KvTransfer:
    """Time to move one request's KV cache: bytes over min(sending, receiving) parallel GPU links,
    plus one link latency."""
    size = kv_transfer_bytes(model, job)
    streams = max(1, min(holders(prefill), holders(decode)))
    return KvTransfer(
        bytes_per_request=size,
        link="rdma" if link.crosses_nodes else "nvlink",
        streams=streams,
        bytes_per_s=streams * link.bytes_per_s,
        seconds=striped_send_s(size, streams, link),
    )


def prefill_seqs(max_num_batched_tokens: int, input_len: int, pp: int) -> int:
    """The requests a prefill instance (per DP rank) must admit to run a full token budget in each of its PP
    micro-batches: vLLM counts the requests of every batch in flight against --max-num-seqs (v1 scheduler) and
    fills a PP pipeline only with PP batches in flight; SGLang splits --max-running-requests over its PP
    micro-batches. A prompt longer than the budget is chunked, one request per micro-batch."""
    return pp * max(1, max_num_batched_tokens // input_len)


def prefill_instance(
    model: ModelSpec, pool: PoolSpec, job: ServeJob, cfg: ServeConfig, memory: ServeMemory
) -> PrefillInstance:
    """Prefill throughput of one instance: every tick each DP rank runs `max_num_batched_tokens`
    prompt tokens (prompts chunked as vLLM/SGLang chunk them), with PP micro-batches in flight, as many
    as its running-request cap admits (`prefill_seqs`: below it, the pipeline runs part-empty). At
    full load every rank has a backlog (the engines route each request to the least-loaded DP rank),
    so every rank fills its budget: no busiest-rank excess (`step_time(balanced_prefill=True)`)."""
    budget = cfg.max_num_batched_tokens
    per_tick_prompts = budget / job.input_len
    fill = min(1.0, cfg.max_num_seqs / prefill_seqs(budget, job.input_len, cfg.pp))
    tick = step_time(
        model,
        pool,
        cfg,
        decode_seqs=0,
        prefill_tokens=budget,
        prefills=per_tick_prompts,
        prefill_len=job.input_len,
        context_len=0,
        balanced_prefill=True,
    )
    prompt = prefill_time(model, pool, cfg, prompt_len=job.input_len)
    rate = cfg.dp_attention * per_tick_prompts / tick.total_s * fill
    return PrefillInstance(config=cfg, memory=memory, prompt=prompt, step=tick, requests_per_s=rate)


def decode_instance(
    model: ModelSpec,
    pool: PoolSpec,
    job: ServeJob,
    cfg: ServeConfig,
    memory: ServeMemory,
    *,
    concurrency: int,
) -> DecodeInstance:
    """Decode-only steps of `concurrency` requests per DP rank attending to the mean context; with
    `cfg.speculative_tokens` each step verifies the MTP drafts and advances every sequence by
    `mtp.accepted_tokens` tokens (`step` is then one step, TPOT the step over those tokens)."""
    per_mb = concurrency / cfg.pp
    advance = 1.0
    if cfg.speculative_tokens:
        tick, advance = mtp_decode_step(
            model, pool, cfg, decode_seqs=per_mb, context_len=decode_context_len(job)
        )
    else:
        tick = step_time(
            model,
            pool,
            cfg,
            decode_seqs=per_mb,
            prefill_tokens=0,
            prefills=0,
            prefill_len=job.input_len,
            context_len=decode_context_len(job),
        )
    step = tick.scaled(cfg.pp)
    tpot = step.total_s / advance
    return DecodeInstance(
        config=cfg,
        memory=memory,
        concurrency=concurrency,
        step=step,
        tpot_s=tpot,
        throughput_tokens_per_s=concurrency * cfg.dp_attention / tpot,
        output_len=job.output_len,
    )


def md1_wait_s(service_s: float, utilization: float) -> float:
    """Mean wait in an M/D/1 queue (Pollaczek-Khinchine with zero service variance)."""
    if utilization <= 0:
        return 0.0
    if utilization >= 1:
        return float("inf")
    return utilization * service_s / (2.0 * (1.0 - utilization))


def md1_wait_quantile_s(service_s: float, utilization: float, q: float) -> float:
    """The q-quantile of the M/D/1 wait from the exponential tail approximation of the M/G/1
    waiting time, P(W > t) ~= rho exp(-t rho / E[W]) (exact mean; exact probability of waiting,
    rho): t_q = E[W] / rho x ln(rho / (1 - q)), zero when rho <= 1 - q."""
    if utilization <= (1 - q) * (1 + 1e-9):
        return 0.0
    mean = md1_wait_s(service_s, utilization)
    return mean / utilization * math.log(utilization / (1 - q))


@dataclass(frozen=True, slots=True)
class PrefillCycle:
    """One prefill instance at a planned utilization (see the module docstring): its steps' linear time
    c(k) = fixed_s + per_prompt_s k, and a request's wait and own step."""

    arrivals_per_s: float
    """p: prompts/s arriving at the instance (all its DP ranks, which step together)."""
    fixed_s: float
    """a: the part of a step (one pipeline tick) that does not grow with its prompts."""
    per_prompt_s: float
    """b: the step time each prompt adds."""
    busy: float
    """The probability that an arrival finds a step running: min(1, p c(1))."""
    mean_s: float
    """E[C]: the mean step, at least one prompt's."""
    var_s2: float
    """Var C of the step lengths."""
    wait_s: float
    """Mean wait for the running step to end: busy x E[C^2] / (2 E[C])."""
    own_s: float
    """Mean time of the request's own step through all PP stages, with the prompts that came with it."""
    own_sd_s: float
    """Standard deviation of `own_s` (the Poisson count of the prompts sharing the step)."""


def prefill_cycle(prefill: PrefillInstance, utilization: float) -> PrefillCycle:
    """The batching queue of one prefill instance at `utilization` of its full-budget rate.

    Attention-DP ranks step in lock-step (they meet at every MoE layer; an idle rank runs a dummy
    batch), so the instance is one server: its arrivals are all its ranks', a step spreads what has
    arrived over the ranks and lasts as long as the busiest rank's share (the full-budget tick prices
    that imbalance). a and b come from two points of the step time: the prompt alone (prompt time /
    PP per tick) and the full-budget tick of K prompts over all ranks, b = (tick - prompt / PP) /
    (K - 1), a = prompt / PP - b (a = 0, b = tick / K when the full tick costs more per prompt than the
    prompt alone). A prompt longer than the budget (K <= 1, or, with several DP ranks each chunking a
    prompt of its own, a prompt alone longer than a tick) is chunked over several ticks with nothing
    to batch: the engine is then an M/D/1 server of the prompt's service time."""
    cfg = prefill.config
    p = max(0.0, utilization) * prefill.requests_per_s
    tick = prefill.step.total_s
    prompts = prefill.requests_per_s * tick  # K, prompts per full-budget tick (all DP ranks)
    alone = prefill.prompt.total_s
    if utilization >= 1:
        inf = float("inf")
        return PrefillCycle(p, 0.0, 0.0, 1.0, inf, inf, inf, inf, 0.0)
    if prompts <= 1 + 1e-9 or alone / cfg.pp >= tick:  # b would be negative: nothing batches
        service = 1.0 / prefill.requests_per_s
        wait = md1_wait_s(service, utilization)
        return PrefillCycle(p, 0.0, service, utilization, service, 0.0, wait, alone, 0.0)
    b = (tick - alone / cfg.pp) / (prompts - 1)
    a = alone / cfg.pp - b
    if a < 0:
        a, b = 0.0, tick / prompts
    one = a + b
    busy = min(1.0, p * one)
    pb = p * b
    mean = max(one, a / (1.0 - pb))
    var = b * b * p * mean / (1.0 - pb * pb)
    biased = (var + mean * mean) / mean  # E[C^2] / E[C]: the step an arrival lands in
    others = p * busy * biased  # prompts that arrived in that step with it
    own = alone + cfg.pp * b * others
    sd = cfg.pp * b * math.sqrt(p * busy * biased + (p * busy) ** 2 * var)
    return PrefillCycle(p, a, b, busy, mean, var, busy * biased / 2, own, sd)


def prefill_wait_s(prefill: PrefillInstance, utilization: float, q: float | None = None) -> float:
    """A request's time in the prefill instance (its wait and its own step), mean or q-quantile. The
    quantile takes the residual of the running step as uniform over the length-biased step (waited
    with the busy probability) and the own step as normal: within 25 % of the simulated p90."""
    c = prefill_cycle(prefill, utilization)
    if q is None or math.isinf(c.wait_s):
        return c.wait_s + c.own_s
    if c.var_s2 == 0.0 and c.fixed_s == 0.0:  # M/D/1 (prompt longer than the budget)
        return md1_wait_quantile_s(c.per_prompt_s, utilization, q) + c.own_s
    biased = 2 * c.wait_s / c.busy if c.busy > 0 else 0.0
    wait = 0.0 if c.busy <= 1 - q else biased * (1 - (1 - q) / c.busy)
    return wait + c.own_s + NormalDist().inv_cdf(q) * c.own_sd_s


def disagg_ttft_s(
    prefill: PrefillInstance,
    transfer: KvTransfer,
    decode_tpot_s: float,
    utilization: float,
    q: float | None = None,
) -> float:
    """Mean TTFT at the given prefill utilization (see the module docstring): the time in the prefill
    instance, the KV transfer and the first token on the decode instance; with `q`, its q-quantile
    (the prefill part's quantile, the rest at its mean)."""
    return prefill_wait_s(prefill, utilization, q) + transfer.seconds + first_token_s(decode_tpot_s)


def first_token_s(decode_tpot_s: float) -> float:
    """From the KV cache landing on the decode instance to the request's first token: a running
    decode batch admits new requests only between steps (continuous batching: vLLM's scheduler moves a
    request whose remote KV has arrived into the batch at its next step, SGLang's decode loop polls
    the transfers once per step), the landing is uniform over the running step, so the request waits
    half a step on average, then runs one: 1.5 TPOT."""
    return 1.5 * decode_tpot_s


def max_utilization_for_ttft(
    prefill: PrefillInstance,
    transfer: KvTransfer,
    decode_tpot_s: float,
    ttft_target_s: float | None,
    cap: float = MAX_PREFILL_UTILIZATION,
) -> float:
    """The highest prefill utilization (at most `cap`) whose mean TTFT meets the target; 0 when even
    an idle instance misses it. TTFT grows monotonically with the utilization: bisection."""
    if ttft_target_s is None:
        return cap

    def ttft(u: float) -> float:
        return disagg_ttft_s(prefill, transfer, decode_tpot_s, u)

    if ttft(0.0) > ttft_target_s:
        return 0.0
    if ttft(cap) <= ttft_target_s:
        return cap
    lo, hi = 0.0, cap
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ttft(mid) <= ttft_target_s else (lo, mid)
    return lo
