"""The serving Pareto front: output tokens/s per GPU against tokens/s per user (1 / TPOT) over every
deployment the planner can build, aggregated replicas and prefill/decode splits alike.

Aggregated points: every legal engine at every concurrency of its ladder (replicas scale throughput
and GPUs alike, so one engine's point is its own tokens/s per GPU). Disaggregated points: every
decode instance at every concurrency of its ladder, paired with the prefill instance that gives the
most planned prompt rate per GPU, in the integer xPyD mix that fits the cluster and serves the most
tokens/s per GPU used. Points missing a TTFT target are left out; TPOT targets are what the front is
cut at. Figures come from the same tables the CP-SAT model reads.

The front honours a deadline (its share of the command's `--time-limit`, `FRONT_SHARE`): its enumeration
stops at it (once it has one engine), the aggregated engines get half of what is left when they start, the
split engines the rest, both the most promising first (`space.promise_order`); past it the engines left are
not evaluated and the front says so (`Front.complete`, `Front.cut_text`, `Front.unexamined`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from autoshard.costmodel.serve.engines import DEFAULT_ENGINE
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.predict import concurrency_ladder, kv_limited_concurrency, predict_serve
from autoshard.errors import InfeasibleError
from autoshard.search.deadline import Deadline
from autoshard.search.serve.disagg import tabulate_disagg
from autoshard.search.serve.ladder import ENUM_TIME_CUT, highest_between
from autoshard.search.serve.space import MAX_CONCURRENCY, Engine, _config, _unpriced, enumerate_serve, promise_order
from autoshard.specs.cluster import ClusterSpec, PoolSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec
from autoshard.units import time_to_us

__all__ = ["FrontPoint", "Front", "serve_front", "STANDARD_TPOT_MS", "FRONT_SHARE"]

FRONT_SHARE = 0.3
"""Share of `solve --mode serve --pareto`'s time limit kept for the front: the plan's solve runs to
(1 - FRONT_SHARE) of the limit, the front to the limit itself (and gets all the solve leaves). At the
default 30 s that is 9 s or more, past the 6 s of CPU the largest measured front takes (Qwen3-235B on 576
GB200); at 2-5 s the plan comes first and the front is cut and labelled as such."""

STANDARD_TPOT_MS = (20.0, 33.0, 50.0, 100.0)
"""TPOT SLAs the front is cut at besides the job's own (50 tokens/s per user down to 10)."""


@dataclass(frozen=True, slots=True)
class FrontPoint:
    kind: str
    """"aggregated" or "disaggregated"."""
    label: str
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    tpot_s: float
    ttft_s: float
    gpus: int
    """GPUs of one engine (aggregated) or of the whole xPyD mix (disaggregated)."""
    pools: tuple[tuple[int, int], ...] = ()
    """(pool index, GPUs there) of the deployment: what a price per pool charges it for."""


@dataclass(frozen=True, slots=True)
class Front:
    points: tuple[FrontPoint, ...]
    """Every deployment evaluated."""
    front: tuple[FrontPoint, ...]
    """The Pareto-optimal ones, fastest per user first."""
    evaluated: int = 0
    """Candidate engines evaluated (an engine as aggregated replicas and as a prefill/decode instance
    count once each)."""
    candidates: int = 0
    """Candidate engines there were: fewer evaluated means the deadline cut the front short."""
    unexamined: int = 0
    """Candidate engines the enumeration never examined (the deadline ran out first): not in `candidates`."""

    @property
    def complete(self) -> bool:
        """Whether every candidate engine was evaluated (no time limit cut the front short)."""
        return self.evaluated >= self.candidates and not self.unexamined

    def cut_text(self) -> str:
        """"" for a complete front, else what it covers: "front over N of M deployments, cut at the
        time limit" (and the candidates the enumeration never examined, when it was cut too)."""
        if self.complete:
            return ""
        more = f", {self.unexamined} more candidate engine(s) not examined" if self.unexamined else ""
        return (f"front over {self.evaluated} of {self.candidates} deployments (candidate engines, "
                f"aggregated and split{more}), cut at the time limit")

    def best_at(self, tpot_s: float) -> FrontPoint | None:
        """The most tokens/s per GPU used with TPOT <= tpot_s (where the SLA cuts the front). A cost
        study ranks `meeting(tpot_s)` by its price on the GPUs rented instead (`study.front`)."""
        return max(self.meeting(tpot_s, front_only=True), key=lambda p: p.tokens_per_s_per_gpu, default=None)

    def meeting(self, tpot_s: float, *, front_only: bool = False) -> list[FrontPoint]:
        """Every deployment evaluated (or only the front's) with TPOT <= tpot_s."""
        return [p for p in (self.front if front_only else self.points) if p.tpot_s <= tpot_s * (1 + 1e-9)]


def _pareto(points: list[FrontPoint]) -> tuple[FrontPoint, ...]:
    out: list[FrontPoint] = []
    for p in sorted(points, key=lambda p: (-p.tokens_per_s_per_user, -p.tokens_per_s_per_gpu)):
        if not out or p.tokens_per_s_per_gpu > out[-1].tokens_per_s_per_gpu:
            out.append(p)
    return tuple(out)


def _aggregated_point(model: ModelSpec, pool: PoolSpec, free: ServeJob, e: Engine, where: str,
                      ttft_ok: Callable[[float], bool], b: int) -> FrontPoint | None:
    """The front's point of aggregated engine `e` at concurrency `b` (None: it cannot run it, or misses
    the TTFT target)."""
    cfg = _config(model, pool, free, e, max_num_seqs=b)
    try:
        pred = predict_serve(model, pool, free, cfg, concurrency=b)
    except InfeasibleError:
        return None
    if pred.concurrency < b or not ttft_ok(pred.ttft_s):
        return None
    return FrontPoint("aggregated", f"{where}{e.label()} x{b}", pred.tokens_per_s_per_gpu, 1.0 / pred.tpot_s,
                      pred.tpot_s, pred.ttft_s, e.gpus, ((e.pool, e.gpus),))


def serve_front(
    model: ModelSpec, cluster: ClusterSpec, job: ServeJob, *, disaggregate: str = "auto",
    framework: str = DEFAULT_ENGINE, time_limit_s: float | None = None, started_at: float | None = None,
    deadline: Deadline | None = None,
) -> Front:
    """Every deployment's (tokens/s per GPU, tokens/s per user) and their Pareto front, priced for
    `framework` ("vllm" or "sglang"). The front spans all TPOTs: the job's TPOT target only adds, per
    aggregated engine and per decode instance, the point at the highest concurrency that meets it (the
    solver's, between two ladder rungs); its TTFT target filters points. With `deadline` (or `time_limit_s`, counted from `started_at`, a
    `time.monotonic()` value) the engines left when it expires are not evaluated: the front returned is
    partial and says so (`Front.complete` false)."""
    if deadline is None:
        deadline = Deadline.never() if time_limit_s is None else Deadline(time_limit_s, start=started_at)
    free = job.model_copy(update={"tpot_target_s": None})
    space = enumerate_serve(model, cluster, free, framework=framework, deadline=deadline)
    unexamined = space.reasons().get(ENUM_TIME_CUT, 0)
    points: list[FrontPoint] = []
    found: dict[int, list[FrontPoint]] = {}  # by index in `space.engines`, listed in that order, cut or not
    ttft_ok = (lambda t: True) if job.ttft_target_s is None else (lambda t: t <= job.ttft_target_s)
    candidates = len(space.engines) * ((disaggregate != "on") + (disaggregate != "off"))
    evaluated = 0
    if disaggregate != "on":
        first = deadline.part(0.5) if disaggregate != "off" else deadline  # the split engines get the rest
        for i in promise_order(model, cluster, free, space):  # the most promising first (what a cut keeps)
            if first.expired():
                break
            evaluated, e, found[i] = evaluated + 1, space.engines[i], []
            pool = cluster.pools[e.pool]
            if _unpriced(pool, e, split=False):
                continue
            top = serve_memory(
                model,
                pool,
                _config(model, pool, free, e, max_num_seqs=MAX_CONCURRENCY),
                context_len=free.context_len,
            )
            where = f"{pool.name} " if len(cluster.pools) > 1 else ""
            point = partial(_aggregated_point, model, pool, free, e, where, ttft_ok)
            ladder = concurrency_ladder(max(1, min(MAX_CONCURRENCY, kv_limited_concurrency(top, free))))
            rungs = {b: point(b) for b in ladder}
            found[i] += [q for q in rungs.values() if q is not None]
            if job.tpot_target_s is not None:  # the solver's concurrency at the target, between two rungs
                target_us = time_to_us(job.tpot_target_s)
                extra: dict[int, FrontPoint | None] = {}

                def meets(b: int, point=point, rungs=rungs, extra=extra, target_us=target_us) -> bool:
                    q = rungs[b] if b in rungs else extra.setdefault(b, point(b))
                    return q is not None and time_to_us(q.tpot_s) <= target_us

                kept = [b for b in ladder if meets(b)]
                above = [b for b in ladder if kept and b > kept[-1]]
                if above and (b := highest_between(kept[-1], above[0], meets)) is not None:
                    found[i].append(extra[b])
    points += [p for i in sorted(found) for p in found[i]]
    if disaggregate != "off":
        split, done = _disagg_points(model, cluster, free, job, space, deadline)
        points += split
        evaluated += done
    return Front(tuple(points), _pareto(points), evaluated, candidates, unexamined)


def _disagg_points(model, cluster, free, job, space, deadline):  # type: ignore[no-untyped-def]
    """The split points and how many engines of `space` were evaluated as split instances (all
    tabulated ones whose decode rows were all paired before `deadline`)."""
    from autoshard.costmodel.serve.disagg import disagg_ttft_s, kv_link, kv_transfer

    tables = tabulate_disagg(model, cluster, free, space, keep_all=True, deadline=deadline,
                             refine_tpot_s=job.tpot_target_s)
    out: list[FrontPoint] = []
    unpaired: set[int] = set()  # indices in space.engines of engines with a decode row never paired
    index = {id(e): i for i, e in enumerate(space.engines)}
    for a, pa in enumerate(cluster.pools):  # prefill pool
        prefill = [r for r in tables.prefill if r.engine.pool == a]
        if not prefill:
            continue
        p = max(prefill, key=lambda r: r.instance.requests_per_s * r.utilization / r.engine.gpus)
        rp = p.instance.requests_per_s * p.utilization
        for b, pb in enumerate(cluster.pools):  # decode pool
            same = a == b
            for d in (r for r in tables.decode if r.engine.pool == b):
                if deadline.expired():
                    unpaired.add(index[id(d.engine)])
                    continue
                rd = d.instance.requests_per_s
                best = None
                for y in range(1, pb.num_gpus // d.engine.gpus + 1):
                    x = math.ceil(y * rd / rp - 1e-9)
                    used = x * p.engine.gpus + y * d.engine.gpus
                    if (used if same else x * p.engine.gpus) > pa.num_gpus:
                        break
                    per_gpu = y * rd * free.output_len / used
                    if best is None or per_gpu > best[0]:
                        best = (per_gpu, x, y, used)
                if best is None:
                    continue
                per_gpu, x, y, used = best
                link = kv_link(
                    pa,
                    # one rack holds `domain_used` GPUs of the job (GB200 racks run with 64 of 72)
                    same_domain=same and used <= pa.domain_fill_size,
                    other=pb,
                    inter_pool_gbps=cluster.pool_link_gbps,
                )
                tr = kv_transfer(model, free, p.instance.config, d.instance.config, link)
                ttft = disagg_ttft_s(
                    p.instance, tr, d.instance.tpot_s, y * rd / (x * p.instance.requests_per_s)
                )
                if job.ttft_target_s is not None and ttft > job.ttft_target_s:
                    continue
                where = (
                    (f"{pa.name}->{pb.name} " if not same else f"{pa.name} ")
                    if cluster.is_heterogeneous
                    else ""
                )
                mtp = f" MTP{d.instance.config.speculative_tokens}" if d.instance.config.speculative_tokens else ""
                label = (f"{where}{x}P{y}D P:{p.engine.label()} D:{d.engine.label()}{mtp} "
                         f"x{d.instance.concurrency}")
                out.append(
                    FrontPoint(
                        "disaggregated",
                        label,
                        per_gpu,
                        1.0 / d.instance.tpot_s,
                        d.instance.tpot_s,
                        ttft,
                        used,
                        ((a, used),) if same else ((a, x * p.engine.gpus), (b, y * d.engine.gpus)),
                    )
                )
    return out, tables.engines_done - len(unpaired)
