"""The cost model against published, measured training runs (targets of the cost-model issue)."""

from __future__ import annotations

import statistics

import pytest

from validate_published import evaluate_runs

RESULTS = evaluate_runs()
HELD = [r for r in RESULTS if not r.skip_throughput]


def test_enough_runs_are_held_to_the_target():
    assert len(HELD) >= 40
    assert {r.gpu for r in HELD} >= {"H100-SXM5-80GB", "A100-SXM4-80GB"}


def test_throughput_median_error_within_10_percent():
    assert statistics.median(abs(r.error) for r in HELD) <= 0.10


@pytest.mark.parametrize("run", HELD, ids=lambda r: r.id)
def test_no_run_worse_than_25_percent(run):
    assert abs(run.error) <= 0.25, f"{run.id}: measured {run.measured}, predicted {run.predicted}"


def test_every_skip_has_a_reason():
    for r in RESULTS:
        assert r.skip_throughput is None or len(r.skip_throughput) > 40


MEMORY = [r for r in RESULTS if r.memory_error is not None]


def test_memory_median_error_within_10_percent():
    """Per-GPU memory where the source reports it (the 8 torchtitan runs, framework: torchtitan):
    median |error| 3.7 %, max 13.4 % (70B FSDP 32 x TP 8 without async TP, under-predicted)."""
    assert len(MEMORY) >= 8
    assert statistics.median(abs(r.memory_error) for r in MEMORY) <= 0.10
    assert max(abs(r.memory_error) for r in MEMORY) <= 0.15
