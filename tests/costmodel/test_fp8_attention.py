"""FP8 attention (Transformer Engine's fp8_dot_product_attention under current scaling, TrainConfig.fp8_attention):
each fused kernel at its BF16 price less the time cuDNN's FP8 kernel saved in NVIDIA's measurement at its
length, plus the Q/K/V and dO casts, on the GPUs NVIDIA measured; refused elsewhere, at unmeasured head
dimensions and outside FP8/FP4 precision."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoshard.costmodel.attention import (
    FP8_ATTENTION_DO_BYTES,
    FP8_ATTENTION_KERNELS,
    FP8_ATTENTION_QKV_BYTES,
    bench_flops,
    flash_attention_kernels_s,
    fp8_attention_kernel_s,
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

# the CSVs' own TFLOP/s columns (NVIDIA/cudnn-frontend 0b1577c8 sdpa_fp8_benchmark_results_NVIDIA_*.csv),
# an independent check of the times and of the FLOP convention: (gpu, length, column, TFLOP/s)
CSV_TFLOPS = [
    ("B200", 8192, "fp8 fwd", 1502.114), ("B200", 8192, "bf16 bwd", 994.850), ("B200", 2048, "bf16 fwd", 907.547),
    ("B200", 131072, "fp8 bwd", 1616.126), ("GB300", 16384, "fp8 fwd", 2266.632), ("GB300", 16384, "bf16 bwd", 1290.765),
    ("GB300", 4096, "bf16 fwd", 1445.205), ("GB300", 65536, "fp8 bwd", 1953.110),
]


@pytest.mark.parametrize("gpu, length, column, tflops", CSV_TFLOPS)
def test_kernel_times_reproduce_the_csvs_tflops(gpu: str, length: int, column: str, tflops: float) -> None:
    """Forward FLOPs 4 s^2 x 128 heads x 128 / 2 (causal) over the stored milliseconds give the CSV's TFLOP/s
    (its backward column counts 2.5 x the forward FLOPs) within what the times' 3 decimals carry."""
    f8, f16, b8, b16 = fp8_attention_kernel_s(gpu, length)
    per_flop = {"fp8 fwd": f8, "bf16 fwd": f16, "fp8 bwd": b8 / 2.5, "bf16 bwd": b16 / 2.5}[column]
    assert 1 / per_flop / 1e12 == pytest.approx(tflops, rel=4e-3)


def test_tables_are_whole_and_fp8_throughput_rises_with_length() -> None:
    """Nine lengths, 512 to 131,072, per table; the FP8 forward kernel's throughput rises with length up to
    65,536 tokens on both GPUs, as a measurement of a fixed-work-per-tile kernel does."""
    assert set(FP8_ATTENTION_KERNELS) == {"B200", "GB300"}
    for name, table in FP8_ATTENTION_KERNELS.items():
        assert [row[0] for row in table] == [512 << k for k in range(9)], name
        rates = [bench_flops(row[0]) / row[1] for row in table if row[0] <= 65536]
        assert rates == sorted(rates), name


def test_interpolation_and_gpu_mapping() -> None:
    """Linear in log(length): the geometric midpoint takes the mean per-FLOP time; beyond the ends the end
    values hold. GB200 runs B200's table (the same GPU), B300 GB300's."""
    mid = fp8_attention_kernel_s("GB300-288GB", math.sqrt(4096 * 8192))
    lo, hi = fp8_attention_kernel_s("GB300-288GB", 4096), fp8_attention_kernel_s("GB300-288GB", 8192)
    assert mid == pytest.approx(tuple((a + b) / 2 for a, b in zip(lo, hi, strict=True)), rel=1e-12)
    assert fp8_attention_kernel_s("B200", 100) == fp8_attention_kernel_s("B200", 512)
    assert fp8_attention_kernel_s("B200", 1 << 20) == fp8_attention_kernel_s("B200", 131072)
    assert fp8_attention_kernel_s("GB200-186GB", 8192) == fp8_attention_kernel_s("B200-SXM-180GB", 8192)
    assert fp8_attention_kernel_s("B300-SXM-288GB", 8192) == fp8_attention_kernel_s("GB300-288GB", 8192)
    f8, f16, b8, b16 = fp8_attention_kernel_s("B200", 8192)
    assert (f8 / f16, b8 / b16) == pytest.approx((1.464 / 1.589, 4.382 / 5.526), rel=1e-12)
    assert fp8_attention_kernel_s("B200", 512)[0] > fp8_attention_kernel_s("B200", 512)[1]  # FP8 slower at 512


def test_unmeasured_gpu_and_head_dimension_are_refused() -> None:
    with pytest.raises(ValueError, match="no kernel measurement on H100-SXM5-80GB"):
        fp8_attention_kernel_s("H100-SXM5-80GB", 8192)
    for name, dims in (("deepseek-v3", "192 / 128 \\(MLA\\)"), ("nemotron-4-340b", "192 / 192")):
        with pytest.raises(ValueError, match=f"measured at head dimension 128 only; {name} has {dims}"):
            fp8_attention_s(load_model(name), tokens=4096, seq_len=4096, dims=ParallelDims(), gpu=B200)


def test_fp8_attention_closed_form_one_kernel() -> None:
    """Llama-3.1-8B, one 8,192-token sequence on one GB300, TP 1: forward = the BF16 price less the measured
    forward saving per FLOP x the kernel's FLOPs (Llama 8B's 32 heads: a quarter of the benchmark's 128) + 9 B
    x (Q + K + V) elements; backward = 2.5 x the BF16 price less the measured backward saving + 5 B x dO."""
    dims = ParallelDims()
    bf16 = attention_time_s(LLAMA8, tokens=8192, seq_len=8192, dims=dims, gpu=GB300)
    flops = bench_flops(8192) * 32 / 128
    fwd_saved = (1.281 - 1.060) * 1e-3 / 4  # the GB300 row at 8,192, 32 of 128 heads
    bwd_saved = (4.778 - 3.632) * 1e-3 / 4
    hbm = GB300.hbm_tbps * 1e12 * GB300.efficiency.hbm
    qkv = 8192 * (32 * 128 + 8 * 128 + 8 * 128)
    d_out = 8192 * 32 * 128
    fwd, bwd = fp8_attention_s(LLAMA8, tokens=8192, seq_len=8192, dims=dims, gpu=GB300)
    assert (FP8_ATTENTION_QKV_BYTES, FP8_ATTENTION_DO_BYTES) == (9.0, 5.0)
    assert [k[1:] for k in flash_attention_kernels_s(LLAMA8, tokens=8192, seq_len=8192, dims=dims, gpu=GB300)] == [
        (8192.0, pytest.approx(flops, rel=1e-12))]
    assert fwd == pytest.approx(bf16 - fwd_saved + 9.0 * qkv / hbm, rel=1e-9)
    assert bwd == pytest.approx(2.5 * bf16 - bwd_saved + 5.0 * d_out / hbm, rel=1e-9)


def test_never_faster_than_the_measured_fp8_kernel() -> None:
    """On a GPU whose fitted BF16 attention were faster than cuDNN's measured FP8 kernel (attention at 100 %
    of peak), the FP8 price is the measured FP8 kernel's time for those FLOPs, not below it."""
    fast = B200.model_copy(update={"efficiency": B200.efficiency.model_copy(update={"attention": 1.0})})
    flops = bench_flops(8192) * 32 / 128
    fwd, bwd = fp8_attention_s(LLAMA8, tokens=8192, seq_len=8192, dims=ParallelDims(), gpu=fast)
    hbm = fast.hbm_tbps * 1e12 * fast.efficiency.hbm
    assert fwd - 9.0 * 8192 * 48 * 128 / hbm == pytest.approx(1.464e-3 / 4, rel=1e-9)
    assert bwd - 5.0 * 8192 * 32 * 128 / hbm == pytest.approx(4.382e-3 / 4, rel=1e-9)
    assert flops > 0


def test_ring_kernels_take_the_saving_at_their_own_length() -> None:
    """Under CP 4 the rank runs one causal kernel of s/4 keys and three unmasked ones of s/8: each saves what
    the measurement saved at its own length per FLOP (on B200 the 1,024-key kernels run slower in FP8)."""
    dims = ParallelDims(cp=4)
    tokens = 8192 // 4
    kernels = flash_attention_kernels_s(LLAMA8, tokens=tokens, seq_len=8192, dims=dims, gpu=B200)
    assert [k[1] for k in kernels] == [b[1] for b in ring_attention_blocks(8192, 4)] == [2048, 1024, 1024, 1024]
    want = 0.0
    for s, length, flops in kernels:
        f8, f16, _, _ = fp8_attention_kernel_s(B200.name, length)
        want += max(s - flops * (f16 - f8), flops * f8)
    hbm = B200.hbm_tbps * 1e12 * B200.efficiency.hbm
    fwd, _ = fp8_attention_s(LLAMA8, tokens=tokens, seq_len=8192, dims=dims, gpu=B200)
    assert fwd == pytest.approx(want + 9.0 * tokens * 48 * 128 / hbm, rel=1e-12)
    f8, f16, _, _ = fp8_attention_kernel_s(B200.name, 1024)
    assert f8 > f16


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
    assert 0.02 < saved / base.step_time_s < 0.06  # a few per cent of this 8B step


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


@pytest.mark.parametrize("model, cluster, precision, message", [
    ("llama-3.1-8b", "dgx-h100", Precision.FP8, "exists for B200, B300, GB200 and GB300 only, not H100-SXM5-80GB"),
    ("llama-3.1-8b", "dgx-b200", Precision.BF16, "runs inside an FP8 or FP4 recipe"),
    ("nemotron-4-340b", "dgx-b200", Precision.FP8, "measured at head dimension 128 only; nemotron-4-340b has 192"),
])
def test_api_refuses_fp8_attention_it_cannot_price(model, cluster, precision, message):
    import autoshard
    from autoshard.errors import SpecError

    m = load_model(model)
    c = autoshard.load_cluster(cluster).with_gpus(8)
    job = autoshard.train_job(m, seq_len=8192, global_batch_size=16, precision=precision)
    with pytest.raises(SpecError, match=message) as err:
        autoshard.evaluate(m, c, job, tp=1, pp=1, micro_batch_size=2, fp8_attention=True)
    assert err.value.source == "fp8_attention"


def test_module_recompute_without_the_attention_core_takes_the_fp8_forward_back() -> None:
    """Selective recompute of modules that leave the attention core out (`--recompute-modules mlp`) subtracts
    the core's forward from the default selective recompute: the FP8 forward when attention runs in FP8."""
    from autoshard.costmodel.train.recompute import module_recompute

    kw = dict(gpu=B200, dims=ParallelDims(dp=8), micro_batch_size=1, seq_len=8192, sequence_parallel=False,
              precision=Precision.FP8)
    bf16 = module_recompute(LLAMA8, LayerKind.DENSE, ("mlp",), **kw)
    fp8 = module_recompute(LLAMA8, LayerKind.DENSE, ("mlp",), fp8_attention=True, **kw)
    a = attention_time_s(LLAMA8, tokens=8192, seq_len=8192, dims=ParallelDims(dp=8), gpu=B200, precision=Precision.FP8)
    f, b = fp8_attention_s(LLAMA8, tokens=8192, seq_len=8192, dims=ParallelDims(dp=8), gpu=B200)
    assert fp8.extra_s - bf16.extra_s == pytest.approx(a - f, rel=1e-9)
    # on B200 at 8,192 tokens the forward's Q/K/V casts (9 B each) cost more than the kernel saves
    # (0.125 ms of 1.589 at 128 heads); the backward's saving (1.144 ms) pays for it
    assert f > a and f + b < 3.5 * a
