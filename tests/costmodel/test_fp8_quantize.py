"""FP8 quantization traffic of a training layer, operand by operand (compute.fp8_quantize_s): the
forward quantizes each FP8 GEMM's input X (m x k), the backward its output gradient dY (m x n), at
the recipe's bytes per element, with Hopper's transposed copy for per-tensor recipes; BF16 GEMMs (the
router) quantize nothing."""

from __future__ import annotations

import pytest

from autoshard.costmodel.compute import fp8_quantize_s, layer_compute_time
from autoshard.costmodel.fp8 import fp8_cast_bytes_per_element
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import layer_gemms
from autoshard.parallel import Fp8Recipe, ParallelDims, Recompute
from autoshard.specs import LayerKind, Precision, load_cluster, load_model

LLAMA8 = load_model("llama-3.1-8b")
H100 = training_gpu(load_cluster("dgx-h100").primary.gpu)
B200 = training_gpu(load_cluster("dgx-b200").primary.gpu)
KW = dict(dims=ParallelDims(), micro_batch_size=1, seq_len=8192, recompute=Recompute.NONE,
          sequence_parallel=False, precision=Precision.FP8)


def _hbm(gpu) -> float:
    return gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm


def test_llama8b_layer_quantizes_inputs_forward_and_output_gradients_backward():
    """Llama-3.1-8B at TP 1, per token: inputs X of QKV, proj, FC1, FC2 = h + h + h + ffn = 26,624
    elements; output gradients dY = (h + 2 kv d) + h + 2 ffn + h = 43,008. Delayed scaling on H100
    writes a row-wise and a transposed FP8 copy (2 + 1 + 1 = 4 B), on B200 the row-wise one (3 B)."""
    h, ffn, kvd, tokens = 4096, 14336, 8 * 128, 8192
    x, dy = 3 * h + ffn, (h + 2 * kvd) + h + 2 * ffn + h
    assert (x, dy) == (26624, 43008)
    gemms = layer_gemms(LLAMA8, LayerKind.DENSE, tokens=tokens, dims=ParallelDims())
    fwd, bwd = fp8_quantize_s(gemms, H100, Fp8Recipe.DELAYED)
    assert fwd == pytest.approx(4 * tokens * x / _hbm(H100))
    assert bwd == pytest.approx(4 * tokens * dy / _hbm(H100))
    fwd, bwd = fp8_quantize_s(gemms, B200, Fp8Recipe.DELAYED)
    assert fwd == pytest.approx(3 * tokens * x / _hbm(B200))
    assert bwd == pytest.approx(3 * tokens * dy / _hbm(B200))
    # current scaling adds one BF16 read (the amax pass) per quantized element, forward and backward
    cur = layer_compute_time(LLAMA8, LayerKind.DENSE, gpu=H100, fp8_recipe=Fp8Recipe.TENSORWISE, **KW)
    dly = layer_compute_time(LLAMA8, LayerKind.DENSE, gpu=H100, fp8_recipe=Fp8Recipe.DELAYED, **KW)
    assert cur.forward_s - dly.forward_s == pytest.approx(2 * tokens * x / _hbm(H100))
    assert cur.backward_s - dly.backward_s == pytest.approx(2 * tokens * dy / _hbm(H100))


def test_bf16_gemms_quantize_nothing():
    """The router is not a Transformer Engine module: it runs in BF16 and adds no quantization
    traffic; an MoE layer quantizes exactly its other GEMMs' operands."""
    qwen = load_model("qwen3-235b-a22b")
    moe = layer_gemms(qwen, LayerKind.MOE, tokens=4096, dims=ParallelDims(dp=8, ep=8))
    router = [g for g in moe if not g.fp8_capable]
    assert [(g.n, g.k) for g in router] == [(qwen.moe.num_experts, qwen.hidden_size)]
    assert fp8_quantize_s(router, H100, Fp8Recipe.DELAYED) == (0.0, 0.0)
    rest = [g for g in moe if g.fp8_capable]
    assert fp8_quantize_s(moe, H100, Fp8Recipe.MXFP8) == pytest.approx(fp8_quantize_s(rest, H100, Fp8Recipe.MXFP8))


@pytest.mark.parametrize(("recipe", "kernels"), [
    (Fp8Recipe.DELAYED, 0), (Fp8Recipe.TENSORWISE, 3), (Fp8Recipe.BLOCKWISE, 1), (Fp8Recipe.MXFP8, 1)])
def test_grouped_expert_operands_are_quantized_expert_by_expert(recipe, kernels):
    """Qwen3-30B-A3B at EP 8 (16 local experts, 4,096 tokens): Transformer Engine's split_quantize fuses
    the experts' casts only under delayed scaling; blockwise and MXFP8 launch one quantize kernel per
    expert, current scaling three (amax, scale, cast). Per layer, the forward quantizes two grouped
    inputs (fc1, fc2) and the backward two grouped output gradients: 15 extra experts x kernels x 2
    operands each way, at 4 us a launch on H100; the bytes are the fused pass's, and a dense layer's
    quantization (one tensor per GEMM) takes no extra launch."""
    qwen = load_model("qwen3-30b-a3b")
    moe = layer_gemms(qwen, LayerKind.MOE, tokens=4096, dims=ParallelDims(dp=8, ep=8))
    grouped = [g for g in moe if g.grouped]
    assert [(g.count, g.n, g.k) for g in grouped] == [(16, 1536, 2048), (16, 2048, 768)]
    launch = kernels * 15 * 2 * 4e-6
    assert H100.efficiency.kernel_overhead_us == 4.0
    fused = _bytes_only(moe, recipe)
    fwd, bwd = fp8_quantize_s(moe, H100, recipe)
    assert fwd == pytest.approx(fused[0] + launch)
    assert bwd == pytest.approx(fused[1] + launch)
    dense = layer_gemms(LLAMA8, LayerKind.DENSE, tokens=8192, dims=ParallelDims())
    assert fp8_quantize_s(dense, H100, recipe) == pytest.approx(_bytes_only(dense, recipe))


def _bytes_only(gemms, recipe) -> tuple[float, float]:
    """The quantization traffic alone: X and dY elements at the recipe's bytes (Hopper's transposed copy)."""
    per = fp8_cast_bytes_per_element(recipe, transpose=True)
    x = sum(g.m * g.k * g.count for g in gemms if g.fp8_capable)
    dy = sum(g.m * g.n * g.count for g in gemms if g.fp8_capable)
    return per * x / _hbm(H100), per * dy / _hbm(H100)
