"""Sequence-parallel traffic of a decoder layer under Transformer Engine without userbuffers overlap
(costmodel.train.layer.sp_block_comm_s): per block, forward all-gather (of the quantized input where the
GEMMs run in FP8 or NVFP4) and reduce-scatter (BF16), backward one all-gather of the output gradient exposed,
the input's re-gather and the data gradient's reduce-scatter hidden under the backward GEMMs."""

from __future__ import annotations

import pytest

from autoshard.costmodel.comm import Collective, collective_time_s, group_links
from autoshard.costmodel.efficiency import training_pool
from autoshard.costmodel.train.layer import layer_cost, sp_block_comm_s
from autoshard.costmodel.train.memory import TrainFramework
from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import Precision
from autoshard.specs.layers import LayerKind

LLAMA = load_model("llama-3.1-70b")
H100 = training_pool(load_cluster("dgx-h100").pools[0])
A100 = training_pool(load_cluster("dgx-a100-80gb").pools[0])
B200 = training_pool(load_cluster("dgx-b200").pools[0])


def _cfg(precision: Precision = Precision.BF16, **kw) -> TrainConfig:
    return TrainConfig(dims=ParallelDims(tp=4, pp=1, dp=2), micro_batch_size=1, global_batch_size=8,
                       seq_len=8192, precision=precision, sequence_parallel=True, **kw)


def _ag_rs(pool, act: float, gathered: float) -> tuple[float, float]:
    link = group_links(pool, _cfg().dims).tp
    return (collective_time_s(Collective.ALL_GATHER, gathered, 4, link),
            collective_time_s(Collective.REDUCE_SCATTER, act, 4, link))


@pytest.mark.parametrize(("pool", "precision", "gathered_bytes"), [
    (H100, Precision.BF16, 2.0), (H100, Precision.FP8, 1.0), (B200, Precision.FP4, 0.5 + 1 / 16),
    (A100, Precision.FP8, 2.0),  # no FP8 tensor cores: the GEMMs and so the gather stay BF16
])
@pytest.mark.parametrize("fwd_passes", [1, 2])
def test_block_traffic_is_two_gathers_and_a_scatter_per_forward_and_backward(pool, precision, gathered_bytes,
                                                                              fwd_passes):
    act = 8192 * 8192 * 2.0  # one micro-batch of 8,192 tokens at hidden 8,192, BF16
    ag, rs = _ag_rs(pool, act, act * gathered_bytes / 2)
    link = group_links(pool, _cfg().dims).tp
    got = sp_block_comm_s(act, pool.gpu, precision, 4, link, fwd_passes)
    assert got == pytest.approx((ag + rs) * fwd_passes + ag, rel=1e-12)
    # against the four BF16 collectives per pass the overlap-free model once priced: at volumes where the
    # links' latency is noise, the bytes' ratio
    big = 64 * act
    old = (fwd_passes + 1) * sum(_ag_rs(pool, big, big))
    bandwidth_bound_ratio = (gathered_bytes / 2 * (fwd_passes + 1) + fwd_passes) / (2 * (fwd_passes + 1))
    got_big = sp_block_comm_s(big, pool.gpu, precision, 4, link, fwd_passes)
    assert got_big / old == pytest.approx(bandwidth_bound_ratio, rel=0.01)


def test_layer_prices_megatron_sp_without_userbuffers_per_block():
    """A dense layer (two blocks) at TP 4 with SP and no --tp-comm-overlap: twice the block traffic; with
    userbuffers overlap the four collectives per pass less the overlapped share; torchtitan keeps them all."""
    act = 8192 * LLAMA.hidden_size * 2.0
    link = group_links(H100, _cfg().dims).tp
    for precision in (Precision.BF16, Precision.FP8):
        cfg = _cfg(precision)
        cost = layer_cost(LLAMA, LayerKind.DENSE, H100, cfg, Recompute.NONE)
        block = sp_block_comm_s(act, H100.gpu, precision, 4, link, 1)
        assert cost.tp_comm_s == pytest.approx(2 * block, rel=1e-12)
    four = 2 * 2 * sum(_ag_rs(H100, act, act))
    ub = layer_cost(LLAMA, LayerKind.DENSE, H100, _cfg(tp_comm_overlap=True), Recompute.NONE)
    assert ub.tp_comm_s == pytest.approx(four * (1 - H100.gpu.efficiency.tp_overlap), rel=1e-12)
    titan = layer_cost(LLAMA, LayerKind.DENSE, H100, _cfg(framework=TrainFramework.TORCHTITAN),
                       Recompute.NONE)
    assert titan.tp_comm_s == pytest.approx(four, rel=1e-12)
    # full recompute repeats the forward's gather and scatter, not the backward's
    full = layer_cost(LLAMA, LayerKind.DENSE, H100, _cfg(recompute=Recompute.FULL), Recompute.FULL)
    block = sp_block_comm_s(act, H100.gpu, Precision.BF16, 4, link, 2)
    assert full.tp_comm_s == pytest.approx(2 * block, rel=1e-12)
