"""A serve solve whose CP-SAT search ends before it places any deployment (status UNKNOWN) says so in
words and counts the candidate engines, not the engine x concurrency table rows (0 of those with
--disaggregate on, where only the prefill/decode tables are built)."""

from __future__ import annotations

import pytest
from ortools.sat.python import cp_model

from autoshard import api
from autoshard.errors import SolverError
from autoshard.search.serve import solve as serve_solve
from autoshard.search.serve.space import enumerate_serve


class _NoSolution:
    """A CP-SAT stand-in whose search ends before any solution (what a spent --time-limit returns)."""

    def __init__(self) -> None:
        self.parameters = cp_model.CpSolver().parameters

    def solve(self, model: cp_model.CpModel) -> int:
        return cp_model.UNKNOWN


@pytest.mark.parametrize("disaggregate", ["off", "on"])
def test_time_limit_message_counts_engines(monkeypatch: pytest.MonkeyPatch, disaggregate: str) -> None:
    model, cluster = api.load("llama-3.1-8b", "dgx-h100", 8)
    job = api.serve_job_for(model, 1024, 256, None, None, None, None, None, None)
    engines = len(enumerate_serve(model, cluster, job, pins={}).engines)
    assert engines > 1
    monkeypatch.setattr(serve_solve, "new_solver", lambda **kw: _NoSolution())
    with pytest.raises(SolverError) as err:
        serve_solve.solve_serve(model, cluster, job, pins=None, top_k=1, time_limit_s=2.5,
                                 disaggregate=disaggregate)
    text = str(err.value)
    assert text.startswith("no deployment found within the 2.5 s time limit")
    assert f"({engines} candidate engines in the model, none placed before the limit)" in text
    assert "CP-SAT" not in text and "UNKNOWN" not in text
