"""Prediction bands: the range a measured value is expected in, from out-of-source validation
residuals of runs of the same kind (GPU generation x dense/MoE x precision x train/serve)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Band"]


@dataclass(frozen=True, slots=True)
class Band:
    """Expected ranges around one prediction. Each range is (low, high) in the metric's own unit."""

    tokens_per_s: tuple[float, float]
    step_time_s: tuple[float, float]
    memory_gib_peak: tuple[float, float]
    basis: str
    """The kind of run the band comes from and how many measured runs back it."""
    runs: int
    """Measured runs of this kind behind the band (0: no run of this kind exists; the band is the
    widest one we have)."""

    def to_json(self) -> dict[str, Any]:
        """The `predicted.band` block of the plan JSON."""
        return {
            "tokens_per_s": list(self.tokens_per_s), "step_time_s": list(self.step_time_s),
            "memory_gib_peak": list(self.memory_gib_peak), "basis": self.basis, "runs": self.runs,
        }
