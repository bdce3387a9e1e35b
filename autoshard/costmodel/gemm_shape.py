"""How fast a GEMM runs for its shape, measured on the GPU instead of assumed.

`gemm_shape_<generation>.json` holds one measurement of a GPU of that generation
(tests/validation/gemm_bench.py: cuBLAS BF16 and per-tensor-scaled FP8 GEMMs over m x n x k grids, and
grouped expert GEMMs over experts x tokens per expert), as speed relative to the same kernel family's
large-shape speed. The training step's GEMMs take their shape fall-off from it where the GPU's
generation has one (`EfficiencySpec.gemm_shape_measured`); the fitted knob (`train_gemm`,
`train_gemm_fp8`) stays the end-to-end level of a large GEMM inside a training step. Elsewhere the
smooth curve d / (d + gemm_half_dim) of the smallest dimension d remains.

H100 SXM5 (2026-11-23, PyTorch 2.11 / CUDA 13.0, 700 W, on random data): a large BF16 GEMM runs at
770 TFLOP/s (0.78 of 989), FP8 at 1,399 (0.71 of 1,979). What the smooth curve (half dim 128) got
wrong: m = 4,096, n = k = 1,024 (a TP 8 projection of a 8k-hidden model) runs at 0.79 of the large
shapes in BF16 and 0.63 in FP8, where d/(d+128) gives 0.89 for both; FP8 falls off faster because
the same tile moves through the tensor cores in half the time while loads and epilogue do not shrink.
Memory-bound points are capped at their HBM roofline at the measured copy bandwidth before the
envelope (back-to-back calls keep small-m weights in L2, which a step's other layers evict).
Grouped expert GEMMs pay for the tile that every expert's rows are padded to: 16, 64, 128, 256 tokens
per expert reach 0.06, 0.24, 0.49, 0.83 of the kernel's speed at 4,096 (16 experts), near-linear
below the 128-row tile."""

from __future__ import annotations

import bisect
import json
import math
from functools import lru_cache
from pathlib import Path

__all__ = ["ShapeTable", "shape_table"]

_DIR = Path(__file__).parent


class ShapeTable:
    """One generation's measured relative GEMM speeds; log-linear interpolation between grid points,
    clamped at the grid's edges (beyond the largest shape the speed stays the largest shape's)."""

    def __init__(self, data: dict) -> None:
        self.source = data["source"]
        self._m = [math.log2(v) for v in data["m"]]
        self._n = [math.log2(v) for v in data["n"]]
        self._k = [math.log2(v) for v in data["k"]]
        self._e = [math.log2(v) for v in data["experts"]]
        self._t = [math.log2(v) for v in data["tokens_per_expert"]]
        self._dense = {False: data["bf16"], True: data["fp8"]}
        self._grouped = {False: data["grouped_bf16"], True: data["grouped_fp8"]}
        self._memo: dict[tuple[int, int, int, bool], float] = {}
        self.reference_tflops = {False: data["bf16_reference_tflops"], True: data["fp8_reference_tflops"]}
        # block-scaled (1 x 128 / 128 x 128) over per-tensor FP8 GEMM speed, median over shapes
        self.fp8_blockwise: float | None = data.get("fp8_blockwise_over_tensorwise")
        # fraction of its FP8 peak a large FP8 GEMM reaches over a large BF16 GEMM's of its BF16 peak
        peaks = data["source"]["datasheet_tflops"]
        self.fp8_over_bf16 = (self.reference_tflops[True] / peaks["fp8"]) / (self.reference_tflops[False] / peaks["bf16"])

    def dense(self, m: int, n: int, k: int, fp8: bool) -> float:
        """Speed of an (m x k) @ (k x n) GEMM relative to large shapes (memoized: a solve asks for the
        same few hundred shapes some 10^5 times)."""
        key = (m, n, k, fp8)
        if (hit := self._memo.get(key)) is not None:
            return hit
        self._memo[key] = out = self._dense_speed(m, n, k, fp8)
        return out

    def _dense_speed(self, m: int, n: int, k: int, fp8: bool) -> float:
        grid = self._dense[fp8]  # [k][n][m]
        (k0, k1, wk), (n0, n1, wn), (m0, m1, wm) = (
            _bracket(self._k, k), _bracket(self._n, n), _bracket(self._m, m))
        out = 0.0
        for ki, fk in ((k0, 1 - wk), (k1, wk)):
            for ni, fn in ((n0, 1 - wn), (n1, wn)):
                for mi, fm in ((m0, 1 - wm), (m1, wm)):
                    out += fk * fn * fm * grid[ki][ni][mi]
        return out

    def grouped(self, rows_per_expert: int, experts: int, n: int, k: int, fp8: bool) -> float:
        """Speed of a grouped GEMM of `experts` groups of `rows_per_expert` rows each: the dense speed
        of its (n, k) at a full-size m, times the measured fall-off with rows per expert."""
        grid = self._grouped[fp8]  # [experts][tokens per expert]
        (e0, e1, we), (t0, t1, wt) = _bracket(self._e, experts), _bracket(self._t, rows_per_expert)
        falloff = ((1 - we) * ((1 - wt) * grid[e0][t0] + wt * grid[e0][t1])
                   + we * ((1 - wt) * grid[e1][t0] + wt * grid[e1][t1]))
        return self.dense(4096, n, k, fp8) * falloff


def _bracket(axis: list[float], value: float) -> tuple[int, int, float]:
    """(lower index, upper index, weight of the upper) of log2(value) on a sorted log2 axis."""
    x = math.log2(max(value, 1))
    if x <= axis[0]:
        return 0, 0, 0.0
    if x >= axis[-1]:
        last = len(axis) - 1
        return last, last, 0.0
    hi = bisect.bisect_right(axis, x)
    lo = hi - 1
    return lo, hi, (x - axis[lo]) / (axis[hi] - axis[lo])


@lru_cache(maxsize=8)
def shape_table(generation: str) -> ShapeTable | None:
    """The measured table of a GPU generation ("hopper"), or None where none was measured."""
    path = _DIR / f"gemm_shape_{generation}.json"
    if not path.is_file():
        return None
    return ShapeTable(json.loads(path.read_text()))
