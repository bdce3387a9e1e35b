"""The burst simulation against hand-computed schedules: one request, a batch that fits in one
step, and slots that serialize requests."""

from __future__ import annotations

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.step import step_time
from autoshard.costmodel.serve.sim import simulate_burst
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
