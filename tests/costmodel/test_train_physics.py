"""Training physics added for cost model v2: FP8 activations and casts, BF16 gradients and FP8
parameter gathers, MoE recompute, the sequence-length dependence of fused attention."""

from __future__ import annotations

import dataclasses

import pytest

from autoshard.costmodel.compute import attention_time_s, layer_compute_time
from autoshard.costmodel.fp8 import fp8_cast_bytes_per_element
from autoshard.costmodel.train.memory import ParamShards, layer_activation_bytes, model_state_bytes
from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import TrainConfig
from autoshard.emit.megatron.layout import default_stages
from autoshard.parallel import Fp8Recipe, ParallelDims, Recompute
from autoshard.specs import EfficiencySpec, LayerKind, ModelSpec, Precision, load_cluster, load_model
from autoshard.specs.cluster import TRAIN_KNOBS

LLAMA70 = load_model("llama-3.1-70b")
QWEN = load_model("qwen3-235b-a22b")
H100 = load_cluster("dgx-h100").with_gpus(64)


def test_fp8_keeps_gemm_inputs_in_one_byte():
    """Llama-3.1-70B, TP 1, per token: BF16 saves 4h (two norm inputs, QKV and MLP inputs) x 2 B,
    Q + K + V + attention output, and SwiGLU gate, up and down-projection inputs. FP8 keeps the QKV
    and MLP inputs, the attention output and the down-projection input in 1 B."""
    h, ffn, d, heads, kv = 8192, 28672, 128, 64, 8
    kw = dict(dims=ParallelDims(), micro_batch_size=1, seq_len=8192, recompute=Recompute.NONE, sequence_parallel=False)
    bf16 = layer_activation_bytes(LLAMA70, LayerKind.DENSE, **kw) / 8192
    fp8 = layer_activation_bytes(LLAMA70, LayerKind.DENSE, fp8=True, **kw) / 8192
    assert bf16 == 2 * (4 * h + heads * d + 2 * kv * d + heads * d + 3 * ffn)
    assert bf16 - fp8 == 2 * h + heads * d + ffn


def test_bf16_gradients_and_fp8_weights_halve_their_bytes():
    shards = ParamShards(dense=1e9, expert=0.0)
    dims = ParallelDims(dp=8)
    base = model_state_bytes(shards, dims=dims, zero_stage=1)
    lean = model_state_bytes(shards, dims=dims, zero_stage=1, grad_fp32=False, fp8_params=True)
    assert (base.weights, base.grads) == (2e9, 4e9)
    assert (lean.weights, lean.grads) == (1e9, 2e9)
    assert lean.optimizer == base.optimizer == 12e9 / 8


def test_bf16_gradients_shorten_the_data_parallel_tail():
    cfg = dict(dims=ParallelDims(tp=8, pp=1, dp=8), micro_batch_size=1, global_batch_size=8, seq_len=8192,
               overlap_grad_reduce=False)
    stages = default_stages(LLAMA70, pp=1)
    fp32 = predict_train(LLAMA70, H100, TrainConfig(**cfg), stages)
    bf16 = predict_train(LLAMA70, H100, TrainConfig(grad_reduce_fp32=False, **cfg), stages)
    assert bf16.time.dp_comm_exposed < fp32.time.dp_comm_exposed
    assert bf16.time.compute == pytest.approx(fp32.time.compute)


def test_fp8_recipes_cast_costs():
    assert fp8_cast_bytes_per_element(Fp8Recipe.DELAYED) == 3.0  # read BF16, write FP8
    assert fp8_cast_bytes_per_element(Fp8Recipe.TENSORWISE) == 5.0  # + the amax read pass
    assert fp8_cast_bytes_per_element(Fp8Recipe.BLOCKWISE) == 4.0  # + the column-wise copy
    assert fp8_cast_bytes_per_element(Fp8Recipe.MXFP8) == pytest.approx(4.0625)  # + E8M0 scales per 32
    # TN-only FP8 GEMMs (Hopper): per-tensor recipes also write the transposed copy; the others always do
    assert fp8_cast_bytes_per_element(Fp8Recipe.DELAYED, transpose=True) == 4.0
    assert fp8_cast_bytes_per_element(Fp8Recipe.TENSORWISE, transpose=True) == 6.0
    assert fp8_cast_bytes_per_element(Fp8Recipe.BLOCKWISE, transpose=True) == 4.0
    assert fp8_cast_bytes_per_element(Fp8Recipe.MXFP8, transpose=True) == pytest.approx(4.0625)
    gpu = H100.primary.gpu
    kw = dict(gpu=gpu, dims=ParallelDims(tp=4), micro_batch_size=1, seq_len=8192, precision=Precision.FP8,
              recompute=Recompute.NONE, sequence_parallel=True)
    delayed = layer_compute_time(LLAMA70, LayerKind.DENSE, fp8_recipe=Fp8Recipe.DELAYED, **kw)
    current = layer_compute_time(LLAMA70, LayerKind.DENSE, fp8_recipe=Fp8Recipe.TENSORWISE, **kw)
    assert current.forward_s > delayed.forward_s


def test_moe_recompute_keeps_only_the_block_input_and_reruns_the_experts():
    kw = dict(dims=ParallelDims(tp=4, ep=8, etp=1, dp=8), micro_batch_size=1, seq_len=4096, recompute=Recompute.NONE,
              sequence_parallel=True)
    full = layer_activation_bytes(QWEN, LayerKind.MOE, **kw)
    lean = layer_activation_bytes(QWEN, LayerKind.MOE, recompute_moe=True, **kw)
    moe = QWEN.moe
    routed = moe.top_k / 4 * (2 * 4096 + 2 * 3 * moe.expert_ffn_hidden_size)  # per token: pairs x (input + SwiGLU)
    assert full - lean == pytest.approx(4096 * (routed + 4 * moe.num_experts))
    gpu = H100.primary.gpu
    ckw = dict(gpu=gpu, dims=kw["dims"], micro_batch_size=1, seq_len=4096, precision=Precision.BF16,
               recompute=Recompute.NONE, sequence_parallel=True)
    assert layer_compute_time(QWEN, LayerKind.MOE, recompute_moe=True, **ckw).recompute_s > 0
    assert layer_compute_time(QWEN, LayerKind.MOE, **ckw).recompute_s == 0


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP8])
def test_recompute_modules_moe_is_the_moe_recompute(precision):
    """One mechanism: `--recompute-modules moe` (selective, without core_attn) costs a Qwen3-235B MoE
    layer exactly what the block recompute adds to a layer without recompute -- the MoE block's
    forward once more, its saved activations gone, the dispatch and combine once more."""
    from autoshard.costmodel.train.layer import layer_cost

    # the recompute's own price: the layer on a host that keeps up (at EP 8 its 16 local experts wait on H100's
    # fitted host floor, README item AC, which hides the GPU time the recompute adds)
    pool = H100.primary.model_copy(update={"gpu": H100.primary.gpu.model_copy(update={
        "efficiency": H100.primary.gpu.efficiency.model_copy(update={"train_expert_host_us": 0.0})})})
    dims = ParallelDims(tp=4, dp=2, ep=8, etp=1)
    none = TrainConfig(dims=dims, micro_batch_size=1, global_batch_size=8, seq_len=4096, precision=precision)
    moe = dataclasses.replace(none, recompute=Recompute.SELECTIVE, recompute_modules=("moe",))
    base = layer_cost(QWEN, LayerKind.MOE, pool, none, Recompute.NONE)
    mine = layer_cost(QWEN, LayerKind.MOE, pool, moe, Recompute.SELECTIVE)
    ckw = dict(gpu=pool.gpu, dims=dims, micro_batch_size=1, seq_len=4096, precision=precision,
               recompute=Recompute.NONE, sequence_parallel=True)
    assert mine.recompute_s == pytest.approx(
        layer_compute_time(QWEN, LayerKind.MOE, recompute_moe=True, **ckw).recompute_s, rel=1e-9)
    akw = dict(dims=dims, micro_batch_size=1, seq_len=4096, recompute=Recompute.NONE, sequence_parallel=True,
               fp8=precision is Precision.FP8)
    assert mine.activation_bytes == pytest.approx(
        layer_activation_bytes(QWEN, LayerKind.MOE, recompute_moe=True, **akw), rel=1e-9)
    assert mine.ep_comm_s == pytest.approx(1.5 * base.ep_comm_s, rel=1e-9)  # 3 passes instead of 2
    assert mine.compute_s == pytest.approx(base.compute_s, rel=1e-9)


def test_attention_efficiency_grows_with_sequence_length():
    """attention is the efficiency at 4,096 tokens; with attention_half_seq s0 it scales as
    s/(s+s0) relative to 4,096, capped at 1."""
    gpu = H100.primary.gpu.model_copy(update={"efficiency": EfficiencySpec(attention=0.25, attention_half_seq=4096)})
    model = ModelSpec.model_validate({
        "name": "m", "hidden_size": 4096, "ffn_hidden_size": 16384, "num_attention_heads": 32, "vocab_size": 32000,
        "max_position_embeddings": 131072,
        "layers": [{"kind": "embedding"}, {"kind": "dense", "count": 1}, {"kind": "output"}],
    })

    def eff(s: int) -> float:
        flops = 2.0 * s * s * 32 * 256 * 0.5
        return flops / (attention_time_s(model, tokens=s, seq_len=s, dims=ParallelDims(), gpu=gpu) * 989e12)

    assert eff(4096) == pytest.approx(0.25)
    assert eff(131072) == pytest.approx(0.25 * (131072 / (131072 + 4096)) / 0.5)
    assert eff(1024) == pytest.approx(0.25 * 0.2 / 0.5)


def test_efficiency_source_says_fitted_or_borrowed():
    from autoshard.costmodel.efficiency import efficiency_source

    assert efficiency_source(load_cluster("dgx-h100").primary.gpu) == "fitted on 154 runs"  # 62 before item AG
    assert efficiency_source(load_cluster("dgx-a100-80gb").primary.gpu) == "fitted on 22 runs"
    assert efficiency_source(load_cluster("dgx-a100-40gb").primary.gpu) == "borrowed from A100-SXM4-80GB"
    # H200: 4 held runs, fewer than 5: the Hopper pool's fit (H100's 154 runs and its own 4)
    assert efficiency_source(load_cluster("dgx-h200").primary.gpu) == "borrowed from Hopper pool (H100-SXM5-80GB, H200-SXM-141GB)"
    # MI300X: no run of its own; its generation's pool is MI325X's runs (tests/validation/clusters/mi325x.yaml)
    assert efficiency_source(load_cluster("mi300x").primary.gpu) == "borrowed from CDNA 3 pool (MI325X-256GB)"
    # Blackwell: every type on its own runs; B300 (3 held runs, the pooled Blackwell fit, before MLPerf
    # v6.0's 8B NVFP4 runs) since its 13
    assert efficiency_source(load_cluster("dgx-b200").primary.gpu) == "fitted on 28 runs"
    assert efficiency_source(load_cluster("gb200-nvl72").primary.gpu) == "fitted on 53 runs"  # 29 before item AF
    assert efficiency_source(load_cluster("gb300-nvl72").primary.gpu) == "fitted on 23 runs"
    assert efficiency_source(load_cluster("dgx-b300").primary.gpu) == "fitted on 14 runs"


def test_prediction_names_its_mfu_peak_and_borrowed_efficiency():
    cfg = TrainConfig(dims=ParallelDims(tp=1, dp=8), micro_batch_size=1, global_batch_size=8, seq_len=8192,
                      precision=Precision.FP8)
    model = load_model("llama-3.1-8b")
    h100 = predict_train(model, load_cluster("dgx-h100").with_gpus(8), cfg, default_stages(model, pp=1))
    assert h100.mfu_peak == "fp8 dense" and h100.notes == ()
    assert h100.mfu == pytest.approx(h100.tflops_per_gpu / 1979)
    h200 = predict_train(model, load_cluster("dgx-h200").with_gpus(8), cfg, default_stages(model, pp=1))
    assert len(h200.notes) == 1 and "borrowed from Hopper pool (H100-SXM5-80GB, H200-SXM-141GB)" in h200.notes[0]
    a100 = predict_train(model, load_cluster("dgx-a100-80gb").with_gpus(8),
                         dataclasses.replace(cfg, precision=Precision.BF16), default_stages(model, pp=1))
    assert a100.mfu_peak == "bf16 dense" and a100.mfu == pytest.approx(a100.tflops_per_gpu / 312)


def test_tp_overlap_splits_gemms_as_userbuffers_do():
    """Llama-3.1-70B dense layer, TP 8, 4,096 tokens, no kernel overhead, no HBM bound: with
    --tp-comm-overlap QKV and FC1 run as 8 GEMMs of 512 rows (ring exchange), proj and FC2 as 4 of
    1,024 rows on 112 of 132 SMs (pipeline), and proj/FC2 dgrad as 8 of 512 rows. Transformer Engine
    issues the chunks round-robin on 3 compute streams, so 3 run at once: the device sees 3 x 512 =
    1,536-row GEMMs (ring) and 3,072-row ones (pipeline). At efficiency e(d) = 0.7 d / (d + 128) (d the
    smallest dimension; the smooth curve, not Hopper's measured table, to keep the closed form) a GEMM
    of F FLOPs takes F / (peak e(d))."""
    from autoshard.costmodel.compute import UB_MAX_STREAMS, UB_PIPELINE_SM_FRACTION, tp_overlap_gemm_extra_s
    from autoshard.costmodel.flops import layer_gemms

    eff = EfficiencySpec(kernel_overhead_us=0.0, hbm=1.0, **{"train_" + k: None for k in TRAIN_KNOBS})
    gpu = H100.primary.gpu.model_copy(update={"efficiency": eff, "hbm_tbps": 1e6})
    dims = ParallelDims(tp=8)
    gemms = layer_gemms(LLAMA70, LayerKind.DENSE, tokens=4096, dims=dims)
    peak = gpu.bf16_tflops * 1e12

    def t(flops: float, d: int) -> float:
        return flops / (peak * 0.7 * d / (d + 128))

    qkv, proj, fc1, fc2 = gemms
    assert proj.k == 1024 and fc2.k == 28672 // 8  # proj's smallest whole dimension is its k = 8192/8
    whole = {g: t(g.flops, min(g.m, g.n, g.k)) for g in gemms}
    assert UB_MAX_STREAMS == 3
    ring = {g: t(g.flops, min(3 * 512, g.n, g.k)) for g in gemms}
    piped = {g: t(g.flops, min(3 * 1024, g.n, g.k)) / UB_PIPELINE_SM_FRACTION for g in gemms}
    # one stream (the chunks one after another) would cost more: 512-row GEMMs fall down the curve
    assert t(qkv.flops, 512) > ring[qkv]
    fwd, bwd = tp_overlap_gemm_extra_s(LLAMA70, LayerKind.DENSE, gemms, gpu=gpu, tp=8, precision=Precision.BF16)
    assert fwd == pytest.approx(ring[qkv] - whole[qkv] + ring[fc1] - whole[fc1] + piped[proj] - whole[proj]
                                + piped[fc2] - whole[fc2], rel=1e-9)
    assert bwd == pytest.approx(ring[proj] - whole[proj] + ring[fc2] - whole[fc2], rel=1e-9)
    assert UB_PIPELINE_SM_FRACTION == pytest.approx(112 / 132)
    # the layer's compute carries it only with sequence parallelism and TP > 1
    kw = dict(gpu=gpu, micro_batch_size=1, seq_len=4096, precision=Precision.BF16, recompute=Recompute.NONE)
    on = layer_compute_time(LLAMA70, LayerKind.DENSE, dims=dims, sequence_parallel=True, tp_comm_overlap=True, **kw)
    off = layer_compute_time(LLAMA70, LayerKind.DENSE, dims=dims, sequence_parallel=True, **kw)
    assert on.forward_s - off.forward_s == pytest.approx(fwd) and on.backward_s - off.backward_s == pytest.approx(bwd)
    no_sp = layer_compute_time(LLAMA70, LayerKind.DENSE, dims=dims, sequence_parallel=False, tp_comm_overlap=True, **kw)
    assert no_sp.forward_s == pytest.approx(off.forward_s)
    tp1 = ParallelDims(tp=1)
    assert tp_overlap_gemm_extra_s(LLAMA70, LayerKind.EMBEDDING, [], gpu=gpu, tp=8, precision=Precision.BF16) == (0.0, 0.0)
    a = layer_compute_time(LLAMA70, LayerKind.DENSE, dims=tp1, sequence_parallel=True, tp_comm_overlap=True, **kw)
    b = layer_compute_time(LLAMA70, LayerKind.DENSE, dims=tp1, sequence_parallel=True, **kw)
    assert a == b


def test_pytorch_fsdp_keeps_fp32_shards_as_master():
    """PyTorch FSDP with a BF16 MixedPrecision policy, ZeRO-3 over 8 ranks, Adam: per parameter the
    FP32 shard (4 B), its FP32 gradient (4 B) and Adam's two moments (8 B), all over 8: 2 B per
    parameter, where Megatron's layout (BF16 weights, FP32 grads, FP32 master + moments) needs 18/8."""
    from autoshard.costmodel.train.memory import TrainFramework

    shards = ParamShards(dense=8e9, expert=0.0)
    dims = ParallelDims(dp=8)
    fsdp = model_state_bytes(shards, dims=dims, zero_stage=3, framework=TrainFramework.FSDP)
    mega = model_state_bytes(shards, dims=dims, zero_stage=3)
    assert (fsdp.weights, fsdp.grads, fsdp.optimizer) == (4e9, 4e9, 8e9)
    assert (mega.weights, mega.grads, mega.optimizer) == (2e9, 4e9, 12e9)
    # BF16 gradient reduction (Composer's PURE policy) changes the wire bytes, not the FP32 shard
    assert model_state_bytes(shards, dims=dims, zero_stage=3, framework=TrainFramework.FSDP, grad_fp32=False) == fsdp


def test_training_takes_its_own_compute_knobs_and_serving_keeps_the_shared_ones():
    """EfficiencySpec.train_*: the training step's GEMMs run at train_gemm, serving's at gemm. A
    large BF16 GEMM (8,192 cubed, no overhead) takes F / (peak x knob x fall-off): serving's smooth
    d/(d+128), training's measured Hopper table (1.0 at this shape)."""
    from autoshard.costmodel.compute import gemm_time_s
    from autoshard.costmodel.efficiency import training_gpu
    from autoshard.costmodel.flops import Gemm
    from autoshard.costmodel.gemm_shape import shape_table

    eff = EfficiencySpec(gemm=0.80, train_gemm=0.60, kernel_overhead_us=0.0)
    gpu = H100.primary.gpu.model_copy(update={"efficiency": eff})
    g = Gemm(8192, 8192, 8192)
    shape = 8192 / (8192 + 128)
    assert gemm_time_s(g, gpu, Precision.BF16) == pytest.approx(g.flops / (989e12 * 0.80 * shape))
    measured = shape_table("hopper").dense(8192, 8192, 8192, fp8=False)
    assert measured == pytest.approx(1.0, abs=0.01)
    assert gemm_time_s(g, training_gpu(gpu), Precision.BF16) == pytest.approx(g.flops / (989e12 * 0.60 * measured))
    assert training_gpu(gpu).efficiency.train_gemm is None  # applied once, idempotent
    assert training_gpu(training_gpu(gpu)) == training_gpu(gpu)
    neutral = gpu.model_copy(update={"efficiency": EfficiencySpec(**{"train_" + k: None for k in TRAIN_KNOBS})})
    assert training_gpu(neutral) is neutral
    # the bundled H100 ships the training refit; A100 files carry their own
    h100 = load_cluster("dgx-h100").primary.gpu
    a100 = load_cluster("dgx-a100-80gb").primary.gpu
    assert (training_gpu(h100).efficiency.gemm, h100.efficiency.gemm) == (0.60, 0.70)
    # H100 attention in training comes from kernel benchmarks (KERNEL_TRAIN_KNOBS), serving keeps its own
    assert (training_gpu(h100).efficiency.attention, training_gpu(h100).efficiency.attention_half_seq) == (0.45, 630.0)
    assert (h100.efficiency.attention, h100.efficiency.attention_half_seq) == (0.25, 4096.0)
    assert training_gpu(a100).efficiency.attention == 0.20 and a100.efficiency.attention == 0.30


def test_hopper_training_attention_comes_from_kernel_benchmarks():
    """KERNEL_TRAIN_KNOBS['hopper'] recomputed from cuDNN's fused attention on H100 SXM5 (head dim 128,
    BF16; FlashAttention-3 paper, Shah et al. 2024, Figs. 5-6): causal forward, non-causal forward and
    non-causal backward TFLOP/s at 1k-16k tokens. The causal backward is taken at the forward's causal /
    non-causal ratio; a training step runs forward and backward FLOPs at 1 : 2.5, so the blended speed
    is 3.5 / (1/fwd + 2.5/bwd). At 4,096 tokens that is 448 TFLOP/s, 0.45 of the 989 TFLOP/s peak, and
    the least-squares s0 of r(s) = s / (s + s0) over 1k-16k is 630 (the curve is flat beyond)."""
    import math
    import sys
    from pathlib import Path

    from autoshard.costmodel.efficiency import KERNEL_TRAIN_KNOBS

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
    from fit_efficiency import kernel_knobs

    seq = [1024, 2048, 4096, 8192, 16384]
    causal_fwd = [410, 484, 518, 529, 539]
    full_fwd = [574, 617, 609, 600, 595]
    full_bwd = [408, 465, 499, 518, 516]
    blended = [3.5 / (1 / f + 2.5 / (b * f / n)) for f, n, b in zip(causal_fwd, full_fwd, full_bwd, strict=True)]
    knobs = KERNEL_TRAIN_KNOBS["hopper"]
    assert blended[2] / 989 == pytest.approx(knobs["attention"], abs=0.005)

    def misfit(s0: float) -> float:
        r = [s / (s + s0) for s in seq]
        return sum((math.log(b / blended[2]) - math.log(x / r[2])) ** 2 for b, x in zip(blended, r, strict=True))

    best = min(range(100, 2000, 10), key=misfit)
    assert best == knobs["attention_half_seq"]
    # the fit holds these knobs for every Hopper GPU (never fitted), and only for Hopper
    assert kernel_knobs("H100-SXM5-80GB") == kernel_knobs(("H200-SXM-141GB",)) == knobs
    assert kernel_knobs("A100-SXM4-80GB") == {} and kernel_knobs(("B200-SXM-180GB", "GB200-186GB")) == {}


# AMD's MI300X measurements of its assembly attention kernels (ROCm/aiter op_tests/cpp/mha/README.md,
# a83421be, 2025-10-31; unchanged at e4048607), BF16, BSHD, head dim 128, causal rows: per sequence
# length, (batch, query heads, KV heads, forward TFLOP/s, backward TFLOP/s with FP32 dQ atomics "a32").
AITER_MI300X_CAUSAL = {
    1024: [
        (1, 32, 8, 130.62, 166.78), (4, 32, 8, 334.005, 226.39), (8, 32, 8, 311.385, 258.26),
        (1, 64, 8, 228.54, 242.43), (4, 64, 8, 326.51, 266.9), (8, 64, 8, 321.865, 265.08),
        (1, 64, 4, 229.09, 238.755), (4, 64, 4, 314.82, 264.795), (8, 64, 4, 348.76, 267.48),
    ],
    2048: [
        (1, 32, 8, 255.105, 295.865), (4, 32, 8, 419.435, 330.23), (8, 32, 8, 412.99, 326.355),
        (1, 64, 8, 392.425, 257.855), (4, 64, 8, 425.735, 326.805), (8, 64, 8, 452.03, 347.89),
        (1, 64, 4, 407.525, 254.375), (4, 64, 4, 426.77, 331.95), (8, 64, 4, 461.89, 352.7),
    ],
    4096: [
        (1, 32, 8, 467.805, 296.025), (4, 32, 8, 486.73, 416.54), (8, 32, 8, 513.1, 409.05),
        (1, 64, 8, 474.385, 378.155), (4, 64, 8, 513.79, 391.235), (8, 64, 8, 509.255, 402.18),
        (1, 64, 4, 476.26, 384.585), (4, 64, 4, 524.585, 405.02), (8, 64, 4, 513.795, 402.68),
    ],
    8192: [
        (1, 32, 8, 522.68, 388.235), (4, 32, 8, 547.09, 422.835), (8, 32, 8, 537.36, 441.4),
        (1, 64, 8, 518.29, 433.285), (4, 64, 8, 540.515, 434.645), (8, 64, 8, 550.67, 432.715),
        (1, 64, 4, 519.32, 442.955), (4, 64, 4, 540.935, 430.95), (8, 64, 4, 552.78, 434.51),
    ],
    10240: [
        (1, 32, 8, 440.12, 244.705), (4, 32, 8, 527.705, 432.545), (8, 32, 8, 556.045, 443.78),
        (1, 64, 8, 510.895, 447.995), (4, 64, 8, 557.475, 442.51), (8, 64, 8, 547.05, 439.785),
        (1, 64, 4, 515.275, 459.745), (4, 64, 4, 560.63, 441.345), (8, 64, 4, 548.65, 435.745),
    ],
    16384: [(1, 64, 8, 541.55, 412.04), (1, 64, 4, 544.1, 419.975)],
}


def test_cdna3_training_attention_comes_from_kernel_benchmarks():
    """KERNEL_TRAIN_KNOBS['cdna3'] recomputed from AMD's MI300X table of its assembly attention
    kernels (what Transformer Engine's ROCm build and Primus-Turbo run on gfx942): per sequence length
    the median over the table's causal configurations of forward and FP32-atomic backward TFLOP/s,
    blended 1 : 2.5 in FLOPs as for Hopper, is 428 TFLOP/s at 4,096 tokens = 0.33 of the 1,307.4
    TFLOP/s dense BF16 peak of MI300X and MI325X (one die), and the least-squares s0 of
    r(s) = s / (s + s0) over 1k-16k is 850. Every CDNA 3 GPU holds them, fitted or borrowed."""
    import math
    import statistics
    import sys
    from pathlib import Path

    from autoshard.costmodel.efficiency import KERNEL_TRAIN_KNOBS

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
    from fit_efficiency import kernel_knobs

    seq = sorted(AITER_MI300X_CAUSAL)
    assert seq == [1024, 2048, 4096, 8192, 10240, 16384]
    fwd = [statistics.median(r[3] for r in AITER_MI300X_CAUSAL[s]) for s in seq]
    bwd = [statistics.median(r[4] for r in AITER_MI300X_CAUSAL[s]) for s in seq]
    blended = [3.5 / (1 / f + 2.5 / b) for f, b in zip(fwd, bwd, strict=True)]
    assert [round(x) for x in blended] == [272, 349, 428, 459, 467, 446]
    knobs = KERNEL_TRAIN_KNOBS["cdna3"]
    assert blended[2] / 1307.4 == pytest.approx(knobs["attention"], abs=0.005)

    def misfit(s0: float) -> float:
        r = [s / (s + s0) for s in seq]
        return sum((math.log(b / blended[2]) - math.log(x / r[2])) ** 2 for b, x in zip(blended, r, strict=True))

    best = min(range(100, 3000, 10), key=misfit)
    assert best == knobs["attention_half_seq"]
    # CDNA 3 kernels are slower than Hopper's at every length, as a fraction of the peak
    assert knobs["attention"] < KERNEL_TRAIN_KNOBS["hopper"]["attention"]
    assert kernel_knobs("MI325X-256GB") == kernel_knobs(("MI300X-192GB",)) == knobs
    # the shipped CDNA 3 clusters carry them for training (serving keeps its own attention)
    for cluster in (load_cluster("mi300x"), load_cluster(Path(__file__).resolve().parents[1] / "validation" / "clusters" / "mi325x.yaml")):
        eff = cluster.primary.gpu.efficiency
        assert (eff.train_attention, eff.train_attention_half_seq) == (knobs["attention"], knobs["attention_half_seq"])


@pytest.mark.parametrize(("cluster", "recipe", "fp8_params", "expected"), [
    ("dgx-h100", Fp8Recipe.DELAYED, False, 4.0),  # read BF16, write the FP8 copy and its transpose
    ("dgx-h100", Fp8Recipe.TENSORWISE, False, 6.0),  # + the amax pass over the BF16 weight
    ("dgx-h100", Fp8Recipe.DELAYED, True, 2.0),  # FP8 primary weight: read it, write the transpose
    ("dgx-b200", Fp8Recipe.DELAYED, False, 3.0),  # Blackwell reads any layout: one copy
    ("dgx-b200", Fp8Recipe.DELAYED, True, 0.0),  # ... and that copy is the primary weight itself
    ("dgx-b200", Fp8Recipe.MXFP8, False, 4.0 + 2 / 32),  # rowwise + columnwise, E8M0 scale per 32
    ("dgx-h100", Fp8Recipe.BLOCKWISE, True, 2.0),  # the other layout from the gathered FP8 weight
])
def test_fp8_weight_cast_bytes(cluster, recipe, fp8_params, expected):
    from autoshard.costmodel.fp8 import fp8_weight_cast_bytes_per_param
    from autoshard.costmodel.train.memory import fp8_weight_cache_bytes

    gpu = load_cluster(cluster).pools[0].gpu
    cached = fp8_weight_cache_bytes(gpu, recipe, fp8_params=fp8_params)
    assert fp8_weight_cast_bytes_per_param(gpu, recipe, fp8_params=fp8_params, cached=cached) == pytest.approx(expected)


def test_fp8_weight_cast_is_paid_once_per_step_and_p_times_through_the_fill():
    """Llama-3.1-70B FP8 (delayed) on 64 H100, TP 8: each rank's decoder weights, 4 B per parameter at
    the training step's HBM speed, once per step whatever the micro-batch count; with PP 4 the fill
    carries every rank's casts, so the step pays 4 x one rank's (its own as compute, 3 x as bubble)."""
    from autoshard.costmodel.efficiency import training_gpu
    from autoshard.costmodel.train.step import stage_cost

    gpu = H100.pools[0].gpu
    bps = gpu.hbm_tbps * 1e12 * training_gpu(gpu).efficiency.hbm
    per_layer = LLAMA70.dense_layer_params() / 8 * 4.0 / bps

    def run(pp: int, gbs: int, precision: Precision):
        cfg = TrainConfig(dims=ParallelDims(tp=8, pp=pp, dp=8 // pp), micro_batch_size=1, global_batch_size=gbs,
                          seq_len=8192, precision=precision)
        stages = default_stages(LLAMA70, pp=pp)
        casts = [stage_cost(LLAMA70, st, H100.pools[0], cfg).weight_cast_s for st in stages]
        return predict_train(LLAMA70, H100, cfg, stages), casts

    eight, casts = run(1, 64, Precision.FP8)
    assert casts == [pytest.approx(80 * per_layer)]  # 80 decoder layers, the embedding and output stay BF16
    sixteen, _ = run(1, 128, Precision.FP8)
    bf16, none = run(1, 64, Precision.BF16)
    assert none == [0.0] and bf16.time.bubble == 0.0
    # step = m x (one micro-batch) + a per-step constant: the DP tail, the optimizer and the cast
    t = eight.time
    assert 2 * eight.step_time_s - sixteen.step_time_s == pytest.approx(casts[0] + t.dp_comm_exposed + t.optimizer)
    four, casts4 = run(4, 32, Precision.FP8)
    assert casts4 == [pytest.approx(20 * per_layer)] * 4
    base = dataclasses.replace(four.time, compute=four.time.compute - casts4[0], bubble=four.time.bubble - 3 * casts4[0])
    assert four.step_time_s - base.total == pytest.approx(4 * casts4[0])
    assert 0.015 < 4 * casts4[0] < 0.03  # 70B / 8 x 4 B at ~2 TB/s: about 20 ms


def test_training_collectives_read_the_fitted_bandwidth_fractions():
    """Item U: a GPU's fitted NVLink fraction ships as train_intra_node_bw (B300: 0.70; H100's fit was 0.70
    until item AC, 0.90 since); the training step's TP all-gather/reduce-scatter runs at it, serving's
    shared knob stays 0.90. A TP 8 Llama-3.1-70B layer's TP traffic then takes 0.90 / 0.70 of what it took
    at the shared fraction (bandwidth-bound sizes)."""
    from autoshard.costmodel.comm import group_links
    from autoshard.costmodel.efficiency import training_pool
    from autoshard.costmodel.train.layer import layer_cost

    b300 = load_cluster("dgx-b300").with_gpus(8)
    pool = b300.primary
    assert pool.gpu.efficiency.intra_node_bw == 0.90 and training_pool(pool).gpu.efficiency.intra_node_bw == 0.70
    dims = ParallelDims(tp=8)
    assert training_pool(pool) is training_pool(pool) and training_pool(training_pool(pool)) == training_pool(pool)
    ratio = group_links(pool, dims).tp.bytes_per_s / group_links(training_pool(pool), dims).tp.bytes_per_s
    assert ratio == pytest.approx(0.90 / 0.70)
    cfg = TrainConfig(dims=dims, micro_batch_size=4, global_batch_size=32, seq_len=8192, precision=Precision.BF16)
    shared = pool.model_copy(update={"gpu": pool.gpu.model_copy(update={"efficiency": pool.gpu.efficiency.model_copy(
        update={"train_intra_node_bw": None})})})
    fitted = layer_cost(LLAMA70, LayerKind.DENSE, pool, cfg, Recompute.NONE).tp_comm_s
    at_shared = layer_cost(LLAMA70, LayerKind.DENSE, shared, cfg, Recompute.NONE).tp_comm_s
    assert fitted / at_shared == pytest.approx(0.90 / 0.70, rel=0.02)
