"""The count-aware joint (t_max, tail) bound: never above the best layout a brute force finds (every
contiguous layout, every per-chunk recompute count), tighter than the average-tail bounds where the
layers differ, and exact on DeepSeek-V3's best candidate at 1,024 H100s."""

from __future__ import annotations

import itertools
import math

import pytest

from autoshard.search.train.bounds import assignment_bounds, bounds, tail_lower_bound
from autoshard.search.train.bounds_joint import joint_tail_bound
from autoshard.search.train.bounds_pools import assignment_capacity, assignment_sends, hetero_pipeline_bound, pipeline_sums
from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train
from autoshard.search.train.tables import Layout, build_tables, int_objective
from autoshard.specs import TrainJob
from conftest import pool_assignments, tiny_cluster, tiny_model
from test_bruteforce import three_pool_cluster

MOE = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 4096}
CASES = {
    # dense-first MoE models over data parallelism, where the MoE layers' gradients and optimizer
    # state dominate each rank's tail: roomy and tight memory
    "dense-first-dp": (tiny_model(layers=6, moe=MOE, dense_first=2), tiny_cluster(gpus_per_node=4, nodes=2),
                       TrainJob(seq_len=1024, global_batch_size=16)),
    "dense-first-tight": (tiny_model(layers=7, hidden=2048, heads=16, kv=4, moe=MOE, dense_first=1),
                          tiny_cluster(gpus_per_node=4, nodes=2, hbm=16.0), TrainJob(seq_len=2048, global_batch_size=16)),
}


def _objective_parts(tab) -> tuple[int, int, int]:
    """(a, b, fixed part) of the objective: a*t_max + b*tail + the sum of the ranks' times without
    recomputation, which no layout undercuts."""
    cfg = tab.config
    vpp, m = cfg.dims.vpp, cfg.num_microbatches
    p = tab.pools[0]
    total = int(p.time_us[-1]) + 2 * (tab.num_chunks - 1) * p.p2p_us
    return (tab.scale // vpp) * (m * vpp - 1), tab.scale, (tab.scale // vpp) * total


def _best(tab, pools=None) -> int | None:
    """Brute force over every contiguous layout and every per-chunk recompute count."""
    s, n = tab.num_chunks, tab.num_layers
    pp = tab.config.dims.pp
    chunk_pools = tuple((pools[k % pp] if pools else 0) for k in range(s))
    best = None
    for inner in itertools.combinations(range(1, n), s - 1):
        bnds = (0, *inner, n)
        sizes = [int(tab.decoders[bnds[k + 1]] - tab.decoders[bnds[k]]) for k in range(s)]
        counts = [range(1) if tab.base_full or tab.config.recompute.value == "selective" else range(z + 1) for z in sizes]
        for rc in itertools.product(*counts):
            obj, fits = int_objective(tab, Layout(bounds=bnds, recompute=rc, pools=chunk_pools))
            if fits and (best is None or obj < best):
                best = obj
    return best


@pytest.mark.parametrize("name", sorted(CASES))
def test_joint_tail_bound_never_exceeds_the_brute_force_optimum(name):
    model, cluster, job = CASES[name]
    space = enumerate_train(model, cluster, job, pins=Pins(), options=SpaceOptions(max_micro_batch=1, max_vpp=1))
    scale = math.lcm(*{c.dims.vpp for c in space.candidates})
    checked = bites = exact = 0
    for cfg in space.candidates:
        if cfg.dims.pp == 1 or cfg.dims.dp == 1:
            continue
        tab = build_tables(model, cluster, cfg, scale=scale)
        best = _best(tab)
        found = bounds(tab)
        if best is None:
            continue
        assert found is not None, cfg.dims.describe()
        a, b, fixed = _objective_parts(tab)
        joint = fixed + joint_tail_bound(tab, found[1], a, b)
        assert joint <= best, (cfg.dims.describe(), cfg.recompute.value, joint, best)
        assert found[0] <= best
        checked += 1
        average = fixed + a * found[1] + b * tail_lower_bound(tab)  # the tail averaged over ranks
        bites += joint > average
        exact += joint == best
    assert checked >= 4
    assert bites >= checked // 2  # the MoE ranks' tail, not the average, sets the bound
    assert exact >= checked // 4  # and it reaches the optimum itself on many candidates


def test_assignment_joint_bound_is_valid_and_bites_on_three_pools():
    """Every rank -> pool assignment on three pools: the joint bound (t_max, the sum of rank times and
    each rank's tail on its own pool) <= the best layout with exactly those pools, and above the
    pipeline bound plus the averaged tail for some of them."""
    model = tiny_model(layers=6)
    cluster = three_pool_cluster()
    job = TrainJob(seq_len=2048, global_batch_size=16)
    space = enumerate_train(model, cluster, job, options=SpaceOptions(max_micro_batch=1, max_vpp=1, max_cp=1))
    pool_gpus = [p.num_gpus for p in cluster.pools]
    checked = bites = 0
    for cfg in space.candidates:
        if not 1 < cfg.dims.pp <= 3 or cfg.recompute.value != "none":
            continue
        tab = build_tables(model, cluster, cfg, scale=1)
        vpp, m = cfg.dims.vpp, cfg.num_microbatches
        for v in pool_assignments(tab, pool_gpus):
            best = _best(tab, v)
            found = assignment_bounds(tab, v, pool_gpus, 0)
            if best is None:
                continue
            assert found is not None and found[0] <= best, (cfg.dims.describe(), v)
            a, c = m * vpp - 1, 1
            older = hetero_pipeline_bound(tab, pool_gpus, found[1], a, c, assignment=v) + tail_lower_bound(tab)
            sums = pipeline_sums(tab, pool_gpus, assignment=v, sends=assignment_sends(tab, v))
            joint = joint_tail_bound(tab, found[1], a, 1, time_caps=assignment_capacity(tab, v), assignment=v,
                                     sums=sums, c=c)
            assert joint <= best, (cfg.dims.describe(), v, joint, best)
            checked += 1
            bites += joint > older
    assert checked > 10
    assert bites >= checked // 2


def test_deepseek_v3_best_candidate_is_certified_by_its_bound():
    """DeepSeek-V3 on 1,024 H100s (the bundled job): on the best candidate the bound now meets the
    best layout found before CP-SAT (within 0.001 %), where the averaged tail left a 0.04 % gap that
    took CP-SAT ~20 s of one core to close."""
    from autoshard.api import resize, train_job
    from autoshard.search.train.incumbents import incumbent
    from autoshard.specs import load_cluster, load_model

    model = load_model("deepseek-v3")
    cluster = resize(load_cluster("dgx-h100"), 1024)
    # the training knobs this certificate was measured at (before the kernel-measured H100 attention
    # refit, which leaves a 2.7 % bound gap here that CP-SAT closes: still OPTIMAL in ~7 s)
    pool = cluster.pools[0]
    eff = pool.gpu.efficiency.model_copy(update=dict(
        train_gemm=0.65, train_gemm_fp8=0.65, train_attention=None, train_attention_half_seq=None))
    gpu = pool.gpu.model_copy(update={"efficiency": eff})
    cluster = cluster.model_copy(update={"pools": (pool.model_copy(update={"gpu": gpu}),)})
    job = train_job(model)
    pins = Pins(tp=2, pp=16, cp=2, ep=16, etp=1, vpp=1, mbs=1, zero_stage=1)
    space = enumerate_train(model, cluster, job, pins=pins)
    cfg = next(c for c in space.candidates if c.recompute.value == "none")
    tab = build_tables(model, cluster, cfg, scale=1, memory_fraction=0.87)
    lower, tmax = bounds(tab, uniform_recompute=True)
    inc = incumbent(tab, None, tmax, True)
    assert inc is not None
    assert lower <= inc[0] <= lower * (1 + 1e-5)
    a, b, fixed = _objective_parts(tab)
    average = fixed + a * tmax + b * tail_lower_bound(tab)
    assert inc[0] - average > 20 * (inc[0] - lower)


@pytest.mark.parametrize("cluster_name", ["dgx-h100", "mixed-3pool"])
def test_shared_quick_bounds_equal_the_plain_ones(cluster_name):
    """QuickBounds shares the cost-model reads of candidates that differ only in interleaving: every
    bound it returns is exactly `quick_lower_bound`'s, and it reads the cost model less often."""
    from autoshard.api import resize, train_job
    from autoshard.search.train.bounds import QuickBounds, quick_lower_bound
    from autoshard.specs import load_cluster, load_model

    model = load_model("mixtral-8x7b")
    cluster = load_cluster(cluster_name)
    if not cluster.is_heterogeneous:
        cluster = resize(cluster, 64)
    job = train_job(model)
    configs = enumerate_train(model, cluster, job, options=SpaceOptions(max_micro_batch=2, max_vpp=4)).candidates
    quick = QuickBounds(model, cluster, scale=12)
    assert [quick(c) for c in configs] == [quick_lower_bound(model, cluster, c, scale=12) for c in configs]
    assert any(c.dims.vpp > 1 for c in configs)
    assert len(quick.memo) < 0.8 * len(configs)
    # the decoder layer's time is shared across DP degrees, ZeRO stages and pipeline depths
    assert len(quick.times) < 0.5 * len(quick.memo)
    assert len({c.zero_stage for c in configs}) > 1 and len({c.dims.dp for c in configs}) > 1
    memory = QuickBounds(model, cluster, scale=12, memory_fraction=0.9)
    assert [memory(c) for c in configs] == [
        quick_lower_bound(model, cluster, c, scale=12, memory_fraction=0.9) for c in configs]
    assert (len(memory.states) > 0) == cluster.is_heterogeneous  # only there do states bound a pool's layers
    assert len(memory.times) + len(memory.states) < 0.5 * len(memory.memo)


@pytest.mark.parametrize(("model_name", "cluster_name"), [
    ("qwen3-30b-a3b", "dgx-h100"), ("deepseek-v3", "dgx-h100"), ("llama-3.1-8b", "dgx-h100"),
    ("mixtral-8x7b", "mixed-3pool")])
def test_decoder_costs_do_not_read_what_the_shared_keys_leave_out(model_name, cluster_name):
    """The premise of `QuickBounds._time_key` and `_state_key`, checked on the cost model itself:
    every candidate's most numerous decoder layer costs exactly the time of the first candidate
    with its time key and holds exactly the model states of the first with its state key, on every
    pool (FP8 among the candidates on the H100 pools)."""
    from autoshard.api import resize, train_job
    from autoshard.costmodel.train.layer import layer_cost
    from autoshard.search.train.bounds import QuickBounds, _major_decoder
    from autoshard.specs import load_cluster, load_model

    model = load_model(model_name)
    cluster = load_cluster(cluster_name)
    if not cluster.is_heterogeneous:
        cluster = resize(cluster, 128 if model.moe else 32)
    configs = enumerate_train(model, cluster, train_job(model), options=SpaceOptions(max_micro_batch=2, max_vpp=2)).candidates
    quick, (major, _), times, states = QuickBounds(model, cluster, scale=2), _major_decoder(model), {}, {}
    for cfg in configs:
        for pool in cluster.pools:
            cost = layer_cost(model, major, pool, cfg, cfg.recompute)
            assert times.setdefault((quick._time_key(cfg), pool.name), cost.time_s) == cost.time_s, cfg
            assert states.setdefault((quick._state_key(cfg), pool.name), cost.state_bytes) == cost.state_bytes, cfg
    assert len(times) < 0.5 * len(configs) * len(cluster.pools)
    assert len(states) < 0.5 * len(configs) * len(cluster.pools)


def test_a_better_incumbent_beats_an_unproven_cpsat_solution(monkeypatch):
    """When CP-SAT stops short of a proof with a solution worse than a layout the bounds search built
    (it found one without the hint), the better layout comes back, as FEASIBLE, with its objective."""
    import autoshard.search.train.solve as solve_module
    from autoshard.search.train.solve import SolverOptions, solve_train

    model = tiny_model(layers=8, moe=MOE, dense_first=2)
    cluster = tiny_cluster(gpus_per_node=4, nodes=2)
    job = TrainJob(seq_len=1024, global_batch_size=32)
    options = SolverOptions(num_workers=1, seed=0, time_limit_s=60, space=SpaceOptions(max_micro_batch=1, max_vpp=2))
    plain_build, plain_solver, seen = solve_module.build_model, solve_module.new_solver, {}

    def build_without_hint(tables, **kwargs):
        return plain_build(tables, **{**kwargs, "hint_index": None, "hint": None})

    def first_solution_only(**kwargs):
        solver = plain_solver(**kwargs)
        solver.parameters.stop_after_first_solution = True
        plain_solve = solver.solve

        def solve(model):
            status = plain_solve(model)
            seen["cpsat"] = solver.objective_value
            return status
        solver.solve = solve
        return solver

    def best_incumbent(*args, **kwargs):
        prep = plain_prepare(*args, **kwargs)
        seen["incumbent"] = min(inc[0] for inc in prep.incumbents if inc is not None)
        return prep

    plain_prepare = solve_module.prepare
    monkeypatch.setattr(solve_module, "build_model", build_without_hint)
    monkeypatch.setattr(solve_module, "new_solver", first_solution_only)
    monkeypatch.setattr(solve_module, "prepare", best_incumbent)
    plan = solve_train(model, cluster, job, options=options)[0]
    scale = solve_module.US_PER_S * math.lcm(*{c.dims.vpp for c in enumerate_train(
        model, cluster, job, options=options.space).candidates})
    assert seen["cpsat"] > seen["incumbent"]  # the situation under test: CP-SAT's first find is worse
    assert round(plan.solver.objective * scale) == seen["incumbent"]
    assert plan.solver.status == "FEASIBLE"


def test_state_floor_does_not_read_interleaving():
    """`prepare` shares the model-state floor of candidates that differ only in VPP: on every
    candidate it equals the floor of the first candidate with the same degrees but VPP."""
    from autoshard.api import resize, train_job
    from autoshard.search.train.prepare import _DIMS_BUT_VPP, _quick_state_floor_bytes
    from autoshard.specs import load_cluster, load_model

    model = load_model("deepseek-v3")  # dense-first MoE with MTP modules
    cluster = resize(load_cluster("dgx-h100"), 256)
    configs = enumerate_train(model, cluster, train_job(model), options=SpaceOptions(max_micro_batch=1, max_vpp=4)).candidates
    first: dict[tuple, float] = {}
    for cfg in configs:
        floor = _quick_state_floor_bytes(model, cfg)
        assert first.setdefault((_DIMS_BUT_VPP(cfg.dims), cfg.zero_stage, cfg.optimizer), floor) == floor, cfg
    assert any(c.dims.vpp > 1 for c in configs) and len(first) < 0.5 * len(configs)
