"""Model-state terms the published NeMo / Megatron FP8 runs need, against closed forms of their
mechanisms: Apex DistributedFusedAdam's BF16-remainder master weights (NeMo 1.x), BF16 optimizer
moments, and Transformer Engine's FP8 weight copies kept for the step."""

from __future__ import annotations

import pytest

from autoshard.costmodel.train.layer import layer_cost
from autoshard.costmodel.train.memory import (
    ParamShards,
    TrainFramework,
    fp8_weight_cache_bytes,
    layer_param_shards,
    model_state_bytes,
)
from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import Fp8Recipe, ParallelDims, Recompute
from autoshard.specs import LayerKind, ModelSpec, Precision, load_cluster
from autoshard.specs.job import Optimizer

NEMO = TrainFramework.NEMO
P = 1e9
SHARDS = ParamShards(dense=P, expert=0.0)


@pytest.mark.parametrize(("grad_fp32", "moments_bf16", "per_param"), [
    # BF16 params (2) + gradient buffer (4 or 2) + [16-bit master remainder (2) + FP32 m, v (8)] / DP
    (True, False, (2, 4, 10)),
    (False, False, (2, 2, 10)),
    # optim.dtype bf16: BF16 m, v (2 + 2); the BF16 params are the master copy (store_params=False)
    (False, True, (2, 2, 4)),
])
def test_nemo_distributed_fused_adam_states(grad_fp32, moments_bf16, per_param):
    dp = 16
    s = model_state_bytes(SHARDS, dims=ParallelDims(dp=dp), zero_stage=1, framework=NEMO, grad_fp32=grad_fp32,
                          moments_bf16=moments_bf16)
    w, g, o = per_param
    assert (s.weights, s.grads, s.optimizer) == pytest.approx((w * P, g * P, o * P / dp))


def test_nemo_with_fp8_params_stores_fp32_masters():
    """NeMo sets store_params=True when fp8_params is on: FP32 master + m + v = 12 B over DP."""
    s = model_state_bytes(SHARDS, dims=ParallelDims(dp=8), zero_stage=1, framework=NEMO, fp8_params=True)
    assert s.optimizer == pytest.approx(12 * P / 8)
    assert s.weights == pytest.approx(1 * P)


def test_megatron_bf16_moments_keep_the_fp32_master():
    """Megatron-Core's precision-aware optimizer with BF16 exp_avg / exp_avg_sq: 4 + 2 + 2 B over DP."""
    s = model_state_bytes(SHARDS, dims=ParallelDims(dp=8), zero_stage=1, moments_bf16=True)
    assert s.optimizer == pytest.approx(8 * P / 8)
    assert s.weights + s.grads == pytest.approx(6 * P)
    sgd = model_state_bytes(SHARDS, dims=ParallelDims(dp=1), zero_stage=1, optimizer=Optimizer.SGD, moments_bf16=True)
    assert sgd.optimizer == pytest.approx(6 * P)  # FP32 master + BF16 momentum


def _gpu(cluster: str):
    return load_cluster(cluster).primary.gpu


@pytest.mark.parametrize(("cluster", "recipe", "fp8_params", "expected"), [
    # Hopper: FP8 GEMMs only in the TN layout -> rowwise copy + transposed copy
    ("dgx-h100", Fp8Recipe.DELAYED, False, 2.0),
    ("dgx-h100", Fp8Recipe.TENSORWISE, False, 2.0),
    ("dgx-h100", Fp8Recipe.TENSORWISE, True, 1.0),  # the FP8 weight is the rowwise copy
    ("dgx-h100", Fp8Recipe.BLOCKWISE, False, 2.0),
    # Blackwell: any layout -> rowwise only, except MXFP8 (row and column 1x32 blocks, E8M0 scales)
    ("dgx-b200", Fp8Recipe.TENSORWISE, False, 1.0),
    ("dgx-b200", Fp8Recipe.TENSORWISE, True, 0.0),
    ("dgx-b200", Fp8Recipe.MXFP8, False, 2 + 2 / 32),
    ("dgx-b200", Fp8Recipe.MXFP8, True, 1 + 2 / 32),
    ("dgx-a100-80gb", Fp8Recipe.DELAYED, False, 0.0),  # no FP8 tensor cores: no FP8 GEMMs
])
def test_fp8_weight_cache_bytes_per_param(cluster, recipe, fp8_params, expected):
    assert fp8_weight_cache_bytes(_gpu(cluster), recipe, fp8_params=fp8_params) == pytest.approx(expected)


def _llama8b() -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "llama3-8b", "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32,
        "num_kv_heads": 8, "vocab_size": 128256, "mlp": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
        "max_position_embeddings": 8192, "tied_embeddings": False,
        "layers": [{"kind": "embedding"}, {"kind": "dense", "count": 32}, {"kind": "output"}],
    })


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_fp8_layer_weights_add_the_te_copies_of_decoder_gemms_only(zero_stage):
    model = _llama8b()
    pool = load_cluster("dgx-h100").primary
    dims = ParallelDims(tp=2, dp=4)
    base = dict(dims=dims, micro_batch_size=1, global_batch_size=8, seq_len=4096, zero_stage=zero_stage)
    bf16 = TrainConfig(**base, precision=Precision.BF16)
    fp8 = TrainConfig(**base, precision=Precision.FP8)
    params = layer_param_shards(model, LayerKind.DENSE, dims).dense
    dense = [layer_cost(model, LayerKind.DENSE, pool, c, Recompute.NONE).weights_bytes for c in (bf16, fp8)]
    extra = 2 * params if zero_stage < 3 else 0.0  # ZeRO-3 gathers weights per layer: the copies are transient
    assert dense[1] - dense[0] == pytest.approx(extra)
    for kind in (LayerKind.EMBEDDING, LayerKind.OUTPUT):  # embedding and output projection stay BF16
        w = [layer_cost(model, kind, pool, c, Recompute.NONE).weights_bytes for c in (bf16, fp8)]
        assert w[0] == w[1]
    titan = TrainConfig(**base, precision=Precision.FP8, framework=TrainFramework.TORCHTITAN)
    tt = [layer_cost(model, LayerKind.DENSE, pool, c, Recompute.NONE).weights_bytes
          for c in (TrainConfig(**base, framework=TrainFramework.TORCHTITAN), titan)]
    assert tt[0] == tt[1]  # torchao float8 casts per use, keeps no copy across micro-batches


def test_fp8_param_gather_keeps_embedding_and_output_in_bf16():
    """--fp8-param-gather holds Transformer Engine's linear weights in FP8 (1 B instead of 2; the FP8
    copy then costs 1 B, not 2); the embedding and the output layer are not TE modules and keep BF16."""
    model = _llama8b()
    pool = load_cluster("dgx-h100").primary
    dims = ParallelDims(tp=2, dp=4)
    base = dict(dims=dims, micro_batch_size=1, global_batch_size=8, seq_len=4096, zero_stage=1, precision=Precision.FP8)
    plain, gathered = TrainConfig(**base), TrainConfig(**base, fp8_param_gather=True)
    params = layer_param_shards(model, LayerKind.DENSE, dims).dense
    dense = [layer_cost(model, LayerKind.DENSE, pool, c, Recompute.NONE).weights_bytes for c in (plain, gathered)]
    assert dense[0] - dense[1] == pytest.approx(2 * params)  # 2 + 2 copy -> 1 + 1 copy
    for kind in (LayerKind.EMBEDDING, LayerKind.OUTPUT):
        shards = layer_param_shards(model, kind, dims).dense
        w = [layer_cost(model, kind, pool, c, Recompute.NONE).weights_bytes for c in (plain, gathered)]
        assert w[0] == w[1] == pytest.approx(2 * shards)


def test_memory_report_names_the_fp8_weight_copies():
    """An FP8 plan on H100: the weights tenant is 2 B/param of BF16 weights plus 2 B per decoder GEMM
    parameter of FP8 copies, and the report's formula says so (the BF16 plan has none)."""
    from autoshard.api import evaluate
    from autoshard.report.memory import memory_rows
    from autoshard.api import train_job
    from autoshard.specs import load_model

    model = load_model("llama-2-7b")
    cluster = load_cluster("dgx-h100").with_gpus(8)
    rows = {}
    for precision in ("bf16", "fp8"):
        job = train_job(model, seq_len=4096, global_batch_size=64, precision=precision)
        plan = evaluate(model, cluster, job, tp=2, pp=1, micro_batch_size=1, recompute=Recompute.FULL)
        rows[precision] = {r.name: r for r in memory_rows(plan)}
    dims = ParallelDims(tp=2, dp=4)
    decoder = model.num_layers * layer_param_shards(model, LayerKind.DENSE, dims).dense
    copies = rows["fp8"]["weights"].bytes - rows["bf16"]["weights"].bytes
    assert copies == pytest.approx(2 * decoder)
    assert "FP8 weight copies" in rows["fp8"]["weights"].formula
    assert "FP8" not in rows["bf16"]["weights"].formula
