"""Fit the per-GPU-type efficiency knobs on the published runs (coordinate descent on a grid).

    python tests/validation/fit_efficiency.py

prints the fitted EfficiencySpec fields for each GPU type, to be copied into the `efficiency:`
block of every bundled cluster with that GPU. One fit per GPU type, shared by all its runs: no
per-run factors. Objective: mean squared log error plus a penalty on errors beyond 15 %.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from validate_published import _cluster, evaluate_runs, load_runs  # noqa: E402

from autoshard.specs import EfficiencySpec  # noqa: E402

GRID = {
    "gemm": [0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90],
    "gemm_fp8": [0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70],
    "gemm_half_dim": [0, 32, 64, 128, 192, 256, 384],
    "attention": [0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60, 0.65],
    "hbm": [0.50, 0.60, 0.70, 0.80, 0.90],
    "tp_overlap": [0.0, 0.2, 0.4, 0.6, 0.8],
    "intra_node_bw": [0.6, 0.7, 0.8, 0.9],
    "inter_node_bw": [0.6, 0.7, 0.8, 0.9],
}


def loss(gpu: str, eff: EfficiencySpec) -> float:
    results = [r for r in evaluate_runs({gpu: eff}) if r.gpu == gpu and not r.skip_throughput]
    total = 0.0
    for r in results:
        e = math.log(r.predicted / r.measured)
        total += e * e + 4 * max(0.0, abs(e) - 0.15) ** 2
    return total / max(len(results), 1)


def fit(gpu: str, start: EfficiencySpec, rounds: int = 3) -> EfficiencySpec:
    best, best_loss = start, loss(gpu, start)
    for _ in range(rounds):
        improved = False
        for knob, values in GRID.items():
            for v in values:
                trial = best.model_copy(update={knob: v})
                trial_loss = loss(gpu, trial)
                if trial_loss < best_loss - 1e-9:
                    best, best_loss, improved = trial, trial_loss, True
        if not improved:
            break
    return best


def main() -> int:
    gpus: dict[str, EfficiencySpec] = {}
    for run in load_runs():
        if run.get("skip_throughput"):
            continue
        p = run["parallel"]
        cluster = _cluster(run["cluster"], p["tp"] * p["pp"] * p["dp"] * p["cp"])
        gpus.setdefault(cluster.primary.gpu.name, cluster.primary.gpu.efficiency)
    for gpu, start in gpus.items():
        fitted = fit(gpu, start)
        changed = {k: getattr(fitted, k) for k in GRID if getattr(fitted, k) != getattr(start, k)}
        print(f"{gpu}: loss {loss(gpu, start):.4f} -> {loss(gpu, fitted):.4f}")
        print("  efficiency:", {k: getattr(fitted, k) for k in GRID}, " changed:", changed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
