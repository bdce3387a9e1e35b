"""Search: the candidate space, integer tables, the CP-SAT model and solve orchestration."""

from autoshard.search.train.options import SolverOptions
from autoshard.search.train.solve import solve_train
from autoshard.search.train.space import Pins, SpaceOptions

__all__ = ["Pins", "SolverOptions", "SpaceOptions", "solve_train"]
