"""Block-scaled FP8 GEMMs in serving (#10, #13): DeepSeek-V3's and Qwen3's FP8 checkpoints scale their
weights per 128 x 128 block and the activations per 1 x 128 group; on Hopper those GEMMs run at the
block-scaled kernels' measured rate (`BLOCK_FP8_GEMM_HOPPER`), not at the per-tensor FP8 rate. Checked
against a kernel measurement that is no validation row."""

from __future__ import annotations

import statistics

import pytest
from pydantic import ValidationError

from autoshard.costmodel.compute import gemm_time_s
from autoshard.costmodel.flops import Gemm
from autoshard.costmodel.serve.compute import (
    BLOCK_FP8_GEMM_HOPPER,
    block_scaled_fp8,
    model_serving_gpu,
    serving_gpu,
)
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.step import step_time
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import Precision, WeightDtype
from autoshard.specs.model import Checkpoint

DSV3 = load_model("deepseek-v3")
FP8 = WeightDtype.FP8

VLLM_BLOCK_FP8_TFLOPS = {
    (1024, 4096, 7168): (603.1, 670.1),
    (1024, 18432, 7168): (816.7, 969.8),
    (2048, 4096, 7168): (606.6, 687.0),
    (4096, 4096, 7168): (613.2, 717.0),
}
"""vllm-project/vllm benchmarks/kernels/deepgemm/README.md (benchmark_fp8_block_dense_gemm.py, H100 80GB
HBM3, activations pre-quantized per 1 x 128 group, weights per 128 x 128 block): (vLLM CUTLASS,
DeepGEMM) TFLOP/s at the compute-bound shapes (m, n, k). The smaller shapes of that table are left
out: their times sit on the harness's per-call floor (28 us CUTLASS, 69 us DeepGEMM, whatever the
size), the Python launch of an eager loop, not the kernel."""


def _h100():
    return load_cluster("dgx-h100").with_gpus(8).pools[0]


def test_only_block_scaled_fp8_checkpoints_are_flagged():
    assert block_scaled_fp8(DSV3, FP8)
    assert block_scaled_fp8(load_model("qwen3-235b-a22b"), FP8)
    assert block_scaled_fp8(load_model("qwen3-30b-a3b"), FP8)
    assert not block_scaled_fp8(DSV3, WeightDtype.BF16)
    # ModelOpt's Llama FP8 checkpoints are per-tensor
    assert not block_scaled_fp8(load_model("llama-3.1-70b"), FP8)
    assert not block_scaled_fp8(load_model("qwen3-235b-a22b"), WeightDtype.INT4)


@pytest.mark.parametrize("shape", sorted(VLLM_BLOCK_FP8_TFLOPS))
def test_block_fp8_gemm_matches_vllms_kernel_table(shape):
    """Each compute-bound shape predicted between 0.75x the slower and 1.1x the faster of the two
    kernels vLLM runs (CUTLASS, DeepGEMM); the per-tensor FP8 rate is above both, by at most 2x."""
    m, n, k = shape
    pool = _h100()
    gpu = model_serving_gpu(DSV3, pool.gpu, FP8)
    g = Gemm(m, n, k)
    tflops = 2 * m * n * k / gemm_time_s(g, gpu, Precision.FP8) / 1e12
    cutlass, deepgemm = VLLM_BLOCK_FP8_TFLOPS[shape]
    assert 0.75 * min(cutlass, deepgemm) <= tflops <= 1.1 * max(cutlass, deepgemm), tflops
    per_tensor = 2 * m * n * k / gemm_time_s(g, serving_gpu(pool.gpu), Precision.FP8) / 1e12
    assert max(cutlass, deepgemm) < per_tensor <= 2 * min(cutlass, deepgemm)


def test_block_fp8_median_error_over_the_kernel_table():
    """Median |error| over the eight measurements (both kernels) under 12 %."""
    gpu = model_serving_gpu(DSV3, _h100().gpu, FP8)
    errs = []
    for (m, n, k), measured in VLLM_BLOCK_FP8_TFLOPS.items():
        tflops = 2 * m * n * k / gemm_time_s(Gemm(m, n, k), gpu, Precision.FP8) / 1e12
        errs += [abs(tflops / x - 1) for x in measured]
    assert statistics.median(errs) <= 0.12, errs


def test_other_gpus_and_dtypes_keep_their_gemm_efficiency():
    """Blackwell scales blocks in its tensor cores; MI300X has no measurement; BF16 serving and
    per-tensor FP8 models are untouched."""
    for cluster in ("dgx-b200", "mi300x", "l40s-pcie"):
        gpu = load_cluster(cluster).pools[0].gpu
        assert model_serving_gpu(DSV3, gpu, FP8) == serving_gpu(gpu)
    h100, h200 = _h100().gpu, load_cluster("dgx-h200").pools[0].gpu
    assert model_serving_gpu(DSV3, h100, WeightDtype.BF16) == serving_gpu(h100)
    assert model_serving_gpu(load_model("llama-3.1-8b"), h100, FP8) == serving_gpu(h100)
    assert model_serving_gpu(DSV3, h200, FP8).efficiency.gemm_fp8 == BLOCK_FP8_GEMM_HOPPER
    assert serving_gpu(h200).efficiency.gemm_fp8 > 1.5 * BLOCK_FP8_GEMM_HOPPER


def test_memory_bound_decode_keeps_the_hbm_roofline_and_prefill_slows():
    """DeepSeek-V3 FP8 TP8 on H100: a 16-request decode step reads the same weights either way (its
    GEMM time within 5 % of the per-tensor pricing: only its few 16-row expert tiles are math-bound),
    an 8,192-token prefill chunk's GEMMs take
    1.35-1.7x longer with every FP8 GEMM at the block kernels' 0.37 of the FP8 peak instead of 0.63 (at
    most 1.7x; the BF16 router GEMM is unchanged), and longer still with fused_moe's routed experts at
    Triton's 0.22 (`serve.fused_moe`): at most 0.63 / 0.22."""
    pool = _h100()
    for kernels, low, high in (("tensorrt_llm", 1.35, 1.7), ("fused_moe", 1.7, 0.63 / 0.22)):
        cfg = ServeConfig(tp=8, weight_dtype=FP8, kv_cache_dtype=WeightDtype.BF16, moe_kernels=kernels)
        per_tensor = DSV3.model_copy(update={"checkpoints": ()})

        def gemm(model, cfg=cfg, **kw):
            return step_time(model, pool, cfg, prefill_len=8192, **kw).gemm_s

        decode = dict(decode_seqs=16, prefill_tokens=0, prefills=0, context_len=2000)
        prefill = dict(decode_seqs=0, prefill_tokens=8192, prefills=1, context_len=0)
        assert gemm(DSV3, **decode) == pytest.approx(gemm(per_tensor, **decode), rel=0.05)
        assert low <= gemm(DSV3, **prefill) / gemm(per_tensor, **prefill) <= high


def test_block_scaled_flag_is_for_fp8_checkpoints_only():
    with pytest.raises(ValidationError, match="block_scaled"):
        Checkpoint(weights=WeightDtype.INT4, repo="a/b", quantization="gptq_marlin", block_scaled=True)
    assert Checkpoint(weights=FP8, repo="a/b", quantization="fp8", block_scaled=True).block_scaled


def test_a_vllm_command_keeps_the_checkpoint_it_loads():
    """`evaluate --from-vllm` with `--quantization fp8`: the bundled block-scaled repo stays block-scaled;
    another repo of the same architecture loaded the same way and not listed (DeepSeek-Prover-V2's FP8 release) is priced
    block-scaled too, as every FP8 checkpoint the model file lists is, with a note (it was priced
    per-tensor); one loaded per channel (fbgemm_fp8) is per-tensor and runs faster (same engine, same
    batch)."""
    from autoshard.api import evaluate_vllm
    from autoshard.specs.job import ServeJob

    h200 = load_cluster("dgx-h200").with_gpus(8)
    job = ServeJob(input_len=2000, output_len=1000, weight_dtype=FP8)
    tail = " -tp 8 --quantization {} --max-model-len 4096 --max-num-seqs 64"
    own = evaluate_vllm(DSV3, h200, "vllm serve deepseek-ai/DeepSeek-V3" + tail.format("fp8"), job=job)
    r1 = evaluate_vllm(DSV3, h200, "vllm serve deepseek-ai/DeepSeek-Prover-V2-671B" + tail.format("fp8"), job=job)
    other = evaluate_vllm(DSV3, h200, "vllm serve someone/DeepSeek-V3-FP8-dynamic" + tail.format("fbgemm_fp8"),
                          job=job)
    assert block_scaled_fp8(own.model, FP8) and block_scaled_fp8(r1.model, FP8)
    assert not block_scaled_fp8(other.model, FP8)
    assert any("DeepSeek-Prover-V2-671B is not under deepseek-v3's checkpoints: priced as block-scaled" in w
               for w in r1.warnings)
    assert own.max_num_seqs == other.max_num_seqs == r1.max_num_seqs == 64
    assert r1.throughput_tokens_per_s == pytest.approx(own.throughput_tokens_per_s, rel=1e-12)
    assert other.throughput_tokens_per_s > 1.02 * own.throughput_tokens_per_s
