"""A burst replay's time by kind of work (`BurstResult.breakdown`, #10): the sum of the `StepTime`s of
the steps the scheduler ran, checked against hand-computed schedules, field by field."""

from __future__ import annotations

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.sim import simulate_at_rate, simulate_burst
from autoshard.costmodel.serve.step import StepTime, step_time
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

FIELDS = StepTime.__slots__


def _step(model, pool, cfg, isl, decodes, prefill, context) -> StepTime:
    return step_time(
        model, pool, cfg, decode_seqs=decodes, prefill_tokens=prefill, prefills=prefill / isl,
        prefill_len=isl, context_len=context,
    )


def _same(a: StepTime, b: StepTime) -> None:
    for name in FIELDS:
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9, abs=1e-15), name


def test_dense_burst_is_one_prefill_step_then_decodes_by_kind():
    """Llama 3.1 8B, 3 requests of 100 in / 4 out on one H100: one step prefills all three (300
    tokens), then three decode steps of 3 requests at contexts 101-103 (bucket 128)."""
    model, pool = load_model("llama-3.1-8b"), load_cluster("dgx-h100").with_gpus(1).primary
    cfg = ServeConfig(max_num_batched_tokens=8192)
    r = simulate_burst(model, pool, ServeJob(input_len=100, output_len=4), cfg, requests=3)
    expected = _step(model, pool, cfg, 100, 0, 300, 0) + _step(model, pool, cfg, 100, 3, 0, 128).scaled(3)
    assert r.steps == 4
    _same(r.breakdown, expected)
    assert r.breakdown.total_s == pytest.approx(r.duration_s, rel=1e-12)


def test_moe_burst_with_chunked_prompts_by_kind():
    """Qwen3-235B-A22B BF16 on 8 H100 (TP 8), 2 requests of 6,000 in / 3 out, budget 8,192: step 1
    takes the first prompt whole and 2,192 tokens of the second; step 2 decodes the first and
    finishes the second prompt (3,808 tokens); step 3 decodes both; step 4 the second alone. Every
    field of the breakdown is the sum of those four steps (context buckets 6,016 / 6,016 / 6,016)."""
    model, pool = load_model("qwen3-235b-a22b"), load_cluster("dgx-h100").with_gpus(8).primary
    cfg = ServeConfig(tp=8, weight_dtype=WeightDtype.BF16, max_num_batched_tokens=8192)
    r = simulate_burst(model, pool, ServeJob(input_len=6000, output_len=3), cfg, requests=2)
    s = lambda d, p, c: _step(model, pool, cfg, 6000, d, p, c)  # noqa: E731
    expected = s(0, 8192, 0) + s(1, 3808, 6016) + s(2, 0, 6016) + s(1, 0, 6016)
    assert r.steps == 4
    _same(r.breakdown, expected)
    assert r.breakdown.gemm_s > r.breakdown.attention_s > 0  # short prompts: the linear layers dominate


def test_at_rate_breakdown_leaves_out_idle_time():
    """Requests far apart: the engine idles between them, the breakdown counts only its steps, so it
    falls short of the duration by the idle gaps (and is the same as one request's, times the count)."""
    model, pool = load_model("llama-3.1-8b"), load_cluster("dgx-h100").with_gpus(1).primary
    cfg = ServeConfig(max_num_batched_tokens=8192)
    job = ServeJob(input_len=100, output_len=4)
    one = simulate_burst(model, pool, job, cfg, requests=1)
    spread = simulate_at_rate(model, pool, job, cfg, requests=5, rate=0.01)
    _same(spread.breakdown, one.breakdown.scaled(5))
    assert spread.duration_s > 10 * spread.breakdown.total_s
