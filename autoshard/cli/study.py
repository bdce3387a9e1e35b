"""`autoshard study`: the pre-provisioning cost study (`autoshard.api.study`), with a progress bar on
stderr, the answers and table (or one JSON object) on stdout, and the report files under --out."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autoshard import api
from autoshard.api import MAX_TOKENS
from autoshard.cli.app import app, err, flush_stdout, guard, out, write_stdout
from autoshard.cli.options import GbsOpt, Mode, SeqOpt, StudyJsonOpt, command_started, float_option
from autoshard.errors import SpecError

FRONT_SHARE_OF_STUDY = 0.4
"""A serving study's share of --time-limit for its Pareto fronts (one per cluster kind, after the sizes)."""
MIN_FRONT_S = 0.5
"""The least time one front gets (a front cut short says so)."""


@app.command(short_help="Cost study: the best plan per cluster kind, in days and dollars.")
@guard
def study(
    model: Annotated[str, typer.Argument(help="Model: bundled name, YAML path, or config.json.")],
    cluster: Annotated[list[str], typer.Option("--cluster", help="Cluster kind to compare (repeat).")],
    gpus: Annotated[str, typer.Option("--gpus", help="Comma-separated GPU counts, e.g. 64,128,256.")],
    tokens: Annotated[float | None, float_option("--tokens", lo=1, hi=MAX_TOKENS, help="Training tokens (default: the model's training: tokens).")] = None,
    deadline_days: Annotated[float | None, float_option("--deadline-days", lo=0.001, hi=1e7, help="Finish within this many days.")] = None,
    budget_usd: Annotated[float | None, float_option("--budget-usd", lo=1, hi=1e12, help="Spend at most this many dollars.")] = None,
    price: Annotated[list[str] | None, typer.Option("--price", help="Override a price: CLUSTER=USD_PER_GPU_HOUR (repeat).")] = None,
    mode: Annotated[Mode, typer.Option("--mode", help="train or serve.")] = Mode.TRAIN,
    seq_len: SeqOpt = None,
    global_batch_size: GbsOpt = None,
    precision: Annotated[str | None, typer.Option("--precision", help="Train: bf16, fp8 or fp4. Serve: the weights, bf16, fp8, int8, int4, nvfp4 or mxfp4 (default: the model's serving precision).")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write study.csv, study.json, study.md and pareto.png here.")] = None,
    json_out: StudyJsonOpt = False,
    time_limit: Annotated[float, float_option("--time-limit", lo=0.5, hi=86400, help="Time limit for the whole study, start-up included: its sizes share it (each size at least 0.5 s); serving studies give 40 % of it to the Pareto fronts.")] = 60.0,
    jobs: Annotated[int, typer.Option("--jobs", min=0, max=256, help="Parallel solver processes (0: one per CPU).")] = 0,
    request_rate: Annotated[float | None, float_option("--request-rate", lo=0.0001, hi=1e6, help="Serve: requests/s to sustain.")] = None,
    tpot_ms: Annotated[float | None, float_option("--tpot-ms", lo=0.001, hi=3.6e6, help="Serve: time per output token target (ms).")] = None,
    ttft_s: Annotated[float | None, float_option("--ttft-s", lo=0.001, hi=86400, help="Serve: time to first token target (s).")] = None,
) -> None:
    """Pre-provisioning cost study: the best plan per cluster kind and size, time and dollars."""
    sizes = parse_sizes(gpus)
    prices = parse_prices(price or [])
    run_study(model=model, clusters=cluster, sizes=sizes, tokens=tokens, deadline_days=deadline_days,
              budget_usd=budget_usd, prices=prices, mode=mode.value, seq_len=seq_len,
              global_batch_size=global_batch_size, precision=precision, out_dir=out_dir, json_out=json_out,
              time_limit=time_limit, jobs=jobs, request_rate=request_rate, tpot_ms=tpot_ms, ttft_s=ttft_s)


def run_study(*, model: str, clusters: list[str], sizes: list[int], tokens: float | None,
              deadline_days: float | None, budget_usd: float | None, prices: dict[str, float], mode: str,
              seq_len: int | None, global_batch_size: int | None, precision: str | None, out_dir: Path | None,
              json_out: bool, time_limit: float, jobs: int, request_rate: float | None,
              tpot_ms: float | None = None, ttft_s: float | None = None) -> api.StudyResult:
    """Solve with a progress bar on stderr, print the answers and the table on stdout (or one JSON
    object with `json_out`), and write the report files under `out_dir`."""
    started = command_started()  # --time-limit covers the whole command
    if out_dir is not None:
        api.check_output_dir(out_dir, "--out", api.STUDY_DIR)
    bar = Progress(TextColumn("solving"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=err, transient=True,
                   disable=json_out or not err.is_terminal)
    task = bar.add_task("", total=None)

    def progress(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, description=f"last: {label}" if label else "")
        if done == 0:
            bar.start()  # its refresh thread starts after the worker processes are forked

    try:
        result = api.study(model, clusters, sizes, mode=mode, tokens=tokens, deadline_days=deadline_days,
                           budget_usd=budget_usd, prices=prices, seq_len=seq_len, global_batch_size=global_batch_size,
                           precision=precision, request_rate=request_rate, tpot_ms=tpot_ms, ttft_s=ttft_s,
                           time_limit_s=time_limit, jobs=jobs, progress=progress, started_at=started,
                           share=1.0 if mode == "train" else 1.0 - FRONT_SHARE_OF_STUDY)
    except KeyboardInterrupt:
        bar.stop()
        where = f"; nothing was written to {out_dir}" if out_dir is not None else ""
        err.print(f"study interrupted before it finished{where}", highlight=False, markup=False)
        raise SystemExit(130) from None
    finally:
        bar.stop()
    fronts, extra = None, []
    if mode == "serve":
        left = time_limit - (time.monotonic() - started)  # one front per cluster kind, one after another
        fronts, extra = api.serve_study_fronts(model, clusters, sizes, prices=prices, precision=precision,
                                               request_rate=request_rate, tpot_ms=tpot_ms, ttft_s=ttft_s,
                                               time_limit_s=max(MIN_FRONT_S, left / max(1, len(clusters))))
    try:
        written = api.write_study(result, out_dir, extra=extra) if out_dir is not None else []
    except KeyboardInterrupt:
        err.print(f"study interrupted while writing; no complete set was left in {out_dir}", highlight=False,
                  markup=False)
        raise SystemExit(130) from None
    if json_out:
        write_stdout(json.dumps(api.study_json(result, fronts, tpot_ms, written), indent=2) + "\n")
        flush_stdout()
    else:
        api.render_study(result, out)
        if fronts:
            api.render_fronts(fronts, out, tpot_ms / 1e3 if tpot_ms else None)
        for path in written:
            err.print(f"wrote {path}", highlight=False, markup=False)
    return result


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SpecError(f"'{text}' is not a comma-separated list of GPU counts (e.g. 64,128,256)", source="--gpus") from None
    if not sizes:
        raise SpecError("give at least one positive GPU count, e.g. --gpus 64,128", source="--gpus")
    if min(sizes) < 1:  # name the bad count: "give at least one positive" read wrong for --gpus 0,8
        bad = [str(n) for n in sizes if n < 1]
        what = "is not a GPU count" if len(bad) == 1 else "are not GPU counts"
        raise SpecError(f"'{text}': {', '.join(bad)} {what}: give positive GPU counts, e.g. --gpus 64,128",
                        source="--gpus")
    return sizes


def parse_prices(items: list[str]) -> dict[str, float]:
    prices: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name.strip() in prices:  # the last one silently won
            raise SpecError(f"'{name.strip()}' is priced twice ('{item}' after {prices[name.strip()]:g}): give one "
                            "--price per cluster", source="--price")
        try:
            prices[name.strip()] = float(value)
        except ValueError:
            raise SpecError(f"'{item}' is not CLUSTER=USD_PER_GPU_HOUR (e.g. dgx-h100=2.9)", source="--price") from None
        if prices[name.strip()] <= 0:
            raise SpecError(f"price must be positive in '{item}'", source="--price")
    return prices
