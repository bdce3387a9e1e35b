"""Prefill arrives as whole prompt chunks, not as a sliver of every prompt in every step
(`mean_step_time`): the mean step is the mix of steps with k and k + 1 chunks that gives the mean
prefill load. Closed forms, the Jensen gap at memory-bound decode, and the cases where the fluid
average was already exact."""

from __future__ import annotations

import math

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.step import mean_step_time, step_time
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype

LLAMA8 = load_model("llama-3.1-8b")
DSV3 = load_model("deepseek-v3")
POOL1 = load_cluster("dgx-h100").with_gpus(1).primary
BF16 = ServeConfig(max_num_batched_tokens=8192)


def _step(cfg, pool, model, *, decodes, tokens, prompt, context=500.0):
    return step_time(
        model, pool, cfg, decode_seqs=decodes, prefill_tokens=tokens, prefills=tokens / prompt,
        prefill_len=prompt, context_len=context,
    ).total_s


def _mean(cfg, pool, model, *, decodes, tokens, prompt, context=500.0):
    return mean_step_time(
        model, pool, cfg, decode_seqs=decodes, prefill_tokens=tokens, prefill_len=prompt, context_len=context
    ).total_s


def test_a_fifth_of_a_prompt_per_step_is_one_step_in_five_carrying_the_prompt():
    """467-token prompts, 0.2 of one per step on average: 80 % of the steps decode alone, 20 % carry
    the whole prompt."""
    mean = _mean(BF16, POOL1, LLAMA8, decodes=5, tokens=0.2 * 467, prompt=467)
    alone = _step(BF16, POOL1, LLAMA8, decodes=5, tokens=0, prompt=467)
    whole = _step(BF16, POOL1, LLAMA8, decodes=5, tokens=467, prompt=467)
    assert mean == pytest.approx(0.8 * alone + 0.2 * whole, rel=1e-12)


def test_slivers_ride_almost_free_on_a_memory_bound_step_whole_prompts_do_not():
    """Llama 3.1 8B BF16 on one H100, 5 decodes: the step reads 16 GB of weights whatever its rows, so
    93 prefill tokens added to every step cost less than a third of what the 467-token prompt they
    stand for costs when it arrives whole. The fluid average underprices the mean step (Jensen: the
    step time is convex in its tokens); whole chunks price it."""
    alone = _step(BF16, POOL1, LLAMA8, decodes=5, tokens=0, prompt=467)
    fluid = _step(BF16, POOL1, LLAMA8, decodes=5, tokens=0.2 * 467, prompt=467)
    mean = _mean(BF16, POOL1, LLAMA8, decodes=5, tokens=0.2 * 467, prompt=467)
    assert fluid - alone < 0.35 * (mean - alone)  # 0.40 ms against 1.31 ms
    assert mean > 1.10 * fluid


def test_whole_numbers_of_chunks_and_compute_bound_steps_match_the_fluid_average():
    """Two whole prompts per step on average: every step carries exactly two (no mixing). At a large,
    compute-bound step the fluid average was already right: the step is linear in its tokens."""
    two = _mean(BF16, POOL1, LLAMA8, decodes=64, tokens=2 * 1000, prompt=1000)
    assert two == pytest.approx(_step(BF16, POOL1, LLAMA8, decodes=64, tokens=2000, prompt=1000), rel=1e-12)
    big = ServeConfig(max_num_batched_tokens=16384)
    mean = _mean(big, POOL1, LLAMA8, decodes=2048, tokens=2.5 * 2000, prompt=2000)
    fluid = _step(big, POOL1, LLAMA8, decodes=2048, tokens=2.5 * 2000, prompt=2000)
    assert mean == pytest.approx(fluid, rel=0.02)


def test_the_chunk_is_the_budget_left_after_the_decodes():
    """A 10,000-token prompt with 8192 - 192 = 8000 tokens of budget free: chunks of 8000 tokens, so a
    mean of 4000 prefill tokens is every other step carrying one chunk."""
    mean = _mean(BF16, POOL1, LLAMA8, decodes=192, tokens=4000, prompt=10_000)
    alone = _step(BF16, POOL1, LLAMA8, decodes=192, tokens=0, prompt=10_000)
    chunk = _step(BF16, POOL1, LLAMA8, decodes=192, tokens=8000, prompt=10_000)
    assert mean == pytest.approx(0.5 * alone + 0.5 * chunk, rel=1e-12)


def test_no_prefill_and_attention_dp_keep_step_time():
    """Without prefill there is nothing to mix; with attention data parallelism `step_time` already
    prices whole chunks (the busiest DP rank's)."""
    assert _mean(BF16, POOL1, LLAMA8, decodes=7, tokens=0, prompt=100) == _step(
        BF16, POOL1, LLAMA8, decodes=7, tokens=0, prompt=100
    )
    pool = load_cluster("dgx-h100").with_gpus(16).primary
    dp = ServeConfig(
        tp=2, dp_attention=8, expert_parallel=True, weight_dtype=WeightDtype.FP8, max_num_batched_tokens=8192
    )
    mean = _mean(dp, pool, DSV3, decodes=32, tokens=300.0, prompt=1000)
    assert mean == _step(dp, pool, DSV3, decodes=32, tokens=300.0, prompt=1000)
    assert math.isfinite(mean) and mean > 0
