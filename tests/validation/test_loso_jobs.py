"""validate_published.leave_one_source_out fits its folds in parallel processes with the same
figures as one process (every fit is deterministic; the last bit may differ with the order in which
plans fill the layer-cost caches), and --jobs refuses what is not a count."""

from __future__ import annotations

import pytest
import validate_published as vp

# three small sources on two GPU generations: each fold has too few H100 runs for a fit of its own
# (fit_efficiency.MIN_RUNS), so it borrows and level-fits, which keeps the test short
SOURCES = ("mlperf31", "mlmllama", "amdperf")


def _runs() -> list[dict]:
    return [r for r in vp.load_runs() if vp.source_key(r) in SOURCES]


def test_parallel_folds_give_the_same_predictions():
    runs = _runs()
    assert {vp.source_key(r) for r in runs} == set(SOURCES) and len(runs) >= 7
    one = vp.leave_one_source_out(runs, jobs=1)
    two = vp.leave_one_source_out(runs, jobs=2)
    assert set(one) == set(two) == {r["id"] for r in runs}
    for rid, (loso, fit) in one.items():
        assert two[rid][0].predicted == pytest.approx(loso.predicted, rel=1e-12)
        assert two[rid][1].predicted == pytest.approx(fit.predicted, rel=1e-12)
    # the fold is a real leave-out: some run's out-of-source prediction differs from its all-in one
    assert any(loso.predicted != pytest.approx(fit.predicted, rel=1e-9) for loso, fit in one.values())


@pytest.mark.parametrize(("argv", "jobs"), [([], 1), (["--jobs", "2"], 2), (["--write-residuals", "--jobs", "3"], 3)])
def test_jobs_argument(argv, jobs):
    assert vp._jobs(argv) == jobs


@pytest.mark.parametrize("argv", [["--jobs"], ["--jobs", "two"], ["--jobs", "0"], ["--jobs", "-1"]])
def test_jobs_argument_refused(argv):
    with pytest.raises(SystemExit, match="--jobs"):
        vp._jobs(argv)


def test_a_bad_jobs_value_is_refused_before_any_prediction(monkeypatch):
    monkeypatch.setattr(vp, "load_runs", lambda: pytest.fail("runs loaded before --jobs was checked"))
    with pytest.raises(SystemExit, match="--jobs"):
        vp.main(["--jobs", "0"])
