"""The memory-aware cheap bound of heterogeneous clusters (`bounds.quick_lower_bound` with a memory
fraction): a rank on a pool takes no more of the decoder layers than its GPUs' memory holds of their
model states. Checked against a brute force over every rank -> pool assignment, every contiguous
layout and every uniform recompute count: the bound never passes the best objective, and a candidate
it drops as NO_MEMORY has no layout that fits, neither in the tables nor in the cost model itself
(`predict_train`)."""

from __future__ import annotations

import math

import pytest

from autoshard.costmodel.train.step import predict_train
from autoshard.search.train.bounds import NO_MEMORY, NO_RANKS, quick_lower_bound
from autoshard.search.train.result import layout_stages
from autoshard.search.train.space import SpaceOptions, enumerate_train
from autoshard.search.train.tables import build_tables, int_objective
from autoshard.specs import TrainJob
from conftest import three_tight_cluster, tiny_model, uniform_layouts


CASES = {  # name: (model, cluster, sequence length)
    # dense: the small pool holds a layer or two at most; the model's states need the big pools
    "dense": (tiny_model(layers=6, hidden=2048, heads=16, kv=4), three_tight_cluster(7.0, 3.0), 2048),
    "dense-looser": (tiny_model(layers=6, hidden=2048, heads=16, kv=4), three_tight_cluster(10.0, 4.0), 4096),
    # MoE with a dense first layer: the experts' states set each rank's share
    "moe": (tiny_model(layers=6, hidden=1024, heads=8, kv=8, moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 4096}, dense_first=1),
            three_tight_cluster(8.0, 3.0), 2048),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_memory_aware_quick_bound_against_brute_force(case):
    model, cluster, seq = CASES[case]
    job = TrainJob(seq_len=seq, global_batch_size=24)
    space = enumerate_train(model, cluster, job, options=SpaceOptions(max_micro_batch=2, max_vpp=2, max_cp=1))
    pool_gpus = [p.num_gpus for p in cluster.pools]
    checked = dropped = higher = 0
    for cfg in space.candidates:
        if cfg.dims.pp > 3:
            continue
        quick = quick_lower_bound(model, cluster, cfg, scale=2, memory_fraction=1.0)
        blind = quick_lower_bound(model, cluster, cfg, scale=2)
        assert quick != NO_RANKS and blind != NO_RANKS
        tab = build_tables(model, cluster, cfg, scale=2)
        best = None
        for lay in uniform_layouts(tab, pool_gpus):
            obj, fits = int_objective(tab, lay)
            if fits:
                best = obj if best is None else min(best, obj)
        if quick == NO_MEMORY:
            assert best is None, (case, cfg.dims.describe())
            # the cost model itself agrees: no assignment and layout fits, with most recomputation
            for lay in uniform_layouts(tab, pool_gpus):
                if lay.recompute[0] == min(int(tab.decoders[b1] - tab.decoders[b0])
                                           for b0, b1 in zip(lay.bounds, lay.bounds[1:])):
                    pred = predict_train(model, cluster, *layout_stages(tab, lay))
                    assert not pred.fits, (case, cfg.dims.describe(), lay)
            dropped += 1
            continue
        assert quick >= blind  # memory only adds to the bound
        if best is None:
            continue
        assert quick <= best, (case, cfg.dims.describe(), cfg.recompute.value, quick, best)
        checked += 1
        higher += quick > blind
    # measured: (checked, dropped, higher) = (10, 66, 5) dense, (38, 24, 4) dense-looser, (34, 102, 34) moe;
    # the memory-blind bound dropped none of them and was lower on every one counted in `higher`
    least = {"dense": (10, 60, 5), "dense-looser": (35, 20, 4), "moe": (30, 90, 30)}[case]
    assert checked >= least[0] and dropped >= least[1] and higher >= least[2], (
        checked, dropped, higher)


def test_hetero_floors_closed_form():
    """Two pools, one rank each: the fast pool (100 us for every layer) holds a quarter of the
    layers, the slow one (300 us) all of them. Without memory the slowest rank needs
    1 / (1/100 + 1/300) = 75 us; with it the fast rank stops at 25 us of work and the slow rank
    takes the other three quarters: 225 us. The path: a quarter at 100, the rest at 300 = 250 us."""
    from autoshard.search.train.bounds import _hetero_floors

    assert _hetero_floors([100, 300], [math.inf, math.inf], [1, 1], 2) == (99, 74)
    assert _hetero_floors([100, 300], [0.25, 1.0], [1, 1], 2) == (249, 224)
    assert _hetero_floors([100, 300], [0.25, 0.5], [1, 1], 2) == NO_MEMORY
    assert _hetero_floors([100, 300], [1.0, 1.0], [1, 0], 2) == NO_RANKS


def test_chunk_floors_closed_form():
    """Every chunk holds a layer: with VPP 3 each rank holds at least 2 of the 8 decoder layers
    (lo = 1/4). Four ranks on two pools (two each; 100 us and 400 us for all the layers): the
    slowest rank is at least 1/4 x 400 = 100 us, the path at least 1/4 x (100 + 100 + 400 + 400)
    = 250 us (the four shares use up every layer). With one other decoder layer standing in,
    lo = 1/8: 50 us and 1/8 x 1,000 + 1/2 x 100 = 175 us. A pool whose memory holds less than
    lo cannot host a rank: too few ranks left is NO_MEMORY."""
    from autoshard.search.train.bounds import _chunk_floors

    pools = [(100, math.inf, 2), (400, math.inf, 2)]
    assert _chunk_floors((0, 0, pools, 8, 0), 4, 3) == (249, 99)
    assert _chunk_floors((0, 0, pools, 8, 1), 4, 3) == (174, 49)
    assert _chunk_floors((0, 0, pools, 8, 0), 4, 1) == (0, 0)
    assert _chunk_floors((0, 0, pools, 8, 0), 1, 3) == (99, 11)  # one rank holds both ends: lo = 1/8
    assert _chunk_floors((0, 0, [(100, math.inf, 2), (400, 0.2, 2)], 8, 0), 4, 3) == NO_MEMORY
