"""NVFP4 training (Precision.FP4: Transformer Engine's NVFP4BlockScaling, Megatron --fp4-format e2m1):
which GPUs may run it, what its GEMMs, casts, weight copies and saved activations cost, which peak its
MFU is stated against, and that the CP-SAT objective still equals `predict_train` for FP4 plans."""

from __future__ import annotations

import dataclasses

import pytest

from autoshard.costmodel.compute import gemm_time_s, layer_compute_time
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import Gemm, layer_gemms
from autoshard.costmodel.fp8 import NVFP4_CAST_BYTES, NVFP4_WEIGHT_CACHE_BYTES, nvfp4_quantize_s
from autoshard.costmodel.train.memory import layer_activation_bytes
from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import TrainConfig
from autoshard.emit.megatron.layout import default_stages
from autoshard.errors import SpecError
from autoshard.parallel import ParallelDims, Recompute, check_dims
from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train
from autoshard.specs import LayerKind, Precision, TrainJob, load_cluster, load_model
from autoshard.specs.prepare import check_precision
from conftest import layout_objectives, tiny_model

LLAMA8 = load_model("llama-3.1-8b")
B200_CLUSTER = load_cluster("dgx-b200")
B200 = training_gpu(B200_CLUSTER.primary.gpu)
DECODER_PARAMS = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096)
"""Llama-3.1-8B's decoder layers: QKV, proj and the three MLP weights, and the two norm weights (2 h, 0.004 %),
as the weight copies and the weight cast count them."""


def _hbm(gpu) -> float:
    return gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm


def test_nvfp4_bytes_closed_forms():
    """E2M1 is half a byte; one E4M3 scale per 16 values adds 1/16. TE keeps a rowwise and a columnwise
    copy (2 x 0.5625 = 1.125 B); a cast reads the BF16 tensor twice (amax, then cast: 4 B) and writes both."""
    assert Precision.FP4.gemm_operand_bytes == 0.5625
    assert Precision.FP8.gemm_operand_bytes == 1.0 and Precision.BF16.gemm_operand_bytes == 2.0
    assert NVFP4_WEIGHT_CACHE_BYTES == 1.125
    assert NVFP4_CAST_BYTES == 5.125
    assert Precision.FP4.quantized and Precision.FP8.quantized and not Precision.BF16.quantized


def test_large_gemm_runs_at_the_fp4_peak_and_reads_half_bytes():
    """A math-bound 16k GEMM: NVFP4 at 9 PFLOP/s dense on B200 is exactly twice FP8's 4.5, at the same
    fraction of peak (`gemm_fp8`); a memory-bound one moves 0.5625 B per operand element instead of 1."""
    big = Gemm(16384, 16384, 16384)
    fp8 = gemm_time_s(big, B200, Precision.FP8)
    fp4 = gemm_time_s(big, B200, Precision.FP4)
    overhead = B200.efficiency.kernel_overhead_us * 1e-6
    assert (fp8 - overhead) / (fp4 - overhead) == pytest.approx(2.0, rel=1e-9)
    # a GEMV-like shape (m = 1) on a GPU whose GEMMs hold full speed at any shape is bound by reading
    # the operands: 0.5625 B vs 1 B per element of X and W, the BF16 output alike
    flat = B200.model_copy(update={"efficiency": B200.efficiency.model_copy(update={"gemm_half_dim": 0.0})})
    thin = Gemm(1, 16384, 16384)
    ratio = (gemm_time_s(thin, flat, Precision.FP4) - overhead) / (gemm_time_s(thin, flat, Precision.FP8) - overhead)
    assert ratio == pytest.approx((16384 * 0.5625 + 16384**2 * 0.5625 + 16384 * 2) /
                                  (16384 * 1.0 + 16384**2 * 1.0 + 16384 * 2), rel=1e-9)
    # the router and output layer stay BF16 under FP4 as under FP8
    router = Gemm(8192, 128, 4096, fp8_capable=False)
    assert gemm_time_s(router, B200, Precision.FP4) == gemm_time_s(router, B200, Precision.BF16)


def test_nvfp4_quantizes_every_operand_at_its_cast_bytes():
    """Llama-3.1-8B at TP 1: 26,624 input and 43,008 output-gradient elements per token (the FP8 test's
    count), each at 5.125 B; in a layer's forward/backward the difference to BF16 is exactly those casts
    plus the GEMMs."""
    tokens = 8192
    gemms = layer_gemms(LLAMA8, LayerKind.DENSE, tokens=tokens, dims=ParallelDims())
    fwd, bwd = nvfp4_quantize_s(gemms, B200)
    assert fwd == pytest.approx(5.125 * tokens * 26624 / _hbm(B200))
    assert bwd == pytest.approx(5.125 * tokens * 43008 / _hbm(B200))
    kw = dict(dims=ParallelDims(), micro_batch_size=1, seq_len=8192, recompute=Recompute.NONE, sequence_parallel=False)
    fp4 = layer_compute_time(LLAMA8, LayerKind.DENSE, gpu=B200_CLUSTER.primary.gpu, precision=Precision.FP4, **kw)
    gemm_fp4 = sum(gemm_time_s(g, B200, Precision.FP4) for g in gemms)
    gemm_bf16 = sum(gemm_time_s(g, B200, Precision.BF16) for g in gemms)
    bf16 = layer_compute_time(LLAMA8, LayerKind.DENSE, gpu=B200_CLUSTER.primary.gpu, precision=Precision.BF16, **kw)
    assert fp4.forward_s - bf16.forward_s == pytest.approx(gemm_fp4 - gemm_bf16 + fwd, rel=1e-9)


def test_saved_gemm_inputs_shrink_to_nvfp4():
    """The FP8 rule (TE keeps each quantized GEMM input for its wgrad in the quantized form) at 0.5625 B:
    Llama-3.1-8B keeps h + h + h (QKV and MLP inputs, attention output) + ffn (down-projection input)
    elements per token in that form, so FP4 saves (1 - 0.5625) B less than FP8 on each."""
    kw = dict(dims=ParallelDims(), micro_batch_size=1, seq_len=8192, recompute=Recompute.NONE, sequence_parallel=False)
    fp8 = layer_activation_bytes(LLAMA8, LayerKind.DENSE, fp8=True, **kw)
    fp4 = layer_activation_bytes(LLAMA8, LayerKind.DENSE, fp4=True, **kw)
    h, ffn = 4096, 14336
    assert fp8 - fp4 == pytest.approx(8192 * (1 - 0.5625) * (3 * h + ffn))


def test_fp4_needs_fp4_tensor_cores():
    check_precision(B200_CLUSTER, Precision.FP4)
    check_precision(load_cluster("gb300-nvl72"), Precision.FP4)
    for name in ("dgx-h100", "dgx-h200", "mi300x", "dgx-a100-80gb"):
        with pytest.raises(SpecError, match="FP4 .*needs FP4 tensor cores.*train in fp8 or bf16") as err:
            check_precision(load_cluster(name), Precision.FP4)
        assert err.value.source == "--precision"
    assert check_dims(ParallelDims(), LLAMA8, seq_len=8192, precision=Precision.FP4) == []
    odd = LLAMA8.model_copy(update={"hidden_size": 4104})
    assert "FP4 GEMMs need hidden_size divisible by 16" in check_dims(
        ParallelDims(), odd, seq_len=8192, precision=Precision.FP4)


def _cfg(precision: Precision, **dims) -> TrainConfig:
    return TrainConfig(dims=ParallelDims(**dims), micro_batch_size=1, global_batch_size=64, seq_len=8192,
                       precision=precision, recompute=Recompute.NONE, sequence_parallel=True, zero_stage=1)


def test_prediction_states_the_fp4_peak_and_charges_casts_and_copies():
    """A Llama-3.1-8B FP4 step on 8 B200: MFU against the 9,000 TFLOP/s FP4 peak, faster than FP8 and
    slower than twice as fast (attention, norms and casts do not shrink); the weights hold the BF16 params
    plus 1.125 B of NVFP4 copies per decoder GEMM weight."""
    cfg4, cfg8 = _cfg(Precision.FP4, dp=8), _cfg(Precision.FP8, dp=8)
    stages = default_stages(LLAMA8, pp=1)
    p4 = predict_train(LLAMA8, B200_CLUSTER, cfg4, stages)
    p8 = predict_train(LLAMA8, B200_CLUSTER, cfg8, stages)
    assert p4.mfu_peak == "fp4 dense" and p8.mfu_peak == "fp8 dense"
    assert p4.tflops_per_gpu / p4.mfu == pytest.approx(9000, rel=1e-9)
    assert p8.step_time_s / 2 < p4.step_time_s < p8.step_time_s
    bf16 = predict_train(LLAMA8, B200_CLUSTER, _cfg(Precision.BF16, dp=8), stages)
    assert p4.memory.weights - bf16.memory.weights == pytest.approx(1.125 * DECODER_PARAMS, rel=1e-6)
    assert p4.time.compute > 0 and p4.time.bubble == pytest.approx(0.0, abs=1e-12)


MODEL = tiny_model(layers=8, hidden=4096, heads=32, kv=8)


def test_solver_objective_equals_the_fp4_step():
    """Every candidate and layout of a small FP4 job on a B200-like pool: the CP-SAT objective equals
    `predict_train` within the tables' microsecond rounding (the FP4 weight cast rides the tail column)."""
    cluster = B200_CLUSTER.with_gpus(8)
    job = TrainJob(seq_len=512, global_batch_size=8, precision=Precision.FP4)
    space = enumerate_train(MODEL, cluster, job, pins=Pins(), options=SpaceOptions(max_micro_batch=1, max_vpp=2))
    checked = pipelined = 0
    for cfg in space.candidates:
        assert cfg.precision is Precision.FP4
        for c, stages, got in layout_objectives(MODEL, cluster, cfg):
            pred = predict_train(MODEL, cluster, c, stages)
            assert abs(got / pred.step_time_s - 1) <= 5e-3, (cfg.dims, got, pred.step_time_s)
            checked += 1
            pipelined += c.dims.pp > 1
    assert checked > 50 and pipelined > 20


def test_fp4_cast_is_charged_once_per_step_per_chunk():
    """The once-per-step NVFP4 weight cast: 5.125 B per decoder GEMM weight at the step's HBM knob,
    in the step as compute (P = 1)."""
    cfg = _cfg(Precision.FP4, dp=8)
    stages = default_stages(LLAMA8, pp=1)
    pred = predict_train(LLAMA8, B200_CLUSTER, cfg, stages)
    no_cast = predict_train(LLAMA8, B200_CLUSTER, dataclasses.replace(cfg, global_batch_size=128), stages)
    cast = 5.125 * DECODER_PARAMS / _hbm(B200)
    # twice the micro-batches: everything per micro-batch doubles, the cast does not
    assert 2 * pred.time.compute - no_cast.time.compute == pytest.approx(cast, rel=1e-6)
