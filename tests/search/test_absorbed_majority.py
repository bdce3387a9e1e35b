"""`bounds_mixed.absorbed_majority` (the max-plus DP over ranks of the count-aware bound) against a
brute force over every split of the minority layers between the ranks."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.search.train.bounds_mixed import absorbed_majority


def _brute(caps: np.ndarray) -> np.ndarray:
    """Most majority layers the ranks absorb while holding exactly width - 1 minority layers: every
    split (j_0, ..., j_pp-1) with that sum, each rank at its capacity for its own count."""
    g, pp, width = caps.shape
    out = np.full(g, -np.inf)
    for split in itertools.product(range(width), repeat=pp):
        if sum(split) == width - 1:
            out = np.maximum(out, sum(caps[:, r, j] for r, j in enumerate(split)))
    return out


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_absorbed_majority_is_the_best_split(g, pp, width, seed):
    rng = np.random.default_rng(seed)
    caps = rng.integers(0, 50, size=(g, pp, width)).astype(float)
    caps[rng.random(caps.shape) < 0.3] = -np.inf  # counts a rank cannot take
    assert np.array_equal(absorbed_majority(caps), _brute(caps))


def test_absorbed_majority_worked_example():
    # two ranks, two minority layers: (0, 2) gives 9 + 1, (1, 1) 5 + 4, (2, 0) -inf (rank 0 cannot take 2)
    caps = np.array([[[9.0, 5.0, -np.inf], [7.0, 4.0, 1.0]]])
    assert absorbed_majority(caps).tolist() == [10.0]
