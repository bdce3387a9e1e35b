"""The serving Pareto front (output tokens/s per GPU against tokens/s per user) as a table, the
points where TPOT SLAs cut it, and a PNG."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from autoshard.costmodel.band_table import Kind, gpu_generation
from autoshard.costmodel.bands import lookup
from autoshard.report.fit import PlainTable
from autoshard.search.serve.front import STANDARD_TPOT_MS, Front, FrontPoint
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec

__all__ = ["plan_on_front", "plan_line", "sla_cuts", "render_front", "write_front_png", "front_json", "FrontBand",
           "front_band"]


@dataclass(frozen=True, slots=True)
class FrontBand:
    """Where measured values land against a front's predictions: measured/predicted ranges of output
    tokens/s per GPU and of TPOT, the serving band of the cluster's kind of run (the ratios every
    serving plan's `predicted.band` is built from, `costmodel.bands`)."""

    tokens_per_s: tuple[float, float]
    tpot_s: tuple[float, float]
    basis: str

    def text(self, what: str = "band") -> str:
        (lo, hi), (tlo, thi) = self.tokens_per_s, self.tpot_s
        return (f"{what}: tok/s/GPU likely {lo:.2f}-{hi:.2f}x the figure, TPOT {tlo:.2f}-{thi:.2f}x, tok/s/user "
                f"{1 / thi:.2f}-{1 / tlo:.2f}x, $/M tokens {1 / hi:.2f}-{1 / lo:.2f}x ({self.basis})")

    def to_json(self) -> dict:
        return {"tokens_per_s_per_gpu_ratio": list(self.tokens_per_s), "tpot_s_ratio": list(self.tpot_s),
                "basis": self.basis}


def front_band(model: ModelSpec, cluster: ClusterSpec, job: ServeJob) -> FrontBand:
    """The band of every point of `cluster`'s front: one kind of run per GPU generation (MoE or dense,
    the job's weights); pools of different kinds get the widest of their ranges, said so."""
    family = "moe" if model.is_moe else "dense"
    kinds = {Kind(gpu_generation(p.gpu.name), family, job.weight_dtype.value, "serve") for p in cluster.pools}
    tput = [lookup(k) for k in sorted(kinds, key=lambda k: k.key)]
    tpot = [lookup(k, section="tpot") for k in sorted(kinds, key=lambda k: k.key)]
    basis = tput[0].basis if len(tput) == 1 else "widest of the pools' bands: " + "; ".join(t.basis for t in tput)
    return FrontBand((min(t.low for t in tput), max(t.high for t in tput)),
                     (min(t.low for t in tpot), max(t.high for t in tpot)), basis)


def sla_cuts(front: Front, tpot_target_s: float | None = None) -> list[tuple[float, FrontPoint | None]]:
    """(TPOT ms, the best deployment meeting it) for the standard SLAs and the job's own."""
    levels = set(STANDARD_TPOT_MS)
    if tpot_target_s is not None:
        levels.add(round(tpot_target_s * 1e3, 6))
    return [(ms, front.best_at(ms / 1e3)) for ms in sorted(levels)]


def front_json(front: Front, tpot_target_s: float | None = None, band: FrontBand | None = None) -> dict:
    def point(p: FrontPoint) -> dict:
        return {
            "kind": p.kind,
            "deployment": p.label,
            "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
            "tokens_per_s_per_user": p.tokens_per_s_per_user,
            "tpot_s": p.tpot_s,
            "ttft_s": p.ttft_s,
            "gpus": p.gpus,
        }

    return {
        **({"band": band.to_json()} if band is not None else {}),
        "front": [point(p) for p in front.front],
        "points_evaluated": len(front.points),
        # a front the time limit cut short is not the front: say so (extends autoshard.plan/v1)
        "complete": front.complete,
        "engines_evaluated": front.evaluated,
        "engines": front.candidates,
        "note": front.cut_text() or None,
        "sla_cuts": [
            {"tpot_ms": ms, "best": point(p) if p else None} for ms, p in sla_cuts(front, tpot_target_s)
        ],
    }


def plan_on_front(plan: Any, front: Front) -> dict:
    """Where the chosen plan sits against the front, in the front's units (tokens/s per GPU it uses, per
    user 1 / TPOT): on it, or inside it with the front point that beats it on both axes. The solver divides
    by every GPU of the cluster, the front by the GPUs a deployment uses, so a split on 6 of 8 GPUs can
    dominate the chosen plan here and still lose to it on the cluster."""
    per_gpu = plan.throughput_tokens_per_s / plan.num_gpus
    per_user = 1.0 / plan.prediction.tpot_s
    better = [p for p in front.front if p.tokens_per_s_per_gpu >= per_gpu and p.tokens_per_s_per_user >= per_user
              and (p.tokens_per_s_per_gpu > per_gpu or p.tokens_per_s_per_user > per_user)]
    beaten_by = max(better, key=lambda p: p.tokens_per_s_per_gpu, default=None)
    return {"deployment": plan.describe(), "gpus": plan.num_gpus, "tokens_per_s_per_gpu": per_gpu,
            "tokens_per_s_per_user": per_user, "on_front": beaten_by is None,
            "beaten_by": None if beaten_by is None else beaten_by.label}


def plan_line(point: dict) -> str:
    where = ("on the front" if point["on_front"] else
             f"inside the front: {point['beaten_by']} beats it per GPU used")
    return (f"the plan above: {point['tokens_per_s_per_gpu']:,.0f} tok/s/GPU over its {point['gpus']} GPUs at "
            f"{point['tokens_per_s_per_user']:.1f} tok/s/user, {where}")


def _kind(p: FrontPoint) -> str:
    return "P/D" if p.kind == "disaggregated" else "agg"


def render_front(
    front: Front, console: Console, *, title: str, tpot_target_s: float | None = None, rows: int = 24,
    band: FrontBand | None = None, cluster_gpus: int | None = None,
) -> None:
    """`cluster_gpus`: the GPUs the plan printed above divides its throughput by; when a row's deployment
    does not tile them, a note says its tok/s/GPU counts only the GPUs it runs on."""
    shown: Sequence[FrontPoint] = front.front
    if len(shown) > rows:  # keep both ends and an even spread between
        step = (len(shown) - 1) / (rows - 1)
        shown = [shown[round(i * step)] for i in range(rows)]
    table = PlainTable(
        title=f"Pareto front: {title} ({len(front.front)} of {len(front.points)} deployments)",
        header_style="bold",
    )
    for col in ("tok/s/user", "TPOT ms", "tok/s/GPU", "TTFT s", "kind", "deployment"):
        table.add_column(col, justify="left" if col in ("kind", "deployment") else "right")
    for p in shown:
        table.add_row(
            f"{p.tokens_per_s_per_user:.1f}",
            f"{1e3 * p.tpot_s:.1f}",
            f"{p.tokens_per_s_per_gpu:,.0f}",
            f"{p.ttft_s:.2f}",
            _kind(p),
            p.label,
        )
    console.print(table)
    if not front.complete:
        console.print(f"[bold yellow]partial:[/bold yellow] {front.cut_text()}: raise --time-limit for the whole front",
                      highlight=False)
    cuts = PlainTable(title="Where each TPOT SLA cuts the front", header_style="bold")
    for col in ("TPOT <= ms", "tok/s/GPU", "tok/s/user", "kind", "deployment"):
        cuts.add_column(col, justify="left" if col in ("kind", "deployment") else "right")
    cuts_at = sla_cuts(front, tpot_target_s)
    for ms, p in cuts_at:
        if p is None:
            cuts.add_row(f"{ms:g}", "-", "-", "-", "no deployment reaches it")
        else:
            cuts.add_row(
                f"{ms:g}",
                f"{p.tokens_per_s_per_gpu:,.0f}",
                f"{p.tokens_per_s_per_user:.1f}",
                _kind(p),
                p.label,
            )
    console.print(cuts)
    if band is not None:  # both tables' figures are predictions, each with the serving band of its kind
        console.print(band.text("band (both tables)"), markup=False, highlight=False)
    # the plan's own SLA first: the row it is compared with
    mine = [p for ms, p in cuts_at if tpot_target_s is not None and ms == round(tpot_target_s * 1e3, 6)]
    partial = [p for p in (*mine, *(p for _, p in cuts_at), *shown)
               if p is not None and cluster_gpus and cluster_gpus % p.gpus]
    if partial:  # a 1P1D mix of 6 GPUs on 8 read 874 here and 655 (x 6/8) in the plan's own line above
        p = partial[0]
        console.print(f"tok/s/GPU: per GPU the deployment runs on; where its GPUs do not tile the cluster's "
                      f"{cluster_gpus} (e.g. {p.label}: {p.gpus}) the rest stay idle, and the plan above, which "
                      f"divides by all {cluster_gpus}, reads that deployment x {p.gpus}/{cluster_gpus} "
                      f"({p.tokens_per_s_per_gpu:,.0f} -> {p.tokens_per_s_per_gpu * p.gpus / cluster_gpus:,.0f})",
                      markup=False, highlight=False)


def write_front_png(
    fronts: dict[str, Front],
    path: Path,
    *,
    title: str,
    tpot_target_s: float | None = None,
    y_label: str = "output tokens/s per GPU",
    scale: dict[str, float] | None = None,
) -> Path:
    """One curve per front (e.g. per cluster), every point faint, the front drawn, aggregated and
    disaggregated front points marked apart, TPOT SLAs as vertical lines. `scale` multiplies a
    front's y values (e.g. 1/price for tokens per dollar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, front) in enumerate(fronts.items()):
        k = (scale or {}).get(name, 1.0)
        c = colors[i % len(colors)]
        ax.scatter(
            [p.tokens_per_s_per_user for p in front.points],
            [k * p.tokens_per_s_per_gpu for p in front.points],
            s=4,
            color=c,
            alpha=0.15,
            linewidths=0,
        )
        xs = [p.tokens_per_s_per_user for p in front.front]
        ys = [k * p.tokens_per_s_per_gpu for p in front.front]
        ax.step(xs, ys, where="post", color=c, label=name)
        for kind, marker in (("aggregated", "o"), ("disaggregated", "s")):
            pts = [
                (p.tokens_per_s_per_user, k * p.tokens_per_s_per_gpu) for p in front.front if p.kind == kind
            ]
            if pts:
                ax.scatter(
                    *zip(*pts, strict=True),
                    marker=marker,
                    s=22,
                    color=c,
                    edgecolors="black",
                    linewidths=0.4,
                    label=f"{name}: {kind}",
                    zorder=3,
                )
    levels = set(STANDARD_TPOT_MS) | ({round(tpot_target_s * 1e3, 6)} if tpot_target_s else set())
    top = ax.get_ylim()[1]
    for ms in sorted(levels):
        ax.axvline(
            1e3 / ms, color="gray", linestyle="--" if ms != (tpot_target_s or 0) * 1e3 else "-", linewidth=0.8
        )
        ax.text(
            1e3 / ms,
            top * 0.98,
            f"TPOT {ms:g} ms",
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color="gray",
        )
    ax.set_xlabel("tokens/s per user (1 / TPOT)")
    ax.set_ylabel(y_label)
    cut = [f"{name}: {f.cut_text()}" if len(fronts) > 1 else f.cut_text()
           for name, f in fronts.items() if not f.complete]
    ax.set_title("\n".join([title, *cut]), fontsize=10 if not cut else 8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
