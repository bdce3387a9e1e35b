"""The cheap tail bound the best-first pass adds before building a candidate's tables
(`bounds.quick_tail_bound`): with the cheap pipeline bound it never passes the best layout of a
brute force, it never passes the tables' own averaged tail bound on the bundled models (DeepSeek-V3
with its MTP module on the last stage, Mixtral, a three-pool cluster), and it is not zero where data
parallelism and optimizer state cost time."""

from __future__ import annotations

import math

import pytest

from autoshard.search.train.bounds import quick_lower_bound, quick_tail_bound, tail_lower_bound
from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train
from autoshard.search.train.tables import build_tables
from autoshard.specs import TrainJob
from conftest import hetero_cluster, tiny_cluster, tiny_model
from test_order_bound import _best

MOE = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 4096}
CASES = {
    "dense-first": (tiny_model(layers=6, moe=MOE, dense_first=2), tiny_cluster(gpus_per_node=4, nodes=2),
                    TrainJob(seq_len=1024, global_batch_size=16)),
    "dense": (tiny_model(layers=6, vocab=64000), tiny_cluster(gpus_per_node=4, nodes=2), TrainJob(seq_len=2048, global_batch_size=16)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cheap_bound_with_tail_never_passes_the_brute_force_optimum(name):
    model, cluster, job = CASES[name]
    space = enumerate_train(model, cluster, job, pins=Pins(), options=SpaceOptions(max_micro_batch=2, max_vpp=2))
    scale = math.lcm(*{c.dims.vpp for c in space.candidates})
    checked = positive = 0
    for cfg in space.candidates[::2]:
        tab = build_tables(model, cluster, cfg, scale=scale)
        best = _best(tab, True)
        if best is None:
            continue
        tail = quick_tail_bound(model, cluster, cfg, scale=scale)
        assert quick_lower_bound(model, cluster, cfg, scale=scale) + tail <= best, cfg.dims.describe()
        checked += 1
        positive += tail > 0
    assert checked >= 50 and positive >= checked // 2


@pytest.mark.parametrize(("model_name", "cluster_name", "gpus"), [
    ("deepseek-v3", "dgx-h100", 1024), ("mixtral-8x7b", "dgx-b200", 1024), ("qwen3-30b-a3b", "mixed-3pool", None),
])
def test_cheap_tail_stays_below_the_tables_tail_bound(model_name, cluster_name, gpus):
    from autoshard.api import resize, train_job
    from autoshard.specs import load_cluster, load_model

    model = load_model(model_name)
    cluster = load_cluster(cluster_name)
    if gpus:
        cluster = resize(cluster, gpus)
    configs = enumerate_train(model, cluster, train_job(model), pins=Pins()).candidates
    checked = bites = 0
    for cfg in configs[:: max(1, len(configs) // 60)]:
        tab = build_tables(model, cluster, cfg, scale=1)
        quick = quick_tail_bound(model, cluster, cfg, scale=1)
        assert quick <= tail_lower_bound(tab), cfg.dims.describe()
        checked += 1
        bites += quick > 0
    assert checked >= 40 and bites >= checked // 2


def test_tiny_heterogeneous_tail_stays_below_the_tables_tail_bound():
    model = tiny_model(layers=6)
    cluster = hetero_cluster()
    configs = enumerate_train(model, cluster, TrainJob(seq_len=2048, global_batch_size=16), pins=Pins()).candidates
    assert configs
    for cfg in configs:
        assert quick_tail_bound(model, cluster, cfg, scale=1) <= tail_lower_bound(build_tables(model, cluster, cfg, scale=1))
