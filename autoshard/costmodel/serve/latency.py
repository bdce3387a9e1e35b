"""Queueing for serving latency: the waits that turn one engine's step times into TTFT and TPOT at a
load, as p50 and p90.

Three waits, each modelled as a queue with Poisson arrivals and deterministic service (M/D/c), with
the Allen-Cunneen approximation: the wait is 0 with the Erlang-C probability P_wait, else exponential
with rate theta = (c / S - lambda) / ((1 + cs^2) / 2), cs^2 = 0 for deterministic service (half the
M/M/c wait). Allen and Cunneen, in Allen, "Probability, Statistics and Queueing Theory" (2nd ed.,
1990), sec. 6.4; exact for M/M/c, within a few percent of M/D/c simulations at the utilizations
engines run (tests/costmodel/test_serving_latency.py checks it against a discrete-event simulation).

- slot queue: a request waits for a free slot (max_num_seqs / KV capacity) when every slot is busy;
  servers = slots, service = the request's whole stay (TTFT + output_len x TPOT). Open loop only: a
  closed-loop benchmark (a fixed number of clients) never queues for a slot.
- prefill lane: chunked prefill gives each step a token budget; a new prompt waits for the prompts
  ahead of it to be prefilled. Servers = prompts one step's budget holds, service = the steps one
  prompt's prefill takes.
- step alignment: a prompt arriving at random joins at the next step boundary (uniform over one
  step); in a closed loop it arrives as another request leaves, at a boundary.

TPOT of one request is the mean of its steps: pure decode steps plus the prefill chunks of the
prompts admitted during its life, a Poisson count whose mean is what the mean TPOT already prices.

Pure functions, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "Wait",
    "NO_WAIT",
    "erlang_c",
    "mdc_wait",
    "poisson_quantile",
    "wait_sum_quantile",
    "LatencyQuantiles",
]


@dataclass(frozen=True, slots=True)
class Wait:
    """A wait that is 0 with probability 1 - p_wait, else exponential with rate `theta` (1/s).
    theta = 0 with p_wait > 0 means the queue is unstable (the wait grows without bound)."""

    p_wait: float
    theta: float

    @property
    def unstable(self) -> bool:
        return self.p_wait > 0 and self.theta <= 0

    @property
    def mean_s(self) -> float:
        if self.p_wait <= 0:
            return 0.0
        return math.inf if self.unstable else self.p_wait / self.theta

    def quantile(self, q: float) -> float:
        """Seconds not exceeded with probability q."""
        return wait_sum_quantile((self,), q)


NO_WAIT = Wait(0.0, 0.0)


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with `servers` servers and offered load
    `offered` = lambda x S (Erlangs). Erlang B by its stable recursion, then C = B / (1 - rho (1 - B))."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1.0 - rho * (1.0 - b))


def mdc_wait(rate: float, service_s: float, servers: int, *, cs2: float = 0.0) -> Wait:
    """Queueing delay of an M/G/c queue (Allen-Cunneen): `rate` arrivals/s, `service_s` per
    customer, `servers` in parallel, squared coefficient of variation `cs2` of the service time."""
    if rate <= 0 or service_s <= 0 or servers < 1:
        return NO_WAIT
    offered = rate * service_s
    if offered >= servers:
        return Wait(1.0, 0.0)
    p = erlang_c(servers, offered)
    theta = (servers / service_s - rate) / ((1.0 + cs2) / 2.0)
    return Wait(p, theta)


def _tail(waits: tuple[Wait, ...], t: float) -> float:
    """P(sum of the waits > t) for independent waits of the atom-plus-exponential form."""
    active = [w for w in waits if w.p_wait > 0]
    if not active:
        return 0.0
    if len(active) == 1:
        w = active[0]
        return w.p_wait * math.exp(-w.theta * t)
    if len(active) > 2:
        raise ValueError("at most two waits are summed")
    a, b = active
    ea, eb = math.exp(-a.theta * t), math.exp(-b.theta * t)
    if abs(a.theta - b.theta) <= 1e-12 * max(a.theta, b.theta):
        both = (1.0 + a.theta * t) * ea
    else:
        both = (b.theta * ea - a.theta * eb) / (b.theta - a.theta)
    return a.p_wait * (1 - b.p_wait) * ea + b.p_wait * (1 - a.p_wait) * eb + a.p_wait * b.p_wait * both


def wait_sum_quantile(waits: tuple[Wait, ...], q: float) -> float:
    """q-quantile (seconds) of the sum of independent waits; inf when one of them is unstable."""
    if not 0 < q < 1:
        raise ValueError(f"quantile must be in (0, 1), got {q}")
    if any(w.unstable for w in waits):
        return math.inf
    if _tail(waits, 0.0) <= 1 - q:
        return 0.0
    hi = max((w.mean_s for w in waits), default=0.0) or 1e-6
    while _tail(waits, hi) > 1 - q:
        hi *= 2
    lo = 0.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if _tail(waits, mid) > 1 - q:
            lo = mid
        else:
            hi = mid
    return hi


def poisson_quantile(mean: float, q: float) -> int:
    """Smallest k with P(Poisson(mean) <= k) >= q (normal approximation above mean 500)."""
    if mean <= 0:
        return 0
    if mean > 500:
        z = {0.5: 0.0, 0.9: 1.2815515655446004}.get(q)
        if z is None:
            raise ValueError("only the median and p90 are tabulated for large means")
        return max(0, math.ceil(mean + z * math.sqrt(mean) - 0.5))
    term = math.exp(-mean)
    cdf, k = term, 0
    while cdf < q:
        k += 1
        term *= mean / k
        cdf += term
    return k


@dataclass(frozen=True, slots=True)
class LatencyQuantiles:
    """TTFT and TPOT of one request at a load, p50 and p90, with the waits they include."""

    ttft_p50_s: float
    ttft_p90_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    ttft_mean_s: float
    tpot_mean_s: float
    slot_wait: Wait
    prefill_wait: Wait
    running: float
    """Mean running requests per DP rank at this load."""
    utilization: float
    """Offered load over slots (1.0: every slot busy; above it the queue grows without bound)."""

    @classmethod
    def combine(
        cls,
        *,
        prefill_s: float,
        align_s: float,
        slot_wait: Wait,
        prefill_wait: Wait,
        tpot_decode_s: float,
        tpot_per_prompt_s: float,
        prompts_per_life: float,
        running: float,
        utilization: float,
    ) -> LatencyQuantiles:
        """TTFT = own prefill + step alignment (uniform over `align_s`: one step for random arrivals, 0 in
        a closed loop, where a request arrives as another leaves at a step boundary) + prefill-lane wait
        + slot wait;
        TPOT = pure decode step + prompts admitted during the request's life x their share each."""
        waits = (slot_wait, prefill_wait)
        ttft = {
            q: prefill_s + q * align_s + wait_sum_quantile(waits, q) for q in (0.5, 0.9)
        }
        tpot = {
            q: tpot_decode_s + poisson_quantile(prompts_per_life, q) * tpot_per_prompt_s for q in (0.5, 0.9)
        }
        waited = slot_wait.mean_s + prefill_wait.mean_s
        return cls(
            ttft_mean_s=prefill_s + 0.5 * align_s + waited,
            tpot_mean_s=tpot_decode_s + prompts_per_life * tpot_per_prompt_s,
            ttft_p50_s=ttft[0.5],
            ttft_p90_s=ttft[0.9],
            tpot_p50_s=tpot[0.5],
            tpot_p90_s=tpot[0.9],
            slot_wait=slot_wait,
            prefill_wait=prefill_wait,
            running=running,
            utilization=utilization,
        )
