"""Three pools, each rank on one of them within the pools' rank limits: `three_pool_assignment`
finds the exact largest total capacity (brute force over every assignment), with an assignment
that reaches it and keeps the limits, and is never above the Lagrangian bound it replaces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoshard.search.train import bounds_pools
from autoshard.search.train.bounds_pools import pools_assignment, three_pool_assignment


def _brute(caps: np.ndarray, lim) -> float | None:
    pp = caps.shape[1]
    best = None
    for v in itertools.product(range(3), repeat=pp):
        if any(v.count(q) > lim[q] for q in range(3)):
            continue
        total = float(sum(caps[q, r] for r, q in enumerate(v)))
        best = total if best is None else max(best, total)
    return best


@pytest.mark.parametrize("enumerate_up_to", [6, 0])
@pytest.mark.parametrize("seed", range(12))
def test_three_pool_assignment_is_exact(seed, enumerate_up_to, monkeypatch):
    """Both ways: every assignment scored at once (few ranks) and the dynamic programme."""
    monkeypatch.setattr(bounds_pools, "_ENUMERATE_RANKS", enumerate_up_to)
    rng = np.random.default_rng(seed)
    pp = int(rng.integers(2, 8))
    lim = np.array([int(rng.integers(0, pp + 1)) for _ in range(3)])
    if lim.sum() < pp:
        lim[2] = pp - lim[0] - lim[1]
    caps = rng.integers(0, 12, size=(3, pp)).astype(np.float64)
    # a pool that cannot take a rank at all: barred, as _HeteroCapacity marks it
    caps[rng.integers(0, 3), rng.integers(0, pp)] = -1e6
    found = three_pool_assignment(caps, lim)
    want = _brute(caps, lim)
    assert found is not None and want is not None
    total, pools = found
    assert total == want
    assert float(caps[pools, np.arange(pp)].sum()) == total
    assert all(int((pools == q).sum()) <= lim[q] for q in range(3))


def test_lagrangian_bound_is_never_tighter_and_was_loose():
    """The Lagrangian bound (still used past the exact method's size) is an upper bound too, never
    below the exact value; on ranks whose capacities favour one pool's limited slots it was loose."""
    rng = np.random.default_rng(7)
    loose = 0
    for _ in range(40):
        pp = 6
        caps = rng.integers(0, 20, size=(3, pp)).astype(np.float64)
        lim = np.array([2, 2, 2])
        exact = three_pool_assignment(caps, lim)[0]
        saved = bounds_pools._EXACT_STATES
        bounds_pools._EXACT_STATES = 0
        try:
            lagrangian = pools_assignment(caps, lim)[0]
        finally:
            bounds_pools._EXACT_STATES = saved
        assert lagrangian >= exact - 1e-9
        loose += lagrangian > exact + 1e-9
        assert pools_assignment(caps, lim)[0] == exact
    assert loose >= 5, loose
