"""Build autoshard's packaged prediction-band table from validation residuals and report its coverage.

    python tests/validation/make_bands.py            # from residuals_train.json + residuals_serve.json
    python tests/validation/make_bands.py --in-sample  # no residual files: predict the runs with the
                                                       # current model (in-sample; a weaker check)
    python tests/validation/make_bands.py --check     # print coverage only, write nothing

Reads tests/validation/residuals_train.json and residuals_serve.json (the leave-one-source-out
predictions written by the validation scripts: one object per run with "id", "source", "mode", "gpu",
"family", "precision", "metric", "measured", "predicted_loso", "predicted_fit", "mem_measured_gib",
"mem_predicted_gib", "held"), writes autoshard/costmodel/bands_table.json (statistic: see
autoshard.costmodel.bands) and prints, per kind of run, its band and the coverage: the share of runs
whose measured value falls inside the band the table gives them. Runs the validation does not hold to
its accuracy target ("held": false, each with a stated reason such as another framework on
power-capped hosts) are left out unless --all-runs is given.

Coverage is printed two ways: in-table (each run against the table built from all runs, optimistic)
and leave-one-source-out (each source's runs against a table built without that source: how the
bands do on runs they have never seen). The target is >= 80 % of runs inside their band.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from autoshard.costmodel.bands import (  # noqa: E402
    TABLE_PATH,
    build_table,
    lookup,
    memory_ratio,
    residual_kind,
    throughput_ratio,
)

RESIDUALS = (HERE / "residuals_train.json", HERE / "residuals_serve.json")
TARGET = 0.80


REQUIRED = ("id", "source", "mode", "gpu", "family", "precision", "metric", "measured", "predicted_loso")


def load_residuals(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The rows of the residual files that exist; SystemExit naming the file, run and field when a
    row cannot be used."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        if not isinstance(data, list):
            raise SystemExit(f"{path}: expected a JSON list of runs")
        for i, row in enumerate(data):
            missing = [k for k in REQUIRED if not isinstance(row, dict) or row.get(k) is None]
            if missing:
                raise SystemExit(f"{path}: run {i} ({row.get('id') if isinstance(row, dict) else row!r}) has no "
                                 f"{', '.join(missing)}")
            if not (float(row["measured"]) > 0 and float(row["predicted_loso"]) > 0):
                raise SystemExit(f"{path}: run {row['id']}: measured and predicted_loso must be positive")
        rows.extend(data)
    return rows


def in_sample_residuals() -> list[dict[str, Any]]:
    """Residual rows of the current model on the validation runs (predicted_loso = predicted_fit)."""
    sys.path.insert(0, str(HERE))
    import validate_published
    import validate_serving

    rows = []
    train = {r["id"]: r for r in validate_published.load_runs()}
    for r in validate_published.evaluate_runs():
        run = train[r.id]
        rows.append({"id": r.id, "source": r.id.split("-")[0], "mode": "train", "gpu": r.gpu,
                     "family": "dense", "precision": run["precision"], "metric": r.metric, "measured": r.measured,
                     "predicted_loso": r.predicted, "predicted_fit": r.predicted,
                     "mem_measured_gib": r.measured_memory_gib,
                     "mem_predicted_gib": r.predicted_memory_gib if r.measured_memory_gib is not None else None,
                     "held": r.skip_throughput is None})
    serve = {r["id"]: r for r in validate_serving.load_runs()}
    for r in validate_serving.evaluate_runs():
        run = serve[r.id]
        rows.append({"id": r.id, "source": r.id.split("-")[0], "mode": "serve",
                     "gpu": r.gpu, "family": "dense", "precision": run["weight_dtype"],
                     "metric": "output_tokens_per_s", "measured": r.measured, "predicted_loso": r.predicted,
                     "predicted_fit": r.predicted, "mem_measured_gib": None, "mem_predicted_gib": None,
                     "held": True})
    return rows


def _inside(ratio: float, lo: float, hi: float) -> bool:
    return lo * (1 - 1e-9) <= ratio <= hi * (1 + 1e-9)


def coverage(rows: Sequence[Mapping[str, Any]], table: Mapping[str, Any] | str | None = None,
             *, section: str = "throughput", held_only: bool = True) -> tuple[int, int]:
    """(runs inside their band, runs) for the rows, each against `table` (default: the table built
    from the same rows) or, with table="loso", against a table built without the row's source.
    Throughput coverage counts only runs held to the target when `held_only`."""
    inside = total = 0
    sources = {r["source"] for r in rows}
    tables = {}
    if table == "loso":
        tables = {s: build_table([r for r in rows if r["source"] != s], residuals="out-of-source",
                                 held_only=held_only) for s in sources}
    else:
        built = table if table is not None else build_table(rows, residuals="out-of-source", held_only=held_only)
    for r in rows:
        if section == "throughput" and held_only and not r.get("held", True):
            continue
        ratio = throughput_ratio(r) if section == "throughput" else memory_ratio(r)
        if ratio is None:
            continue
        t = tables[r["source"]] if table == "loso" else built
        band = lookup(residual_kind(r), t, section=section)
        total += 1
        inside += _inside(ratio, band.low, band.high)
    return inside, total


def report(rows: Sequence[Mapping[str, Any]], table: Mapping[str, Any], *, held_only: bool = True) -> int:
    print(f"band table from {len(rows)} runs ({table['residuals']} residuals)")
    print(f"{'kind':30} {'runs':>5} {'sources':>7} {'measured/predicted band':>24}  {'coverage':>9}")
    kinds = sorted({residual_kind(r).key for r in rows})
    for key in kinds:
        kind_rows = [r for r in rows if residual_kind(r).key == key]
        b = lookup(residual_kind(kind_rows[0]), table)
        inside, total = coverage(kind_rows, table, held_only=held_only)
        counted = [r for r in kind_rows if not held_only or r.get("held", True)]
        sources = len({r["source"] for r in counted})
        print(f"{key:30} {total:5d} {sources:7d} {b.low:11.3f} - {b.high:<10.3f}  {inside:3d}/{total:<3d}  ({b.level})")
    ok = True
    for section in ("throughput", "memory"):
        inside, total = coverage(rows, table, section=section, held_only=held_only)
        if not total:
            print(f"{section}: no run reports it")
            continue
        loso_in, loso_total = coverage(rows, "loso", section=section, held_only=held_only)
        line = (f"{section} coverage: in-table {inside}/{total} = {inside / total:.0%}; "
                f"leave-one-source-out {loso_in}/{loso_total} = {loso_in / loso_total:.0%} (target >= {TARGET:.0%})")
        print(line)
        ok = ok and inside / total >= TARGET
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-sample", action="store_true",
                        help="predict the validation runs with the current model instead of reading residual files")
    parser.add_argument("--check", action="store_true", help="report coverage, do not write the table")
    parser.add_argument("--all-runs", action="store_true",
                        help='also use runs not held to the accuracy target ("held": false, e.g. another framework)')
    parser.add_argument("--out", type=Path, default=TABLE_PATH)
    args = parser.parse_args(argv)
    if args.in_sample:
        rows, kind = in_sample_residuals(), "in-sample"
    else:
        rows, kind = load_residuals(RESIDUALS), "out-of-source"
        if not rows:
            print("no residuals_train.json / residuals_serve.json next to this script: run the validation "
                  "scripts first, or pass --in-sample", file=sys.stderr)
            return 2
    held_only = not args.all_runs
    left = [r for r in rows if not r.get("held", True)]
    if left and held_only:
        print(f"throughput: left out {len(left)} runs not held to the target (--all-runs keeps them): "
              + ", ".join(sorted({str(r['source']) for r in left})))
    sources = sorted({str(r["source"]) for r in rows})
    table = build_table(rows, residuals=kind, sources=sources, held_only=held_only)
    status = report(rows, table, held_only=held_only)
    if not args.check:
        args.out.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
        print(f"wrote {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
