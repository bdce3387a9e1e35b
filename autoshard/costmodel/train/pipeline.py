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


def schedule_time(
    rank_times_s: Sequence[float], *, num_microbatches: int, vpp: int = 1, steady_times_s: Sequence[float] | None = None,
) -> ScheduleTime:
    """`steady_times_s`: each rank's mean per-micro-batch time over the whole run where it differs from
    `rank_times_s` (the EP all-to-all overlap pairs most forwards with a backward, which the fill and
    drain cannot: costmodel.train.a2a_overlap); the slowest of them sets the busy time, the unpaired
    times the fill and drain."""
    if not rank_times_s:
        raise ValueError("a pipeline needs at least one rank")
    if num_microbatches < 1 or vpp < 1:
        raise ValueError("num_microbatches and vpp must be positive")
    steady = list(steady_times_s if steady_times_s is not None else rank_times_s)
    if len(steady) != len(rank_times_s):
        raise ValueError("steady_times_s needs one time per rank")
    rank = steady.index(max(steady))
    busy = num_microbatches * steady[rank]
    bubble = (sum(rank_times_s) - rank_times_s[rank]) / vpp
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
