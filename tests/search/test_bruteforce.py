"""The CP-SAT planner reaches exactly the optimum a brute-force enumeration finds: every candidate of
the space, every contiguous layout, every uniform recompute count and every pool assignment,
scored with the same integer objective."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from autoshard.search.train.options import SolverOptions
from autoshard.search.train.solve import solve_train
from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train
from autoshard.search.train.tables import Layout, build_tables, int_objective
from autoshard.specs import TrainJob
from autoshard.units import US_PER_S
from conftest import gpu, hetero_cluster, node, pool_assignments, tiny_cluster, tiny_model

OPTIONS = SolverOptions(num_workers=1, seed=0, time_limit_s=60, memory_fraction=1.0,
                        space=SpaceOptions(max_micro_batch=4, max_vpp=2))


def brute_force(model, cluster, job, options: SolverOptions, pins: Pins = Pins()) -> tuple[int, int]:
    """(best scaled integer objective, objective scale) over everything."""
    space = enumerate_train(model, cluster, job, pins=pins, options=options.space)
    scale = math.lcm(*{c.dims.vpp for c in space.candidates})
    best = None
    for cfg in space.candidates:
        tab = build_tables(model, cluster, cfg, scale=scale, memory_fraction=options.memory_fraction)
        s, n, pp = tab.num_chunks, tab.num_layers, cfg.dims.pp
        pool_choices = list(itertools.product(range(len(cluster.pools)), repeat=pp))
        stage_gpus = cfg.dims.tp * cfg.dims.cp * cfg.dims.dp
        for inner in itertools.combinations(range(1, n), s - 1):
            bounds = (0, *inner, n)
            counts = [int(tab.decoders[bounds[k + 1]] - tab.decoders[bounds[k]]) for k in range(s)]
            if not tab.chunks_allowed(counts):
                continue  # the A2A overlap's near-even chunks; interleaved ranks' chunks within one layer
            smallest = min(counts)
            max_rc = smallest if tab.block_recompute else 0
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


def solver_objective(model, cluster, job, options: SolverOptions, pins: Pins = Pins()) -> tuple[int, str]:
    plan = solve_train(model, cluster, job, pins=pins, options=options)[0]
    space = enumerate_train(model, cluster, job, pins=pins, options=options.space)
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


def test_cpsat_reaches_the_brute_force_optimum_with_the_a2a_overlap():
    """--moe-a2a-overlap pinned: the tables count each layer's EP traffic as hidden on every micro-batch (a
    relaxation of the step) over near-even chunks, with no block recompute and only candidates Megatron
    accepts (EP > 1, VPP > 1 with PP > 1, no full recompute). The solver proves the brute-force optimum of
    that relaxation as its bound and reports the plan at its real step, FEASIBLE for the gap between them;
    the cheap bound that prunes candidates stays below every candidate's step."""
    from autoshard.costmodel.train.step import predict_train
    from autoshard.emit.megatron.layout import default_stages
    from autoshard.search.train.bounds import quick_lower_bound

    model, cluster, _ = CASES["moe"]
    job = TrainJob(seq_len=1024, global_batch_size=64)  # micro-batches to pair
    pins = Pins(moe_a2a_overlap=True)
    space = enumerate_train(model, cluster, job, pins=pins, options=OPTIONS.space)
    assert space.candidates and all(c.moe_a2a_overlap and c.dims.ep > 1 and c.recompute.value != "full"
                                    and (c.dims.pp == 1 or c.dims.vpp > 1) for c in space.candidates)
    best, scale = brute_force(model, cluster, job, OPTIONS, pins)
    plan = solve_train(model, cluster, job, pins=pins, options=OPTIONS)[0]
    assert (plan.solver.status, plan.solver.stop_reason) == ("FEASIBLE", "relaxed")
    assert round(plan.solver.bound * scale * US_PER_S) == best
    assert plan.solver.objective == plan.prediction.step_time_s > plan.solver.bound
    assert plan.config.moe_a2a_overlap and all(st.full_recompute_layers == 0 for st in plan.stages)
    assert plan.prediction.time.ep_comm_hidden > 0
    for cfg in space.candidates:
        stages = default_stages(model, pp=cfg.dims.pp, vpp=cfg.dims.vpp)
        step = predict_train(model, cluster, cfg, stages).step_time_s * scale * US_PER_S
        assert quick_lower_bound(model, cluster, cfg, scale=scale) <= step + 1, cfg
    off = predict_train(model, cluster, dataclasses.replace(plan.config, moe_a2a_overlap=False), plan.stages)
    assert plan.prediction.step_time_s < off.step_time_s  # the same plan without it pays the traffic


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


def _rank_tmax(tab, layout) -> int:
    """Slowest rank's time per micro-batch of a layout, as `int_objective` counts it."""
    pp, s = tab.config.dims.pp, tab.num_chunks
    b, r, q = layout.bounds, layout.recompute, layout.pools
    times = [0] * pp
    for k in range(s):
        p = tab.pools[q[k]]
        t = int(p.time_us[b[k + 1]] - p.time_us[b[k]]) + r[k] * p.recompute_extra_us
        t += (p.p2p_us if k + 1 < s else 0) + (p.p2p_us if k > 0 else 0)
        times[k % pp] += t
    return max(times)


MIXED = {
    # dense-first MoE models (the DeepSeek-V3 shape), roomy and tight memory, and a dense-last mix
    "dense-first": (tiny_model(layers=6, moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024}, dense_first=2),
                    tiny_cluster(gpus_per_node=4, nodes=1), TrainJob(seq_len=1024, global_batch_size=8)),
    "dense-first-tight": (tiny_model(layers=7, hidden=2048, heads=16, kv=4,
                                     moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 4096}, dense_first=1),
                          tiny_cluster(gpus_per_node=4, nodes=1, hbm=14.0), TrainJob(seq_len=2048, global_batch_size=8)),
    "dense-first-3": (tiny_model(layers=8, hidden=1536, heads=12, kv=4,
                                 moe={"num_experts": 4, "top_k": 1, "expert_ffn_hidden_size": 6144}, dense_first=3),
                      tiny_cluster(gpus_per_node=4, nodes=1, hbm=12.0), TrainJob(seq_len=2048, global_batch_size=8)),
}


@pytest.mark.parametrize("name", sorted(MIXED))
def test_mixed_layer_bounds_never_exceed_the_brute_force_optimum(name):
    """Per candidate: the count-aware slowest-rank bound <= the best feasible layout's slowest rank,
    the objective bound <= the best feasible layout's objective, and 'no layout fits' only when none
    does. The count-aware bound must also bite (be the tighter one) somewhere in each model."""
    from autoshard.search.train.bounds import bounds
    from autoshard.search.train.bounds_mixed import mixed_tmax_lower_bound
    from autoshard.search.train.bounds_rank import tmax_lower_bound

    model, cluster, job = MIXED[name]
    options = SolverOptions(num_workers=1, seed=0, time_limit_s=60, space=SpaceOptions(max_micro_batch=2, max_vpp=2))
    space = enumerate_train(model, cluster, job, pins=Pins(), options=options.space)
    scale = math.lcm(*{c.dims.vpp for c in space.candidates})
    checked = bites = 0
    for cfg in space.candidates:
        tab = build_tables(model, cluster, cfg, scale=scale)
        s, n = tab.num_chunks, tab.num_layers
        best_obj = best_tmax = None
        for inner in itertools.combinations(range(1, n), s - 1):
            bnds = (0, *inner, n)
            smallest = min(int(tab.decoders[bnds[k + 1]] - tab.decoders[bnds[k]]) for k in range(s))
            for rc in range(0 if tab.base_full else smallest + 1):
                lay = Layout(bounds=bnds, recompute=(rc,) * s, pools=(0,) * s)
                obj, fits = int_objective(tab, lay)
                if fits:
                    best_obj = obj if best_obj is None else min(best_obj, obj)
                    tmax = _rank_tmax(tab, lay)
                    best_tmax = tmax if best_tmax is None else min(best_tmax, tmax)
        mixed = mixed_tmax_lower_bound(tab)
        assert mixed is not True  # these models mix decoder kinds
        found = bounds(tab, uniform_recompute=True)
        if best_obj is None:
            continue  # nothing fits: any answer of the bound is valid (None is the sharp one)
        assert mixed is not None and found is not None, cfg.dims.describe()
        assert mixed <= best_tmax
        assert found[1] <= best_tmax
        assert found[0] <= best_obj
        checked += 1
        plain = tmax_lower_bound(tab)  # every decoder layer at the cheapest layer's cost
        if plain is not None and mixed > plain:
            bites += 1
    assert checked > 0
    assert bites > 0


@pytest.mark.parametrize("name", sorted(MIXED))
def test_cpsat_reaches_the_brute_force_optimum_on_mixed_layer_models(name):
    model, cluster, job = MIXED[name]
    options = SolverOptions(num_workers=1, seed=0, time_limit_s=60, space=SpaceOptions(max_micro_batch=2, max_vpp=2))
    best, _ = brute_force(model, cluster, job, options)
    got, status = solver_objective(model, cluster, job, options)
    assert status == "OPTIMAL"
    assert got == best


def three_pool_cluster():
    """Three pools, two node sizes: fast 80 GB GPUs in 4-GPU nodes, slow 80 GB and slow 24 GB GPUs
    in 2-GPU nodes."""
    from autoshard.specs import ClusterSpec

    return ClusterSpec.model_validate({
        "name": "three",
        "pools": [
            {"name": "fast", "gpu": gpu("H100", hbm=80.0), "node": node(4), "num_nodes": 1},
            {"name": "slow", "gpu": gpu("A100", hbm=80.0, tflops=312.0), "node": node(2), "num_nodes": 1},
            {"name": "small", "gpu": gpu("A10", hbm=24.0, tflops=125.0), "node": node(2), "num_nodes": 1},
        ],
        "inter_pool_gbps": 25,
    })


@pytest.mark.parametrize("layers,moe", [(6, None), (5, {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024})])
def test_three_pool_cpsat_reaches_the_brute_force_optimum(layers, moe):
    """Pools of different node sizes, every rank -> pool assignment the pools can host: CP-SAT (with
    candidates split by pool assignment and their bounds) matches brute force exactly."""
    model = tiny_model(layers=layers, moe=moe, dense_first=1 if moe else 0)
    cluster = three_pool_cluster()
    job = TrainJob(seq_len=2048, global_batch_size=16)
    options = SolverOptions(num_workers=1, seed=0, time_limit_s=60,
                            space=SpaceOptions(max_micro_batch=2, max_vpp=1, max_cp=1))
    best, _ = brute_force(model, cluster, job, options)
    got, status = solver_objective(model, cluster, job, options)
    assert status == "OPTIMAL"
    assert got == best


def test_assignment_bounds_never_exceed_the_best_layout_of_that_assignment():
    """For every candidate and every rank -> pool assignment on three pools: the assignment's bound
    <= the best feasible layout with exactly those pools (brute force), and 'no fit' only if none fits."""
    from autoshard.search.train.bounds_pools import assignment_bounds

    model = tiny_model(layers=6)
    cluster = three_pool_cluster()
    job = TrainJob(seq_len=2048, global_batch_size=16)
    space = enumerate_train(model, cluster, job, options=SpaceOptions(max_micro_batch=2, max_vpp=1, max_cp=1))
    scale = math.lcm(*{c.dims.vpp for c in space.candidates})
    pool_gpus = [p.num_gpus for p in cluster.pools]
    checked = 0
    for cfg in space.candidates:
        if cfg.dims.pp > 4 or cfg.micro_batch_size > 1:
            continue  # keeps the enumeration (3^PP assignments x layouts) fast
        tab = build_tables(model, cluster, cfg, scale=scale)
        pp, s, n = cfg.dims.pp, tab.num_chunks, tab.num_layers
        for v in pool_assignments(tab, pool_gpus):
            best = None
            chunk_pools = tuple(v[k % pp] for k in range(s))
            for inner in itertools.combinations(range(1, n), s - 1):
                bnds = (0, *inner, n)
                smallest = min(int(tab.decoders[bnds[k + 1]] - tab.decoders[bnds[k]]) for k in range(s))
                for rc in range(0 if tab.base_full else smallest + 1):
                    obj, fits = int_objective(tab, Layout(bounds=bnds, recompute=(rc,) * s, pools=chunk_pools))
                    if fits and (best is None or obj < best):
                        best = obj
            found = assignment_bounds(tab, v, pool_gpus, 0)
            if best is None:
                continue
            assert found is not None, (cfg.dims.describe(), v)
            assert found[0] <= best, (cfg.dims.describe(), v)
            checked += 1
    assert checked > 20
