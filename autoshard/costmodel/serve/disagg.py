"""Prefill/decode disaggregation physics: what one prefill instance and one decode instance deliver,
the KV-cache hand-off between them, and the queueing that balances them.

A disaggregated (xPyD) deployment runs x prefill instances and y decode instances. A prefill instance
runs prompts only, in steps of `max_num_batched_tokens` tokens; a decode instance runs decode steps
only (no prefill chunks riding its batch). After its prefill a request's KV cache moves to a decode
instance once: input_len x kv_cache_bytes_per_token bytes (vLLM NixlConnector / SGLang Mooncake
transfer engine), over NVLink when both instances sit in one NVLink domain, else over RDMA: every
GPU of the prefill instance that holds part of the request's cache sends its part through its own
NIC, so the transfer runs on min(sending, receiving) GPU links in parallel.

TTFT of a disaggregated request = the wait in the prefill queue + half a prefill step (a request
joins at a step boundary) + its own prefill + the KV transfer + the first decode step. The queue is
M/D/1 (Poisson arrivals, deterministic service at the instance's prefill rate): the mean wait at
utilization rho is rho / (2 (1 - rho)) x the service time. Prefill instances are planned at a
utilization no higher than `MAX_PREFILL_UTILIZATION`, or lower when a TTFT target needs it.

The step times come from `autoshard.costmodel.serve.step` (`step_time`, `prefill_time`), so any
refinement there flows into these figures. Pure functions: no I/O, no solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoshard.costmodel.comm import Link, group_link, nic_link, pool_link, striped_send_s
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import ServeMemory
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
    "prefill_instance",
    "decode_instance",
    "md1_wait_s",
    "md1_wait_quantile_s",
    "max_utilization_for_ttft",
    "disagg_ttft_s",
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
    """One TPOT (PP ticks of the slowest stage), no prefill chunks."""
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


def prefill_instance(
    model: ModelSpec, pool: PoolSpec, job: ServeJob, cfg: ServeConfig, memory: ServeMemory
) -> PrefillInstance:
    """Prefill throughput of one instance: every tick each DP rank runs `max_num_batched_tokens`
    prompt tokens (prompts chunked as vLLM/SGLang chunk them), with PP micro-batches in flight."""
    budget = cfg.max_num_batched_tokens
    per_tick_prompts = budget / job.input_len
    tick = step_time(
        model,
        pool,
        cfg,
        decode_seqs=0,
        prefill_tokens=budget,
        prefills=per_tick_prompts,
        prefill_len=job.input_len,
        context_len=0,
    )
    prompt = prefill_time(model, pool, cfg, prompt_len=job.input_len)
    rate = cfg.dp_attention * per_tick_prompts / tick.total_s
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
    """Decode-only steps of `concurrency` requests per DP rank attending to the mean context."""
    per_mb = concurrency / cfg.pp
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
    tpot = step.total_s
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


def disagg_ttft_s(
    prefill: PrefillInstance,
    transfer: KvTransfer,
    decode_tpot_s: float,
    utilization: float,
    q: float | None = None,
) -> float:
    """Mean TTFT at the given prefill utilization (see the module docstring); with `q`, its
    q-quantile (the queue wait's quantile, the rest deterministic)."""
    service = 1.0 / prefill.requests_per_s
    wait = md1_wait_s(service, utilization) if q is None else md1_wait_quantile_s(service, utilization, q)
    return wait + prefill.step.total_s / 2 + prefill.prompt.total_s + transfer.seconds + decode_tpot_s


def max_utilization_for_ttft(
    prefill: PrefillInstance,
    transfer: KvTransfer,
    decode_tpot_s: float,
    ttft_target_s: float | None,
    cap: float = MAX_PREFILL_UTILIZATION,
) -> float:
    """The highest prefill utilization (at most `cap`) whose mean TTFT meets the target; 0 when even
    an idle instance misses it. Solves rho s / (2 (1 - rho)) = slack for rho."""
    if ttft_target_s is None:
        return cap
    slack = ttft_target_s - disagg_ttft_s(prefill, transfer, decode_tpot_s, 0.0)
    if slack < 0:
        return 0.0
    service = 1.0 / prefill.requests_per_s
    return min(cap, 2.0 * slack / (service + 2.0 * slack))
