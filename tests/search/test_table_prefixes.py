"""The batched prefix sums of `build_tables` (`tables._per_layer_prefixes`, one array operation per
pool instead of seven) give the same integers as the per-row `_per_layer_prefix` they replace."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.search.train.tables import _per_layer_prefix, _per_layer_prefixes

_values = st.floats(min_value=0.0, max_value=5.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(kinds=st.integers(1, 4), layers=st.integers(1, 40), data=st.data())
def test_batched_prefixes_equal_the_per_row_ones(kinds, layers, data):
    rows = data.draw(st.lists(st.lists(_values, min_size=kinds, max_size=kinds), min_size=1, max_size=7))
    scales = data.draw(st.lists(st.sampled_from([1.0, 1e6]), min_size=len(rows), max_size=len(rows)))
    idx = np.asarray(data.draw(st.lists(st.integers(0, kinds - 1), min_size=layers, max_size=layers)))
    batched = _per_layer_prefixes(rows, idx, scales)
    for row, scale, got in zip(rows, scales, batched, strict=True):
        want = _per_layer_prefix(row, idx, scale)
        assert got.dtype == want.dtype and np.array_equal(got, want)
