"""The solver's lower bounds with the host floor under MoE layers (costmodel.train.layer._with_host_floor,
README item AC) binding: the floor raises a MoE layer's time to the host's, so the layer tables, the
count- and order-aware bounds and the brute-force optimum all see it; no bound may pass the best layout a
brute force finds (every contiguous layout and recompute count), and the floor must raise that optimum
on the candidates where it binds."""

from __future__ import annotations

import math

import pytest
from conftest import SYNTHETIC_EFFICIENCY, tiny_cluster
from test_order_bound import CASES, _best

from autoshard.search.train.bounds import bounds
from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train
from autoshard.search.train.tables import build_tables

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
