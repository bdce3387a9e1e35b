"""The serving Pareto front across GPU types and prices for `study --mode serve`: for each studied
cluster kind, at its largest studied size, every deployment's output tokens/s per GPU against
tokens/s per user (`autoshard.search.serve.front`), priced as output tokens per dollar, and where
each TPOT SLA cuts each front."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoshard.search.serve.front import STANDARD_TPOT_MS, Front, FrontPoint, serve_front
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec

__all__ = ["ClusterFront", "FrontsWriter", "serve_fronts", "serve_study_fronts", "render_fronts", "fronts_json",
           "write_fronts_png"]


@dataclass(frozen=True, slots=True)
class ClusterFront:
    cluster: str
    num_gpus: int
    price_per_gpu_hour: float | None
    front: Front
    band: Any = None
    """The front's `report.pareto.FrontBand`: where measured values land against its figures."""
    pool_gpus: tuple[int, ...] = ()
    """GPUs of each pool at the studied size (default: one pool of `num_gpus`)."""
    pool_prices: tuple[float | None, ...] = ()
    """Dollars per GPU-hour of each pool (default: `price_per_gpu_hour` for the one pool)."""

    def rented(self, p: FrontPoint) -> tuple[int, int, float | None]:
        """(copies, GPUs rented, dollars per hour) of deployment `p` at the studied size: the pools it runs
        on are rented whole, at their own prices, and run as many copies of it as fit (idle GPUs are paid
        for). A 6-GPU H100 1P1D on mixed-h100-a100 rents the 32 H100s at $3.00, five copies, not the 96
        GPUs at their $2.19 mean with 16 copies at H100 speed."""
        sizes: tuple[int, ...] = (self.num_gpus,)
        prices: tuple[float | None, ...] = (self.price_per_gpu_hour,)
        use = {0: p.gpus}
        if p.pools and self.pool_gpus:
            sizes, use = self.pool_gpus, dict(p.pools)
            prices = self.pool_prices or (self.price_per_gpu_hour,) * len(sizes)
        copies = min(sizes[i] // g for i, g in use.items() if g > 0)
        gpus = sum(sizes[i] for i in use)
        usd = None if any(prices[i] is None for i in use) else sum(sizes[i] * (prices[i] or 0.0) for i in use)
        return copies, gpus, usd

    def tokens_per_s_per_gpu_rented(self, p: FrontPoint) -> float:
        """Output tokens/s of `p`'s copies over every GPU of the pools rented for them."""
        copies, gpus, _ = self.rented(p)
        return copies * p.tokens_per_s_per_gpu * p.gpus / gpus if gpus else 0.0

    def usd_per_million_of(self, p: FrontPoint) -> float | None:
        """Dollars per million output tokens of `p` on the GPUs rented for it (`rented`); None unpriced."""
        copies, _, usd = self.rented(p)
        if usd is None or copies < 1 or p.tokens_per_s_per_gpu <= 0:
            return None
        return usd / (copies * p.tokens_per_s_per_gpu * p.gpus * 3600.0) * 1e6

    def cheapest_at(self, tpot_s: float) -> FrontPoint | None:
        """The cost cut at TPOT <= `tpot_s`: of every deployment evaluated that meets it (not only the
        per-GPU-used front), the cheapest per output token on the GPUs rented (unpriced: the most tokens/s
        per GPU rented). A looser SLA only adds deployments, so it is never dearer. It was the front's
        best per GPU used, then charged for the idle GPUs: 70B on 16 H100 read $1.27/M at 50 ms (a 6-GPU
        1P1D, twice, 4 idle) above $1.09/M at 33 ms, beside the study's own row of $0.961/M at 49.9 ms."""
        ok = [p for p in self.front.meeting(tpot_s) if self.rented(p)[0] >= 1]

        def key(p: FrontPoint) -> tuple[float, float]:
            usd = self.usd_per_million_of(p)
            return (usd if usd is not None else 0.0, -self.tokens_per_s_per_gpu_rented(p))

        return min(ok, key=key, default=None)

    def cuts(self, tpot_target_s: float | None) -> list[tuple[float, FrontPoint | None]]:
        """(TPOT ms, `cheapest_at` it) at the standard SLAs and the job's own."""
        levels = set(STANDARD_TPOT_MS)
        if tpot_target_s is not None:
            levels.add(round(tpot_target_s * 1e3, 6))
        return [(ms, self.cheapest_at(ms / 1e3)) for ms in sorted(levels)]


def serve_fronts(
    model: ModelSpec,
    clusters: dict[str, ClusterSpec],
    sizes: list[int],
    job: ServeJob,
    prices: dict[str, float | None],
    time_limit_s: float | None = None,
    pool_prices: dict[str, tuple[float | None, ...]] | None = None,
) -> list[ClusterFront]:
    """One front per cluster kind at the largest studied size it can be resized to, with its band, each
    within its own `time_limit_s` (a front cut short says so: `Front.complete`). `pool_prices`: each
    cluster's price per pool (default: its one price for every pool)."""
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
                each = (pool_prices or {}).get(key) or (prices.get(key),) * len(sized.pools)
                out.append(ClusterFront(key, n, prices.get(key), front, front_band(model, sized, job),
                                        tuple(p.num_gpus for p in sized.pools), tuple(each)))
            break
    return out


def serve_study_fronts(model: str, clusters: list[str], sizes: list[int], *, prices: dict[str, float] | None,
                       precision: str | None, request_rate: float | None, tpot_ms: float | None,
                       ttft_s: float | None, time_limit_s: float | None = None,
                       ) -> tuple[list[ClusterFront], list[Callable[[Path], Path]]]:
    """`study --mode serve`'s fronts (the study's own serving job and prices) and the writer that adds
    them to the study's output set (`FrontsWriter`: their PNG, and `serve_front` in study.json)."""
    from autoshard.specs import load_model
    from autoshard.study.run import _load_clusters, _pool_prices, _prices, _serve_job

    model_spec = load_model(model)
    serve = _serve_job(model_spec, precision, request_rate, tpot_ms, ttft_s)
    specs = _load_clusters(clusters)
    fronts = serve_fronts(model_spec, specs, sizes, serve, _prices(specs, dict(prices or {})), time_limit_s,
                          _pool_prices(specs, dict(prices or {})))
    title = f"{model_spec.name}: {serve.input_len} in / {serve.output_len} out"
    return fronts, [FrontsWriter(fronts, serve.tpot_target_s, title)]


@dataclass(frozen=True, slots=True)
class FrontsWriter:
    """Writes the fronts' PNG into a study's output set (`write_study` also puts `json()` into
    study.json as `serve_front`, as `--json` prints it; `--out` used to lose it)."""

    fronts: list[ClusterFront]
    tpot_target_s: float | None
    title: str

    def __call__(self, directory: Path) -> Path:
        return write_fronts_png(self.fronts, directory / "serve_front.png", tpot_target_s=self.tpot_target_s,
                                title=self.title)

    def json(self) -> list[dict[str, Any]]:
        return fronts_json(self.fronts, self.tpot_target_s)


def fronts_json(fronts: list[ClusterFront], tpot_target_s: float | None) -> list[dict[str, Any]]:
    """The fronts as `serve_front` in the study's JSON: each SLA cut is `cheapest_at` it, with its copies,
    GPUs rented and dollars per million output tokens on them."""
    from autoshard.report.pareto import front_json

    out = []
    for cf in fronts:
        obj = front_json(cf.front, tpot_target_s, cf.band)
        cuts = dict(cf.cuts(tpot_target_s))
        for cut in obj["sla_cuts"]:
            p = cuts[cut["tpot_ms"]]
            copies, rented, _ = cf.rented(p) if p else (0, 0, None)
            cut["best"] = None if p is None else {**_point(p), "copies": copies, "gpus_rented": rented,
                                                  "tokens_per_s_per_gpu_rented": cf.tokens_per_s_per_gpu_rented(p)}
            cut["usd_per_million_output_tokens"] = cf.usd_per_million_of(p) if p else None
        out.append({"cluster": cf.cluster, "num_gpus": cf.num_gpus, "price_per_gpu_hour": cf.price_per_gpu_hour,
                    "pool_gpus": list(cf.pool_gpus), "pool_prices_per_gpu_hour": list(cf.pool_prices), **obj})
    return out


def _point(p: FrontPoint) -> dict[str, Any]:
    return {"kind": p.kind, "deployment": p.label, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
            "tokens_per_s_per_user": p.tokens_per_s_per_user, "tpot_s": p.tpot_s, "ttft_s": p.ttft_s, "gpus": p.gpus}


def render_fronts(fronts: list[ClusterFront], console: Any, tpot_target_s: float | None) -> None:
    from autoshard.report.fit import PlainTable as Table

    table = Table(title="Serving front: the cheapest deployment per TPOT SLA on the GPUs rented",
                  header_style="bold")
    for col in ("cluster", "GPUs", "TPOT <= ms", "tok/s/GPU rented", "copies on GPUs", "$/M out tokens", "deployment"):
        table.add_column(col, justify="left" if col in ("cluster", "deployment") else "right")
    for cf in fronts:
        for ms, p in cf.cuts(tpot_target_s):
            if p is None:
                table.add_row(cf.cluster, str(cf.num_gpus), f"{ms:g}", "-", "-", "-", "no deployment reaches it")
                continue
            usd = cf.usd_per_million_of(p)
            copies, rented, _ = cf.rented(p)
            table.add_row(cf.cluster, str(cf.num_gpus), f"{ms:g}", f"{cf.tokens_per_s_per_gpu_rented(p):,.0f}",
                          f"{copies} on {rented}", "-" if usd is None else f"{usd:,.2f}", p.label)
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

    # one price per front: a mixed cluster's pools differ in price, so its points are drawn per GPU
    priced = all(cf.price_per_gpu_hour and len(set(cf.pool_prices or (0,))) == 1 for cf in fronts)
    named = {f"{cf.cluster} x{cf.num_gpus}": cf.front for cf in fronts}
    scale = None
    label = "output tokens/s per GPU"
    if priced:
        scale = {
            f"{cf.cluster} x{cf.num_gpus}": 3600.0 / ((cf.pool_prices or (cf.price_per_gpu_hour,))[0] or 1.0) / 1e3
            for cf in fronts
        }
        label = "thousand output tokens per dollar"
    return write_front_png(named, path, title=title, tpot_target_s=tpot_target_s, y_label=label, scale=scale)
