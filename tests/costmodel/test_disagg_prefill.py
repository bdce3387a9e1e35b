"""The prefill queue of a disaggregated deployment (autoshard.costmodel.serve.disagg.prefill_cycle):
a prefill engine starts a step whenever it is free and prompts wait, and each step takes every prompt
that has arrived (up to its budget). Closed forms for the idle and loaded limits, the cycle moments
by hand, and a discrete-event simulation of that engine (Poisson arrivals, step time a + b k) that the
mean must match within 12 % and the p90 within 25 % from 5 % to 90 % load."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.disagg import (
    KvTransfer,
    PrefillInstance,
    disagg_ttft_s,
    first_token_s,
    max_utilization_for_ttft,
    md1_wait_s,
    prefill_cycle,
    prefill_wait_s,
)
from autoshard.costmodel.serve.step import StepTime

NO_TRANSFER = KvTransfer(bytes_per_request=0.0, link="nvlink", streams=1, bytes_per_s=1.0, seconds=0.0)


def instance(a: float, b: float, k: float, *, pp: int = 1, dp: int = 1) -> PrefillInstance:
    """A prefill instance whose tick is a + b x prompts per DP rank, k prompts in a full tick, and a
    prompt alone takes pp ticks of one prompt."""
    cfg = ServeConfig(pp=pp, dp_attention=dp, expert_parallel=dp > 1)
    tick = a + b * k
    return PrefillInstance(
        config=cfg,
        memory=None,  # type: ignore[arg-type]
        prompt=StepTime(gemm_s=pp * (a + b)),
        step=StepTime(gemm_s=tick),
        requests_per_s=dp * k / tick,
    )


def simulate(p: float, a: float, b: float, k: int, n: int = 30_000, seed: int = 7) -> np.ndarray:
    """Time from arrival to the end of the step that ran it, per prompt (first 10 % dropped)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / p, n))
    out = np.empty(n)
    t, i = 0.0, 0
    while i < n:
        t = max(t, arrivals[i])
        j = min(int(np.searchsorted(arrivals, t, side="right")), i + k)
        t += a + b * (j - i)
        out[i:j] = t - arrivals[i:j]
        i = j
    return out[n // 10 :]


def test_cycle_moments_closed_form():
    a, b, k = 0.04, 0.05, 125
    inst = instance(a, b, k)
    u = 0.6
    c = prefill_cycle(inst, u)
    p = u * k / (a + b * k)
    assert c.arrivals_per_s == pytest.approx(p)
    assert c.fixed_s == pytest.approx(a) and c.per_prompt_s == pytest.approx(b)
    # p (a + b) = 1.11 > 1: the engine never idles, E[C] = a / (1 - p b), Var C = b^2 p E[C] / (1 - (p b)^2)
    assert c.busy == 1.0
    mean = a / (1 - p * b)
    var = b * b * p * mean / (1 - (p * b) ** 2)
    assert c.mean_s == pytest.approx(mean) and c.var_s2 == pytest.approx(var)
    assert c.wait_s == pytest.approx((var + mean**2) / (2 * mean))
    assert c.own_s == pytest.approx(a + b + b * p * (var + mean**2) / mean)


def test_idle_engine_runs_the_prompt_alone():
    inst = instance(0.04, 0.05, 125)
    assert prefill_wait_s(inst, 0.0) == pytest.approx(0.09)
    assert prefill_wait_s(inst, 0.0, q=0.9) == pytest.approx(0.09)


def test_full_load_is_a_full_step_and_a_half_without_variance():
    """With b -> 0 nothing varies: at the full rate the steps are full-budget ticks, an arrival waits
    half of one and runs in the next."""
    a, k = 1.0, 10
    inst = instance(a, 1e-9, k)
    assert prefill_wait_s(inst, 0.999999) == pytest.approx(1.5 * a, rel=1e-4)


def test_unstable_and_monotone():
    inst = instance(0.04, 0.05, 125)
    assert math.isinf(prefill_wait_s(inst, 1.0))
    waits = [prefill_wait_s(inst, u) for u in np.linspace(0, 0.95, 40)]
    assert waits == sorted(waits)


def test_prompt_longer_than_the_budget_is_md1():
    """Half a prompt per tick: nothing to batch, an M/D/1 server of two ticks per prompt."""
    inst = instance(0.0, 0.2, 0.5)
    service = 1 / inst.requests_per_s
    assert prefill_wait_s(inst, 0.5) == pytest.approx(md1_wait_s(service, 0.5) + inst.prompt.total_s)


def test_dp_ranks_each_chunking_a_long_prompt_are_md1():
    """8 attention-DP ranks, each chunking its own prompt over two ticks: 4 prompts per tick over the
    instance (K > 1) but none batches with another, so the instance is the M/D/1 server of the
    long-prompt case (was a negative per-prompt step and a math domain error: `solve qwen3-30b-a3b
    dgx-h100 --gpus 16 --mode serve --input-len 12000`)."""
    inst = instance(0.0, 0.2, 0.5, dp=8)
    assert inst.requests_per_s * inst.step.total_s == pytest.approx(4.0)
    service = 1 / inst.requests_per_s
    for u in (0.1, 0.5, 0.9):
        c = prefill_cycle(inst, u)
        assert (c.fixed_s, c.var_s2) == (0.0, 0.0)
        assert prefill_wait_s(inst, u) == pytest.approx(md1_wait_s(service, u) + inst.prompt.total_s)
        assert math.isfinite(prefill_wait_s(inst, u, 0.9))


def test_pipeline_stages_lengthen_the_own_step_not_the_tick():
    flat, deep = instance(0.04, 0.05, 50), instance(0.04, 0.05, 50, pp=4)
    cf, cd = prefill_cycle(flat, 0.7), prefill_cycle(deep, 0.7)
    assert cd.mean_s == pytest.approx(cf.mean_s) and cd.wait_s == pytest.approx(cf.wait_s)
    assert cd.own_s - deep.prompt.total_s == pytest.approx(4 * (cf.own_s - flat.prompt.total_s))


def test_dp_ranks_step_together():
    """Eight lock-stepped DP ranks of k prompts a tick each: one server of 8k prompts a tick, whose
    prompt alone still costs a + b: b' = (a + b k - (a + b)) / (8k - 1), a' = a + b - b'."""
    a, b, k = 0.04, 0.05, 50
    c = prefill_cycle(instance(a, b, k, dp=8), 0.5)
    b8 = b * (k - 1) / (8 * k - 1)
    assert c.per_prompt_s == pytest.approx(b8) and c.fixed_s == pytest.approx(a + b - b8)
    assert c.arrivals_per_s == pytest.approx(0.5 * 8 * k / (a + b * k))


@pytest.mark.parametrize(
    ("a", "b", "k"),
    [(0.043, 0.0487, 125), (0.065, 0.12, 64), (0.2, 0.05, 50), (0.01, 0.1, 20)],
)
def test_matches_a_discrete_event_simulation(a, b, k):
    inst = instance(a, b, k)
    for u in (0.05, 0.3, 0.6, 0.9):
        sim = simulate(u * inst.requests_per_s, a, b, k)
        assert prefill_wait_s(inst, u) == pytest.approx(sim.mean(), rel=0.12), (u, sim.mean())
        if u <= 0.8:
            assert prefill_wait_s(inst, u, q=0.9) == pytest.approx(np.quantile(sim, 0.9), rel=0.25), u


def test_old_half_full_step_is_gone():
    """At 40 % load a 64k-token engine's steps are far shorter than a full step (6 s here)."""
    inst = instance(0.043, 0.0487, 125)
    assert inst.step.total_s == pytest.approx(6.13, abs=0.01)
    assert prefill_wait_s(inst, 0.4) < 0.2 * inst.step.total_s


def test_max_utilization_inverts_the_ttft():
    inst = instance(0.04, 0.05, 125)
    for target in (0.2, 0.5, 1.0):
        u = max_utilization_for_ttft(inst, NO_TRANSFER, 0.02, target, cap=0.999)
        assert disagg_ttft_s(inst, NO_TRANSFER, 0.02, u) == pytest.approx(target, rel=1e-6)
    assert max_utilization_for_ttft(inst, NO_TRANSFER, 0.02, 0.05) == 0.0


def test_ttft_adds_the_transfer_and_a_step_and_a_half_of_decode():
    """The KV cache lands uniformly within a running decode step; the batch admits the request at the
    next step boundary (half a step on average) and its first token comes one step later."""
    inst = instance(0.04, 0.05, 125)
    hand_off = KvTransfer(bytes_per_request=1e8, link="rdma", streams=8, bytes_per_s=1.6e11, seconds=0.003)
    assert first_token_s(0.04) == pytest.approx(0.06)
    for u in (0.0, 0.5):
        assert disagg_ttft_s(inst, hand_off, 0.04, u) == pytest.approx(prefill_wait_s(inst, u) + 0.003 + 0.06)
    assert disagg_ttft_s(inst, hand_off, 0.04, 0.0) == pytest.approx(0.09 + 0.003 + 0.06)
