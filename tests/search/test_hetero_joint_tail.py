"""The joint bound over every rank -> pool assignment on slowest-rank time, sends and tail
(`bounds_hetero_tail`): never above the brute-force optimum over every assignment, layout and
recompute count, and above the candidate bound of `bounds` (each term at its own best assignment)
on some candidates."""

from __future__ import annotations

import pytest

from autoshard.search.train.bounds import bounds
from autoshard.search.train.bounds_hetero_tail import hetero_joint_tail_bound
from test_exact_sends import _tables
from test_hetero_uniform_bound import _brute


def _weights(tab):
    vpp, m, scale = tab.config.dims.vpp, tab.config.num_microbatches, tab.scale
    return (scale // vpp) * (m * vpp - 1), scale, scale // vpp


@pytest.mark.parametrize("inter_gbps,pools", [(2.0, 3), (25.0, 3), (2.0, 2)])
def test_joint_bound_never_above_the_brute_force_optimum(inter_gbps, pools):
    checked = higher = 0
    for tab, pool_gpus in _tables(inter_gbps, pools=pools):
        if tab.config.dims.pp > 3:
            continue
        best = _brute(tab, pool_gpus)
        found = bounds(tab, pool_gpus=pool_gpus)
        if best is None or found is None:
            continue
        joint = hetero_joint_tail_bound(tab, pool_gpus, found[1], *_weights(tab))
        assert 0 < joint <= best[0], (tab.config.dims.describe(), joint, best)
        higher += joint > found[0]
        checked += 1
    assert checked >= 5 and higher >= 1
