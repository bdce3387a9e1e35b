"""Measured against predicted for the published Megatron-family configurations.

    python tests/validation/validate_megatron_table.py

evaluates every row of tests/emit/published_megatron.yaml exactly as `autoshard evaluate CLUSTER
--from-megatron CMD` does and prints the measured figure (Megatron-Core model TFLOP/s per GPU, or the
step time) beside the prediction, with the median and largest |error| for all rows and for the MoE rows
alone. The MoE rows (Qwen3-235B from Megatron-MoE-ModelZoo, DeepSeek-V3 on GB200) are not in
training_runs.yaml, on which the efficiencies were fitted: their errors are out of sample.
Nothing here is fitted; nothing is asserted (the table test checks that every row evaluates).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

from autoshard.api import resize
from autoshard.costmodel.train.step import predict_train
from autoshard.emit.megatron.parse import parse_megatron
from autoshard.specs import load_cluster

TABLE = Path(__file__).resolve().parents[1] / "emit" / "published_megatron.yaml"


def evaluate_row(row: dict) -> tuple[float, float, bool]:
    """(measured, predicted, fits) of one row."""
    parsed = parse_megatron(row["command"]).with_world_size(row["gpus"])
    cluster = resize(load_cluster(row["cluster"]), row["gpus"])
    pred = predict_train(parsed.model, cluster, parsed.train_config(), parsed.layout())
    metric = row["measured"]["metric"]
    predicted = pred.tflops_per_gpu if metric == "tflops_per_gpu" else pred.step_time_s
    return float(row["measured"]["value"]), predicted, pred.fits


def main() -> int:
    rows = [r for r in yaml.safe_load(TABLE.read_text(encoding="utf-8")) if "measured" in r]
    print(f"{'run':52} {'metric':15} {'measured':>9} {'predicted':>9} {'error':>8}  fits")
    errors: dict[str, float] = {}
    for row in rows:
        measured, predicted, fits = evaluate_row(row)
        err = (predicted - measured) / measured
        errors[row["id"]] = err
        print(f"{row['id']:52} {row['measured']['metric']:15} {measured:9.2f} {predicted:9.2f} {err:+8.1%}  "
              f"{'yes' if fits else 'NO'}")
    for label, keep in (("all rows", lambda i: True), ("MoE rows (out of sample)", lambda i: i.startswith(("moezoo", "mcore-dsv3")))):
        errs = [abs(e) for i, e in errors.items() if keep(i)]
        print(f"{label}: {len(errs)} runs, median |error| {statistics.median(errs):.1%}, max |error| {max(errs):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
