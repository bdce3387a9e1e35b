"""The serving cost model against published inference runs (TensorRT-LLM 0.17 numbers, a different
engine from vLLM; see validate_serving.py): decode throughput median error <= 25 %, TP ordering right."""

from __future__ import annotations

import statistics

import pytest
from validate_serving import evaluate_runs, load_runs, tp_ordering

RESULTS = evaluate_runs()


def test_all_rows_are_inference_rows_with_sources():
    runs = load_runs()
    assert len(runs) == len(RESULTS) == 5
    for run in runs:
        assert (
            run["id"].startswith("trtllm-") and run["source"] and run["framework"].startswith("TensorRT-LLM")
        )
        assert (run["input_len"], run["output_len"]) == (1000, 1000)


def test_throughput_median_error_within_25_percent():
    assert statistics.median(abs(r.error) for r in RESULTS) <= 0.25


@pytest.mark.parametrize("run", RESULTS, ids=lambda r: r.id)
def test_no_run_worse_than_40_percent(run):
    assert abs(run.error) <= 0.40, f"{run.id}: measured {run.measured}, predicted {run.predicted:.0f}"


def test_tp_ordering_matches():
    measured, predicted = tp_ordering(RESULTS)
    assert measured == [1, 2, 4, 8]
    assert predicted == measured


def test_concurrency_is_kv_limited_and_grows_with_tp():
    llama = sorted((r for r in RESULTS if r.model == "llama-3.1-70b"), key=lambda r: r.tp)
    batches = [r.concurrency for r in llama]
    assert batches == sorted(batches) and batches[0] < 64 < batches[-1]
