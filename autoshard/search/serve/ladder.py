"""Which rows of a serving engine are kept: bisection of its concurrency ladder for the highest
concurrency that meets the targets (throughput, TPOT and TTFT all grow with concurrency, so lower rows
are dominated), the row kept among its step budgets (`best_row`, shared by the planner and the other
engine's figures, `api_engines.vllm_budget_row`), a row's objective, and the reasons under which the
time limit cuts the enumeration and the aggregated rows short (`time_cut`).

Pure functions: no I/O, no solver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from autoshard.search.deadline import Deadline
from autoshard.specs.job import ServeJob
from autoshard.units import time_to_us

__all__ = ["bisect_ladder", "highest_between", "meets_targets", "best_row", "row_objective", "time_cut", "may_stop",
           "ROWS_TIME_CUT", "ENUM_TIME_CUT"]

ROWS_TIME_CUT = "time limit: engines not tabulated as aggregated replicas (no bound on them)"
"""The `pruned` reason of the engines the aggregated rows never reached: their share of the command's
`--time-limit` ran out first (the plan is then chosen from what was tabulated, FEASIBLE, not proven)."""
ENUM_TIME_CUT = "time limit: candidate engines not examined (no bound on them)"
"""The `pruned` reason of the candidates the enumeration never examined: the deadline ran out first."""


class Row(Protocol):
    """What the bisection reads of a table row (`search.serve.space.Row`)."""

    tpot_us: int
    ttft_us: int


class Scored(Row, Protocol):
    """A table row with its objective (`row_objective`)."""

    objective: int


R = TypeVar("R", bound=Scored)


def bisect_ladder(job: ServeJob, ladder: list[int], make: Callable[[int], Row | None]) -> dict[int, Row | None]:
    """Rows, by concurrency, that bisection visits while looking for the highest concurrency that meets
    the targets: first over the ladder's rungs, then over every concurrency between the highest rung
    that meets them and the next (the rungs are powers of two and their 1.5x: a TPOT target between
    128 and 192 was met at 128 where 170 meets it too, 10 % less throughput). The top of the ladder when
    it meets them."""
    evaluated: dict[int, Row | None] = {}

    def ok(concurrency: int) -> bool:
        if concurrency not in evaluated:
            evaluated[concurrency] = make(concurrency)
        r = evaluated[concurrency]
        return r is not None and meets_targets(job, r)

    lo, hi = 0, len(ladder) - 1
    if ok(ladder[hi]) or not ok(ladder[lo]):
        return evaluated
    while hi - lo > 1:  # ok(ladder[lo]) holds, ok(ladder[hi]) does not
        mid = (lo + hi) // 2
        if ok(ladder[mid]):
            lo = mid
        else:
            hi = mid
    highest_between(ladder[lo], ladder[hi], ok)
    return evaluated


def highest_between(below: int, above: int, ok: Callable[[int], bool]) -> int | None:
    """The highest concurrency strictly between `below` (which meets the targets) and `above` (which does
    not) that `ok` accepts, by bisection (what meets them at a concurrency meets them at every lower
    one); None when none does. The planner's ladder rungs are powers of two and their 1.5x: this is the
    step that finds the concurrency between two rungs."""
    best = None
    while above - below > 1:
        mid = (below + above) // 2
        if ok(mid):
            below = best = mid
        else:
            above = mid
    return best


def meets_targets(job: ServeJob, row: Row) -> bool:
    if job.tpot_target_s is not None and row.tpot_us > time_to_us(job.tpot_target_s):
        return False
    return job.ttft_target_s is None or row.ttft_us <= time_to_us(job.ttft_target_s)


def best_row(job: ServeJob, rows: Sequence[R | None]) -> R | None:
    """The row an engine keeps among its step budgets (None: a budget that cannot run it): first those
    that meet the targets, then the best objective (`row_objective`: the most throughput per cluster GPU,
    or with a request rate the fewest GPUs), the first listed (the smallest budget) among equals. The
    planner's rows (`space._row`) and an SGLang plan's vLLM line (`api_engines.vllm_budget_row`) both
    keep their budget with it."""
    sign, best = 1 if job.request_rate is None else -1, None
    for r in rows:
        if r is not None and (best is None or (meets_targets(job, r), sign * r.objective)
                              > (meets_targets(job, best), sign * best.objective)):
            best = r
    return best


def row_objective(job: ServeJob, cluster_gpus: int, gpus: int, throughput: float, tie_scale: int) -> int:
    """The CP-SAT objective of a row deploying `gpus` GPUs at `throughput` output tokens/s: without a
    request rate the tokens/s per GPU of the cluster in thousandths (maximized), else the GPUs at work
    times `tie_scale` less the tokens/s per GPU (minimized: fewest GPUs, then the most per GPU)."""
    if job.request_rate is None:
        return int(throughput * 1000 / cluster_gpus)
    return gpus * tie_scale - min(int(throughput / gpus), tie_scale - 1)


def time_cut(deadline: Deadline | None, reason: str, ready: Callable[[], bool]) -> str | None:
    """`reason` when `deadline` has expired and the phase may stop (`ready()`: it has something to show),
    else None."""
    return reason if deadline is not None and deadline.expired() and ready() else None


def may_stop(job: ServeJob, rows: Sequence[Row], grace: Deadline | None) -> bool:
    """Whether a tabulation past its deadline may stop: a row meets the targets (a plan exists), or its
    `grace` (None: no grace) is spent too."""
    return grace is None or grace.expired() or any(meets_targets(job, r) for r in rows)
