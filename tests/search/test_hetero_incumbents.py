"""Greedy incumbents on a heterogeneous cluster under the default HBM headroom: the tight A100 40GB
pool fits only with one recompute count for every chunk (Megatron's --recompute-num-layers)."""

from __future__ import annotations

from autoshard.api import train_job
from autoshard.search.train.bounds import bounds
from autoshard.search.train.incumbents import memory_pools, uniform_assignment_incumbent
from autoshard.search.train.options import DEFAULT_MEMORY_FRACTION
from autoshard.search.train.space import Pins, enumerate_train
from autoshard.search.train.tables import build_tables, int_objective
from autoshard.specs import load_cluster, load_model


def test_uniform_recompute_incumbent_fits_the_tight_pool():
    model = load_model("llama-3.1-70b")
    cluster = load_cluster("mixed-3pool")
    # 1,536 sequences: a multiple of PP 6 micro-batches per DP rank, as the interleaved schedule needs
    space = enumerate_train(model, cluster, train_job(model, global_batch_size=1536), pins=Pins(tp=4, pp=6, vpp=4))
    pool_gpus = [p.num_gpus for p in cluster.pools]
    hits = recomputed = 0
    for cfg in space.candidates[:12]:
        tab = build_tables(model, cluster, cfg, memory_fraction=DEFAULT_MEMORY_FRACTION)
        ranks = memory_pools(cluster, tab)
        assert ranks is not None and sorted(ranks, key=lambda q: -tab.pools[q].capacity_mib) == ranks
        found = bounds(tab, uniform_recompute=True, pool_gpus=pool_gpus, cutoff=None)
        got = uniform_assignment_incumbent(tab, ranks, found[1] if found else 0)
        if got is None:
            continue
        obj, lay = got
        assert len(set(lay.recompute)) == 1  # one count for every chunk
        assert int_objective(tab, lay) == (obj, True)  # fits, objective as the model counts it
        assert found is not None and found[0] <= obj  # the bound stays below the layout
        assert tuple(lay.pools[:cfg.dims.pp]) == tuple(ranks)
        hits += 1
        recomputed += lay.recompute[0] > 0
    assert hits > 0 and recomputed > 0  # the 40 GB ranks need the recompute
