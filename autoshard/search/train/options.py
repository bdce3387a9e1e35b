"""Options of a training solve: time limit, CP-SAT workers and seed, gap, how many plans, the memory
headroom, and the candidate space's options."""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.search.train.space import SpaceOptions

__all__ = ["DEFAULT_MEMORY_FRACTION", "SolverOptions"]


DEFAULT_MEMORY_FRACTION = 0.87
"""Plans keep each GPU's predicted peak under 87 % of HBM by default: the memory model under-predicts
the published per-GPU peaks by up to 13.4 % (torchtitan Llama 3 70B on 256 H100s; median |error| 3.7 %,
`python tests/validation/validate_published.py`), and a true peak 1 / (1 - 0.134) = 1.155 x the
prediction still fits under 0.87 x 1.155 = 1.005 ~ 100 % of HBM. `--memory-fraction 1.0` plans to the brim."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverOptions:
    time_limit_s: float = 30.0
    num_workers: int = 8
    """CP-SAT portfolio workers. Results are deterministic for a fixed seed and worker count
    whenever the solve proves optimality (the optimum is unique up to ties, broken by candidate order)."""
    seed: int = 0
    relative_gap: float = 0.0
    top_k: int = 1
    max_candidates_in_model: int = 40
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    """Cap every GPU's predicted peak (context, NCCL and fragmentation included) at this fraction of
    its HBM: below 1 keeps headroom for what no model predicts (default: DEFAULT_MEMORY_FRACTION)."""
    log: bool = False
    space: SpaceOptions = SpaceOptions()
    started_at: float | None = None
    """`time.monotonic()` when the command started: the time limit counts from there (None: from the
    call to `solve_train`)."""
