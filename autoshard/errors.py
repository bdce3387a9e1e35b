"""The exception tree. Catch :class:`AutoshardError` to handle every failure autoshard reports.

::

    AutoshardError
    ├── SpecError         bad input: a model/cluster/job file or a CLI value (CLI exit code 2)
    ├── InfeasibleError   the job cannot run on the cluster as asked (CLI exit code 1)
    └── SolverError       CP-SAT failed to produce an answer within its limits (CLI exit code 1)
"""

from __future__ import annotations

__all__ = ["AutoshardError", "SpecError", "InfeasibleError", "SolverError"]


class AutoshardError(Exception):
    """Base class of every error autoshard raises on purpose."""

    exit_code = 1


class SpecError(AutoshardError):
    """A user input is wrong. The message names the file, the field and the fix."""

    exit_code = 2

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None) -> None:
        self.source = source
        self.field = field
        prefix = ""
        if source:
            prefix += f"{source}: "
        if field:
            prefix += f"field '{field}': "
        super().__init__(prefix + message)


class InfeasibleError(AutoshardError):
    """No plan fits. The message says what is missing ("needs X GiB per GPU, has Y") and the nearest fix."""

    exit_code = 1


class SolverError(AutoshardError):
    """The solver returned no solution (time limit hit before any feasible plan, or a model error)."""

    exit_code = 1
