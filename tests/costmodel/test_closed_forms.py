"""The cost model against closed forms from the papers it implements."""

from __future__ import annotations

import math

import pytest

from autoshard.costmodel.comm import Collective, Link, collective_time_s
from autoshard.costmodel.flops import layer_flops, model_flops_per_step
from autoshard.costmodel.train.memory import (
    ParamShards,
    in_flight_microbatches,
    layer_activation_bytes,
    model_state_bytes,
)
from autoshard.costmodel.train.pipeline import bubble_fraction, schedule_time
from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import Stage, TrainConfig
from autoshard.parallel import ParallelDims, Recompute
from autoshard.report.gantt import simulate
from autoshard.specs import LayerKind, ModelSpec, load_cluster


def gpt(layers: int = 96, hidden: int = 12288, heads: int = 96, vocab: int = 51200, seq: int = 2048) -> ModelSpec:
    """Narayanan et al.'s GPT: MHA, 4h GeLU MLP, learned positions."""
    return ModelSpec.model_validate({
        "name": "gpt", "hidden_size": hidden, "ffn_hidden_size": 4 * hidden, "num_attention_heads": heads,
        "vocab_size": vocab, "mlp": "gelu", "norm": "layernorm", "position_embedding": "learned",
        "max_position_embeddings": seq, "tied_embeddings": True, "linear_bias": True,
        "layers": [{"kind": "embedding"}, {"kind": "dense", "count": layers}, {"kind": "output"}],
    })


@pytest.mark.parametrize(("layers", "hidden", "heads", "seq", "batch"), [
    (96, 12288, 96, 2048, 1536),  # GPT-3 175B
    (24, 2304, 24, 2048, 512),  # Narayanan Table 1, 1.7B
    (128, 25600, 160, 2048, 3072),  # 1T
])
def test_model_flops_match_narayanan_without_recompute(layers, hidden, heads, seq, batch):
    model = gpt(layers, hidden, heads, seq=seq)
    b, s, l, h, v = batch, seq, layers, hidden, model.vocab_size
    expected = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert model_flops_per_step(model, seq_len=s, global_batch_size=b) == pytest.approx(expected, rel=1e-12)


def test_hardware_flops_with_full_recompute_match_narayanan_96():
    model = gpt(24, 2304, 24)
    cluster = load_cluster("dgx-a100-80gb").with_gpus(32)
    cfg = TrainConfig(dims=ParallelDims(tp=1, pp=1, dp=32), micro_batch_size=1, global_batch_size=512, seq_len=2048,
                      recompute=Recompute.FULL, sequence_parallel=False, zero_stage=0)
    pred = predict_train(model, cluster, cfg, [Stage(0, model.num_layers + 2)])
    b, s, l, h, v = 512, 2048, 24, 2304, model.vocab_size
    expected = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    hw = pred.hw_tflops_per_gpu * 1e12 * pred.step_time_s * 32
    assert hw == pytest.approx(expected, rel=1e-9)


def test_attention_flops_are_4bsh_per_layer_forward():
    model = gpt(1, 4096, 32)
    f = layer_flops(model, LayerKind.DENSE, tokens=2048, seq_len=2048)
    assert f.attention == 4 * 2048 * 2048 * 4096
    assert f.linear == 24 * 2048 * 4096 * 4096


# --------------------------------------------------------------------------- activations (Korthikanti Table 2)

S, B, H, A = 2048, 4, 6144, 64


def act(t: int, *, sp: bool, recompute: Recompute) -> float:
    model = gpt(1, H, A)
    return layer_activation_bytes(model, LayerKind.DENSE, dims=ParallelDims(tp=t, dp=1), micro_batch_size=B, seq_len=S,
                                  recompute=recompute, sequence_parallel=sp, flash_attention=False, dropout=True)


def test_activation_no_parallelism():
    assert act(1, sp=False, recompute=Recompute.NONE) == pytest.approx(S * B * H * (34 + 5 * A * S / H))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_activation_tensor_parallel(t):
    expected = S * B * H * (10 + 24 / t + 5 * A * S / (H * t))
    assert act(t, sp=False, recompute=Recompute.NONE) == pytest.approx(expected)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_activation_tensor_and_sequence_parallel(t):
    expected = S * B * H / t * (34 + 5 * A * S / H)
    assert act(t, sp=True, recompute=Recompute.NONE) == pytest.approx(expected)


@pytest.mark.parametrize("t", [2, 8])
def test_activation_selective_recompute(t):
    assert act(t, sp=True, recompute=Recompute.SELECTIVE) == pytest.approx(34 * S * B * H / t)


@pytest.mark.parametrize(("t", "sp", "expected"), [(1, False, 2 * S * B * H), (8, False, 2 * S * B * H),
                                                   (8, True, 2 * S * B * H / 8)])
def test_activation_full_recompute_keeps_only_the_input(t, sp, expected):
    assert act(t, sp=sp, recompute=Recompute.FULL) == pytest.approx(expected)


def test_gqa_swiglu_activation_counts_tensors():
    """Llama-style layer with flash attention: 4 hidden-sized tensors outside the TP region, Q, K, V
    and the attention output inside, 3 x ffn for SwiGLU (gate, up, down input), 2 bytes each."""
    model = ModelSpec.model_validate({
        "name": "l", "hidden_size": 8192, "ffn_hidden_size": 28672, "num_attention_heads": 64, "num_kv_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 8192,
        "layers": [{"kind": "embedding"}, {"kind": "dense", "count": 1}, {"kind": "output"}],
    })
    tokens = 4096
    got = layer_activation_bytes(model, LayerKind.DENSE, dims=ParallelDims(tp=1), micro_batch_size=1, seq_len=tokens,
                                 recompute=Recompute.NONE, sequence_parallel=False)
    per_token = 2 * (4 * 8192 + (8192 + 2 * 1024 + 8192) + 3 * 28672)
    assert got == tokens * per_token


# --------------------------------------------------------------------------- model states (Megatron-LM)


def test_megatron_18_bytes_per_parameter():
    states = model_state_bytes(ParamShards(dense=1e9, expert=0), dims=ParallelDims(dp=8), zero_stage=0)
    assert states.total == pytest.approx(18e9)


@pytest.mark.parametrize("dp", [1, 2, 8, 64])
def test_distributed_optimizer_6_plus_12_over_dp(dp):
    states = model_state_bytes(ParamShards(dense=1e9, expert=0), dims=ParallelDims(dp=dp), zero_stage=1)
    assert states.total == pytest.approx(1e9 * (6 + 12 / dp))


def test_zero3_shards_everything():
    states = model_state_bytes(ParamShards(dense=1e9, expert=0), dims=ParallelDims(dp=16), zero_stage=3)
    assert states.total == pytest.approx(18e9 / 16)


# --------------------------------------------------------------------------- pipeline schedule


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 1), (8, 32, 1), (4, 8, 2), (8, 16, 4)])
def test_schedule_matches_bubble_fraction(p, m, v):
    t = 1.0
    sched = schedule_time([t] * p, num_microbatches=m, vpp=v)
    ideal = m * t
    assert sched.step_s == pytest.approx(ideal * (1 + bubble_fraction(pp=p, num_microbatches=m, vpp=v)))
    assert bubble_fraction(pp=p, num_microbatches=m, vpp=v) == pytest.approx((p - 1) / (v * m))


def test_uneven_stages_fill_drain_plus_slowest():
    times = [1.0, 3.0, 2.0]
    sched = schedule_time(times, num_microbatches=10)
    assert sched.step_s == pytest.approx(sum(times) + 9 * 3.0)


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 1), (4, 8, 2), (2, 6, 3)])
def test_simulated_megatron_schedule_agrees_with_formula(p, m, v):
    f, b = 1.0, 2.0
    ops = simulate([f / v] * (p * v), [b / v] * (p * v), pp=p, vpp=v, m=m)
    makespan = max(o.end for o in ops)
    assert makespan == pytest.approx(schedule_time([f + b] * p, num_microbatches=m, vpp=v).step_s)


def test_in_flight_microbatches():
    assert [in_flight_microbatches(rank=r, pp=4, vpp=1, num_microbatches=16) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches(rank=0, pp=4, vpp=1, num_microbatches=2) == 2
    p, v = 8, 4
    assert in_flight_microbatches(rank=0, pp=p, vpp=v, num_microbatches=64) == pytest.approx(p * (1 + (p - 1) / (p * v)))


# --------------------------------------------------------------------------- collectives

LINK = Link(bytes_per_s=100e9, latency_s=0.0, crosses_nodes=False)


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_collective_volumes(n):
    size = 1e9
    assert collective_time_s(Collective.ALL_REDUCE, size, n, LINK) == pytest.approx(2 * (n - 1) / n * size / 100e9)
    for kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL):
        assert collective_time_s(kind, size, n, LINK) == pytest.approx((n - 1) / n * size / 100e9)
    assert collective_time_s(Collective.P2P, size, 2, LINK) == pytest.approx(size / 100e9)


def test_collective_latency_counts_log_steps():
    link = Link(bytes_per_s=math.inf, latency_s=1e-5, crosses_nodes=True)
    assert collective_time_s(Collective.ALL_REDUCE, 1.0, 8, link) == pytest.approx(6e-5)
    assert collective_time_s(Collective.ALL_GATHER, 1.0, 8, link) == pytest.approx(3e-5)
    assert collective_time_s(Collective.ALL_REDUCE, 1.0, 1, link) == 0.0


# --------------------------------------------------------------------------- MoE folding


def moe_model(experts: int = 8, top_k: int = 2) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "moe", "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32, "num_kv_heads": 8,
        "vocab_size": 32000, "max_position_embeddings": 4096,
        "moe": {"num_experts": experts, "top_k": top_k, "expert_ffn_hidden_size": 14336},
        "layers": [{"kind": "embedding"}, {"kind": "moe", "count": 1}, {"kind": "output"}],
    })


@pytest.mark.parametrize(("tp", "cp", "ep", "etp", "dp"), [(1, 1, 8, 1, 8), (2, 1, 4, 1, 4), (2, 1, 4, 2, 8),
                                                          (4, 2, 8, 1, 8), (1, 1, 1, None, 1)])
def test_expert_work_is_conserved_under_moe_folding(tp, cp, ep, etp, dp):
    """Whatever the expert grid, the GPUs of one attention group (TP x CP) together run exactly the
    top-k expert FLOPs of that group's tokens: EP spreads the pairs over experts, ETP splits each
    pair's FFN, neither creates or drops work."""
    from autoshard.costmodel.flops import layer_gemms

    model = moe_model()
    seq, mbs = 4096, 2
    dims = ParallelDims(tp=tp, cp=cp, ep=ep, etp=etp, dp=dp)
    # layer_gemms lists attention (2), router (1), then the expert GEMMs (no shared experts here)
    single = sum(g.flops for g in layer_gemms(model, LayerKind.MOE, tokens=mbs * seq, dims=ParallelDims())[3:])
    per_gpu = sum(g.flops for g in layer_gemms(model, LayerKind.MOE, tokens=mbs * seq // cp, dims=dims)[3:])
    assert per_gpu * tp * cp == pytest.approx(single, rel=1e-9)


def test_expert_activations_follow_the_pairs_a_gpu_runs():
    model = moe_model()
    kw = dict(micro_batch_size=1, seq_len=4096, recompute=Recompute.NONE, sequence_parallel=False)
    a = layer_activation_bytes(model, LayerKind.MOE, dims=ParallelDims(tp=1, ep=8, dp=8), **kw)
    b = layer_activation_bytes(model, LayerKind.MOE, dims=ParallelDims(tp=1, ep=1, dp=8), **kw)
    assert a == b  # EP does not change how many token-expert pairs a GPU runs
    per_pair = 2 * 4096 + 2 * 3 * 14336  # permuted input + SwiGLU gate, up and down input
    dense_part = layer_activation_bytes(moe_model(top_k=1), LayerKind.MOE, dims=ParallelDims(tp=1, dp=8), **kw)
    assert a - dense_part == pytest.approx(4096 * per_pair)  # one more pair per token (top-2 vs top-1)


def test_qk_norm_reads_and_writes_the_local_q_and_k_heads():
    """Qwen3's per-head Q/K RMSNorm (Megatron --qk-layernorm): one read and one write of the rank's Q and
    K heads per token, BF16, the same bytes as rotary: Qwen3-30B-A3B (32 query heads, 4 KV heads, head
    dim 128) at TP 1 adds 2 x 36 x 128 x 2 = 18,432 B a token; at TP 4, a quarter."""
    from autoshard.costmodel.compute import elementwise_bytes_per_token
    from autoshard.specs import load_model

    qwen = load_model("qwen3-30b-a3b")
    assert qwen.qk_norm
    plain = qwen.model_copy(update={"qk_norm": False})
    for tp in (1, 4):
        dims = ParallelDims(tp=tp)
        got = elementwise_bytes_per_token(qwen, LayerKind.MOE, dims=dims, sequence_parallel=tp > 1)
        base = elementwise_bytes_per_token(plain, LayerKind.MOE, dims=dims, sequence_parallel=tp > 1)
        assert got - base == pytest.approx(2 * (32 + 4) * 128 * 2 / tp)
