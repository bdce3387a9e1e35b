"""One wall-clock deadline for a whole solve (space building, bounds, incumbents, CP-SAT, float
re-check), threaded through every phase so that `--time-limit` holds for the command, not only for
CP-SAT. Phases that run out of time stop early and say so; the caller then returns the best plan it
has with the bound it has proven (status FEASIBLE and a gap)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Deadline"]


class Deadline:
    """A point in wall-clock time (`time.monotonic`, or the `clock` given: tests pass a fake one), with
    helpers for the phases that share it."""

    __slots__ = ("start", "end", "clock")

    def __init__(self, seconds: float, *, start: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.start = clock() if start is None else start
        self.end = self.start + max(0.0, seconds)

    @classmethod
    def never(cls) -> Deadline:
        return cls(float("inf"))

    def remaining(self) -> float:
        return max(0.0, self.end - self.clock())

    def elapsed(self) -> float:
        return self.clock() - self.start

    def expired(self) -> bool:
        return self.clock() >= self.end

    def part(self, fraction: float) -> Deadline:
        """A sub-deadline at `fraction` of the time left now (never past this one)."""
        sub = Deadline(0.0, start=self.start, clock=self.clock)
        now = self.clock()
        left = self.end - now
        sub.end = self.end if left == float("inf") else now + max(0.0, fraction * left)
        return sub

    def later(self, seconds: float) -> Deadline:
        """This deadline moved `seconds` later, on the same clock and from the same start (a grace past
        the limit for a phase that has produced nothing yet)."""
        sub = Deadline(0.0, start=self.start, clock=self.clock)
        sub.end = self.end + max(0.0, seconds)
        return sub
