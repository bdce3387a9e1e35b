"""fit_efficiency.loss weighs each run by its source's run count ^ -1/2 (source_weights): a source that
publishes one plan at many scales counts as the root of its runs, so it no longer outvotes the others."""

from __future__ import annotations

import math
from types import SimpleNamespace

import fit_efficiency as fe
import pytest


def _runs(spec: dict[str, int]) -> list[dict]:
    return [{"id": f"{src}-run{i}"} for src, n in spec.items() for i in range(n)]


def test_weights_are_the_root_of_each_sources_count():
    runs = _runs({"big": 16, "one": 1, "four": 4})
    w = fe.source_weights(runs)
    assert w[:16] == [0.25] * 16 and w[16] == 1.0 and w[17:] == [0.5] * 4
    by_source = {src: sum(x for r, x in zip(runs, w, strict=True) if r["id"].startswith(src + "-"))
                 for src in ("big", "one", "four")}
    # each source's total weight is the root of its runs: 16 runs weigh 4, not 16 times one run
    assert by_source == {"big": 4.0, "one": 1.0, "four": 2.0}


def test_loss_is_the_weighted_mean(monkeypatch):
    """16 runs of one source 10 % long, one run of another 30 % short: run by run the large source's squared
    error would dominate; weighted, the single run holds a fifth of the objective (1 / (16 x 1/4 + 1))."""
    runs = _runs({"big": 16, "one": 1})
    ratio = {r["id"]: (1.10 if r["id"].startswith("big-") else 0.70) for r in runs}
    monkeypatch.setattr(fe, "evaluate_runs", lambda eff, rs: [
        SimpleNamespace(predicted=ratio[r["id"]], measured=1.0) for r in rs])

    def term(x: float) -> float:
        e = math.log(x)
        return e * e + 4 * max(0.0, abs(e) - 0.15) ** 2

    expected = (4.0 * term(1.10) + 1.0 * term(0.70)) / 5.0
    assert fe.loss("H100-SXM5-80GB", fe.START, runs) == pytest.approx(expected, rel=1e-12)
    unweighted = (16 * term(1.10) + term(0.70)) / 17
    assert expected > 2 * unweighted  # the single run's 30 % now counts
