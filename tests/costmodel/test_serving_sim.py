"""The burst simulation against hand-computed schedules: one request, a batch that fits in one
step, and slots that serialize requests; requests at a rate against the same schedules."""

from __future__ import annotations

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.step import step_time
from autoshard.costmodel.serve.sim import simulate_at_rate, simulate_burst
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob

LLAMA8 = load_model("llama-3.1-8b")
POOL = load_cluster("dgx-h100").with_gpus(1).primary
JOB = ServeJob(input_len=1000, output_len=50)


def _step(cfg, decodes, prefill, context):
    return step_time(
        LLAMA8, POOL, cfg, decode_seqs=decodes, prefill_tokens=prefill, prefills=prefill / 1000,
        prefill_len=1000, context_len=context,
    ).total_s


def test_one_request_is_one_prefill_step_then_decodes():
    cfg = ServeConfig(max_num_batched_tokens=8192)
    r = simulate_burst(LLAMA8, POOL, JOB, cfg, requests=1)
    prefill = _step(cfg, 0, 1000, 0)
    decodes = sum(_step(cfg, 1, 0, 64 * round((1000 + g) / 64)) for g in range(1, 50))
    assert r.steps == 50 and r.max_running == 1
    assert r.mean_ttft_s == pytest.approx(prefill)
    assert r.duration_s == pytest.approx(prefill + decodes)
    assert r.mean_tpot_s == pytest.approx(decodes / 49)


def test_a_batch_that_fits_one_step_prefills_together():
    cfg = ServeConfig(max_num_batched_tokens=8192)
    r = simulate_burst(LLAMA8, POOL, JOB, cfg, requests=8)  # 8 x 1000 tokens <= 8192
    assert r.steps == 50 and r.max_running == 8
    assert r.mean_ttft_s == pytest.approx(_step(cfg, 0, 8000, 0))


def test_chunked_prefill_splits_a_long_prompt():
    cfg = ServeConfig(max_num_batched_tokens=512)
    r = simulate_burst(LLAMA8, POOL, JOB, cfg, requests=1)
    assert r.steps == 2 + 49  # 512 + 488 prompt tokens, then 49 decodes


def test_slots_serialize_requests():
    """max_num_seqs 1: the second request starts when the first finishes."""
    cfg = ServeConfig(max_num_seqs=1)
    one = simulate_burst(LLAMA8, POOL, JOB, cfg, requests=1)
    two = simulate_burst(LLAMA8, POOL, JOB, cfg, requests=2)
    assert two.duration_s == pytest.approx(2 * one.duration_s)
    assert two.mean_ttft_s == pytest.approx(one.mean_ttft_s + one.duration_s / 2)
    assert two.output_tokens_per_s(50) == pytest.approx(one.output_tokens_per_s(50))


def test_more_requests_more_throughput_until_the_engine_saturates():
    cfg = ServeConfig()
    rates = [
        simulate_burst(LLAMA8, POOL, JOB, cfg, requests=n).output_tokens_per_s(50) for n in (1, 16, 256)
    ]
    assert rates[0] < rates[1] < rates[2]


def test_rejects_what_it_does_not_model():
    with pytest.raises(ValueError, match="PP stage"):
        simulate_burst(LLAMA8, load_cluster("dgx-h100").with_gpus(2).primary, JOB, ServeConfig(pp=2), requests=4)
    with pytest.raises(ValueError, match="positive"):
        simulate_burst(LLAMA8, POOL, JOB, ServeConfig(), requests=0)


def test_requests_at_a_low_rate_each_run_alone():
    """Arrivals far apart (one per ~1000 s, each request takes ~0.4 s): every request meets an idle
    engine, so its TTFT is its own prefill step from its arrival and its TPOT the lone decodes; the
    run lasts until the last arrival plus one request's service."""
    import random

    cfg = ServeConfig(max_num_batched_tokens=8192)
    one = simulate_burst(LLAMA8, POOL, JOB, cfg, requests=1)
    r = simulate_at_rate(LLAMA8, POOL, JOB, cfg, requests=5, rate=0.001, seed=7)
    rng = random.Random(7)
    last = sum(rng.expovariate(0.001) for _ in range(4))  # the 5th arrival (the 1st is at t = 0)
    assert r.mean_ttft_s == pytest.approx(one.mean_ttft_s)
    assert r.mean_tpot_s == pytest.approx(one.mean_tpot_s)
    assert r.duration_s == pytest.approx(last + one.duration_s)
    assert r.max_running == 1 and r.steps == 5 * one.steps


def test_requests_at_a_huge_rate_are_the_burst_and_the_seed_fixes_the_run():
    cfg = ServeConfig(max_num_batched_tokens=8192)
    burst = simulate_burst(LLAMA8, POOL, JOB, cfg, requests=40)
    fast = simulate_at_rate(LLAMA8, POOL, JOB, cfg, requests=40, rate=1e9)
    # within a step of the burst: only the first request is there at t = 0, the rest join step 2
    assert fast.mean_ttft_s == pytest.approx(burst.mean_ttft_s, rel=0.01)
    assert fast.duration_s == pytest.approx(burst.duration_s, rel=0.01)
    assert fast.steps == burst.steps + 1
    a = simulate_at_rate(LLAMA8, POOL, JOB, cfg, requests=200, rate=20.0, seed=3)
    assert a == simulate_at_rate(LLAMA8, POOL, JOB, cfg, requests=200, rate=20.0, seed=3)
    assert a != simulate_at_rate(LLAMA8, POOL, JOB, cfg, requests=200, rate=20.0, seed=4)
    # queueing: at a rate near what the engine absorbs, the same requests wait longer for a first token
    slow = simulate_at_rate(LLAMA8, POOL, JOB, cfg, requests=200, rate=2.0, seed=3)
    assert a.mean_ttft_s > slow.mean_ttft_s
    for bad in ({"requests": 0, "rate": 1.0}, {"requests": 5, "rate": 0.0}):
        with pytest.raises(ValueError):
            simulate_at_rate(LLAMA8, POOL, JOB, cfg, **bad)
