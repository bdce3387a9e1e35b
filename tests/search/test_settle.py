"""Settling candidates one CP-SAT model at a time (search/train/settle.py): every bound it leaves
is at most the candidate's optimum from a brute force over every layout and recompute count, every
layout it records is real (fits, objective as `int_objective` counts it) and is that optimum, and
the whole solve still returns the brute-force optimum, proven."""

from __future__ import annotations

import math

import pytest

from autoshard.search.deadline import Deadline
from autoshard.search.train.bounds import bounds
from autoshard.search.train.incumbents import incumbent
from autoshard.search.train.options import SolverOptions
from autoshard.search.train.prepare import Prepared
from autoshard.search.train.settle import settle
from autoshard.search.train.solve import _select
from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train
from autoshard.search.train.tables import build_tables, int_objective
from autoshard.specs import TrainJob
from conftest import tiny_cluster, tiny_model
from test_bruteforce import brute_force, solver_objective
from test_order_bound import _best

MOE = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 4096}
CASES = {
    "dense-first-tight": (tiny_model(layers=7, hidden=2048, heads=16, kv=4, moe=MOE, dense_first=1),
                          tiny_cluster(gpus_per_node=4, nodes=2, hbm=16.0), TrainJob(seq_len=2048, global_batch_size=16)),
    "dense": (tiny_model(layers=6), tiny_cluster(gpus_per_node=4, nodes=2), TrainJob(seq_len=2048, global_batch_size=16)),
}
OPTIONS = SolverOptions(num_workers=1, seed=0, time_limit_s=60, memory_fraction=1.0,
                        space=SpaceOptions(max_micro_batch=2, max_vpp=2))


def _prepared(model, cluster, job) -> Prepared:
    """Every candidate with pipeline parallelism (a third of them), each with its incumbent and its
    bound forgotten (0 is valid): settling alone must then prove or solve each one."""
    space = enumerate_train(model, cluster, job, pins=Pins(), options=OPTIONS.space)
    scale = math.lcm(*{c.dims.vpp for c in space.candidates})
    prep = Prepared(tables=[], lower_bounds=[], tmax_bounds=[], incumbents=[], scale=scale)
    for cfg in space.candidates[::3]:
        if cfg.dims.pp == 1:
            continue
        tab = build_tables(model, cluster, cfg, scale=scale, memory_fraction=OPTIONS.memory_fraction)
        found = bounds(tab, uniform_recompute=True)
        if found is None:
            continue
        prep.tables.append(tab)
        prep.lower_bounds.append(0)
        prep.tmax_bounds.append(0)
        prep.incumbents.append(incumbent(tab, None, found[1], True))
        prep.fixed_pools.append(None)
    return prep


@pytest.mark.parametrize("name", sorted(CASES))
def test_settled_bounds_and_layouts_are_the_candidates_optima(name):
    model, cluster, job = CASES[name]
    prep = _prepared(model, cluster, job)
    keep = list(range(len(prep.tables)))
    done = settle(prep, keep, pool_gpus=[p.num_gpus for p in cluster.pools], uniform_recompute=True,
                  options=OPTIONS, recompute_num_layers=None, deadline=Deadline(60), reserve_s=0.3)
    optima = [_best(tab, True) for tab in prep.tables]  # one recompute count for every chunk, as the model counts it
    best = min(inc[0] for inc in prep.incumbents if inc is not None)
    assert best == min(optima)
    for i, tab in enumerate(prep.tables):
        assert 0 < prep.lower_bounds[i] <= optima[i], (tab.config.dims.describe(), prep.lower_bounds[i], optima[i])
        inc = prep.incumbents[i]
        if inc is not None:
            assert int_objective(tab, inc[1]) == (inc[0], True)
            assert inc[0] >= optima[i]
    assert done.solved == len(keep) >= 5
    kept = _select(prep, OPTIONS, among=keep)
    assert len(kept) == 1 and prep.incumbents[kept[0]][0] == best == prep.lower_bounds[kept[0]]


@pytest.mark.parametrize("name", sorted(CASES))
def test_solve_with_settling_reaches_the_brute_force_optimum(name):
    model, cluster, job = CASES[name]
    best, _ = brute_force(model, cluster, job, OPTIONS)
    got, status = solver_objective(model, cluster, job, OPTIONS)
    assert status == "OPTIMAL" and got == best
