"""Attention work of sliding-window layers in closed form: a causal query at position i sees min(i, w) keys, so a
sequence of s > w tokens has s w - w^2 / 2 query-key pairs instead of s^2 / 2 (7/16 of them at s = 4 w); the
training kernels, serving prefill and the step FLOPs carry it layer by layer."""

from __future__ import annotations

import pytest

from autoshard.costmodel.attention import flash_attention_kernels_s
from autoshard.costmodel.flops import (
    attention_dims, causal_keys, causal_model_flops_per_step, layer_flops, model_flops_per_step,
    window_attention_share,
)
from autoshard.costmodel.serve.attention import _forward_attention_efficiency, prefill_attention_s
from autoshard.parallel import ParallelDims
from autoshard.specs import load_cluster
from autoshard.specs.model import LayerKind, ModelSpec

W = 1024
GPU = load_cluster("dgx-h100").with_gpus(8).primary.gpu


def _model(windows: list[int | None]) -> ModelSpec:
    groups = [{"kind": "dense", "count": 1, **({"attention_window": w} if w else {})} for w in windows]
    return ModelSpec(name="toy", hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_kv_heads=8,
                     vocab_size=32000, max_position_embeddings=131072,
                     layers=[{"kind": "embedding"}, *groups, {"kind": "output"}])


FULL = _model([None] * 6)
SLIDING = _model([W] * 6)
GEMMA_LIKE = _model([W] * 5 + [None])  # 5 local : 1 global


def test_causal_keys_closed_form() -> None:
    s = 4 * W
    assert causal_keys(s, None) == s / 2
    assert causal_keys(s, W) * s == s * W - W * W / 2 == 3.5 * W * W
    assert causal_keys(s, W) / causal_keys(s, None) == 7 / 16
    assert causal_keys(W, W) == causal_keys(W, None)  # a window as long as the sequence changes nothing
    assert causal_keys(512, W) == 256


def test_layer_flops_at_four_windows() -> None:
    s = 4 * W
    full = layer_flops(FULL, LayerKind.DENSE, tokens=s, seq_len=s)
    qk, v = attention_dims(FULL)
    assert full.attention == 2.0 * s * s * 32 * (qk + v)
    assert layer_flops(SLIDING, LayerKind.DENSE, tokens=s, seq_len=s).attention == pytest.approx(7 / 16 * full.attention)
    assert window_attention_share(GEMMA_LIKE, s) == pytest.approx((5 * 7 / 16 + 1) / 6)
    mixed = layer_flops(GEMMA_LIKE, LayerKind.DENSE, tokens=s, seq_len=s)
    assert mixed.linear == full.linear
    assert mixed.attention == pytest.approx((5 * 7 / 16 + 1) / 6 * full.attention)


def test_step_flops_subtract_only_the_attention_saved() -> None:
    s, b = 4 * W, 8
    saved = model_flops_per_step(FULL, seq_len=s, global_batch_size=b) - model_flops_per_step(
        SLIDING, seq_len=s, global_batch_size=b)
    attn = 6 * layer_flops(FULL, LayerKind.DENSE, tokens=s * b, seq_len=s).attention
    assert saved == pytest.approx(3.0 * attn * 9 / 16)
    # useful (causal) FLOPs: half of each, so the saving halves too
    causal_saved = causal_model_flops_per_step(FULL, seq_len=s, global_batch_size=b) - causal_model_flops_per_step(
        SLIDING, seq_len=s, global_batch_size=b)
    assert causal_saved == pytest.approx(3.0 * 0.5 * attn * 9 / 16)


def test_training_kernels_per_window_class() -> None:
    s = 4 * W
    dims = ParallelDims(tp=2)
    (full,) = flash_attention_kernels_s(FULL, tokens=s, seq_len=s, dims=dims, gpu=GPU)
    kernels = flash_attention_kernels_s(GEMMA_LIKE, tokens=s, seq_len=s, dims=dims, gpu=GPU)
    assert [length for _, length, _ in kernels] == [float(s), float(W)]
    (g_s, _, g_f), (w_s, _, w_f) = kernels
    assert g_f == pytest.approx(full[2] / 6) and g_s == pytest.approx(full[0] / 6)
    assert w_f == pytest.approx(full[2] * 5 / 6 * 7 / 16)
    eff = GPU.efficiency
    ramp = (W / (W + eff.attention_half_seq)) / (s / (s + eff.attention_half_seq))
    assert w_s == pytest.approx(full[0] * 5 / 6 * 7 / 16 / ramp)  # the causal ramp at w, not at s
    # no window: the one causal kernel as before
    assert flash_attention_kernels_s(SLIDING, tokens=W, seq_len=W, dims=dims, gpu=GPU) == flash_attention_kernels_s(
        FULL, tokens=W, seq_len=W, dims=dims, gpu=GPU)


def test_serving_prefill_over_the_window() -> None:
    s = 4 * W
    qk, v = attention_dims(FULL)
    heads = 32 / 2
    full = 2.0 * s * s * heads * (qk + v) * 0.5 / (GPU.bf16_tflops * 1e12 * _forward_attention_efficiency(GPU, s))
    assert prefill_attention_s(FULL, GPU, tp=2, prompt_len=s) == pytest.approx(full)
    window = 2.0 * 3.5 * W * W * heads * (qk + v) / (GPU.bf16_tflops * 1e12 * _forward_attention_efficiency(GPU, W))
    assert prefill_attention_s(SLIDING, GPU, tp=2, prompt_len=s) == pytest.approx(window)
    assert prefill_attention_s(GEMMA_LIKE, GPU, tp=2, prompt_len=s) == pytest.approx((5 * window + full) / 6)
    assert prefill_attention_s(SLIDING, GPU, tp=2, prompt_len=W) == pytest.approx(
        prefill_attention_s(FULL, GPU, tp=2, prompt_len=W))
