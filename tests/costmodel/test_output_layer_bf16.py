"""The output layer (logits GEMM, vocab x hidden) runs in BF16 under every FP8 recipe: Megatron-Core
builds `GPTModel.output_layer` as its own `tensor_parallel.ColumnParallelLinear` (core_v0.12.0
`models/gpt/gpt_model.py:197`, `torch.matmul` forward and dgrad, `wgrad_gemm_accum_fp32` wgrad in
`tensor_parallel/layers.py:439/477/511`), not a Transformer Engine module, and the FP8 context wraps
the decoder block only (`transformer/transformer_block.py:505-509`). The opt-in MXFP8 LM head
(`--fp8-output-proj`, Megatron-LM 3f6a2ed8, 2026-05-31) is newer than every run and plan here."""

from __future__ import annotations

import dataclasses

import pytest

from autoshard.costmodel.compute import fp8_quantize_s, gemm_time_s, layer_compute_time
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import Gemm, layer_gemms
from autoshard.costmodel.train.layer import layer_cost
from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import Fp8Recipe, ParallelDims, Recompute
from autoshard.costmodel.gemm_shape import shape_table
from autoshard.search.train.tables import build_tables
from autoshard.specs import LayerKind, Precision, load_cluster, load_model
from autoshard.units import US_PER_S

LLAMA70 = load_model("llama-3.1-70b")
H100_CLUSTER = load_cluster("dgx-h100")
H100 = training_gpu(H100_CLUSTER.primary.gpu)
B200 = training_gpu(load_cluster("dgx-b200").primary.gpu)
TP8 = ParallelDims(tp=8)
TOKENS = 8192


def test_logits_gemm_is_priced_at_the_bf16_peak_in_closed_form():
    """Llama-3.1-70B at TP 8, 8,192 tokens: (8192 x 8192) @ (8192 x 16032), 2.15 TFLOP forward, at
    H100's BF16 989 TFLOP/s x train_gemm x the measured shape fall-off (gemm_shape: Hopper's table);
    the FP8 decoder body's GEMMs at 1,979 x train_gemm_fp8 x the FP8 table."""
    (out,) = layer_gemms(LLAMA70, LayerKind.OUTPUT, tokens=TOKENS, dims=TP8)
    assert (out.m, out.n, out.k, out.fp8_capable) == (8192, 16032, 8192, False)
    eff = H100.efficiency
    table = shape_table("hopper")
    shape = table.dense(8192, 16032, 8192, fp8=False)
    assert shape == pytest.approx(1.0, abs=0.01)  # a large GEMM: no fall-off
    flops = 2.0 * 8192 * 16032 * 8192
    want = flops / (989e12 * eff.gemm * shape) + eff.kernel_overhead_us * 1e-6
    assert gemm_time_s(out, H100, Precision.FP8) == pytest.approx(want, rel=1e-9)
    assert gemm_time_s(out, H100, Precision.FP8) == pytest.approx(gemm_time_s(out, H100, Precision.BF16), rel=1e-12)
    # what it cost when priced like the FP8 body: the ratio of the two peaks times their knobs
    as_fp8 = gemm_time_s(dataclasses.replace(out, fp8_capable=True), H100, Precision.FP8)
    overhead = eff.kernel_overhead_us * 1e-6
    ratio = (1979 * eff.gemm_fp8 * table.dense(8192, 16032, 8192, fp8=True)) / (989 * eff.gemm * shape)
    assert (want - overhead) / (as_fp8 - overhead) == pytest.approx(ratio, rel=1e-9)
    assert ratio > 1.5  # H100's fitted knobs: BF16 at about half the FP8 rate


@pytest.mark.parametrize("gpu", [H100, B200], ids=["h100", "b200"])
@pytest.mark.parametrize("recipe", list(Fp8Recipe))
def test_output_layer_costs_the_same_under_every_fp8_recipe_as_in_bf16(gpu, recipe):
    """Forward, dgrad and wgrad (into the FP32 main gradient), the loss, no FP8 casts: the output layer
    under an FP8 plan is the BF16 output layer to the last bit."""
    kw = dict(gpu=gpu, dims=TP8, micro_batch_size=1, seq_len=TOKENS, recompute=Recompute.NONE,
              sequence_parallel=True, main_grad_bytes=4)
    fp8 = layer_compute_time(LLAMA70, LayerKind.OUTPUT, precision=Precision.FP8, fp8_recipe=recipe, **kw)
    bf16 = layer_compute_time(LLAMA70, LayerKind.OUTPUT, precision=Precision.BF16, **kw)
    assert fp8 == bf16
    assert fp8_quantize_s(layer_gemms(LLAMA70, LayerKind.OUTPUT, tokens=TOKENS, dims=TP8), gpu, recipe) == (0.0, 0.0)
    # the decoder layers do run in FP8: the same check on them fails
    dense_fp8 = layer_compute_time(LLAMA70, LayerKind.DENSE, precision=Precision.FP8, fp8_recipe=recipe, **kw)
    dense_bf16 = layer_compute_time(LLAMA70, LayerKind.DENSE, precision=Precision.BF16, **kw)
    assert dense_fp8.forward_s < 0.9 * dense_bf16.forward_s


def test_solver_tables_price_the_output_layer_as_the_cost_model():
    """The solver's tables read `layer_cost`: the last prefix step is the BF16 output layer's time."""
    cfg = TrainConfig(dims=ParallelDims(tp=8, pp=2, dp=4), micro_batch_size=1, global_batch_size=64,
                      seq_len=TOKENS, precision=Precision.FP8, recompute=Recompute.NONE, fp8_recipe=Fp8Recipe.DELAYED)
    tab = build_tables(LLAMA70, H100_CLUSTER.with_gpus(64), cfg, scale=1)
    pool = H100_CLUSTER.with_gpus(64).pools[0]
    out = layer_cost(LLAMA70, LayerKind.OUTPUT, pool, cfg, cfg.recompute)
    got = (tab.pools[0].time_us[-1] - tab.pools[0].time_us[-2]) / US_PER_S
    assert got == pytest.approx(out.time_s, abs=2 / US_PER_S)
    bf16 = layer_cost(LLAMA70, LayerKind.OUTPUT, pool, dataclasses.replace(cfg, precision=Precision.BF16), cfg.recompute)
    assert out.compute_s == bf16.compute_s
    # the logits GEMM forward + dgrad + wgrad is most of it (the rest: loss, final norm)
    (g,) = layer_gemms(LLAMA70, LayerKind.OUTPUT, tokens=TOKENS, dims=cfg.dims)
    assert 3 * gemm_time_s(g, training_gpu(pool.gpu), Precision.BF16) > 0.8 * out.compute_s
    assert isinstance(g, Gemm)
