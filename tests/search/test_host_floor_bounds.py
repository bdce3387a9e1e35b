"""The solver's lower bounds with the host floor under MoE layers (costmodel.train.layer._with_host_floor,
README item AC) binding: the floor raises a MoE layer's time to the host's, so the layer tables, the
count- and order-aware bounds and the brute-force optimum all see it; no bound may pass the best layout a
brute force finds (every contiguous layout and recompute count), and the floor must raise that optimum
on the candidates where it binds."""

from __future__ import annotations

import itertools
import math

import pytest
from conftest import SYNTHETIC_EFFICIENCY, gpu, tiny_cluster, tiny_model
from test_order_bound import CASES, _best

from autoshard.costmodel.train.step import predict_train
from autoshard.search.train.bounds import bounds
from autoshard.search.train.result import layout_stages
from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train
from autoshard.search.train.tables import Layout, build_tables, int_objective
from autoshard.specs import ClusterSpec, TrainJob
from autoshard.units import US_PER_S

HOST_BOUND = {**SYNTHETIC_EFFICIENCY, "train_expert_host_us": 3000.0}  # 3 ms per local expert: every MoE layer waits


@pytest.mark.parametrize("name", ["dense-between", "dense-first-2"])
def test_bounds_hold_with_the_host_floor_binding(name):
    model, cluster, job, _ = CASES[name]
    slow = tiny_cluster(gpus_per_node=4, nodes=2, hbm=cluster.primary.gpu.hbm_gib, efficiency=HOST_BOUND)
    space = enumerate_train(model, slow, job, pins=Pins(), options=SpaceOptions(max_micro_batch=1, max_vpp=1))
    checked = raised = 0
    for cfg in space.candidates:
        if cfg.dims.pp == 1 or cfg.zero_stage or cfg.recompute.value == "selective":
            continue
        tab = build_tables(model, slow, cfg, scale=math.lcm(1))
        best = _best(tab, uniform=False)
        if best is None:
            continue
        found = bounds(tab)
        assert found is not None and found[0] <= best, (cfg.dims.describe(), cfg.recompute.value, found, best)
        checked += 1
        plain = _best(build_tables(model, cluster, cfg, scale=math.lcm(1)), uniform=False)
        raised += plain is not None and best > plain
    assert checked >= 20 and raised >= checked // 2, (checked, raised)


def test_the_tables_price_a_host_bound_step_as_the_cost_model_does():
    """The tables' objective of a layout (one DP window per layer kind, search.train.tables) against
    predict_train of the same layout, on an all-MoE model whose layers wait on the host, over slow DP links
    (the exposed DP tail reads the window) and with block recompute: the window keeps the wait of the layer
    without recompute in every mode, so the two agree (7 % apart when a fully recomputed layer's window took
    its larger wait; a helper's review)."""
    slow = ClusterSpec.model_validate({
        "name": "slow-dp", "gpu": gpu(efficiency=HOST_BOUND),
        "node": {"gpus_per_node": 4, "intra_node_link": "nvlink", "intra_node_gbps": 450, "inter_node_gbps": 5},
        "num_nodes": 4})
    model = tiny_model(layers=8, hidden=2048, heads=16, kv=8,
                       moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 4096})
    space = enumerate_train(model, slow, TrainJob(seq_len=1024, global_batch_size=32), pins=Pins(),
                            options=SpaceOptions(max_micro_batch=2, max_vpp=1))
    checked, worst = 0, 0.0
    for cfg in space.candidates:
        if cfg.dims.pp == 1 or cfg.recompute.value != "none":
            continue
        tab = build_tables(model, slow, cfg, scale=1)
        if not tab.block_recompute:
            continue
        layouts = []
        for inner in itertools.combinations(range(1, tab.num_layers), tab.num_chunks - 1):
            bnds = (0, *inner, tab.num_layers)
            sizes = [int(tab.decoders[bnds[k + 1]] - tab.decoders[bnds[k]]) for k in range(tab.num_chunks)]
            if tab.chunks_allowed(sizes):
                layouts += [Layout(bounds=bnds, recompute=rc, pools=(0,) * tab.num_chunks)
                            for rc in itertools.product(*(range(z + 1) for z in sizes))]
        for lay in layouts[::97]:  # a spread sample: every recompute count, every split
            obj, _ = int_objective(tab, lay)
            c, stages = layout_stages(tab, lay)
            step = predict_train(model, slow, c, stages).step_time_s
            worst = max(worst, abs(obj / US_PER_S / step - 1))
            checked += 1
    assert checked >= 500 and worst < 2e-3, (checked, worst)
