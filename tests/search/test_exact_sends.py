"""The exact-sends heterogeneous bound (`bounds_sends`): its dynamic programme over the ranks equals
a brute force over every rank -> pool assignment (each rank's sends priced by
`bounds_pools.assignment_sends`, the pricing `int_objective` uses), the least total of sends equals
the brute-force minimum, and the candidate bound stays below the brute-force optimum of every
assignment, layout and recompute count while rising above the cheapest-link bound it tightens."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoshard.search.train.bounds import bounds
from autoshard.search.train.bounds_pools import _HeteroCapacity, assignment_capacity, assignment_sends, pool_rank_limits
from autoshard.search.train.bounds_rank import _rank_sends
from autoshard.search.train.bounds_sends import SendsCapacity, link_matrix, min_total_sends, pool_send_floor
from autoshard.search.train.space import SpaceOptions, enumerate_train
from autoshard.search.train.tables import build_tables
from autoshard.specs import ClusterSpec, TrainJob
from conftest import gpu, node, pool_assignments, tiny_model
from test_hetero_uniform_bound import _brute


def _cluster(inter_gbps: float, pools: int = 3) -> ClusterSpec:
    """Fast GPUs in a 2-GPU NVLink node, slower ones in 1-GPU nodes (every send leaves the node),
    small ones; pools joined by a thin link: a send's price depends on both ends' pools."""
    return ClusterSpec.model_validate({
        "name": "three-links",
        "pools": [
            {"name": "fast", "gpu": gpu("H100", hbm=12.0), "node": node(2), "num_nodes": 1},
            {"name": "slow", "gpu": gpu("A100", hbm=12.0, tflops=312.0), "node": node(1), "num_nodes": 2},
            {"name": "small", "gpu": gpu("A10", hbm=6.0, tflops=125.0), "node": node(1), "num_nodes": 2},
        ][:pools],
        "inter_pool_gbps": inter_gbps,
    })


def _tables(inter_gbps: float, min_pp: int = 2, pools: int = 3):
    model = tiny_model(layers=6, hidden=2048, heads=16, kv=4)
    cluster = _cluster(inter_gbps, pools)
    job = TrainJob(seq_len=2048, global_batch_size=24)
    space = enumerate_train(model, cluster, job, options=SpaceOptions(max_micro_batch=2, max_vpp=2, max_cp=1))
    pool_gpus = [p.num_gpus for p in cluster.pools]
    for cfg in space.candidates:
        if min_pp <= cfg.dims.pp <= 4:
            yield build_tables(model, cluster, cfg, scale=2), pool_gpus


@pytest.mark.parametrize("inter_gbps,pools", [(2.0, 3), (25.0, 3), (2.0, 2)])
def test_dp_equals_brute_force_over_assignments(inter_gbps, pools):
    checked = vpp2 = 0
    for tab, pool_gpus in _tables(inter_gbps, pools=pools):
        cap = _HeteroCapacity(tab, pool_gpus, exact_sends=True)
        assert cap.sends is not None
        vectors = pool_assignments(tab, pool_gpus)
        step = max(1, max(p.decoder_unit[0] for p in tab.pools))
        base = int(max(max(p.p2p_us for p in tab.pools), max(tab.cross_p2p_us.values())))
        for t in (base + step * i for i in range(0, 14, 3)):
            dp = cap.sends.at(t)
            # assignment_capacity zeroes an assignment with a rank below its minimum: so does max(., 0)
            brute = max((float(assignment_capacity(tab, v)(t).sum()) for v in vectors), default=None)
            if brute is None:
                assert dp is None
                continue
            assert max(dp, 0.0) == brute, (tab.config.dims.describe(), t, dp, brute)
            checked += 1
        vpp2 += tab.config.dims.vpp > 1
    assert checked >= 25 and vpp2 >= 1


@pytest.mark.parametrize("inter_gbps", [2.0, 25.0])
def test_least_total_sends_is_the_brute_force_minimum(inter_gbps):
    checked = 0
    for tab, pool_gpus in _tables(inter_gbps):
        vectors = pool_assignments(tab, pool_gpus)
        brute = min(float(assignment_sends(tab, v).sum()) for v in vectors)
        found = min_total_sends(tab, pool_rank_limits(tab, pool_gpus))
        assert found == pytest.approx(brute), tab.config.dims.describe()
        checked += 1
    assert checked >= 10


def test_candidate_bound_below_the_optimum_and_tighter_than_the_cheapest_link():
    checked = higher = 0
    for tab, pool_gpus in _tables(2.0, min_pp=2):
        if tab.config.dims.pp > 3:
            continue
        best = _brute(tab, pool_gpus)
        found = bounds(tab, pool_gpus=pool_gpus)
        if best is None:
            continue
        assert found is not None and found[0] <= best[0], (tab.config.dims.describe(), found, best)
        assert found[1] <= best[1]
        loose = _HeteroCapacity(tab, pool_gpus)
        exact = _HeteroCapacity(tab, pool_gpus, exact_sends=True)
        for t in range(int(found[1]) - 200, int(found[1]) + 1, 50):
            a, b = loose.at(t), exact.at(t)
            if b is not None:
                assert a is not None and b[0] <= a[0] + 1e-9
                higher += b[0] < a[0]
        checked += 1
    assert checked >= 5 and higher >= 1


@pytest.mark.parametrize("inter_gbps", [2.0, 25.0])
def test_pool_send_floor_never_exceeds_a_ranks_sends(inter_gbps):
    """Every rank's sends, in every assignment, cost at least its pool's floor more than the
    cheapest-link price; the floor is reached by some assignment (it is the sharpest such price)."""
    checked = raised = 0
    for tab, pool_gpus in _tables(inter_gbps):
        floor = pool_send_floor(tab)
        links = link_matrix(tab)
        relaxed = np.asarray(_rank_sends(tab), dtype=np.float64) * links.min()
        reached = np.zeros_like(floor, dtype=bool)
        for v in itertools.product(range(len(pool_gpus)), repeat=tab.config.dims.pp):
            extra = assignment_sends(tab, v) - relaxed
            for r, q in enumerate(v):
                assert extra[r] >= floor[q, r] - 1e-9
                reached[q, r] |= abs(extra[r] - floor[q, r]) < 1e-9
        assert reached.all(), tab.config.dims.describe()
        checked += 1
        raised += bool((floor > 0).any())
    assert checked >= 10 and raised >= 10
