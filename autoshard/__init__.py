"""autoshard: plan how to split LLM training and serving across GPUs."""

from autoshard.errors import AutoshardError, InfeasibleError, SolverError, SpecError
from autoshard.specs import load_cluster, load_model

__version__ = "0.1.0"

__all__ = [
    "AutoshardError", "InfeasibleError", "SolverError", "SpecError",
    "load_cluster", "load_model", "__version__",
]
