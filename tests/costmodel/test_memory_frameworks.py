"""torchtitan's memory terms (TrainFramework.TORCHTITAN) against closed forms of their mechanisms;
Megatron (the default) must be unchanged by the framework switch."""

from __future__ import annotations

import dataclasses

import pytest

from autoshard.costmodel.train.memory import (
    ParamShards,
    TrainFramework,
    layer_activation_bytes,
    layer_param_shards,
    model_state_bytes,
)
from autoshard.costmodel.train.memory_torchtitan import (
    allocator_reported_bytes,
    torchtitan_layer_activation_bytes,
    torchtitan_loss_bytes,
    torchtitan_loss_hole_bytes,
)
from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import Stage, TrainConfig
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs import LayerKind, ModelSpec, load_cluster
from autoshard.units import GIB

TT = TrainFramework.TORCHTITAN
H, FFN, HEADS, KV, V, L = 4096, 14336, 32, 8, 128256, 32


def llama8b(layers: int = L) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "llama3-8b", "hidden_size": H, "ffn_hidden_size": FFN, "num_attention_heads": HEADS,
        "num_kv_heads": KV, "vocab_size": V, "mlp": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
        "max_position_embeddings": 8192, "tied_embeddings": False,
        "layers": [{"kind": "embedding"}, {"kind": "dense", "count": layers}, {"kind": "output"}],
    })


def test_fsdp2_states_are_16_bytes_per_param_over_dp():
    shards = ParamShards(dense=1e9, expert=0.0)
    dims = ParallelDims(dp=8)
    s = model_state_bytes(shards, dims=dims, zero_stage=3, framework=TT)
    assert s.weights == pytest.approx(4 * 1e9 / 8)  # FP32 sharded parameters
    assert s.grads == pytest.approx(4 * 1e9 / 8)  # FP32 sharded gradients
    assert s.optimizer == pytest.approx(8 * 1e9 / 8)  # Adam m, v
    assert s.total == pytest.approx(16 * 1e9 / 8)
    mega = model_state_bytes(shards, dims=dims, zero_stage=3)
    assert mega.total == pytest.approx(18 * 1e9 / 8)


def test_op_sac_saves_block_input_every_other_mm_and_attention():
    model, dims, b, s = llama8b(), ParallelDims(dp=8), 2, 8192
    got = torchtitan_layer_activation_bytes(
        model, LayerKind.DENSE, dims=dims, micro_batch_size=b, seq_len=s, recompute=Recompute.SELECTIVE,
        sequence_parallel=False)
    d = H // HEADS
    # input, wq, wv, w1, w2 (mms 1, 3, 5, 7 of wq wk wv wo w1 w3 w2), flash output, FP32 logsumexp
    per_token = 2 * H + 2 * HEADS * d + 2 * KV * d + 2 * FFN + 2 * H + 2 * HEADS * d + 4 * HEADS
    assert per_token == 63616
    assert got == pytest.approx(b * s * per_token)


def test_op_sac_with_tp_and_sp_adds_reduce_scatter_outputs():
    model, b, s, tp = llama8b(), 1, 4096, 4
    got = torchtitan_layer_activation_bytes(
        model, LayerKind.DENSE, dims=ParallelDims(tp=tp), micro_batch_size=b, seq_len=s,
        recompute=Recompute.SELECTIVE, sequence_parallel=True)
    d = H // HEADS
    per_token = (2 * H / tp + 2 * HEADS * d / tp + 2 * KV * d / tp + 2 * FFN / tp + 2 * H
                 + 2 * HEADS * d / tp + 4 * HEADS / tp + 2 * 2 * H / tp)
    assert got == pytest.approx(b * s * per_token)


def test_full_ac_saves_the_block_input_only():
    got = torchtitan_layer_activation_bytes(
        llama8b(), LayerKind.DENSE, dims=ParallelDims(tp=8), micro_batch_size=16, seq_len=8192,
        recompute=Recompute.FULL, sequence_parallel=True)
    assert got == pytest.approx(16 * 8192 * 2 * H / 8)


def test_output_layer_saves_norm_input_and_gathered_projection_input():
    got = torchtitan_layer_activation_bytes(
        llama8b(), LayerKind.OUTPUT, dims=ParallelDims(tp=8), micro_batch_size=1, seq_len=8192,
        recompute=Recompute.FULL, sequence_parallel=True)
    assert got == pytest.approx(8192 * (2 * H / 8 + 2 * H))


@pytest.mark.parametrize(("tp", "per_vocab"), [(1, 12), (8, 16)])
def test_loss_peak(tp, per_vocab):
    """Fused log_softmax backward: saved output + nll grad + log_softmax grad (3 x FP32); loss
    parallel's fused backward: saved output, zeros_like, exp(x), their sum (4 x FP32 on V/tp)."""
    got = torchtitan_loss_bytes(llama8b(), dims=ParallelDims(tp=tp), micro_batch_size=2, seq_len=8192)
    assert got == pytest.approx(2 * 8192 * per_vocab * V / tp)


def test_allocator_report_excludes_context_and_nccl():
    gpu = load_cluster("dgx-h100").primary.gpu
    assert allocator_reported_bytes(gpu, 50 * GIB) == pytest.approx(50 * GIB - gpu.efficiency.reserved_memory_gib * GIB)


def _predict(framework: TrainFramework, dp: int = 8, recompute: Recompute = Recompute.SELECTIVE):
    model = llama8b()
    cluster = load_cluster("dgx-h100").with_gpus(dp)
    cfg = TrainConfig(dims=ParallelDims(dp=dp), micro_batch_size=2, global_batch_size=2 * dp, seq_len=8192,
                      recompute=recompute, sequence_parallel=False, zero_stage=3, framework=framework)
    return model, cluster, cfg, predict_train(model, cluster, cfg, [Stage(0, model.num_layers + 2)])


def test_torchtitan_peak_is_states_root_saved_activations_and_loss():
    """8B, FSDP 8, op-level SAC: the loss in backward (23.5 GiB) dominates a block's backward."""
    model, cluster, cfg, pred = _predict(TT)
    dims, tokens = cfg.dims, 2 * 8192
    params = sum(layer_param_shards(model, k, dims).total for k in model.layer_kinds)
    root = layer_param_shards(model, LayerKind.EMBEDDING, dims).total + layer_param_shards(model, LayerKind.OUTPUT, dims).total
    states = 16 * params / 8
    saved = L * tokens * 63616 + tokens * 4 * H
    loss = tokens * 12 * V
    allocated = states + 2 * root + saved + loss
    eff = cluster.primary.gpu.efficiency
    assert pred.memory.activations == pytest.approx(saved + loss)
    assert pred.memory.weights == pytest.approx(4 * params / 8 + 2 * root)
    hole = tokens * 2 * V  # the freed BF16 logits, below the saved log-softmax output (reserved, unallocated)
    # fragmentation spares the FP32 parameter shards and Adam's moments (4 + 8 B/param, allocated once);
    # the FP32 gradients (freed by zero_grad every step), the root's BF16 copy and activations are dynamic
    dynamic = allocated - 12 * params / 8
    assert pred.peak_memory_bytes == pytest.approx(allocated + dynamic * eff.fragmentation + hole + eff.reserved_memory_gib * GIB)
    assert pred.memory.overhead == pytest.approx(dynamic * eff.fragmentation + hole + eff.reserved_memory_gib * GIB)


def test_torchtitan_block_phase_when_the_loss_is_small():
    """With a tiny vocabulary a block's backward is the peak: two gathered BF16 blocks, its BF16
    gradients + FP32 reduce-scatter copy, the root's BF16 gradients and the recompute working set."""
    model = llama8b().model_copy(update={"vocab_size": 256})
    cluster = load_cluster("dgx-h100").with_gpus(8)
    cfg = TrainConfig(dims=ParallelDims(dp=8), micro_batch_size=1, global_batch_size=8, seq_len=2048,
                      recompute=Recompute.FULL, sequence_parallel=False, zero_stage=3, framework=TT)
    pred = predict_train(model, cluster, cfg, [Stage(0, model.num_layers + 2)])
    dims = cfg.dims
    params = sum(layer_param_shards(model, k, dims).total for k in model.layer_kinds)
    block = layer_param_shards(model, LayerKind.DENSE, dims).total
    root = layer_param_shards(model, LayerKind.EMBEDDING, dims).total + layer_param_shards(model, LayerKind.OUTPUT, dims).total
    assert pred.memory.weights == pytest.approx(4 * params / 8 + 2 * root + 2 * 2 * block)
    assert pred.memory.grads == pytest.approx(4 * params / 8 + 6 * block + 2 * root)
    kw = dict(dims=dims, micro_batch_size=1, seq_len=2048, sequence_parallel=False)
    working = layer_activation_bytes(model, LayerKind.DENSE, recompute=Recompute.NONE, **kw) - 2048 * 2 * H
    saved = L * 2048 * 2 * H + 2048 * 4 * H
    assert pred.memory.activations == pytest.approx(saved + working)


def test_megatron_default_is_unchanged_by_the_field():
    _, _, cfg, pred = _predict(TrainFramework.MEGATRON)
    default = dataclasses.replace(cfg)
    assert default.framework is TrainFramework.MEGATRON
    tt = _predict(TT)[3]
    assert tt.step_time_s == pred.step_time_s  # time is framework-independent
    assert tt.peak_memory_bytes != pred.peak_memory_bytes


@pytest.mark.parametrize(("tp", "cp"), [(1, 1), (8, 1), (1, 4)])
def test_loss_hole_is_one_bf16_logits_tensor(tp, cp):
    """Expandable segment, allocations in order at its end: BF16 logits (2 B x V/tp per token), FP32
    copy (4 B), log-softmax output (4 B); the copy and the logits are freed before backward (a 6 B
    hole), nll_loss's FP32 zeros take 4 B of it and the next FP32 tensor extends the segment: the
    reservation peaks 2 B x V/tp per (local) token above the allocation."""
    dims = ParallelDims(tp=tp, cp=cp, dp=8)
    b, s = 2, 8192
    hole = torchtitan_loss_hole_bytes(llama8b(), dims=dims, micro_batch_size=b, seq_len=s)
    assert hole == pytest.approx(b * (s // cp) * 2 * V / tp)
    assert hole / GIB == pytest.approx(3.915 / cp / tp, rel=1e-3)  # 16,384 tokens x 128,256 x 2 B = 3.92 GiB


@pytest.mark.parametrize("tp", [1, 8])
def test_compiled_loss_keeps_the_bf16_logits_and_writes_a_bf16_gradient(tp):
    """torch.compile'd cross-entropy (torchtitan since 2025-04): the BF16 logits kept for backward
    plus the BF16 gradient, 4 B x V/tp per token, against 12 (16 with loss parallel) eager; no hole."""
    dims = ParallelDims(tp=tp, dp=8)
    kw = dict(dims=dims, micro_batch_size=2, seq_len=8192)
    tokens = 2 * 8192
    assert torchtitan_loss_bytes(llama8b(), compiled=True, **kw) == pytest.approx(tokens * 4 * V / tp)
    eager = 12 if tp == 1 else 16
    assert torchtitan_loss_bytes(llama8b(), **kw) == pytest.approx(tokens * eager * V / tp)
    assert torchtitan_loss_hole_bytes(llama8b(), compiled=True, **kw) == 0.0


def test_compiled_loss_moves_the_8b_peak_by_the_loss_difference():
    """8B FSDP 8, op-level SAC, 16,384 tokens: the compiled loss lowers the allocated peak by
    (12 - 4) B x V per token and drops the 2 B x V hole (fragmentation scales with the allocation)."""
    model, cluster, cfg, eager = _predict(TT)
    compiled = predict_train(model, cluster, dataclasses.replace(cfg, compiled_loss=True), [Stage(0, model.num_layers + 2)])
    tokens = 2 * 8192
    eff = cluster.primary.gpu.efficiency
    drop = tokens * 8 * V * (1 + eff.fragmentation) + tokens * 2 * V
    assert eager.peak_memory_bytes - compiled.peak_memory_bytes == pytest.approx(drop)
