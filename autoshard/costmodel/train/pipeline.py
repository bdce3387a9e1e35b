"""Pipeline schedules: step time of 1F1B and interleaved 1F1B from per-stage times, and the layouts
frameworks accept.

A pipeline of p ranks, each hosting v model chunks ("virtual stages"), runs m micro-batches. With
T_r the time rank r spends on one micro-batch (forward + backward over all its chunks):

    step = m * max_r T_r + (sum_r T_r - max_r T_r) / v

For equal stages this is (m + (p-1)/v) * T: the bubble fraction (p-1)/(v*m) of Narayanan et al. 2021
(sec. 2.2). For uneven stages with v = 1 it is the fill/drain of every stage plus (m-1) times the
slowest one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ScheduleTime", "schedule_time", "bubble_fraction", "even_split"]


@dataclass(frozen=True, slots=True)
class ScheduleTime:
    step_s: float
    busy_s: float
    """m x the slowest rank's per-micro-batch time."""
    bubble_s: float
    bottleneck_rank: int


def schedule_time(rank_times_s: Sequence[float], *, num_microbatches: int, vpp: int = 1) -> ScheduleTime:
    if not rank_times_s:
        raise ValueError("a pipeline needs at least one rank")
    if num_microbatches < 1 or vpp < 1:
        raise ValueError("num_microbatches and vpp must be positive")
    slowest = max(rank_times_s)
    rank = list(rank_times_s).index(slowest)
    busy = num_microbatches * slowest
    bubble = (sum(rank_times_s) - slowest) / vpp
    return ScheduleTime(step_s=busy + bubble, busy_s=busy, bubble_s=bubble, bottleneck_rank=rank)


def bubble_fraction(*, pp: int, num_microbatches: int, vpp: int = 1) -> float:
    """Bubble time over ideal time for equal stages: (p-1)/(v*m)."""
    return (pp - 1) / (vpp * num_microbatches)


def even_split(num_items: int, num_parts: int) -> list[int]:
    """Sizes of `num_parts` contiguous parts, as even as possible, larger parts last (so the first
    stage, which holds the most in-flight activations, is never the larger one)."""
    if num_parts < 1 or num_items < num_parts:
        raise ValueError(f"cannot split {num_items} items into {num_parts} non-empty parts")
    base, extra = divmod(num_items, num_parts)
    return [base + (1 if i >= num_parts - extra else 0) for i in range(num_parts)]
