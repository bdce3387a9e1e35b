"""Queueing behind the serving latencies: closed forms (Erlang C, Pollaczek-Khinchine, Erlang-2,
Poisson), a discrete-event simulation of M/D/c as the brute-force check, and the p50/p90 and at-rate
figures predict_serve and latency_at_rate derive from them."""

from __future__ import annotations

import heapq
import math
import random

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.predict import latency_at_rate, predict_serve
from autoshard.costmodel.serve.latency import (
    NO_WAIT,
    Wait,
    erlang_c,
    mdc_wait,
    poisson_quantile,
    wait_sum_quantile,
)
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob

LLAMA70 = load_model("llama-3.1-70b")
POOL4 = load_cluster("dgx-h100").with_gpus(4).primary
JOB = ServeJob(input_len=467, output_len=256)


def test_erlang_c_closed_forms():
    assert erlang_c(1, 0.7) == pytest.approx(0.7)  # M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)  # M/M/2 at rho 0.5: 2 rho^2 / (1 + rho)
    assert erlang_c(4, 0.0) == 0.0 and erlang_c(4, 4.0) == 1.0


def test_md1_mean_wait_is_pollaczek_khinchine():
    lam, s = 0.8, 1.0  # rho 0.8, deterministic service: W = rho S / (2 (1 - rho)) = 2.0
    assert mdc_wait(lam, s, 1).mean_s == pytest.approx(0.8 * 1.0 / (2 * 0.2))


def test_unstable_queue_waits_forever():
    w = mdc_wait(5.0, 1.0, 4)
    assert w.unstable and w.mean_s == math.inf and w.quantile(0.5) == math.inf


def _simulate_mdc(lam: float, service: float, servers: int, n: int, seed: int = 7) -> list[float]:
    """FCFS M/D/c: waits of n Poisson arrivals (the brute-force reference)."""
    rng = random.Random(seed)
    free = [0.0] * servers
    heapq.heapify(free)
    t, waits = 0.0, []
    for _ in range(n):
        t += rng.expovariate(lam)
        start = max(t, heapq.heappop(free))
        waits.append(start - t)
        heapq.heappush(free, start + service)
    return sorted(waits[n // 10 :])


@pytest.mark.parametrize(("servers", "rho"), [(1, 0.7), (4, 0.85), (16, 0.9)])
def test_allen_cunneen_matches_a_discrete_event_simulation(servers, rho):
    service = 1.0
    lam = rho * servers / service
    sim = _simulate_mdc(lam, service, servers, 60_000)
    model = mdc_wait(lam, service, servers)
    sim_mean = sum(sim) / len(sim)
    sim_p90 = sim[int(0.9 * len(sim))]
    assert model.mean_s == pytest.approx(sim_mean, rel=0.20)
    assert model.quantile(0.9) == pytest.approx(sim_p90, rel=0.20, abs=0.02)


def test_sum_of_two_exponential_waits_is_erlang_2():
    w = Wait(1.0, 2.0)
    # Gamma(2, rate 2): P(S > t) = (1 + 2t) e^{-2t}; median at 2t = 1.67835
    assert wait_sum_quantile((w, w), 0.5) == pytest.approx(1.678347 / 2, rel=1e-4)
    # different rates: P(S > t) = (b e^{-at} - a e^{-bt}) / (b - a)
    a, b = Wait(1.0, 1.0), Wait(1.0, 3.0)
    t = wait_sum_quantile((a, b), 0.9)
    assert (3 * math.exp(-t) - math.exp(-3 * t)) / 2 == pytest.approx(0.1, rel=1e-6)
    assert wait_sum_quantile((NO_WAIT, a), 0.9) == pytest.approx(math.log(10), rel=1e-6)


def test_poisson_quantiles():
    assert poisson_quantile(3.0, 0.5) == 3  # CDF(2) = 0.423, CDF(3) = 0.647
    assert poisson_quantile(3.0, 0.9) == 5  # CDF(4) = 0.815, CDF(5) = 0.916
    assert poisson_quantile(0.0, 0.9) == 0
    assert poisson_quantile(10_000.0, 0.9) == math.ceil(10_000 + 1.28155 * 100 - 0.5)


def test_prediction_p90_at_least_p50():
    pred = predict_serve(LLAMA70, POOL4, JOB, ServeConfig(tp=4))
    assert pred.ttft_p90_s >= pred.ttft_s >= pred.prefill.total_s
    assert pred.tpot_p90_s >= pred.tpot_s
    assert pred.latency.tpot_mean_s == pytest.approx(pred.tpot_s)
    assert pred.at_rate is None


def test_latency_at_rate_grows_with_load():
    cfg = ServeConfig(tp=4)
    cap = predict_serve(LLAMA70, POOL4, JOB, cfg)
    prev = None
    for rate in (1.0, 4.0, 8.0):
        lat = latency_at_rate(LLAMA70, POOL4, JOB, cfg, concurrency=cap.concurrency, arrival_rate=rate)
        assert lat.utilization < 1 and lat.tpot_p50_s < cap.tpot_s
        if prev is not None:
            assert lat.running > prev.running and lat.tpot_p50_s > prev.tpot_p50_s
        prev = lat


def test_latency_at_rate_running_count_solves_littles_law():
    cfg = ServeConfig(tp=4)
    cap = predict_serve(LLAMA70, POOL4, JOB, cfg)
    rate = 6.0
    lat = latency_at_rate(LLAMA70, POOL4, JOB, cfg, concurrency=cap.concurrency, arrival_rate=rate)
    # the running count is what a request's stay in a slot (prefill + 256 tokens) times the rate gives
    low = latency_at_rate(LLAMA70, POOL4, JOB, cfg, concurrency=cap.concurrency, arrival_rate=1e-3)
    assert low.running == pytest.approx(1e-3 * (low.ttft_mean_s + 256 * low.tpot_mean_s), rel=0.05)
    assert rate * 256 * lat.tpot_mean_s < lat.running < rate * (1 + 256 * lat.tpot_mean_s + lat.ttft_mean_s)


def test_overload_is_unbounded_not_a_number():
    cfg = ServeConfig(tp=4)
    cap = predict_serve(LLAMA70, POOL4, JOB, cfg)
    lat = latency_at_rate(
        LLAMA70, POOL4, JOB, cfg, concurrency=cap.concurrency, arrival_rate=2 * cap.requests_per_s
    )
    assert lat.utilization >= 1 and lat.ttft_p50_s == math.inf and math.isfinite(lat.tpot_p50_s)


def test_arrival_rate_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        latency_at_rate(LLAMA70, POOL4, JOB, ServeConfig(tp=4), concurrency=8, arrival_rate=0)


def test_plan_json_carries_p90_and_the_latency_at_the_request_rate():
    from autoshard.search.serve.solve import solve_serve

    cluster = load_cluster("dgx-h100").with_gpus(8)
    kw = dict(pins=None, top_k=1, time_limit_s=10.0, num_workers=1)
    plain = solve_serve(LLAMA70, cluster, ServeJob(input_len=1000, output_len=1000), **kw)[0]
    plain = plain.to_json()["predicted"]["serve"]
    assert plain["ttft_p90_s"] >= plain["ttft_s"] > 0 and plain["tpot_p90_s"] >= plain["tpot_s"] > 0
    assert "at_request_rate" not in plain
    plan = solve_serve(LLAMA70, cluster, ServeJob(input_len=1000, output_len=1000, request_rate=4.0), **kw)[0]
    serve = plan.to_json()["predicted"]["serve"]
    at = serve["at_request_rate"]
    assert at["requests_per_s_per_engine"] == pytest.approx(4.0 / plan.replicas)
    assert 0 < at["utilization"] < 1 and at["ttft_p90_s"] >= at["ttft_p50_s"] > 0
    assert at["tpot_p50_s"] <= serve["tpot_s"]  # below capacity fewer requests share a step
