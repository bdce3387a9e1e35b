"""The CP-SAT planner reaches exactly the optimum a brute-force enumeration finds: every candidate of
the space, every contiguous layout, every uniform recompute count and every pool assignment,
scored with the same integer objective."""

from __future__ import annotations

import itertools
import math

import pytest

from autoshard.search.run import SolverOptions, solve_train
from autoshard.search.space import Pins, SpaceOptions, enumerate_train
from autoshard.search.tables import Layout, build_tables, int_objective
from autoshard.specs import TrainJob
from autoshard.units import US_PER_S
from conftest import hetero_cluster, tiny_cluster, tiny_model

OPTIONS = SolverOptions(num_workers=1, seed=0, time_limit_s=60, memory_fraction=1.0,
                        space=SpaceOptions(max_micro_batch=4, max_vpp=2))


def brute_force(model, cluster, job, options: SolverOptions) -> tuple[int, int]:
    """(best scaled integer objective, objective scale) over everything."""
    space = enumerate_train(model, cluster, job, pins=Pins(), options=options.space)
    scale = math.lcm(*{c.dims.vpp for c in space.candidates})
    best = None
    for cfg in space.candidates:
        tab = build_tables(model, cluster, cfg, scale=scale, memory_fraction=options.memory_fraction)
        s, n, pp = tab.num_chunks, tab.num_layers, cfg.dims.pp
        pool_choices = list(itertools.product(range(len(cluster.pools)), repeat=pp))
        stage_gpus = cfg.dims.tp * cfg.dims.cp * cfg.dims.dp
        for inner in itertools.combinations(range(1, n), s - 1):
            bounds = (0, *inner, n)
            smallest = min(int(tab.decoders[bounds[k + 1]] - tab.decoders[bounds[k]]) for k in range(s))
            max_rc = 0 if tab.base_full else smallest
            for pools in pool_choices:
                used = [sum(stage_gpus for q in pools if q == i) for i in range(len(cluster.pools))]
                if any(u > p.num_gpus for u, p in zip(used, cluster.pools, strict=True)):
                    continue
                chunk_pools = tuple(pools[k % pp] for k in range(s))
                for rc in range(max_rc + 1):
                    obj, fits = int_objective(tab, Layout(bounds=bounds, recompute=(rc,) * s, pools=chunk_pools))
                    if fits and (best is None or obj < best):
                        best = obj
    assert best is not None
    return best, scale


def solver_objective(model, cluster, job, options: SolverOptions) -> tuple[int, str]:
    plan = solve_train(model, cluster, job, options=options)[0]
    space = enumerate_train(model, cluster, job, pins=Pins(), options=options.space)
    scale = math.lcm(*{c.dims.vpp for c in space.candidates})
    return round(plan.solver.objective * scale * US_PER_S), plan.solver.status


CASES = {
    "dense": (tiny_model(layers=6), tiny_cluster(gpus_per_node=4, nodes=2), TrainJob(seq_len=2048, global_batch_size=16)),
    "dense-tight-memory": (tiny_model(layers=6, hidden=2048, heads=16, kv=4), tiny_cluster(gpus_per_node=4, nodes=1, hbm=7.0),
                           TrainJob(seq_len=2048, global_batch_size=8)),
    "tied-embeddings": (tiny_model(layers=5, tied=True, vocab=64000), tiny_cluster(gpus_per_node=4, nodes=1),
                        TrainJob(seq_len=1024, global_batch_size=8)),
    "moe": (tiny_model(layers=4, moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024}, dense_first=1),
            tiny_cluster(gpus_per_node=4, nodes=1), TrainJob(seq_len=1024, global_batch_size=8)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpsat_reaches_the_brute_force_optimum(name):
    model, cluster, job = CASES[name]
    best, _ = brute_force(model, cluster, job, OPTIONS)
    got, status = solver_objective(model, cluster, job, OPTIONS)
    assert status == "OPTIMAL"
    assert got == best


def test_heterogeneous_cpsat_reaches_the_brute_force_optimum():
    model = tiny_model(layers=6)
    cluster = hetero_cluster()
    job = TrainJob(seq_len=2048, global_batch_size=16)
    options = SolverOptions(num_workers=1, seed=0, time_limit_s=60,
                            space=SpaceOptions(max_micro_batch=2, max_vpp=1, max_cp=1))
    best, _ = brute_force(model, cluster, job, options)
    got, status = solver_objective(model, cluster, job, options)
    assert status == "OPTIMAL"
    assert got == best
