"""The serving Pareto front across GPU types and prices for `study --mode serve`: for each studied
cluster kind, at its largest studied size, every deployment's output tokens/s per GPU against
tokens/s per user (`autoshard.search.serve.front`), priced as output tokens per dollar, and where
each TPOT SLA cuts each front."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoshard.search.serve.front import Front, serve_front
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec

__all__ = ["ClusterFront", "serve_fronts", "serve_study_fronts", "render_fronts", "fronts_json", "write_fronts_png"]


@dataclass(frozen=True, slots=True)
class ClusterFront:
    cluster: str
    num_gpus: int
    price_per_gpu_hour: float | None
    front: Front
    band: Any = None
    """The front's `report.pareto.FrontBand`: where measured values land against its figures."""

    def usd_per_million(self, tokens_per_s_per_gpu: float, gpus: int | None = None) -> float | None:
        """Dollars per million output tokens at the studied size: a deployment of `gpus` GPUs runs as many
        copies as fit in the size and the size's every GPU is paid for, the rule the study's rows follow
        (a 1P1D on 6 of 8 GPUs read $1.175/M beside an answer of $1.309/M for two TP4 replicas on all 8; it
        costs $1.566/M on the 8 GPUs rented). Without `gpus`: per GPU the deployment runs on."""
        if self.price_per_gpu_hour is None or tokens_per_s_per_gpu <= 0:
            return None
        if gpus is not None and 0 < gpus <= self.num_gpus:
            tokens_per_s_per_gpu *= (self.num_gpus // gpus) * gpus / self.num_gpus  # idle GPUs still paid for
        return self.price_per_gpu_hour / (tokens_per_s_per_gpu * 3600.0) * 1e6


def serve_fronts(
    model: ModelSpec,
    clusters: dict[str, ClusterSpec],
    sizes: list[int],
    job: ServeJob,
    prices: dict[str, float | None],
    time_limit_s: float | None = None,
) -> list[ClusterFront]:
    """One front per cluster kind at the largest studied size it can be resized to, with its band, each
    within its own `time_limit_s` (a front cut short says so: `Front.complete`)."""
    from autoshard.report.pareto import front_band

    out = []
    for key, spec in clusters.items():
        for n in sorted(sizes, reverse=True):
            try:
                sized = spec if n == spec.num_gpus else spec.with_gpus(n)
            except ValueError:
                continue
            front = serve_front(model, sized, job, time_limit_s=time_limit_s)
            if front.front or not front.complete:  # a cut front is shown as such, never dropped
                out.append(ClusterFront(key, n, prices.get(key), front, front_band(model, sized, job)))
            break
    return out


def serve_study_fronts(model: str, clusters: list[str], sizes: list[int], *, prices: dict[str, float] | None,
                       precision: str | None, request_rate: float | None, tpot_ms: float | None,
                       ttft_s: float | None, time_limit_s: float | None = None,
                       ) -> tuple[list[ClusterFront], list[Callable[[Path], Path]]]:
    """`study --mode serve`'s fronts (the study's own serving job and prices) and the writers that add
    their PNG to the study's output set (none when no cluster has a front)."""
    from autoshard.specs import load_model
    from autoshard.study.run import _load_clusters, _prices, _serve_job

    model_spec = load_model(model)
    serve = _serve_job(model_spec, precision, request_rate, tpot_ms, ttft_s)
    specs = _load_clusters(clusters)
    fronts = serve_fronts(model_spec, specs, sizes, serve, _prices(specs, dict(prices or {})), time_limit_s)
    if not fronts:
        return fronts, []

    def front_png(directory: Path) -> Path:
        return write_fronts_png(fronts, directory / "serve_front.png", tpot_target_s=serve.tpot_target_s,
                                title=f"{model_spec.name}: {serve.input_len} in / {serve.output_len} out")

    return fronts, [front_png]


def _cuts(cf: ClusterFront, tpot_target_s: float | None) -> list[tuple[float, Any]]:
    from autoshard.report.pareto import sla_cuts

    return sla_cuts(cf.front, tpot_target_s)


def fronts_json(fronts: list[ClusterFront], tpot_target_s: float | None) -> list[dict[str, Any]]:
    from autoshard.report.pareto import front_json

    out = []
    for cf in fronts:
        obj = front_json(cf.front, tpot_target_s, cf.band)
        for cut in obj["sla_cuts"]:
            best = cut["best"]
            cut["usd_per_million_output_tokens"] = (
                cf.usd_per_million(best["tokens_per_s_per_gpu"], best["gpus"]) if best else None
            )
        out.append(
            {
                "cluster": cf.cluster,
                "num_gpus": cf.num_gpus,
                "price_per_gpu_hour": cf.price_per_gpu_hour,
                **obj,
            }
        )
    return out


def render_fronts(fronts: list[ClusterFront], console: Any, tpot_target_s: float | None) -> None:
    from autoshard.report.fit import PlainTable as Table

    table = Table(
        title="Serving front across GPU types: the best deployment at each TPOT SLA", header_style="bold"
    )
    for col in ("cluster", "GPUs", "TPOT <= ms", "tok/s/GPU", "$/M out tokens", "deployment"):
        table.add_column(col, justify="left" if col in ("cluster", "deployment") else "right")
    for cf in fronts:
        for ms, p in _cuts(cf, tpot_target_s):
            if p is None:
                table.add_row(cf.cluster, str(cf.num_gpus), f"{ms:g}", "-", "-", "no deployment reaches it")
                continue
            usd = cf.usd_per_million(p.tokens_per_s_per_gpu, p.gpus)
            table.add_row(
                cf.cluster,
                str(cf.num_gpus),
                f"{ms:g}",
                f"{p.tokens_per_s_per_gpu:,.0f}",
                "-" if usd is None else f"{usd:,.2f}",
                p.label,
            )
    console.print(table)
    for cf in fronts:  # every figure above is a prediction: the band of each cluster's kind of run
        if cf.band is not None:
            console.print(cf.band.text(f"band of {cf.cluster}"), markup=False, highlight=False)
    for cf in fronts:
        if not cf.front.complete:
            console.print(f"partial: {cf.cluster} x{cf.num_gpus}: {cf.front.cut_text()} (raise --time-limit)",
                          highlight=False, markup=False)


def write_fronts_png(
    fronts: list[ClusterFront], path: Path, *, title: str, tpot_target_s: float | None
) -> Path:
    """Output tokens per dollar (priced clusters) or per GPU-second against tokens/s per user."""
    from autoshard.report.pareto import write_front_png

    priced = all(cf.price_per_gpu_hour for cf in fronts)
    named = {f"{cf.cluster} x{cf.num_gpus}": cf.front for cf in fronts}
    scale = None
    label = "output tokens/s per GPU"
    if priced:
        scale = {
            f"{cf.cluster} x{cf.num_gpus}": 3600.0 / (cf.price_per_gpu_hour or 1.0) / 1e3 for cf in fronts
        }
        label = "thousand output tokens per dollar"
    return write_front_png(named, path, title=title, tpot_target_s=tpot_target_s, y_label=label, scale=scale)
