"""The caching allocator's fragmentation is charged on the step's dynamic allocations only
(costmodel.train.memory.static_bytes / overhead_bytes), against closed forms: Megatron's contiguous
parameter/gradient buffers and optimizer shards are static; under torchtitan/FSDP the gradients are
freed by zero_grad every step and so dynamic; activations, working sets and ZeRO-3's gathered
layers are dynamic everywhere."""

from __future__ import annotations

import dataclasses

import pytest

from autoshard.costmodel.train.memory import TrainFramework, layer_param_shards, overhead_bytes, static_bytes
from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import Stage, TrainConfig
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs import load_cluster
from autoshard.specs.job import Optimizer
from autoshard.units import GIB
from test_memory_frameworks import llama8b


@pytest.mark.parametrize(("framework", "static"), [
    (TrainFramework.MEGATRON, 1 + 2 + 4),
    (TrainFramework.NEMO, 1 + 2 + 4),
    (TrainFramework.TORCHTITAN, 1 + 4),
    (TrainFramework.FSDP, 1 + 4),
])
def test_static_bytes_per_framework(framework, static):
    """weights 1, gradients 2, optimizer 4: which of them never leave the allocator."""
    assert static_bytes(framework, weights=1.0, grads=2.0, optimizer=4.0) == static


def test_overhead_is_reserve_plus_fragmentation_of_the_dynamic_bytes():
    gpu = load_cluster("dgx-h100").primary.gpu
    eff = gpu.efficiency
    assert eff.fragmentation == pytest.approx(0.07)
    assert overhead_bytes(gpu, 0.0) == pytest.approx(eff.reserved_memory_gib * GIB)
    assert overhead_bytes(gpu, 10 * GIB) == pytest.approx(eff.reserved_memory_gib * GIB + 0.7 * GIB)


def _megatron(zero: int, recompute: Recompute = Recompute.SELECTIVE, optimizer: Optimizer = Optimizer.ADAM):
    model = llama8b()
    cluster = load_cluster("dgx-h100").with_gpus(8)
    cfg = TrainConfig(dims=ParallelDims(dp=8), micro_batch_size=1, global_batch_size=8, seq_len=4096,
                      recompute=recompute, sequence_parallel=False, zero_stage=zero, optimizer=optimizer)
    return model, cluster, cfg, predict_train(model, cluster, cfg, [Stage(0, model.num_layers + 2)])


def test_megatron_distributed_optimizer_peak_charges_fragmentation_on_activations_only():
    """Llama-3-8B, DP 8, ZeRO-1: peak = (2 + 4 + 12/8) B x N + activations x 1.07 + reserve."""
    model, cluster, cfg, pred = _megatron(1)
    eff = cluster.primary.gpu.efficiency
    n = sum(layer_param_shards(model, k, cfg.dims).total for k in model.layer_kinds)
    m = pred.memory
    assert m.weights + m.grads + m.optimizer == pytest.approx((2 + 4 + 12 / 8) * n)
    assert m.overhead == pytest.approx(eff.reserved_memory_gib * GIB + eff.fragmentation * m.activations)
    assert pred.peak_memory_bytes == pytest.approx(
        7.5 * n + (1 + eff.fragmentation) * m.activations + eff.reserved_memory_gib * GIB)


def test_optimizer_state_moves_the_peak_byte_for_byte():
    """Adam and SGD differ only in static optimizer state: the peak moves by exactly that (no 7 %)."""
    _, cluster, _, adam = _megatron(1)
    _, _, _, sgd = _megatron(1, optimizer=Optimizer.SGD)
    assert adam.memory.overhead == pytest.approx(sgd.memory.overhead)
    assert adam.peak_memory_bytes - sgd.peak_memory_bytes == pytest.approx(
        adam.memory.optimizer - sgd.memory.optimizer)
    assert adam.memory.optimizer > sgd.memory.optimizer


def test_zero3_gathered_layers_are_dynamic():
    """Megatron ZeRO-3: the two gathered BF16 layers and one layer's FP32 gradients (4 + 4 B x the
    largest layer) are allocated and freed every layer: fragmented like activations; the 18/DP
    shards are not."""
    model, cluster, cfg, pred = _megatron(3)
    eff = cluster.primary.gpu.efficiency
    n = sum(layer_param_shards(model, k, cfg.dims).total for k in model.layer_kinds)
    largest = max(layer_param_shards(model, k, cfg.dims).total for k in model.layer_kinds)  # not sharded over DP
    m = pred.memory
    assert m.weights + m.grads + m.optimizer == pytest.approx(18 * n / 8 + 8 * largest)
    dynamic = m.activations + 8 * largest
    assert m.overhead == pytest.approx(eff.reserved_memory_gib * GIB + eff.fragmentation * dynamic)


def test_framework_switch_moves_fragmentation_to_the_gradients():
    """Same 8B, FSDP 8 states (FP32 params, grads, moments) with PyTorch FSDP's accounting: the
    gradients are dynamic, so the overhead is the Megatron-like one plus 7 % of the FP32 gradients."""
    model, cluster, cfg, _ = _megatron(3)
    fsdp = predict_train(model, cluster, dataclasses.replace(cfg, framework=TrainFramework.FSDP),
                         [Stage(0, model.num_layers + 2)])
    eff = cluster.primary.gpu.efficiency
    n = sum(layer_param_shards(model, k, cfg.dims).total for k in model.layer_kinds)
    largest = max(layer_param_shards(model, k, cfg.dims).total for k in model.layer_kinds)
    m = fsdp.memory
    assert m.weights + m.grads + m.optimizer == pytest.approx(16 * n / 8 + 8 * largest)
    dynamic = m.activations + 8 * largest + 4 * n / 8
    assert m.overhead == pytest.approx(eff.reserved_memory_gib * GIB + eff.fragmentation * dynamic)
