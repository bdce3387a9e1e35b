"""Bisection of a serving engine's concurrency ladder for the highest concurrency that meets the
targets (throughput, TPOT and TTFT all grow with concurrency, so lower rows are dominated).

Pure functions: no I/O, no solver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from autoshard.specs.job import ServeJob
from autoshard.units import time_to_us

__all__ = ["bisect_ladder", "meets_targets"]


class Row(Protocol):
    """What the bisection reads of a table row (`search.serve.space.Row`)."""

    tpot_us: int
    ttft_us: int


def bisect_ladder(job: ServeJob, ladder: list[int], make: Callable[[int], Row | None]) -> dict[int, Row | None]:
    """Rows at the ladder concurrencies bisection visits while looking for the highest one that meets
    the targets (the top of the ladder when it does)."""
    evaluated: dict[int, Row | None] = {}

    def ok(i: int) -> bool:
        if i not in evaluated:
            evaluated[i] = make(ladder[i])
        r = evaluated[i]
        return r is not None and meets_targets(job, r)

    lo, hi = 0, len(ladder) - 1
    if ok(hi) or not ok(lo):
        return evaluated
    while hi - lo > 1:  # ok(lo) holds, ok(hi) does not
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return evaluated


def meets_targets(job: ServeJob, row: Row) -> bool:
    if job.tpot_target_s is not None and row.tpot_us > time_to_us(job.tpot_target_s):
        return False
    return job.ttft_target_s is None or row.ttft_us <= time_to_us(job.ttft_target_s)
