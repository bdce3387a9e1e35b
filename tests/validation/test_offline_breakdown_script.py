"""offline_breakdown.py (#10): the rows it prints are the offline predictions validate_serving.py
checks, and their engines hold whole 64-token KV blocks per request."""

from __future__ import annotations

import math

import pytest
from offline_breakdown import ATTENTION_GRID, attention_by_tp, main, row_breakdown
from validate_serving import TRTLLM_TOKENS_PER_BLOCK, _pool, fit_loss, load_runs, num_requests, predict_run

from autoshard.costmodel.serve.config import HOST_US_PER_SEQ

ROWS = {r["id"]: r for r in load_runs()}
SAMPLE = (
    "trtllm-v014-llama31-70b-h100-fp16-tp8-500-2000",
    "trtllm-v017-llama31-8b-a100-tp1-1000-1000",
    "trtllm-v017-mixtral-8x7b-l40s-tp4-128-4096",
    "trtllm-v015-llama31-70b-h100-tp1-2048-2048",
)


@pytest.mark.parametrize("rid", SAMPLE)
def test_breakdown_is_the_checked_prediction(rid):
    run = ROWS[rid]
    b = row_breakdown(run)
    assert b["result"] == predict_run(run)
    length = run["input_len"] + run["output_len"]
    assert b["request_blocks"] == math.ceil(length / TRTLLM_TOKENS_PER_BLOCK)
    assert b["concurrency"] == min(b["max_batch_size"], b["kv_blocks"] // b["request_blocks"])
    assert b["waves"] == math.ceil(num_requests(run) / b["concurrency"])
    assert sum(b["decode"].values()) == pytest.approx(b["tpot_s"], rel=1e-9)


def test_script_prints_the_worst_held_rows_of_a_selection(capsys):
    engine = "trtllm-v014-llama31-70b-h100-fp16-tp2-"
    assert main([engine, "--worst", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    results = sorted((predict_run(r) for i, r in ROWS.items() if engine in i), key=lambda r: -abs(r.error))
    worst = [r.id for r in results if r.held][:3]
    assert worst[0] == engine + "2048-2048"  # the +126 % row
    assert len(lines) == 3 and all(line.startswith(rid) for line, rid in zip(lines, worst, strict=True))


def test_attention_by_tp_is_the_grid_minimum_of_that_tp_degree():
    """L40S TP 1: the 18 held Llama 3.1 8B rows; each grid point's loss recomputed by hand."""
    best, loss, rows = attention_by_tp("L40S-48GB", 1)
    held = [r for r in ROWS.values() if r["cluster"] == "l40s-pcie" and r["tp"] == 1 and predict_run(r).held]
    assert rows == len(held) == 18
    gemm = _pool("l40s-pcie", 1).gpu.efficiency.serve_gemm  # the bundled value, as attention_by_tp
    losses = {a: fit_loss([predict_run(r, (HOST_US_PER_SEQ, gemm, a)) for r in held]) for a in ATTENTION_GRID}
    assert loss == min(losses.values()) and losses[best] == loss
    assert attention_by_tp("L40S-48GB", 2) is None  # no L40S engine of 2 GPUs was published
