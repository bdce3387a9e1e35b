"""Disaggregated (xPyD) serving: tables of prefill and decode instances for the CP-SAT model.

Every legal engine of the serving space (`autoshard.search.serve.space.enumerate_serve`) can be a
prefill instance or a decode instance. A prefill row is an engine at one planned utilization (a
ladder of levels when a TTFT target needs headroom, else `MAX_PREFILL_UTILIZATION`); a decode row is
an engine at one concurrency of its ladder, meeting the TPOT target. `autoshard.search.serve.solve` adds
the instance counts and the balance between them to the same CP-SAT model that picks aggregated
rows. Physics in `autoshard.costmodel.serve.disagg`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

from autoshard.costmodel.serve.disagg import (
    MAX_PREFILL_UTILIZATION,
    DecodeInstance,
    KvTransfer,
    PrefillInstance,
    decode_instance,
    disagg_ttft_s,
    first_token_s,
    holders,
    kv_link,
    kv_transfer,
    kv_transfer_bytes,
    prefill_instance,
    prefill_seqs,
)
from autoshard.costmodel.comm import Link
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.mtp import mtp_draft_options
from autoshard.costmodel.serve.predict import concurrency_ladder, kv_limited_concurrency
from autoshard.search.deadline import Deadline
from autoshard.search.serve.budget import ll_budgeted
from autoshard.search.serve.ladder import highest_between
from autoshard.search.serve.space import (
    MAX_CONCURRENCY, Engine, ServeSpace, _config, _ladder_top, _unpriced, split_decode_rule,
)
from autoshard.specs.cluster import ClusterSpec, PoolSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec
from autoshard.units import time_to_us

__all__ = [
    "UTILIZATION_LADDER",
    "PrefillRow",
    "DecodeRow",
    "DisaggTables",
    "tabulate_disagg",
    "transfer_for",
    "MILLI",
    "TIME_CUT",
]

UTILIZATION_LADDER = (0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
"""Planned prefill utilizations tried when a TTFT target is set (the highest that meets it wins)."""
MILLI = 1000
TIME_CUT = "time limit: engines not tabulated as prefill/decode instances (no bound on them)"
"""The `pruned` reason of the engines a split table never reached: the deadline's share for the tables
ran out first (the plan is then chosen from what was tabulated, FEASIBLE, not proven optimal)."""


@dataclass(frozen=True, slots=True)
class PrefillRow:
    engine: Engine
    instance: PrefillInstance
    utilization: float
    rate_milli: int
    """Requests/s it is planned to take (rate x utilization), in thousandths, rounded down."""
    ttft_us: int
    """TTFT before the KV transfer and the first decode step: queue wait, half a step, the prompt."""
    send_us: tuple[int, int, int]
    """KV-transfer time if this side's GPUs were the narrower end: (NVLink, RDMA, across pools), us."""


@dataclass(frozen=True, slots=True)
class DecodeRow:
    engine: Engine
    instance: DecodeInstance
    rate_milli: int
    """Requests/s of one instance, in thousandths, rounded down."""
    tpot_us: int
    first_us: int
    """From the KV cache landing to the first token (`first_token_s`): the TTFT's decode part."""
    recv_us: tuple[int, int, int]
    """KV-transfer time if this side's GPUs were the narrower end: (NVLink, RDMA, across pools), us."""


@dataclass(slots=True)
class DisaggTables:
    prefill: list[PrefillRow]
    decode: list[DecodeRow]
    dropped: Counter[str]
    latency_us: tuple[int, ...]
    """Per-transfer link latency (NVLink, RDMA, across pools)."""
    untabulated: int = 0
    """Engines of the space never tabulated: the deadline ran out first (0: the tables are complete)."""
    engines_done: int = 0
    """Engines of the space tabulated (dropped ones included), in `space.engines` order."""


def _side_us(model: ModelSpec, job: ServeJob, streams: int, bytes_per_s: float) -> int:
    return time_to_us(kv_transfer_bytes(model, job) / (streams * bytes_per_s))


def _decode_row(model: ModelSpec, pool: PoolSpec, job: ServeJob, e: Engine, plinks: Sequence[Link], b: int,
                drafts: int, lost: Counter[str]) -> DecodeRow | None:
    """The decode instance of engine `e` at concurrency `b` with `drafts` MTP tokens; None (its reason
    counted in `lost`) when its KV cache cannot hold `b` requests or it misses the TPOT target."""
    dcfg = _config(model, pool, job, e, max_num_seqs=b, split=True, role="decode")
    dcfg = ll_budgeted(model, pool.gpu, replace(dcfg, speculative_tokens=drafts), job)  # its MTP tokens too
    dmem = serve_memory(model, pool, dcfg, context_len=job.context_len)
    if dmem.problem() or kv_limited_concurrency(dmem, job) < b:
        lost["decode concurrency beyond the KV cache"] += 1
        return None
    d = decode_instance(model, pool, job, dcfg, dmem, concurrency=b)
    tpot = time_to_us(d.tpot_s)
    if job.tpot_target_s is not None and tpot > time_to_us(job.tpot_target_s):
        lost["decode instance misses the TPOT target"] += 1
        return None
    recv = tuple(_side_us(model, job, holders(dcfg), lk.bytes_per_s) for lk in plinks)
    return DecodeRow(e, d, int(d.requests_per_s * MILLI), tpot, time_to_us(first_token_s(d.tpot_s)),
                     recv)  # type: ignore[arg-type]


def tabulate_disagg(
    model: ModelSpec, cluster: ClusterSpec, job: ServeJob, space: ServeSpace, *, keep_all: bool = False,
    deadline: Deadline | None = None, refine_tpot_s: float | None = None,
) -> DisaggTables:
    """Prefill and decode rows of every engine in `space`, dominated rows dropped (with a count)
    unless `keep_all` (the Pareto front wants every decode concurrency). Once `deadline` has expired
    the engines left are not tabulated: they are counted under `TIME_CUT` and in `untabulated`.
    `refine_tpot_s`: a TPOT the decode concurrency is also searched to between the ladder's rungs when the
    job has none (the Pareto front, which spans all TPOTs, at the plan's target)."""
    cap = job.tpot_target_s if job.tpot_target_s is not None else refine_tpot_s
    cap_us = time_to_us(cap) if cap is not None else None
    dropped: Counter[str] = Counter()
    done = 0
    prefill: list[PrefillRow] = []
    decode: list[DecodeRow] = []
    all_links = [_links(cluster, q) for q in cluster.pools]
    levels = UTILIZATION_LADDER if job.ttft_target_s is not None else (MAX_PREFILL_UTILIZATION,)
    for e in space.engines:  # listed order (pool, TP, PP): measured to cut better than a memory ranking here
        if deadline is not None and deadline.expired():
            break
        done += 1
        pool = cluster.pools[e.pool]
        plinks = all_links[e.pool]
        if why := _unpriced(pool, e, split=True):  # an SGLang split instance whose line runs no DeepEP, or
            dropped[why if e.framework == "vllm" else  # vLLM's DP with TP experts (serve.vllm_dp_moe)
                    "SGLang prefill/decode instance with attention DP + EP without DeepEP (not priced)"] += 1
            continue
        # ---- prefill side
        budget_cfg = _config(model, pool, job, e, max_num_seqs=1, split=True, role="prefill")
        seqs = prefill_seqs(budget_cfg.max_num_batched_tokens, job.input_len, e.pp)
        cfg = _config(model, pool, job, e, max_num_seqs=seqs, split=True, role="prefill")
        mem = serve_memory(model, pool, cfg, context_len=job.context_len)
        if mem.problem() or kv_limited_concurrency(mem, job) < 1:
            cfg = budget_cfg
            mem = serve_memory(model, pool, cfg, context_len=job.context_len)
        inst = prefill_instance(model, pool, job, cfg, mem)
        send = tuple(_side_us(model, job, holders(cfg), lk.bytes_per_s) for lk in plinks)
        for u in levels:
            ttft = disagg_ttft_s(inst, _zero_transfer(), 0.0, u)
            if job.ttft_target_s is not None and time_to_us(ttft) > time_to_us(job.ttft_target_s):
                dropped["prefill utilization too high for the TTFT target"] += 1
                continue
            rate = int(inst.requests_per_s * u * MILLI)
            if rate < 1:
                dropped["prefill instance too slow"] += 1
                continue
            prefill.append(PrefillRow(e, inst, u, rate, time_to_us(ttft), send))  # type: ignore[arg-type]
        # ---- decode side
        if (reason := split_decode_rule(e)) is not None:
            dropped[reason] += 1
            continue
        top = serve_memory(
            model,
            pool,
            _ladder_top(model, pool, _config(model, pool, job, e, max_num_seqs=MAX_CONCURRENCY, split=True, role="decode")),
            context_len=job.context_len,
        )
        limit = max(1, min(MAX_CONCURRENCY, kv_limited_concurrency(top, job)))
        # MTP drafts only without PP (SGLang refuses speculative decoding with --pp-size > 1)
        drafting = mtp_draft_options(model) if e.pp == 1 else (0,)
        row = partial(_decode_row, model, pool, job, e, plinks)
        ladder = concurrency_ladder(limit)
        edge: dict[int, list[int]] = {drafts: [0, 0] for drafts in drafting}  # highest rung kept, next rung lost
        for b, drafts in itertools.product(ladder, drafting):
            if (r := row(b, drafts, dropped)) is not None:
                decode.append(r)
            if r is not None and (cap_us is None or r.tpot_us <= cap_us):
                edge[drafts] = [b, 0]
            elif edge[drafts][0] and not edge[drafts][1]:
                edge[drafts][1] = b
        # between the highest rung kept and the next, the highest concurrency the TPOT target and the KV
        # cache still allow (it dominates the other rows between the two)
        for drafts, (below, above) in edge.items():
            extra: dict[int, DecodeRow | None] = {}

            def kept(b: int, drafts=drafts, extra=extra, row=row) -> bool:
                r = extra.setdefault(b, row(b, drafts, Counter()))
                return r is not None and (cap_us is None or r.tpot_us <= cap_us)

            if below and above and (b := highest_between(below, above, kept)) is not None:
                decode.append(extra[b])  # type: ignore[arg-type]
    # one latency per kind of link, the slowest pool's (the transfer time itself is per row)
    latency = tuple(max(time_to_us(lk[k].latency_s) for lk in all_links) for k in range(3))
    if (untabulated := len(space.engines) - done):
        dropped[TIME_CUT] += untabulated
    if keep_all:
        return DisaggTables(prefill, decode, dropped, latency, untabulated, done)
    if job.ttft_target_s is None:  # then TTFT, TPOT and transfer times are not in the model
        kept_p = _pareto(prefill, lambda r: (r.engine.gpus, -r.rate_milli))
        kept_d = _pareto(decode, lambda r: (r.engine.gpus, -r.rate_milli))
    else:
        kept_p = _pareto(prefill, lambda r: (r.engine.gpus, -r.rate_milli, r.ttft_us, *r.send_us))
        kept_d = _pareto(decode, lambda r: (r.engine.gpus, -r.rate_milli, r.tpot_us, r.first_us, *r.recv_us))
    dropped["prefill instance dominated (as many GPUs or more, no faster, no sooner)"] += len(prefill) - len(
        kept_p
    )
    dropped["decode instance dominated (as many GPUs or more, no faster, no lower TPOT)"] += len(
        decode
    ) - len(kept_d)
    return DisaggTables(kept_p, kept_d, dropped, latency, untabulated, done)


def _pareto(rows: list, key) -> list:  # type: ignore[no-untyped-def]
    """Rows no other row of the same pool beats or ties on every coordinate of `key` (smaller is
    better). A dominated instance can be swapped for its dominator in any deployment without using
    more GPUs, losing rate, or lengthening TTFT/TPOT (the deployment serves min(prefill, decode)
    capacity, so spare rate is never a cost), and the optimum is unchanged."""
    keyed = sorted(((r.engine.pool, key(r)), i) for i, r in enumerate(rows))
    kept: list[tuple[int, tuple]] = []
    out = []
    for (pool, k), i in keyed:
        if any(q == pool and all(a <= b for a, b in zip(kk, k, strict=True)) for q, kk in kept):
            continue
        kept.append((pool, k))
        out.append(rows[i])
    return out


def _links(cluster: ClusterSpec, pool):  # type: ignore[no-untyped-def]
    """(NVLink, RDMA inside the pool, the inter-pool network) per-GPU links of a pool's instances."""
    cross = (
        kv_link(
            pool,
            same_domain=False,
            other=cluster.pools[-1] if pool is cluster.pools[0] else cluster.pools[0],
            inter_pool_gbps=cluster.pool_link_gbps,
        )
        if cluster.is_heterogeneous
        else None
    )
    rdma = kv_link(pool, same_domain=False)
    return (kv_link(pool, same_domain=True), rdma, cross or rdma)


def _zero_transfer() -> KvTransfer:
    return KvTransfer(bytes_per_request=0.0, link="nvlink", streams=1, bytes_per_s=1.0, seconds=0.0)


def transfer_for(
    model: ModelSpec, cluster: ClusterSpec, job: ServeJob, p: PrefillRow, d: DecodeRow, *, same_domain: bool
) -> KvTransfer:
    """The KV transfer of a chosen prefill/decode pair (over the inter-pool network when their pools
    differ)."""
    pool, other = cluster.pools[p.engine.pool], cluster.pools[d.engine.pool]
    link = kv_link(
        pool, same_domain=same_domain and pool is other, other=other, inter_pool_gbps=cluster.pool_link_gbps
    )
    return kv_transfer(model, job, p.instance.config, d.instance.config, link)
