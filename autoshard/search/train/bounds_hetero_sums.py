"""The smallest sum of the ranks' times of a heterogeneous candidate at slowest-rank time t, with the
sends and the layers' pools taken at one rank -> pool assignment.

`bounds_pools.pipeline_sums` fills the fastest pools first up to their capacity at t and adds the
least total of sends over every assignment: each term at its own best assignment. GPT-3 TP4 PP24 on
mixed-3pool (three pools of eight ranks): at the plan's slowest-rank time the H100 ranks are full at
six layers each and the A100 ranks take three, which only an order with three boundaries across
pools fits; the least sends of any order have two, so the bound on the sum of rank times sat 1,153 us
below the plan's (1,080 of it that one boundary) and the solve stayed unproven.

Here the sum is bounded by Lagrangian duality on the one coupling constraint, sum_r x_r = n (the
decoder layers): for any price lam, sum_r d_r x_r = lam * n + sum_r (d_r - lam) x_r, and each rank
on its own minimises (d_r - lam) x_r over least_r <= x_r <= cap_r (its capacity at t on its pool,
given its neighbours' pools, `bounds_sends.SendsCapacity.caps`): at cap_r when its layers cost less
than lam, else at least_r. What is left, each rank's sends at their own links, its embedding or
output and that term, depends only on its own pool and its two neighbours', which is exactly the
dynamic programme of `SendsCapacity` over every assignment within the pools' rank limits. Every lam
gives a lower bound; a few prices are tried and the largest kept. A price above every pool's layer
time charges each layer the ranks cannot hold (and credits each they could hold beyond the decoder
layers): on GPT-3 above, where the capacities at the plan's slowest-rank time hold exactly the 96
layers, that is the plan's own sum (the A100 40GB ranks early in the pipeline, with more micro-
batches in flight, hold two layers, not three). Recompute extras are left out of the sum (a lower
bound still) while the capacities allow them."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from autoshard.search.train.bounds_sends import SendsCapacity

__all__ = ["joint_sums"]


def joint_sums(sends: SendsCapacity) -> Callable[[float], int | None]:
    """The lower bound on the sum of the rank times at slowest-rank time t, as a function of t
    (None where no assignment lets every rank hold its fewest layers). Non-increasing in t, as the
    capacities only grow with t."""
    k, pp, n_dec = sends.k, sends.pp, sends.n_dec
    price = np.asarray([float(part[1]) for part in sends.parts])  # us per decoder layer, per pool
    # fixed[r, a, b, c]: rank r on pool b between a and c: embedding / output and its sends
    fixed = np.stack([np.moveaxis(sends.fixed[b], 2, 0) for b in range(k)], axis=2)
    if sends.uniform_k:
        # one count for every chunk: each rank recomputes vpp * k layers at its own pool's extra price
        extra = np.asarray([float(part[2]) for part in sends.parts]) * sends.tab.config.dims.vpp * sends.uniform_k
        fixed = fixed + extra.reshape(1, 1, k, 1)
    least = np.asarray(sends.least, dtype=np.float64).reshape(pp, 1, 1, 1)
    # the pools' layer prices, and past the dearest one prices at which leaving capacity unused (to
    # save a boundary across pools, say) no longer pays: one and four times the most a rank's sends
    # can exceed the cheapest link's
    dearest = float(price.max())
    prices = sorted({*price.tolist(), dearest + sends.extra_us, dearest + 4 * sends.extra_us})

    def at(t: float) -> int | None:
        caps = sends.caps(t)
        ok = caps >= least
        best = -math.inf
        for lam in prices:
            slope = (price - lam).reshape(1, 1, k, 1)
            cost = np.where(ok, fixed + np.minimum(slope * least, slope * caps), np.inf)
            most = sends.best_total(-cost)
            if most is None or not math.isfinite(most):
                return None
            best = max(best, lam * n_dec - most)
        return math.floor(best + 1e-6)

    return at
