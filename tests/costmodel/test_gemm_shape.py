"""The measured GEMM shape table (autoshard/costmodel/gemm_shape.py): generated from the committed raw
measurement, interpolated monotonically, and used by the training step only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.costmodel.compute import backward_gemms_s, dgrad_shape, gemm_time_s, shape_efficiency, wgrad_shape
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import Gemm
from autoshard.costmodel.gemm_shape import shape_table
from autoshard.specs import load_cluster
from autoshard.specs.job import Precision

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "autoshard" / "costmodel" / "gemm_shape_hopper.json"
RAW = ROOT / "tests" / "validation" / "gemm_h100_raw.json"
BLOCKWISE_RAW = ROOT / "tests" / "validation" / "gemm_h100_blockwise_raw.json"


def test_table_is_generated_from_the_committed_h100_measurement(tmp_path):
    out = tmp_path / "table.json"
    subprocess.run([sys.executable, str(ROOT / "tests" / "validation" / "gemm_bench.py"), "--table", str(RAW), str(out),
                    "--blockwise-raw", str(BLOCKWISE_RAW)], check=True, capture_output=True)
    assert json.loads(out.read_text()) == json.loads(TABLE.read_text())
    raw = json.loads(RAW.read_text())
    assert raw["device"] == "NVIDIA H100 80GB HBM3" and raw["sms"] == 132
    assert len(raw["bf16"]) == len(raw["fp8"]) == 560 and len(raw["grouped"]) == len(raw["grouped_fp8"]) == 360


def test_figures_quoted_in_the_module_docstring():
    t = shape_table("hopper")
    assert t.reference_tflops[False] == pytest.approx(770.3) and t.reference_tflops[True] == pytest.approx(1399.0)
    assert t.dense(4096, 1024, 1024, fp8=False) == pytest.approx(0.787, abs=5e-4)  # smooth curve said 0.89
    assert t.dense(4096, 1024, 1024, fp8=True) == pytest.approx(0.627, abs=5e-4)
    assert t.dense(8192, 8192, 8192, fp8=False) == pytest.approx(1.0, abs=0.01)
    assert [round(t.grouped(r, 16, 3072, 4096, fp8=False), 2) for r in (16, 64, 128, 256)] == [0.06, 0.24, 0.49, 0.83]
    assert shape_table("blackwell") is None  # no measurement: the smooth curve stays


def test_grid_points_are_exact_and_edges_clamp():
    t = shape_table("hopper")
    data = json.loads(TABLE.read_text())
    k_i, n_i, m_i = data["k"].index(2048), data["n"].index(4096), data["m"].index(512)
    assert t.dense(512, 4096, 2048, fp8=True) == pytest.approx(data["fp8"][k_i][n_i][m_i])
    assert t.dense(10**6, 10**6, 10**6, fp8=False) == pytest.approx(data["bf16"][-1][-1][-1])
    assert t.dense(1, 1, 1, fp8=False) == pytest.approx(data["bf16"][0][0][0])


@settings(max_examples=200, deadline=None)
@given(st.integers(16, 40000), st.integers(256, 40000), st.integers(256, 40000), st.booleans(),
       st.sampled_from(["m", "n", "k"]))
def test_a_larger_gemm_never_runs_at_a_lower_fraction(m, n, k, fp8, axis):
    t = shape_table("hopper")
    bigger = {"m": (2 * m, n, k), "n": (m, 2 * n, k), "k": (m, n, 2 * k)}[axis]
    assert t.dense(*bigger, fp8=fp8) >= t.dense(m, n, k, fp8=fp8) - 1e-12


def test_training_uses_the_table_and_serving_keeps_the_smooth_curve():
    h100 = load_cluster("dgx-h100").pools[0].gpu
    g = Gemm(4096, 1024, 1024)
    train = training_gpu(h100)
    eff_train = shape_efficiency(g, train, Precision.FP8)
    assert eff_train == pytest.approx(train.efficiency.gemm_fp8 * shape_table("hopper").dense(4096, 1024, 1024, True))
    # serving (shared knobs, gemm_shape_measured False): gemm_fp8 * d / (d + gemm_half_dim)
    half = h100.efficiency.gemm_half_dim
    assert shape_efficiency(g, h100, Precision.FP8) == pytest.approx(h100.efficiency.gemm_fp8 * 1024 / (1024 + half))
    # A100 (no measured table for its generation) keeps the smooth curve in training too
    a100 = training_gpu(load_cluster("dgx-a100-80gb").pools[0].gpu)
    d = 1024
    assert shape_efficiency(g, a100, Precision.BF16) == pytest.approx(
        a100.efficiency.gemm * d / (d + a100.efficiency.gemm_half_dim))


def test_backward_shapes_transpose_on_the_measured_path():
    train = training_gpu(load_cluster("dgx-h100").pools[0].gpu)
    logits = Gemm(8192, 16032, 8192, fp8_capable=False)  # Llama-3 vocabulary over TP 8, 8k tokens
    assert dgrad_shape(logits, train) == Gemm(8192, 8192, 16032, fp8_capable=False)
    assert wgrad_shape(logits, train) == Gemm(8192, 16032, 8192, fp8_capable=False)  # k x n out, m contracted
    proj = Gemm(2048, 8192, 1024)  # row-parallel projection at TP 8, 2k tokens: wgrad contracts the 2k tokens
    assert wgrad_shape(proj, train) == Gemm(1024, 8192, 2048)
    expert = Gemm(64, 3072, 4096, count=16, grouped=True)
    assert dgrad_shape(expert, train) == expert and wgrad_shape(expert, train) == expert
    # without the table (serving knobs) backward = 2 x forward, as before
    h100 = load_cluster("dgx-h100").pools[0].gpu
    assert backward_gemms_s([proj], h100, Precision.BF16, None) == pytest.approx(2 * gemm_time_s(proj, h100, Precision.BF16))
    # with it: the dgrad (m=2048, n=1024, k=8192) runs slower than the forward (k=1024 is the contraction)
    t = shape_table("hopper")
    assert t.dense(2048, 1024, 8192, False) != t.dense(2048, 8192, 1024, False)
    assert backward_gemms_s([proj], train, Precision.BF16, None) == pytest.approx(
        gemm_time_s(Gemm(2048, 1024, 8192), train, Precision.BF16) + gemm_time_s(Gemm(1024, 8192, 2048), train, Precision.BF16))


def test_grouped_expert_gemms_pay_the_tile_padding():
    train = training_gpu(load_cluster("dgx-h100").pools[0].gpu)
    dense = Gemm(16 * 32, 3072, 4096)
    grouped = Gemm(32, 3072, 4096, count=16, grouped=True)
    # the same FLOPs: 16 experts x 32 rows run ~4x slower than one 512-row GEMM
    ratio = gemm_time_s(grouped, train, Precision.BF16) / gemm_time_s(dense, train, Precision.BF16)
    assert 3.0 < ratio < 12.0


def test_blockwise_fp8_runs_the_measured_block_scaled_kernel_on_hopper():
    """--fp8-recipe blockwise on H100: cuBLAS's block-scaled FP8 kernel at 0.861 of the per-tensor one
    (median of 48 measured shapes); per-tensor recipes, BF16 and GPUs without the measurement keep
    their knob."""
    from autoshard.costmodel.compute import layer_compute_time
    from autoshard.costmodel.fp8 import fp8_recipe_gpu
    from autoshard.parallel import Fp8Recipe, ParallelDims, Recompute
    from autoshard.specs import LayerKind, load_model

    raw = json.loads(BLOCKWISE_RAW.read_text())["blockwise"]
    assert len(raw) == 48
    ratios = sorted(r["blockwise_tflops"] / r["tensorwise_tflops"] for r in raw)
    assert (ratios[23] + ratios[24]) / 2 == pytest.approx(0.861, abs=5e-4)
    assert shape_table("hopper").fp8_blockwise == pytest.approx(0.861, abs=5e-4)
    h100 = training_gpu(load_cluster("dgx-h100").pools[0].gpu)
    block = fp8_recipe_gpu(h100, Precision.FP8, Fp8Recipe.BLOCKWISE)
    assert block.efficiency.gemm_fp8 == pytest.approx(h100.efficiency.gemm_fp8 * shape_table("hopper").fp8_blockwise)
    assert fp8_recipe_gpu(h100, Precision.FP8, Fp8Recipe.TENSORWISE) is h100
    assert fp8_recipe_gpu(h100, Precision.BF16, Fp8Recipe.BLOCKWISE) is h100
    b200 = training_gpu(load_cluster("dgx-b200").pools[0].gpu)
    assert fp8_recipe_gpu(b200, Precision.FP8, Fp8Recipe.BLOCKWISE) is b200
    # a compute-bound FP8 GEMM takes 1/0.861 as long (less the fixed launch cost)
    g = Gemm(8192, 3584, 8192)
    slow = gemm_time_s(g, block, Precision.FP8) - 4e-6
    assert slow / (gemm_time_s(g, h100, Precision.FP8) - 4e-6) == pytest.approx(1 / 0.8613, rel=1e-3)
    # a Llama-3.1-70B layer at TP 8 is slower by less: block scales cast in one pass with both layouts
    # (4 B per element against tensorwise's 6 on Hopper), and attention and element-wise work stay
    model = load_model("llama-3.1-70b")
    kw = dict(gpu=load_cluster("dgx-h100").pools[0].gpu, dims=ParallelDims(tp=8), micro_batch_size=1, seq_len=8192,
              precision=Precision.FP8, recompute=Recompute.NONE, sequence_parallel=True)
    blk = layer_compute_time(model, LayerKind.DENSE, fp8_recipe=Fp8Recipe.BLOCKWISE, **kw)
    tw = layer_compute_time(model, LayerKind.DENSE, fp8_recipe=Fp8Recipe.TENSORWISE, **kw)
    assert 1.01 < blk.forward_s / tw.forward_s < 1.10 and blk.backward_s > tw.backward_s


def test_h200_measures_the_same_curve_as_the_h100_table(tmp_path):
    """The same sweep on an H200 (same GH100 die and 700 W, HBM3e at 4.8 TB/s): large GEMMs within 1.3 %
    of the H100's speed and the relative speeds at m >= 1,024 within 1.2 % (BF16) and 1.7 % (FP8)
    median, so Hopper's one table and H200 borrowing H100's compute knobs are what the kernels do;
    only memory-bound small shapes run faster on H200 (its bandwidth, which the roofline prices)."""
    import statistics

    out = tmp_path / "h200.json"
    subprocess.run([sys.executable, str(ROOT / "tests" / "validation" / "gemm_bench.py"), "--table",
                    str(ROOT / "tests" / "validation" / "gemm_h200_raw.json"), str(out)], check=True, capture_output=True)
    h100, h200 = json.loads(TABLE.read_text()), json.loads(out.read_text())
    assert h200["source"]["device"] == "NVIDIA H200"
    for fam, tol in (("bf16", 0.012), ("fp8", 0.017)):
        ref = h200[f"{fam}_reference_tflops"] / h100[f"{fam}_reference_tflops"]
        assert abs(ref - 1) < 0.013
        diffs = [abs(h200[fam][ki][ni][mi] / h100[fam][ki][ni][mi] - 1)
                 for ki in range(len(h100["k"])) for ni in range(len(h100["n"]))
                 for mi, m in enumerate(h100["m"]) if m >= 1024]
        assert statistics.median(diffs) <= tol + 5e-4
