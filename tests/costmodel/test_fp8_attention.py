"""FP8 attention (Transformer Engine's fp8_dot_product_attention, TrainConfig.fp8_attention): each fused
kernel at cuDNN's measured FP8/BF16 time ratio for its length, plus the Q/K/V and dO casts, on the GPUs
NVIDIA measured; refused elsewhere and outside FP8/FP4 precision."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoshard.costmodel.attention import (
    FP8_ATTENTION_CAST_BYTES,
    FP8_ATTENTION_KERNELS,
    fp8_attention_ratios,
    fp8_attention_s,
    ring_attention_blocks,
)
from autoshard.costmodel.compute import attention_time_s, layer_compute_time
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import TrainConfig
from autoshard.emit.megatron.layout import default_stages
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs import LayerKind, Precision, load_cluster, load_model

LLAMA8 = load_model("llama-3.1-8b")
GB300 = training_gpu(load_cluster("gb300-nvl72").primary.gpu)
B200 = training_gpu(load_cluster("dgx-b200").primary.gpu)


def test_ratios_are_the_measured_kernel_times():
    """At a measured length the ratio is the CSV's FP8 time over its BF16 time (B200 at 8,192 tokens:
    forward 1.464 / 1.589 ms, backward 4.382 / 5.526 ms); between two lengths it is linear in log(length),
    so the geometric midpoint takes the mean; beyond the ends it holds the end value."""
    assert fp8_attention_ratios("B200-SXM-180GB", 8192) == (1.464 / 1.589, 4.382 / 5.526)
    assert fp8_attention_ratios("GB200-186GB", 4096) == (0.331 / 0.399, 1.264 / 1.304)
    mid = fp8_attention_ratios("GB300-288GB", math.sqrt(4096 * 8192))
    lo, hi = fp8_attention_ratios("GB300-288GB", 4096), fp8_attention_ratios("GB300-288GB", 8192)
    assert mid == pytest.approx(((lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2), rel=1e-12)
    assert fp8_attention_ratios("B200", 100) == fp8_attention_ratios("B200", 512)
    assert fp8_attention_ratios("B200", 1 << 20) == fp8_attention_ratios("B200", 131072)
    # B300 is GB300's GPU: it runs the GB300 table
    assert fp8_attention_ratios("B300-SXM-288GB", 8192) == fp8_attention_ratios("GB300-288GB", 8192)
    # FP8 pays off from a few thousand tokens on; short kernels run slower than BF16 on B200 and GB300
    for name in FP8_ATTENTION_KERNELS:
        f, b = fp8_attention_ratios(name, 8192)
        assert f < 1 and b < 1, name
    assert fp8_attention_ratios("B200", 512)[0] > 1 and fp8_attention_ratios("GB300", 512)[0] > 1


def test_every_table_row_is_a_consistent_measurement():
    """Lengths strictly increase from 512 to 131,072 and every time is positive; the BF16 kernel's time
    grows about 4x per doubling at long lengths (the causal square), as a real measurement does."""
    for name, table in FP8_ATTENTION_KERNELS.items():
        lengths = [row[0] for row in table]
        assert lengths == [512 << k for k in range(9)], name
        assert all(t > 0 for row in table for t in row[1:]), name
        growth = table[-1][2] / table[-2][2]
        assert 3.5 < growth < 4.6, name


def test_unmeasured_gpu_is_refused_by_name():
    with pytest.raises(ValueError, match="H100-SXM5-80GB.*measured: B200, B300, GB200, GB300"):
        fp8_attention_ratios("H100-SXM5-80GB", 8192)


def test_fp8_attention_closed_form_one_kernel():
    """Llama-3.1-8B, one 8,192-token sequence on one GB300, TP 1: forward = BF16 kernel x forward ratio +
    5 B x (Q + K + V) elements of casts; backward = 2.5 x BF16 kernel x backward ratio + 5 B x dO elements."""
    dims = ParallelDims()
    bf16 = attention_time_s(LLAMA8, tokens=8192, seq_len=8192, dims=dims, gpu=GB300)
    rf, rb = fp8_attention_ratios(GB300.name, 8192)
    hbm = GB300.hbm_tbps * 1e12 * GB300.efficiency.hbm
    qkv = 8192 * (32 * 128 + 8 * 128 + 8 * 128)
    d_out = 8192 * 32 * 128
    fwd, bwd = fp8_attention_s(LLAMA8, tokens=8192, seq_len=8192, dims=dims, gpu=GB300)
    assert FP8_ATTENTION_CAST_BYTES == 5.0
    assert fwd == pytest.approx(bf16 * rf + 5.0 * qkv / hbm, rel=1e-12)
    assert bwd == pytest.approx(2.5 * bf16 * rb + 5.0 * d_out / hbm, rel=1e-12)
    assert fwd + bwd < 3.5 * bf16  # FP8 attention pays off at 8,192 tokens, casts included


def test_ring_kernels_take_the_ratio_of_their_own_length():
    """Under CP 4 the rank runs one causal kernel of s/4 keys and three unmasked ones of s/8: each takes
    the measured ratio at its length (the casts do not depend on CP's split beyond the tokens)."""
    dims = ParallelDims(cp=4)
    tokens = 8192 // 4
    fwd, _ = fp8_attention_s(LLAMA8, tokens=tokens, seq_len=8192, dims=dims, gpu=B200)
    one = dataclasses.replace(dims, cp=1)
    hbm = B200.hbm_tbps * 1e12 * B200.efficiency.hbm
    casts = 5.0 * tokens * (32 + 8 + 8) * 128 / hbm
    bf16 = attention_time_s(LLAMA8, tokens=tokens, seq_len=8192, dims=dims, gpu=B200)
    blocks = ring_attention_blocks(8192, 4)
    assert [length for _, length, _ in blocks] == [2048, 1024, 1024, 1024]
    r2k, r1k = fp8_attention_ratios(B200.name, 2048)[0], fp8_attention_ratios(B200.name, 1024)[0]
    assert r1k > 1 > r2k  # on B200 the 1,024-key kernels run slower in FP8
    assert bf16 * min(r1k, r2k) < fwd - casts < bf16 * max(r1k, r2k)
    assert fp8_attention_s(LLAMA8, tokens=8192, seq_len=8192, dims=one, gpu=B200)[0] != fwd


def test_layer_and_step_use_fp8_attention():
    """A GB300 decoder layer saves exactly the attention difference; selective recompute re-runs the FP8
    forward; the step of an FP4 Llama-3.1-8B plan on 8 GB300 is shorter by m x layers x that difference."""
    kw = dict(gpu=GB300, dims=ParallelDims(dp=8), micro_batch_size=2, seq_len=8192, precision=Precision.FP4,
              recompute=Recompute.SELECTIVE, sequence_parallel=False)
    bf16 = layer_compute_time(LLAMA8, LayerKind.DENSE, **kw)
    fp8 = layer_compute_time(LLAMA8, LayerKind.DENSE, fp8_attention=True, **kw)
    a = attention_time_s(LLAMA8, tokens=16384, seq_len=8192, dims=ParallelDims(dp=8), gpu=GB300)
    f, b = fp8_attention_s(LLAMA8, tokens=16384, seq_len=8192, dims=ParallelDims(dp=8), gpu=GB300)
    assert bf16.forward_s - fp8.forward_s == pytest.approx(a - f, rel=1e-9)
    assert bf16.backward_s - fp8.backward_s == pytest.approx(2.5 * a - b, rel=1e-9)
    assert fp8.recompute_s == pytest.approx(f, rel=1e-12) and bf16.recompute_s == pytest.approx(a, rel=1e-12)
    cluster = load_cluster("gb300-nvl72")
    cfg = TrainConfig(dims=ParallelDims(dp=8), micro_batch_size=2, global_batch_size=16, seq_len=8192,
                      precision=Precision.FP4, recompute=Recompute.NONE, sequence_parallel=False)
    stages = default_stages(LLAMA8, pp=1, vpp=1)
    base = predict_train(LLAMA8, cluster, cfg, stages)
    fast = predict_train(LLAMA8, cluster, dataclasses.replace(cfg, fp8_attention=True), stages)
    saved = LLAMA8.num_layers * ((a - f) + (2.5 * a - b))
    assert base.step_time_s - fast.step_time_s == pytest.approx(saved, rel=1e-6)
    assert 0.03 < saved / base.step_time_s < 0.10  # a few per cent of this 8B step


@pytest.mark.parametrize("precision, flash", [(Precision.BF16, True), (Precision.FP8, False)])
def test_fp8_attention_needs_a_quantized_recipe_and_flash(precision, flash):
    with pytest.raises(ValueError, match="fp8_attention needs FP8 or FP4 precision and flash attention"):
        TrainConfig(dims=ParallelDims(dp=8), micro_batch_size=1, global_batch_size=8, seq_len=8192,
                    precision=precision, flash_attention=flash, fp8_attention=True)


def test_fp8_attention_on_an_unmeasured_gpu_fails_in_the_step():
    h100 = load_cluster("dgx-h100")
    cfg = TrainConfig(dims=ParallelDims(dp=8), micro_batch_size=1, global_batch_size=8, seq_len=8192,
                      precision=Precision.FP8, fp8_attention=True)
    with pytest.raises(ValueError, match="FP8 attention has no kernel measurement on H100"):
        predict_train(LLAMA8, h100, cfg, default_stages(LLAMA8, pp=1, vpp=1))


def test_api_evaluate_prices_fp8_attention_and_prints_no_megatron_launch():
    """`autoshard.evaluate(..., fp8_attention=True)`: the step is shorter by the layer difference, the plan
    JSON says so, and no Megatron-LM command is attached (Megatron-LM has no flag for FP8 attention)."""
    import autoshard

    cluster = autoshard.load_cluster("dgx-b200").with_gpus(8)
    job = autoshard.train_job(LLAMA8, seq_len=8192, global_batch_size=16, precision=Precision.FP4)
    base = autoshard.evaluate(LLAMA8, cluster, job, tp=1, pp=1, micro_batch_size=2)
    fp8 = autoshard.evaluate(LLAMA8, cluster, job, tp=1, pp=1, micro_batch_size=2, fp8_attention=True)
    assert fp8.prediction.step_time_s < base.prediction.step_time_s
    assert "megatron" in base.launch and "megatron" not in fp8.launch
    assert fp8.to_json()["plan"]["fp8_attention"] is True and base.to_json()["plan"]["fp8_attention"] is False


@pytest.mark.parametrize("cluster, precision, message", [
    ("dgx-h100", Precision.FP8, "exists for B200, B300, GB200 and GB300 only, not H100-SXM5-80GB"),
    ("dgx-b200", Precision.BF16, "runs inside an FP8 or FP4 recipe"),
])
def test_api_refuses_fp8_attention_it_cannot_price(cluster, precision, message):
    import autoshard
    from autoshard.errors import SpecError

    c = autoshard.load_cluster(cluster).with_gpus(8)
    job = autoshard.train_job(LLAMA8, seq_len=8192, global_batch_size=16, precision=precision)
    with pytest.raises(SpecError, match=message) as err:
        autoshard.evaluate(LLAMA8, c, job, tp=1, pp=1, micro_batch_size=2, fp8_attention=True)
    assert err.value.source == "fp8_attention"
