"""The heterogeneous slowest-rank bound under one recompute count for every chunk (Megatron's
--recompute-num-layers, the default) and with every rank holding at least one decoder layer per
chunk on its own pool: never above what a brute force finds (every rank -> pool assignment, every
contiguous layout, every uniform recompute count), 'no fit' only when nothing fits, and tighter
than the per-rank (continuous) recompute bound where a tight pool caps the count for everyone."""

from __future__ import annotations

import pytest

from autoshard.search.train.bounds import bounds
from autoshard.search.train.bounds_pools import hetero_tmax_lower_bound
from autoshard.search.train.space import SpaceOptions, enumerate_train
from autoshard.search.train.tables import Layout, build_tables, int_objective
from autoshard.specs import TrainJob
from conftest import three_tight_cluster, tiny_model, uniform_layouts


def _rank_times(tab, lay: Layout) -> list[int]:
    """Each rank's time per micro-batch, as `int_objective` counts it (sends included)."""
    pp, s = tab.config.dims.pp, tab.num_chunks
    times = [0] * pp
    b, q = lay.bounds, lay.pools
    for k in range(s):
        p = tab.pools[q[k]]
        t = int(p.time_us[b[k + 1]] - p.time_us[b[k]]) + lay.recompute[k] * p.recompute_extra_us
        if k + 1 < s:
            t += p.p2p_us if q[k] == q[k + 1] else tab.cross_p2p_us[(q[k], q[k + 1])]
        if k > 0:
            t += p.p2p_us if q[k - 1] == q[k] else tab.cross_p2p_us[(q[k - 1], q[k])]
        times[k % pp] += t
    return times


def _brute(tab, pool_gpus) -> tuple[int, int] | None:
    """(best objective, smallest slowest-rank time) over every assignment, layout and uniform count."""
    best = None
    for lay in uniform_layouts(tab, pool_gpus):
        obj, fits = int_objective(tab, lay)
        if fits:
            tmax = max(_rank_times(tab, lay))
            best = (obj, tmax) if best is None else (min(best[0], obj), min(best[1], tmax))
    return best


@pytest.mark.parametrize("big_hbm,small_hbm,seq", [(8.0, 3.0, 2048), (10.0, 4.0, 4096)])
def test_uniform_hetero_bound_never_exceeds_the_brute_force_optimum(big_hbm, small_hbm, seq):
    model = tiny_model(layers=6, hidden=2048, heads=16, kv=4)
    cluster = three_tight_cluster(big_hbm, small_hbm)
    job = TrainJob(seq_len=seq, global_batch_size=16)
    space = enumerate_train(model, cluster, job, options=SpaceOptions(max_micro_batch=2, max_vpp=2, max_cp=1))
    pool_gpus = [p.num_gpus for p in cluster.pools]
    checked = higher = proven = 0
    for cfg in space.candidates:
        if not 1 < cfg.dims.pp <= 3:
            continue
        tab = build_tables(model, cluster, cfg, scale=2)
        best = _brute(tab, pool_gpus)
        found = bounds(tab, uniform_recompute=True, pool_gpus=pool_gpus)
        tmax = hetero_tmax_lower_bound(tab, pool_gpus, uniform_recompute=True)
        plain = hetero_tmax_lower_bound(tab, pool_gpus)
        if best is None:
            proven += plain is not None and found is None  # it proves what the per-rank bound could not
            continue
        assert found is not None and tmax is not None, cfg.dims.describe()
        assert found[0] <= best[0], (cfg.dims.describe(), cfg.recompute.value, found[0], best[0])
        assert tmax <= best[1], (cfg.dims.describe(), cfg.recompute.value, tmax, best[1])
        checked += 1
        higher += plain is None or tmax > plain
    # measured (fragmentation charged on transient memory only): higher on 3 of 21 and 11 of 33
    # candidates that fit; 5 and 11 that do not fit proven so only by this bound (9 and 13 while the
    # per-rank bound assigned three pools by a Lagrangian bound; exact now, it proves the others)
    assert checked >= 10
    assert higher >= 3
    assert proven >= 5
