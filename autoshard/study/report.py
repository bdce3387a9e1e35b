"""Rendering of cost studies: the terminal table, study.csv, study.json, study.md and pareto.png.
Reads a StudyResult; solves nothing."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autoshard.report.fit import table as fit_table

from autoshard.study.costs import Row, ServeRow, StudyResult, TrainRow, money

__all__ = ["render_study", "table_rows", "write_outputs", "write_csv", "write_json", "write_markdown",
           "write_pareto_png"]


def _si(value: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= div:
            return f"{value / div:.2f}{unit}"
    return f"{value:.0f}"


def _headers(result: StudyResult) -> list[str]:
    if result.mode == "train":
        return ["cluster", "GPUs", "plan", "MFU", "tokens/s", "days", "GPU-hours", "total $", "$/M tokens", "status",
                "Pareto"]
    return ["cluster", "GPUs", "plan", "GPUs used", "out tok/s", "req/s", "TTFT ms", "TPOT ms", "$/hour",
            "$/M out tokens", "status", "Pareto"]


def _status(r: Row) -> str:
    """"optimal" for a proven optimum, else the remaining gap ("not proven" where there is none to give: a
    solve cut by the clock can stop with its bound at the objective and still not have proven it)."""
    gap = getattr(r, "gap", None)
    if r.status == "optimal":
        return "optimal"
    if not gap:
        return "not proven"
    return f"gap {100 * gap:.2g}%" if gap < 0.01 else f"gap {100 * gap:.1f}%"


def table_rows(result: StudyResult) -> list[list[str]]:
    """The study table as text cells (terminal and markdown share it)."""
    out = []
    for r in result.rows:
        mark = "*" if result.is_pareto(r) else ""
        if isinstance(r, TrainRow):
            per_m = "n/a" if r.usd_per_million_tokens is None else f"${r.usd_per_million_tokens:.3f}"
            out.append([r.cluster, f"{r.num_gpus:,}", r.plan, f"{r.mfu:.1%}" + (" !" if r.sanity else ""),
                        _si(r.tokens_per_s),
                        _range(f"{r.days:,.1f}", r.days_low, r.days_high, lambda d: f"{d:,.1f}"), _si(r.gpu_hours),
                        _range(money(r.total_usd), r.total_usd_low, r.total_usd_high, money), per_m, _status(r), mark])
        else:
            assert isinstance(r, ServeRow)
            per_m = "n/a" if r.usd_per_million_output_tokens is None else f"${r.usd_per_million_output_tokens:.3f}"
            per_m = _range(per_m, r.usd_per_million_output_tokens_low, r.usd_per_million_output_tokens_high,
                           lambda v: f"${v:.3f}")
            miss = "" if r.meets_targets else " (misses target)"
            out.append([r.cluster, f"{r.num_gpus:,}", r.plan, f"{r.gpus_used:,}",
                        _si(r.throughput_tokens_per_s), f"{r.requests_per_s:.2f}", f"{r.ttft_s * 1e3:.0f}",
                        f"{r.tpot_s * 1e3:.1f}{miss}", money(r.usd_per_hour), per_m, _status(r), mark])
    return out


def _range(point: str, low: float | None, high: float | None, fmt: Any) -> str:
    """"41.2 (38.1-47.0)": the point figure and its likely range from the prediction band."""
    if low is None or high is None:
        return point
    return f"{point} ({fmt(low)}-{fmt(high)})"


def _count(value: float) -> str:
    """15e12 -> "15T", 2.5e11 -> "250B"."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if abs(value) >= div:
            return f"{value / div:.4g}{unit}"
    return f"{value:.4g}"


def _axis_money(value: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= div:
            return f"${value / div:.3g}{unit}"
    return f"${value:.3g}"


def _title(result: StudyResult) -> str:
    i = result.inputs
    if result.mode == "train":
        return f"{i['model']}: training {_count(i['tokens'])} tokens"
    rate = i["job"].get("request_rate")
    return f"{i['model']}: serving {rate:g} requests/s" if rate else f"{i['model']}: serving"


def _pareto_line(r: Row) -> str:
    if isinstance(r, TrainRow):
        return f"{r.num_gpus:,} x {r.gpu} ({r.cluster}): {r.days:,.1f} days, {money(r.total_usd)}, {r.plan}"
    assert isinstance(r, ServeRow)
    return (f"{r.gpus_used:,} x {r.gpu} ({r.cluster}): TPOT {r.tpot_s * 1e3:.1f} ms, "
            f"${r.usd_per_million_output_tokens or 0:.3f} per million output tokens, {r.plan}")


_LEGEND = {
    "train": "* on the Pareto front (no other option is both faster and cheaper); status: optimal = proven "
             "optimal, gap = the best plan found within the time or gap limit, the bound that much better; "
             "(low-high): likely range from the prediction band; ! useful MFU more than 10 % above the best "
             "measured for the GPU class, precision and dense/MoE (rows' sanity in study.json).",
    "serve": "* on the Pareto front (no other option has both a lower TPOT and a lower cost per token); "
             "status: optimal = proven optimal, otherwise the best found within the solver's limits; "
             "(low-high): likely range from the prediction band.",
}

# Narrow terminals: figures that belong together share a cell on two lines, the plan moves to a key.
# A likely range "(lo-hi)" goes on its own line under its point figure, and the status under the
# cluster and its GPU count, so that the ranges never widen the table past 80 columns.
_STACKED = {
    "train": [("#", ()), ("cluster\nGPUs\nstatus", ("cluster", "GPUs", "status")), ("MFU", ("MFU",)),
              ("tokens/s", ("tokens/s",)), ("days\nGPU-hours", ("days", "GPU-hours")),
              ("total $\n$/M tok", ("total $", "$/M tokens")), ("P", ("Pareto",))],
    "serve": [("#", ()), ("cluster\nGPUs\nstatus", ("cluster", "GPUs", "status")), ("used", ("GPUs used",)),
              ("out tok/s\nreq/s", ("out tok/s", "req/s")), ("TTFT ms\nTPOT ms", ("TTFT ms", "TPOT ms")),
              ("$/hour\n$/M out", ("$/hour", "$/M out tokens")), ("P", ("Pareto",))],
}
_LEFT = {"cluster", "plan", "status", "Pareto", "P", "cluster\nGPUs\nstatus", "#"}
_TEXT = {"cluster", "plan", "status"}


def _wide_table(result: StudyResult) -> Table:
    table = fit_table()
    for h in _headers(result):
        table.add_column(h, justify="left" if h in _LEFT else "right", no_wrap=True)
    for cells in table_rows(result):
        table.add_row(*cells, style="bold" if cells[-1] else None)
    return table


def _stacked_table(result: StudyResult, *, with_plan: bool) -> Table:
    table = fit_table()
    spec = list(_STACKED[result.mode])
    if with_plan:
        spec = spec[:2] + [("plan", ("plan",))] + spec[2:]
    for h, _ in spec:  # folds rather than cuts if even this is too wide (a very long cluster name)
        table.add_column(h, justify="left" if h in _LEFT else "right", no_wrap=True, overflow="fold")
    index = {h: i for i, h in enumerate(_headers(result))}
    for k, cells in enumerate(table_rows(result), 1):
        row = [str(k)] + ["\n".join(cells[index[name]] if name in _TEXT else cells[index[name]].replace(" (", "\n(")
                                    for name in names) for _, names in spec[1:]]
        table.add_row(*row, style="bold" if cells[-1] else None, end_section=True)
    return table


def render_study(result: StudyResult, console: Console) -> None:
    """Answers first, then the table, the skipped sizes and the notes, all within the console's
    width: a table too wide for it stacks related figures in one cell and lists the plans below."""
    width = console.width
    console.print(Text(_title(result), style="bold"), highlight=False)
    for a in result.answers:
        head, _, rest = a.text.partition(": ")
        console.print(_indent(f"[bold green]{escape(head)}:[/bold green] {escape(rest)}", width), highlight=False)
    def fits(t: Table) -> bool:
        return console.measure(t, options=console.options.update_width(1000)).maximum <= width

    table = _wide_table(result)
    stacked = _stacked_table(result, with_plan=True)
    if fits(table):
        console.print(table)
    elif fits(stacked):
        console.print(stacked)
    else:
        console.print(_stacked_table(result, with_plan=False))
        console.print("Plans:", style="bold")
        plan_at = _headers(result).index("plan")
        for k, cells in enumerate(table_rows(result), 1):
            console.print(_indent(f"{k:>3}  {escape(cells[plan_at])}", width, 7), highlight=False)
    console.print(_indent(escape(_LEGEND[result.mode]), width), highlight=False)
    if result.skipped:
        console.print("[bold]Sizes that cannot run:[/bold]")
        for s in result.skipped:
            reason = " ".join(s.reason.split())
            console.print(_indent(escape(f"{s.cluster} x {s.num_gpus:,}: {reason}"), width), highlight=False)
    for note in result.notes:
        console.print(_indent(f"[yellow]note:[/yellow] {escape(note)}", width), highlight=False)


def _indent(markup: str, width: int, hang: int = 4) -> Text:
    """A paragraph wrapped to `width`, its continuation lines indented by `hang` spaces."""
    text = Text.from_markup(markup)
    lines = text.wrap(Console(width=width), width - hang)
    out = Text()
    for i, line in enumerate(lines):
        if i:
            out.append("\n" + " " * hang)
        out.append_text(line)
    return out


# ----------------------------------------------------------------------------- files


def write_outputs(result: StudyResult, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_csv(result, out_dir / "study.csv"), write_json(result, out_dir / "study.json"),
            write_markdown(result, out_dir / "study.md"), write_pareto_png(result, out_dir / "pareto.png")]


def write_csv(result: StudyResult, path: Path) -> Path:
    """One line per (cluster, size): the figures at full precision, skipped sizes with their reason."""
    rows = [{**_flat(r), "pareto": result.is_pareto(r), "skipped_reason": ""} for r in result.rows]
    fields = list(rows[0]) if rows else ["cluster", "num_gpus", "pareto", "skipped_reason"]
    for s in result.skipped:
        rows.append({**dict.fromkeys(fields, ""), "cluster": s.cluster, "num_gpus": s.num_gpus, "status": "skipped",
                     "skipped_reason": " ".join(s.reason.split())})
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _flat(r: Row) -> dict[str, Any]:
    from dataclasses import asdict

    d = asdict(r)
    degrees = d.pop("degrees", None) or {}
    return {**d, **{k: v for k, v in degrees.items()}}


def write_json(result: StudyResult, path: Path) -> Path:
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    return path


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return lines


def markdown(result: StudyResult) -> str:
    i = result.inputs
    lines = [f"# Cost study: {_title(result)}", ""]
    lines += ["## Inputs", "",
              f"- Model: {i['model']} ({i['params'] / 1e9:.1f} B parameters)",
              f"- Clusters: {', '.join(i['clusters'])}",
              f"- GPU counts: {', '.join(f'{n:,}' for n in i['sizes'])}"]
    if result.mode == "train":
        job = i["job"]
        lines += [f"- Tokens: {_count(i['tokens'])} ({i['tokens']:.4g})",
                  f"- Job: sequence length {job['seq_len']}, global batch {job['global_batch_size']}, "
                  f"{job['precision']}"]
        if i["deadline_days"] is not None:
            lines.append(f"- Deadline: {i['deadline_days']:g} days")
        if i["budget_usd"] is not None:
            lines.append(f"- Budget: {money(i['budget_usd'])}")
    lines += ["", "## Answers", ""] + [f"- **{a.text.partition(': ')[0]}:** {a.text.partition(': ')[2]}"
                                        for a in result.answers]
    lines += ["", "## All options", ""] + _md_table(_headers(result), table_rows(result))
    lines += ["", "`*`" + _LEGEND[result.mode][1:], "", "## Pareto front", ""]
    lines += [f"{k + 1}. {_pareto_line(r)}" for k, r in enumerate(result.pareto)] or ["(no priced options)"]
    if result.skipped:
        lines += ["", "## Sizes that cannot run", ""]
        lines += [f"- {s.cluster} x {s.num_gpus:,}: {' '.join(s.reason.split())}" for s in result.skipped]
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    lines += ["", "## Assumptions", ""] + [f"- {a}" for a in result.assumptions]
    lines += ["", f"Generated by `autoshard study` in {result.wall_s:.0f} s.", ""]
    return "\n".join(lines)


def write_markdown(result: StudyResult, path: Path) -> Path:
    path.write_text(markdown(result), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- plot

_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]


def write_pareto_png(result: StudyResult, path: Path) -> Path:
    """Time (or TPOT) vs cost, one series per cluster kind, the Pareto front drawn and labelled.
    Uses the Agg canvas directly: no pyplot, no global backend switch."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

    train = result.mode == "train"
    fig = Figure(figsize=(12, 6.5), dpi=120)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    priced = [r for r in result.rows if r.y is not None]
    clusters = list(dict.fromkeys(r.cluster for r in result.rows))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    labelled = {(r.x, r.y) for r in result.pareto}
    for k, name in enumerate(clusters):
        pts = sorted((r for r in priced if r.cluster == name), key=lambda r: r.x)
        if not pts:
            continue
        gpu = pts[0].gpu
        ax.plot([r.x for r in pts], [r.y or 0.0 for r in pts], marker=_MARKERS[k % len(_MARKERS)], linestyle="-",
                linewidth=1.0, alpha=0.85, color=palette[k % len(palette)], label=f"{name} ({gpu})", markersize=6,
                zorder=3)
        for r in pts:
            if (seg := _likely_segment(r)) is not None:
                ax.plot(*seg, color=palette[k % len(palette)], alpha=0.3, linewidth=4, solid_capstyle="butt", zorder=1)
        for r in pts:
            if (r.x, r.y) in labelled:
                continue  # a front point (numbered below) or a duplicate already labelled
            labelled.add((r.x, r.y))
            ax.annotate(f"{_gpus(r):,}", (r.x, r.y), textcoords="offset points", xytext=(5, 4), fontsize=7,
                        color=palette[k % len(palette)])
    front = sorted(result.pareto, key=lambda r: r.x)
    if front:
        xs, ys = [front[0].x], [front[0].y or 0.0]
        for r in front[1:]:  # staircase: the best cost reachable by each time
            xs += [r.x, r.x]
            ys += [ys[-1], r.y or 0.0]
        ax.plot(xs, ys, color="black", linestyle="--", linewidth=1.2, zorder=2, label="Pareto front")
        ax.scatter([r.x for r in front], [r.y or 0.0 for r in front], s=140, facecolors="none", edgecolors="black",
                   linewidths=1.5, zorder=4)
        for j, r in enumerate(front, 1):  # numbered here, spelled out beside the legend
            # up and to the right: the front falls to the right, so that side is clear of its neighbours
            ax.annotate(str(j), (r.x, r.y), textcoords="offset points", xytext=(6, 6), ha="left", va="bottom",
                        fontsize=8, fontweight="bold", zorder=5)
    if train and result.inputs.get("deadline_days") is not None:
        ax.axvline(result.inputs["deadline_days"], color="#888888", linestyle=":", linewidth=1.2,
                   label=f"deadline {result.inputs['deadline_days']:g} days")
    if train and result.inputs.get("budget_usd") is not None:
        ax.axhline(result.inputs["budget_usd"], color="#aa4444", linestyle=":", linewidth=1.2,
                   label=f"budget {money(result.inputs['budget_usd'])}")
    if priced:
        _log_if_wide(ax, [r.x for r in priced], "x")
        _log_if_wide(ax, [r.y for r in priced if r.y], "y")
    for axis, fmt in ((ax.yaxis, (lambda v, _: _axis_money(v)) if train else (lambda v, _: f"${v:.3g}")),
                      (ax.xaxis, lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:g}")):
        axis.set_major_formatter(FuncFormatter(fmt))
        if axis.get_scale() == "log":
            axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
            axis.set_minor_formatter(FuncFormatter(fmt))
    ax.set_xlabel("days to train" if train else "time per output token (ms)")
    ax.set_ylabel("total cost (USD)" if train else "USD per million output tokens")
    ax.set_title(f"{_title(result)}: {'time vs cost' if train else 'latency vs cost'} "
                 "(labels: GPU count; circled and numbered: Pareto front; shaded: likely range)", fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    if priced:
        legend = ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        box = legend.get_window_extent(canvas.get_renderer()).transformed(ax.transAxes.inverted())
        ax.text(1.02, box.y0 - 0.04, _front_key(front, train), transform=ax.transAxes, va="top", ha="left",
                fontsize=7.5, family="monospace")
    else:
        ax.text(0.5, 0.5, "no priced options to plot", ha="center", va="center", transform=ax.transAxes)
    ax.margins(x=0.06, y=0.1)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def _likely_segment(r: Row) -> tuple[list[float], list[float]] | None:
    """The likely range of a point as a segment: days and dollars move together (both scale with
    1/throughput); serving, the cost per token at the same TPOT."""
    if isinstance(r, TrainRow):
        if None in (r.days_low, r.days_high, r.total_usd_low, r.total_usd_high):
            return None
        return [r.days_low or 0.0, r.days_high or 0.0], [r.total_usd_low or 0.0, r.total_usd_high or 0.0]
    lo, hi = r.usd_per_million_output_tokens_low, r.usd_per_million_output_tokens_high
    return None if lo is None or hi is None else ([r.x, r.x], [lo, hi])


def _front_key(front: list[Row], train: bool, most: int = 18) -> str:
    lines = ["Pareto front:"]
    for j, r in enumerate(front[:most], 1):
        figures = f"{r.x:,.1f} d, {money(r.y)}" if train else f"{r.x:.1f} ms, ${r.y or 0.0:.3f}/M"
        lines.append(f"{j:>2}. {_gpus(r):>6,} x {r.gpu.split('-')[0]:<6} {figures}")
    if len(front) > most:
        lines.append(f"    ... {len(front) - most} more in study.md")
    return "\n".join(lines)


def _gpus(r: Row) -> int:
    return r.gpus_used if isinstance(r, ServeRow) else r.num_gpus


def _log_if_wide(ax: Any, values: list[float], axis: str) -> None:
    lo, hi = min(values), max(values)
    if lo > 0 and hi / lo > 8:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
