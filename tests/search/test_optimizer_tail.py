"""The solver's tables price the optimizer step exactly as the cost model does: at the training
step's HBM efficiency (`train_hbm`, not serving's `hbm`) and with the framework's bytes per parameter
(Megatron's fused Adam, PyTorch FSDP's eager AdamW)."""

from __future__ import annotations

import pytest

from autoshard.costmodel.train.memory import TrainFramework
from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import TrainConfig
from autoshard.emit.megatron.layout import default_stages
from autoshard.parallel import ParallelDims, Recompute
from autoshard.search.train.tables import build_tables, layer_tails
from autoshard.specs import ClusterSpec
from autoshard.units import US_PER_S
from conftest import gpu, tiny_model

# hbm and train_hbm far apart, so a side that reads the wrong knob is off by 3x
CLUSTER = ClusterSpec.model_validate({
    "name": "opt-tail", "gpu": {**gpu(), "efficiency": {"hbm": 0.90, "train_hbm": 0.30}},
    "node": {"gpus_per_node": 4, "intra_node_link": "nvlink", "intra_node_gbps": 450, "inter_node_gbps": 50},
    "num_nodes": 1,
})
MODEL = tiny_model(layers=4, hidden=2048, heads=16, kv=8)


@pytest.mark.parametrize("framework,zero", [(TrainFramework.MEGATRON, 1), (TrainFramework.MEGATRON, 0),
                                            (TrainFramework.FSDP, 3)])
def test_tables_optimizer_equals_cost_model(framework, zero):
    cfg = TrainConfig(dims=ParallelDims(dp=4), micro_batch_size=1, global_batch_size=8, seq_len=1024,
                      recompute=Recompute.NONE, zero_stage=zero, framework=framework)
    stages = default_stages(MODEL, pp=1, vpp=1)
    want = predict_train(MODEL, CLUSTER, cfg, stages).time.optimizer
    tab = build_tables(MODEL, CLUSTER, cfg, scale=1)
    got = tab.pools[0].opt_us[-1] / US_PER_S
    assert got == pytest.approx(want, rel=1e-3, abs=len(MODEL.layer_kinds) / US_PER_S)
    # and the cost model's figure is the closed form at train_hbm: bytes per local parameter / (0.30 x 3.35 TB/s)
    per_param = {TrainFramework.MEGATRON: 30, TrainFramework.FSDP: 100}[framework]
    local = MODEL.num_params / (4 if zero >= 1 else 1)
    assert want == pytest.approx(local * per_param / (0.30 * 3.35e12), rel=1e-6)


def test_layer_tails_read_train_hbm_not_hbm():
    """The check above can fail: at serving's `hbm` the optimizer step is 3x shorter."""
    cfg = TrainConfig(dims=ParallelDims(dp=4), micro_batch_size=1, global_batch_size=8, seq_len=1024,
                      recompute=Recompute.NONE, zero_stage=1)
    pool = CLUSTER.pools[0]
    shared = pool.gpu.efficiency.model_copy(update={"train_hbm": None})  # falls back to hbm 0.90
    serving = pool.model_copy(update={"gpu": pool.gpu.model_copy(update={"efficiency": shared})})
    *_, opt = layer_tails(cfg, pool, [1e9], [0.0])
    *_, opt_hbm = layer_tails(cfg, serving, [1e9], [0.0])
    assert opt[0] == pytest.approx(1e9 / 4 * 30 / (0.30 * 3.35e12), rel=1e-9)
    assert opt[0] / opt_hbm[0] == pytest.approx(3.0, rel=1e-9)
