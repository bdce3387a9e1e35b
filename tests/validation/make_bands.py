"""Build autoshard's packaged prediction-band table from validation residuals and report its coverage.

    python tests/validation/make_bands.py            # from residuals_train.json + residuals_serve.json
    python tests/validation/make_bands.py --in-sample  # no residual files: predict the runs with the
                                                       # current model (in-sample; a weaker check)
    python tests/validation/make_bands.py --check     # print coverage only, write nothing
    python tests/validation/make_bands.py --choose-coverage  # the central-probability scan per mode and family
    python tests/validation/make_bands.py --mfu-reference    # also regenerate mfu_reference.json

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
bands do on runs they have never seen), per section (throughput, memory, TTFT, TPOT) and mode. The
target is >= 80 % of runs inside their band out-of-source; the exit status is 1 when throughput
misses it in a mode.

--mfu-reference rebuilds autoshard/costmodel/mfu_reference.json, the physical-sanity references: per
GPU class x precision x dense/MoE the held training run with the best measured useful MFU (causal
attention core counted once), with its run id and citation, and prints how many held runs the flag
would fire on against it (must be 0) and against a table built without their own source.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from autoshard.costmodel.band_table import (  # noqa: E402
    COVERAGE,
    LATENCY_METRICS,
    Kind,
    THROUGHPUT_METRICS,
    build_table,
    latency_ratio,
    memory_ratio,
    residual_kind,
    throughput_ratio,
)
from autoshard.costmodel.bands import TABLE_PATH, lookup  # noqa: E402
from autoshard.costmodel.sanity import MFU_REFERENCE_PATH  # noqa: E402

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
    """Residual rows of the current model on the validation runs, as the validation scripts write them
    but with predicted_loso = predicted_fit (the all-in fit: in-sample for training; serving fits
    nothing on its runs, so its rows are the same either way)."""
    sys.path.insert(0, str(HERE))
    import validate_published
    import validate_serving

    runs = validate_published.load_runs()
    fit = {r["id"]: (p, p) for r, p in zip(runs, validate_published.evaluate_runs(runs=runs), strict=True)}
    rows = validate_published.residual_rows(runs, fit)
    online = validate_serving.evaluate_online() + validate_serving.evaluate_burst()
    rows += validate_serving.residuals(validate_serving.evaluate_runs(), online)
    return [dict(r, predicted_loso=r["predicted_fit"]) for r in rows]


def _inside(ratio: float, lo: float, hi: float) -> bool:
    return lo * (1 - 1e-9) <= ratio <= hi * (1 + 1e-9)


SECTIONS = ("throughput", "memory", *LATENCY_METRICS)


def _ratio(row: Mapping[str, Any], section: str, held_only: bool) -> float | None:
    """The row's measured/predicted ratio in `section`, None where the row is not part of it."""
    if section == "memory":
        return memory_ratio(row)
    if held_only and not row.get("held", True):
        return None
    if section == "throughput":
        return throughput_ratio(row) if str(row["metric"]) in THROUGHPUT_METRICS else None
    return latency_ratio(row) if str(row["metric"]) in LATENCY_METRICS[section] else None


def coverage_runs(rows: Sequence[Mapping[str, Any]], table: Mapping[str, Any] | str | None = None,
                  *, section: str = "throughput", held_only: bool = True,
                  cover: Mapping[str, float] | None = None) -> list[tuple[Mapping[str, Any], bool, float, float]]:
    """(row, inside, band low, band high) for every row of `section`, each against `table` (default:
    the table built from the same rows) or, with table="loso", against a table built without the row's
    source. `cover`: the central probability per mode and family (default: the shipped COVERAGE)."""
    sources = {r["source"] for r in rows}
    tables: dict[str, Mapping[str, Any]] = {}
    if table == "loso":
        tables = {s: build_table([r for r in rows if r["source"] != s], residuals="out-of-source",
                                 held_only=held_only, coverage=cover) for s in sources}
    else:
        built = table if table is not None else build_table(rows, residuals="out-of-source", held_only=held_only,
                                                             coverage=cover)
    out = []
    for r in rows:
        ratio = _ratio(r, section, held_only)
        if ratio is None:
            continue
        t = tables[r["source"]] if table == "loso" else built
        band = lookup(residual_kind(r), t, section=section)
        out.append((r, _inside(ratio, band.low, band.high), band.low, band.high))
    return out


def coverage(rows: Sequence[Mapping[str, Any]], table: Mapping[str, Any] | str | None = None,
             *, section: str = "throughput", held_only: bool = True, mode: str | None = None,
             family: str | None = None, cover: Mapping[str, float] | None = None) -> tuple[int, int]:
    """(runs inside their band, runs) of `section` (and `mode`, `family` if given); see coverage_runs."""
    got = [inside for r, inside, _, _ in coverage_runs(rows, table, section=section, held_only=held_only, cover=cover)
           if (mode is None or residual_kind(r).mode == mode) and (family is None or residual_kind(r).family == family)]
    return sum(got), len(got)


def report(rows: Sequence[Mapping[str, Any]], table: Mapping[str, Any], *, held_only: bool = True) -> int:
    print(f"band table from {len(rows)} rows ({table['residuals']} residuals); central probability "
          + ", ".join(f"{m} {p:g}" for m, p in sorted(table["coverage"].items())))
    ok = True
    for section in SECTIONS:
        in_table = coverage_runs(rows, table, section=section, held_only=held_only)
        if not in_table:
            print(f"\n{section}: no run reports it")
            continue
        loso = coverage_runs(rows, "loso", section=section, held_only=held_only, cover=table["coverage"])
        print(f"\n{section}: {'kind':28} {'runs':>5} {'sources':>7} {'measured/predicted':>19} {'width':>7}  "
              f"{'in-table':>8} {'out-of-source':>13}")
        for key in sorted({residual_kind(r).key for r, *_ in in_table}):
            mine = [x for x in in_table if residual_kind(x[0]).key == key]
            theirs = [x for x in loso if residual_kind(x[0]).key == key]
            b = lookup(residual_kind(mine[0][0]), table, section=section)
            srcs = len({r["source"] for r, *_ in mine})
            print(f"{'':{len(section) + 2}}{key:28} {len(mine):5d} {srcs:7d} {b.low:8.3f} - {b.high:<8.3f} "
                  f"{(b.high / b.low) ** 0.5 - 1:6.1%}  {sum(x[1] for x in mine):3d}/{len(mine):<4d} "
                  f"{sum(x[1] for x in theirs):5d}/{len(theirs):<4d}  ({b.level})")
        pools = sorted({residual_kind(r).mode for r, *_ in in_table}
                       | {_pool(residual_kind(r)) for r, *_ in in_table})
        for pool in pools:  # each mode, then each mode's families ("train", "train/dense", "train/moe", ...)
            mine = [x for x in in_table if pool in (residual_kind(x[0]).mode, _pool(residual_kind(x[0])))]
            theirs = [x for x in loso if pool in (residual_kind(x[0]).mode, _pool(residual_kind(x[0])))]
            i, n = sum(x[1] for x in mine), len(mine)
            li, ln = sum(x[1] for x in theirs), len(theirs)
            width = statistics.median([(hi / lo) ** 0.5 - 1 for _, _, lo, hi in theirs])
            print(f"{section} {pool} coverage: in-table {i}/{n} = {i / n:.0%}; leave-one-source-out {li}/{ln} = "
                  f"{li / ln:.0%} (target >= {TARGET:.0%}); median half-width out-of-source +-{width:.1%}")
            if section == "throughput":
                ok = ok and li / ln >= TARGET
    return 0 if ok else 1


def _pool(kind: Kind) -> str:
    """The "mode/family" a run's band takes its central probability from (COVERAGE)."""
    return f"{kind.mode}/{kind.family}"


GRID_P = [round(0.70 + 0.025 * i, 3) for i in range(12)]
"""Central probabilities the scan tries: 0.700, 0.725, ..., 0.975."""


def choose_coverage(rows: Sequence[Mapping[str, Any]], *, held_only: bool = True) -> dict[str, float]:
    """Per mode and family ("train/dense", "train/moe", ...) the smallest central probability of GRID_P
    whose throughput bands cover >= TARGET of that family's runs leave-one-source-out (printed as it
    goes). A family's bands take only its own P, so one scan serves every family."""
    chosen: dict[str, float] = {}
    pools = sorted({_pool(residual_kind(r)) for r in rows if _ratio(r, "throughput", held_only) is not None})
    for p in GRID_P:
        got = coverage_runs(rows, "loso", held_only=held_only, cover={pool: p for pool in pools})
        for pool in pools:
            mine = [x for x in got if _pool(residual_kind(x[0])) == pool]
            share = sum(x[1] for x in mine) / len(mine)
            width = statistics.median([(hi / lo) ** 0.5 - 1 for _, _, lo, hi in mine])
            print(f"P = {p:.3f} {pool:11}: leave-one-source-out coverage {share:.0%} ({len(mine)} runs), "
                  f"median half-width +-{width:.1%}")
            if share >= TARGET and pool not in chosen:
                chosen[pool] = p
    return chosen


def measured_useful_mfu() -> list[dict[str, Any]]:
    """Every held training run's measured useful MFU: its measured step time (as validate_published
    converts the source's metric and FLOP convention) turned into useful TFLOP/s per GPU (causal
    attention core halved, `causal_model_flops_per_step`) over the GPU's dense peak at the run's
    precision. One dict per run: id, source, gpu, precision, family, mfu, tflops, peak_tflops,
    citation (the run's `source` text)."""
    sys.path.insert(0, str(HERE))
    import validate_published

    from autoshard.costmodel.flops import causal_model_flops_per_step
    from autoshard.costmodel.fp8 import quantized_peak_tflops
    from autoshard.specs.job import Precision

    out = []
    for run in validate_published.load_runs():
        if run.get("skip_throughput"):
            continue
        result = validate_published.predict_run(run)
        model = validate_published._model(run)
        p = run["parallel"]
        gpus = p["tp"] * p["pp"] * p["dp"] * p["cp"]
        tokens = run["seq_len"] * run["global_batch_size"]
        step = {
            "tflops_per_gpu": lambda v: model_flops(model, run) / (v * 1e12 * gpus),
            "step_time_s": lambda v: v,
            "tokens_per_s_per_gpu": lambda v: tokens / (v * gpus),
        }[result.metric](result.measured)
        gpu = validate_published._base_cluster(run["cluster"]).primary.gpu
        # the peak the run's GEMMs ran against, as predict_train states it
        quantized = quantized_peak_tflops(gpu, Precision(run["precision"]))
        precision, peak = (run["precision"], quantized) if quantized else ("bf16", gpu.bf16_tflops)
        useful = causal_model_flops_per_step(model, seq_len=run["seq_len"], global_batch_size=run["global_batch_size"])
        tflops = useful / step / gpus / 1e12
        out.append({"id": run["id"], "source": validate_published.source_key(run), "gpu": gpu.name,
                    "precision": precision, "family": validate_published.run_family(run),
                    "mfu": tflops / peak, "tflops": tflops, "peak_tflops": peak, "num_gpus": gpus,
                    "seq_len": run["seq_len"],
                    "citation": " ".join(str(run["source"]).split())})
    return out


def model_flops(model: Any, run: Mapping[str, Any]) -> float:
    from autoshard.costmodel.flops import model_flops_per_step

    return model_flops_per_step(model, seq_len=run["seq_len"], global_batch_size=run["global_batch_size"])


MFU_ABOUT = (
    "GENERATED by tests/validation/make_bands.py --mfu-reference from the held runs of "
    "tests/validation/training_runs.yaml: per GPU class x precision x dense/MoE the run with the best measured "
    "useful MFU = useful model FLOPs (fwd+bwd, logits, no recompute, causal attention core QK^T and AV counted "
    "over half the s x s square: autoshard.costmodel.flops.causal_model_flops_per_step) per second / dense "
    "peak of the GPU at that precision. 'gpus': the name prefixes of the GPU class (same peak). 'run_id' and "
    "'citation' are copied from the run's row. Do not edit by hand."
)


def mfu_reference(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The reference table: the best run per GPU class x precision x family."""
    from autoshard.costmodel.sanity import gpu_class

    best: dict[tuple[tuple[str, ...], str, str], Mapping[str, Any]] = {}
    for r in runs:
        key = (gpu_class(r["gpu"]), r["precision"], r["family"])
        if key not in best or r["mfu"] > best[key]["mfu"]:
            best[key] = r
    refs = [{"gpus": list(cls), "precision": prec, "family": fam, "mfu": round(r["mfu"], 4),
             "tflops": round(r["tflops"], 1), "peak_tflops": r["peak_tflops"], "run_id": r["id"],
             "run": f"{r['id']}: {r['num_gpus']} x {r['gpu']}, seq {r['seq_len']}", "citation": r["citation"]}
            for (cls, prec, fam), r in sorted(best.items())]
    return {"about": MFU_ABOUT, "references": refs}


def mfu_report(runs: Sequence[Mapping[str, Any]], table: Mapping[str, Any]) -> int:
    """Print the reference rows and how many held runs the flag would fire on: against the table
    (must be none) and against a table built without the run's source (out-of-source false alarms)."""
    from autoshard.costmodel.sanity import SANITY_MARGIN, _reference

    print(f"\nuseful-MFU references ({len(table['references'])} rows from {len(runs)} held training runs):")
    for ref in table["references"]:
        print(f"  {'/'.join(ref['gpus']):24} {ref['precision']:5} {ref['family']:6} {ref['mfu']:6.1%}  {ref['run_id']}")
    fired = loso_fired = 0
    for r in runs:
        ref, _ = _reference(r["gpu"], r["precision"], r["family"], table["references"])
        fired += ref is not None and r["mfu"] > ref["mfu"] * (1 + SANITY_MARGIN)
        other = mfu_reference([x for x in runs if x["source"] != r["source"]])["references"]
        ref, _ = _reference(r["gpu"], r["precision"], r["family"], other)
        loso_fired += ref is not None and r["mfu"] > ref["mfu"] * (1 + SANITY_MARGIN)
    print(f"sanity flag on measured runs: {fired}/{len(runs)} against the table; {loso_fired}/{len(runs)} against "
          "a table built without the run's source")
    return 1 if fired else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-sample", action="store_true",
                        help="predict the validation runs with the current model instead of reading residual files")
    parser.add_argument("--check", action="store_true", help="report coverage, do not write the table")
    parser.add_argument("--all-runs", action="store_true",
                        help='also use runs not held to the accuracy target ("held": false, e.g. another framework)')
    parser.add_argument("--choose-coverage", action="store_true",
                        help="print leave-one-source-out coverage for central probabilities 0.700-0.975 per mode "
                             "and family, and the smallest reaching the target (the shipped COVERAGE is that choice)")
    parser.add_argument("--mfu-reference", action="store_true",
                        help="also regenerate autoshard/costmodel/mfu_reference.json (best measured useful MFU per "
                             "GPU class x precision x dense/MoE) from the held training runs")
    parser.add_argument("--out", type=Path, default=TABLE_PATH)
    args = parser.parse_args(argv)
    if args.mfu_reference:
        runs = measured_useful_mfu()
        ref = mfu_reference(runs)
        if mfu_report(runs, ref):
            return 1
        if not args.check:
            MFU_REFERENCE_PATH.write_text(json.dumps(ref, indent=1) + "\n")
            print(f"wrote {MFU_REFERENCE_PATH}")
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
    if args.choose_coverage:
        chosen = choose_coverage(rows, held_only=held_only)
        print("smallest central probability reaching the target: "
              + ", ".join(f"{m} {p:g}" for m, p in sorted(chosen.items())) + f" (shipped: "
              + ", ".join(f"{m} {p:g}" for m, p in sorted(COVERAGE.items())) + ")")
        return 0
    sources = sorted({str(r["source"]) for r in rows})
    table = build_table(rows, residuals=kind, sources=sources, held_only=held_only)
    status = report(rows, table, held_only=held_only)
    if not args.check:
        args.out.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
        print(f"wrote {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
