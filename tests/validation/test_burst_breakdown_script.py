"""burst_breakdown.py (#10): the per-row breakdown it prints is the replay validate_serving.py checks."""

from __future__ import annotations

import pytest
from burst_breakdown import MEASURED_ITL, burst_setup, main, step_rows
from validate_serving import load_burst_runs, predict_burst

from autoshard.costmodel.serve.sim import simulate_burst


@pytest.mark.parametrize("run", load_burst_runs(), ids=lambda r: r["id"])
def test_breakdown_is_the_checked_replay(run):
    model, pool, job, cfg = burst_setup(run)
    sim = simulate_burst(model, pool, job, cfg, requests=run["requests"])
    checked = {r.metric: r.predicted for r in predict_burst(run)}
    assert sim.total_tokens_per_s(job.input_len, job.output_len) == checked["total_tokens_per_s"]
    assert sim.breakdown.total_s == pytest.approx(sim.duration_s, rel=1e-9)  # a burst never idles
    for _, step, experts in step_rows(run, sim):
        assert 0 < experts < step.gemm_s  # the routed experts are part of the step's GEMMs


def test_script_prints_every_checked_row(capsys):
    assert main() == 0
    out = capsys.readouterr().out
    assert all(run["id"] in out for run in load_burst_runs())


def test_measured_itl_covers_the_checked_rows_and_orders_its_percentiles():
    assert set(MEASURED_ITL) == {run["id"] for run in load_burst_runs()}
    assert all(0 < median <= p99 for median, p99 in MEASURED_ITL.values())
