"""Unit constants and the only float -> int conversions the solver sees.

The cost model works in SI floats (seconds, bytes, FLOPs). CP-SAT needs integers: time in
microseconds and memory in MiB, both rounded *up* so a plan the solver accepts never under-counts.
"""

from __future__ import annotations

import math

__all__ = [
    "KIB", "MIB", "GIB", "TIB", "GB", "TB", "TERA", "GIGA",
    "US_PER_S", "time_to_us", "bytes_to_mib", "INT64_SAFE",
]

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4
GB = 1e9  # vendor bandwidths and FLOP rates are decimal
TB = 1e12
GIGA = 1e9
TERA = 1e12
US_PER_S = 1_000_000

# CP-SAT works on int64; keep every coefficient and bound well inside it so sums cannot overflow.
INT64_SAFE = 2**50


def time_to_us(seconds: float) -> int:
    """Seconds -> whole microseconds, rounded up."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"time must be a finite non-negative number of seconds, got {seconds!r}")
    value = math.ceil(seconds * US_PER_S - 1e-9)
    if value > INT64_SAFE:
        raise OverflowError(f"{seconds} s does not fit the solver's integer range")
    return max(value, 0)


def bytes_to_mib(num_bytes: float) -> int:
    """Bytes -> whole MiB, rounded up."""
    if not math.isfinite(num_bytes) or num_bytes < 0:
        raise ValueError(f"memory must be a finite non-negative number of bytes, got {num_bytes!r}")
    value = math.ceil(num_bytes / MIB - 1e-9)
    if value > INT64_SAFE:
        raise OverflowError(f"{num_bytes} bytes does not fit the solver's integer range")
    return max(value, 0)
