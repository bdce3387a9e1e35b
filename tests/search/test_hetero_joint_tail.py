"""The joint bound over every rank -> pool assignment on slowest-rank time, sends and tail
(`bounds_hetero_tail`): never above the brute-force optimum over every assignment, contiguous
layout and one recompute count for every chunk, and above the candidate bound of `bounds` (each
term at its own best assignment) on some candidates."""

from __future__ import annotations

import pytest

import autoshard.search.train.assign as assign_module
from autoshard.search.train.bounds import bounds
from autoshard.search.train.bounds_hetero_tail import hetero_joint_tail_bound
from autoshard.search.train.options import SolverOptions
from autoshard.search.train.prepare import prepare
from autoshard.search.train.space import Pins, SpaceOptions
from autoshard.specs import TrainJob
from conftest import tiny_model
from test_exact_sends import _cluster, _tables
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


def test_preparation_bounds_open_candidates_jointly_and_stays_below_the_optimum(monkeypatch):
    """`prepare` raises every open heterogeneous candidate's bound to at least the joint bound (pools
    left free: no candidate split by assignment here, as candidates with too many assignments are),
    and the result stays below the brute-force optimum of that candidate."""

    monkeypatch.setattr(assign_module, "_MAX_ASSIGNMENTS", 0)
    model, cluster = tiny_model(layers=6, hidden=2048, heads=16, kv=4), _cluster(2.0)
    job = TrainJob(seq_len=2048, global_batch_size=16)
    options = SolverOptions(top_k=50, space=SpaceOptions(max_micro_batch=2, max_vpp=2, max_cp=1))
    prep = prepare(model, cluster, job, pins=Pins(), options=options)
    pool_gpus = [p.num_gpus for p in cluster.pools]
    checked = 0
    rows = zip(prep.tables, prep.lower_bounds, prep.tmax_bounds, prep.fixed_pools, strict=True)
    for tab, lb, tmax, fixed in rows:
        if fixed is not None or not 1 < tab.config.dims.pp <= 3:
            continue
        assert lb >= hetero_joint_tail_bound(tab, pool_gpus, tmax, *_weights(tab)) > 0
        best = _brute(tab, pool_gpus)  # None: no layout with one recompute count for every chunk fits
        if best is not None:
            assert lb <= best[0], (tab.config.dims.describe(), lb, best)
            checked += 1
    assert checked >= 3
