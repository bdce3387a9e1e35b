"""The weight-gradient GEMM accumulates into the main gradient (#10): Transformer Engine's fused wgrad
accumulation has cuBLAS read and write the k x n main gradient in its epilogue, 2 x 4 B per weight
element with Megatron's FP32 main grads, which binds when the contraction (an expert's rows) is short."""

from __future__ import annotations

import pytest

from autoshard.costmodel.compute import gemm_time_s, layer_compute_time, wgrad_shape, wgrad_time_s
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import Gemm, layer_gemms
from autoshard.costmodel.train.layer import _main_grad_bytes
from autoshard.costmodel.train.memory import TrainFramework
from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs import EfficiencySpec, LayerKind, Precision, load_cluster, load_model

H100 = load_cluster("dgx-h100").primary.gpu
# H100 at 0.6 of its 989 TFLOP/s and of its 3.35 TB/s, shape half-point 128, 4 us per kernel
GPU = H100.model_copy(update={"efficiency": EfficiencySpec(
    gemm=0.6, hbm=0.6, gemm_half_dim=128.0, kernel_overhead_us=4.0,
    train_gemm=None, train_gemm_fp8=None, train_hbm=None)})


def test_a_short_contraction_streams_the_fp32_main_grad():
    # Qwen3-235B expert fc1 (h 4096 -> 2 x 1536 gated) with 512 rows, 16 local experts
    g = Gemm(512, 3072, 4096, 16)
    math_s = 2 * 512 * 3072 * 4096 / (989e12 * 0.6 * 512 / (512 + 128))  # 27.1 us
    # read X (512 x 4096) and dY (512 x 3072) in BF16, read + write the 4096 x 3072 FP32 main grad
    mem_s = (512 * 4096 * 2 + 512 * 3072 * 2 + 2 * 4096 * 3072 * 4) / (3.35e12 * 0.6)  # 53.7 us
    assert mem_s > 1.9 * math_s
    assert wgrad_time_s(g, GPU, Precision.BF16, 4) == pytest.approx(16 * (mem_s + 4e-6), rel=1e-12)
    # the forward reads the weight once, math-bound: the wgrad costs twice the forward here
    assert gemm_time_s(g, GPU, Precision.BF16) == pytest.approx(16 * (math_s + 4e-6), rel=1e-12)
    # a BF16 main grad (--grad-reduce-in-bf16) moves half the epilogue bytes
    mem_bf16 = (512 * 4096 * 2 + 512 * 3072 * 2 + 2 * 4096 * 3072 * 2) / (3.35e12 * 0.6)
    assert wgrad_time_s(g, GPU, Precision.BF16, 2) == pytest.approx(16 * (mem_bf16 + 4e-6), rel=1e-12)


def test_a_long_contraction_keeps_the_wgrad_at_the_forward_time():
    # 4,096 rows: 2*m*n*k FLOPs over 8*k*n epilogue bytes is ~m/4 = 1,024 FLOP/B, past the ridge
    g = Gemm(4096, 3072, 4096)
    assert wgrad_time_s(g, GPU, Precision.BF16, 4) == gemm_time_s(g, GPU, Precision.BF16)


def test_fp8_wgrad_reads_one_byte_inputs_and_the_fp32_main_grad():
    g = Gemm(1024, 4096, 4096)
    math_s = 2 * 1024 * 4096 * 4096 / (1979e12 * 0.6 * 1024 / (1024 + 128))
    mem_s = (1024 * 4096 + 1024 * 4096 + 2 * 4096 * 4096 * 4) / (3.35e12 * 0.6)
    assert wgrad_time_s(g, GPU, Precision.FP8, 4) == pytest.approx(max(math_s, mem_s) + 4e-6, rel=1e-12)


def test_the_layer_backward_takes_each_wgrad_in_place_of_a_forward():
    model = load_model("qwen3-235b-a22b")
    dims = ParallelDims(tp=4, pp=8, dp=8, ep=8, etp=1)
    kw = dict(gpu=H100, dims=dims, micro_batch_size=1, seq_len=4096, precision=Precision.BF16,
              recompute=Recompute.NONE, sequence_parallel=True)
    plain = layer_compute_time(model, LayerKind.MOE, **kw)
    fused = layer_compute_time(model, LayerKind.MOE, main_grad_bytes=4, **kw)
    gpu = training_gpu(H100)
    gemms = layer_gemms(model, LayerKind.MOE, tokens=4096, dims=dims)
    def extra(gs):  # the wgrad into the main gradient instead of one written like a forward at its shape
        return sum(wgrad_time_s(g, gpu, Precision.BF16, 4) - gemm_time_s(wgrad_shape(g, gpu), gpu, Precision.BF16)
                   for g in gs)

    excess = extra(gemms)
    assert fused.forward_s == plain.forward_s
    assert fused.backward_s == pytest.approx(plain.backward_s + excess, rel=1e-12)
    # the 16 local experts' 512-row wgrads carry nearly all of it (0.73 ms a layer and micro-batch; 0.67 before
    # README item AF's refit priced H100's BF16 GEMMs at 0.60 of peak, which leaves the main gradient's traffic)
    experts = extra(gemms[-2:])
    assert experts == pytest.approx(0.73e-3, rel=0.02) and experts > 0.95 * excess


@pytest.mark.parametrize(("framework", "fp32", "expected"), [
    (TrainFramework.MEGATRON, True, 4),  # --accumulate-allreduce-grads-in-fp32, Megatron's BF16 default
    (TrainFramework.MEGATRON, False, 2),  # --grad-reduce-in-bf16
    (TrainFramework.NEMO, True, 4),
    (TrainFramework.FSDP, True, None),  # PyTorch FSDP: the wgrad writes a fresh BF16 gradient
    (TrainFramework.TORCHTITAN, True, None),
])
def test_which_frameworks_accumulate_in_the_wgrad(framework, fp32, expected):
    cfg = TrainConfig(dims=ParallelDims(tp=1, pp=1, dp=8), micro_batch_size=1, global_batch_size=8,
                      seq_len=4096, framework=framework, grad_reduce_fp32=fp32)
    assert _main_grad_bytes(cfg) == expected
