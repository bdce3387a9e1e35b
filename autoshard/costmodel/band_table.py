"""The band statistic: how the packaged band table (`bands_table.json`) is built from validation
residuals. Lookup of a plan's band is in `autoshard.costmodel.bands`.

The statistic (built by `build_table`, shipped as `bands_table.json` by
`tests/validation/make_bands.py`) is a central interval, calibrated on sources never seen:

- each validation run gives q = measured / predicted throughput (predicted / measured for a step
  time), x = ln q; throughput bands use throughput metrics only (serving TTFT and TPOT/ITL get their
  own bands, q = measured / predicted time);
- each run's *out-of-source deviation* e = x - c', where c' is the centre the table would give its
  kind were the run's source absent (the median x of the kind's runs from other sources; failing
  that, of the generation's; failing that, of the mode's). e holds both the source's own systematic
  error and the run's scatter: exactly what a band must cover for a user whose cluster is none of
  the sources;
- a kind with >= 2 runs: centre c = median x of its runs (its own bias); edges c + Q_a and
  c + Q_(1-a), where Q are the quantiles (linear interpolation) of e pooled over every run of the
  kind's model family (dense or MoE) in the mode, a = (1 - P) / 2; each side at least MIN_HALF_WIDTH
  from c. A family whose runs come from fewer than MIN_POOL_SOURCES sources takes the whole mode's
  pool. The spread is pooled per family, not per kind or generation: measured, a kind's own spread
  (even shrunk toward the pool by n / (n + 10) or n / (n + 40)) does not carry to unseen sources
  (leave-one-source-out coverage of serving at P = 0.85: 71 % and 73 % against 82 % pooled; training
  68 %, 75 % against 78 %), nor does a generation's within a family (training MoE 80 % against 84 %
  at P 0.825); but one pool for the whole mode gave MoE training bands the dense runs' spread:
  +-14.5 % holding 11 of 25 MoE runs of unseen sources (44 %) while dense held 88 %, and serving's
  dense runs 72 % against MoE's 90 %. Per family, each holds >= 80 % (`make_bands.py` prints both);
- P, the central probability, is one number per mode and family (COVERAGE), chosen so that
  leave-one-source-out coverage (each source's runs against a table built without that source) is
  >= 80 % for each;
- a kind with fewer than 2 runs, and only then, gets a wider band: centre the median x of its GPU
  generation's runs of both families (else of the whole mode: centres from the family's runs alone
  held 7 of 25 MoE training runs of unseen sources), edges from the quantiles of its family's deviations
  from that pool's out-of-source centre (which include the spread between kinds), never narrower
  than a kind's; a mode with a single source has nothing to measure another source's error by:
  NO_SOURCE_SPREAD either side; no run of the mode at all: DEFAULT_RATIO;
- memory: the same statistic on q = measured / predicted peak memory of the runs that report it;
- a training band's top is capped at the sanity ceiling (best measured useful MFU + 10 %,
  `sanity_for`); a band wholly above it keeps its width and moves under it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = [
    "Kind", "gpu_generation", "gpu_name_key", "central_band", "out_of_source_deviations", "build_table", "residual_kind",
    "throughput_ratio", "memory_ratio", "latency_ratio", "MIN_HALF_WIDTH", "DEFAULT_RATIO",
    "DEFAULT_MEMORY_RATIO", "COVERAGE", "FAMILIES", "MIN_POOL_SOURCES", "NO_SOURCE_SPREAD", "central_probability", "THROUGHPUT_METRICS", "LATENCY_METRICS",
    "TABLE_SCHEMA",
]

TABLE_SCHEMA = "autoshard.bands/v1"

MIN_HALF_WIDTH = 0.03
"""Smallest distance of either band edge from the centre, in ln units (about 3 %)."""
DEFAULT_RATIO = (0.5, 1.5)
"""measured / predicted throughput assumed when no run of the mode exists at all."""
DEFAULT_MEMORY_RATIO = (0.8, 1.2)
"""measured / predicted peak memory assumed when no run of the mode reports memory."""
COVERAGE = {"train/dense": 0.825, "train/moe": 0.80, "serve/dense": 0.95, "serve/moe": 0.925}
"""Central probability P of the bands per mode and model family ("mode/family"): the quantiles of the
out-of-source deviations are (1 - P) / 2 and (1 + P) / 2. Chosen, one number per mode and family and
never per kind, as the smallest of 0.700, 0.725, ..., 0.975 that gives >= 80 % leave-one-source-out
coverage of that family's runs (`make_bands.py --choose-coverage` prints the scan). A `coverage`
argument may also name a whole mode ("train": P for both families)."""
FAMILIES = ("dense", "moe")
"""Model families with bands of their own spread."""
MIN_POOL_SOURCES = 3
"""A family's runs in a mode make their own pool of deviations (the spread of its bands) when they come
from at least this many sources; with fewer, the family takes the whole mode's pool."""
NO_SOURCE_SPREAD = 0.25
"""Half-width (ln units, about 25 %) when a mode has runs of a single source only: nothing measures how
far another source lands."""
THROUGHPUT_METRICS = frozenset({
    "tflops_per_gpu", "step_time_s", "tokens_per_s_per_gpu", "tokens_per_s", "output_tokens_per_s",
    "total_tokens_per_s", "requests_per_s",
})
"""Residual metrics the throughput bands are made of (a step time is inverted)."""
LATENCY_METRICS = {"ttft": frozenset({"ttft_mean_s", "ttft_median_s"}),
                   "tpot": frozenset({"tpot_mean_s", "tpot_median_s", "itl_mean_s", "itl_median_s"})}
"""Serving latency metrics, each section its own band (q = measured / predicted time). Inter-token
latency (ITL) and time per output token (TPOT) are the same quantity per request stream."""

# GPU name prefix (upper case, longest first wins) -> generation
_GENERATIONS = (
    ("GB300", "blackwell"), ("GB200", "blackwell"), ("B300", "blackwell"), ("B200", "blackwell"), ("B100", "blackwell"),
    ("GH200", "hopper"), ("H800", "hopper"), ("H200", "hopper"), ("H100", "hopper"), ("H20", "hopper"),
    ("A800", "ampere"), ("A100", "ampere"), ("A40", "ampere"), ("A30", "ampere"), ("A10", "ampere"),
    ("L40", "ada"), ("L4", "ada"), ("RTX 40", "ada"), ("RTX 6000 ADA", "ada"),
    ("V100", "volta"), ("MI355", "cdna4"), ("MI350", "cdna4"), ("MI325", "cdna3"), ("MI300", "cdna3"),
    ("MI250", "cdna2"), ("MI210", "cdna2"), ("TPU", "tpu"),
)
_MODES = {"train": "training", "serve": "serving"}


@lru_cache(maxsize=256)
def gpu_name_key(name: str) -> str:
    """A GPU name as the prefix tables read it: upper case, without the vendor and product-line words
    ("NVIDIA H100-SXM5-80GB" -> "H100-SXM5-80GB", "AMD Instinct MI300X" -> "MI300X")."""
    return name.upper().replace("NVIDIA ", "").replace("AMD ", "").replace("INSTINCT ", "").strip()


@lru_cache(maxsize=256)
def gpu_generation(name: str) -> str:
    """The GPU generation of a GPU name ("H100-SXM5-80GB" -> "hopper"); an unknown GPU is its own
    generation (its name, lower case), which no measured run backs."""
    upper = gpu_name_key(name)
    for prefix, gen in sorted(_GENERATIONS, key=lambda p: -len(p[0])):
        if upper.startswith(prefix):
            return gen
    return name.lower()


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def central_probability(coverage: Mapping[str, float], mode: str, family: str) -> float:
    """P for a mode and family from a coverage map keyed "mode/family" or "mode" (the first that is
    there; else the largest P in the map)."""
    for key in (f"{mode}/{family}", mode):
        if key in coverage:
            return coverage[key]
    return max(coverage.values())


def central_band(xs: Sequence[float], pooled: Sequence[float], coverage: float) -> tuple[float, float]:
    """(low, high) of measured/predicted for one new run of a kind with log ratios `xs` (>= 2 runs):
    median(xs) + the (1-P)/2 and (1+P)/2 quantiles of the mode's out-of-source deviations `pooled`
    (+-NO_SOURCE_SPREAD when there are none); each side at least MIN_HALF_WIDTH from the centre."""
    c = _quantile(xs, 0.5)
    a = (1 - coverage) / 2
    lo, hi = (_quantile(pooled, a), _quantile(pooled, 1 - a)) if pooled else (-NO_SOURCE_SPREAD, NO_SOURCE_SPREAD)
    return math.exp(c + min(lo, -MIN_HALF_WIDTH)), math.exp(c + max(hi, MIN_HALF_WIDTH))


# ----------------------------------------------------------------------------- kinds and the table


@dataclass(frozen=True, slots=True)
class Kind:
    generation: str
    family: str
    """"dense" or "moe"."""
    precision: str
    mode: str
    """"train" or "serve"."""

    @property
    def key(self) -> str:
        return f"{self.generation}/{self.family}/{self.precision}/{self.mode}"

    def describe(self) -> str:
        family = "MoE" if self.family == "moe" else self.family
        return f"{self.generation} {family} {self.precision} {_MODES.get(self.mode, self.mode)}"


def _is_time_metric(metric: str) -> bool:
    return metric.endswith("_ms") or (metric.endswith("_s") and not metric.endswith("per_s"))


def _precision(name: str) -> str:
    """A residual file's precision as a plan names it: every FP8 recipe ("mxfp8", "fp8-blockwise") is
    "fp8", 16-bit mixed precision ("amp_bf16", "fp16") is "bf16"; int8/int4 serving weights stay."""
    p = name.lower()
    if "fp8" in p:
        return "fp8"
    if "bf16" in p or "fp16" in p or "16-bit" in p:
        return "bf16"
    return p


def residual_kind(row: Mapping[str, Any]) -> Kind:
    """The kind of run of one residual row."""
    mode = str(row["mode"]).lower()
    mode = {"training": "train", "serving": "serve", "inference": "serve"}.get(mode, mode)
    return Kind(gpu_generation(str(row["gpu"])), str(row["family"]).lower(), _precision(str(row["precision"])), mode)


def throughput_ratio(row: Mapping[str, Any]) -> float:
    """measured / predicted throughput of one residual row (out-of-source prediction)."""
    measured, predicted = float(row["measured"]), float(row["predicted_loso"])
    if measured <= 0 or predicted <= 0:
        raise ValueError(f"run {row.get('id')}: measured and predicted must be positive")
    return predicted / measured if _is_time_metric(str(row["metric"])) else measured / predicted


def memory_ratio(row: Mapping[str, Any]) -> float | None:
    measured, predicted = row.get("mem_measured_gib"), row.get("mem_predicted_gib")
    if measured is None or predicted is None or measured <= 0 or predicted <= 0:
        return None
    return float(measured) / float(predicted)


def latency_ratio(row: Mapping[str, Any]) -> float:
    """measured / predicted time of one serving latency row (TTFT, TPOT/ITL)."""
    measured, predicted = float(row["measured"]), float(row["predicted_loso"])
    if measured <= 0 or predicted <= 0:
        raise ValueError(f"run {row.get('id')}: measured and predicted must be positive")
    return measured / predicted


def _outward(lo: float, hi: float, runs: int, **extra: Any) -> dict[str, Any]:
    """A table entry, rounded outwards to 4 decimals (never narrower than computed)."""
    return {"low": math.floor(lo * 1e4) / 1e4, "high": math.ceil(hi * 1e4) / 1e4, "runs": runs, **extra}


Point = tuple[Kind, float, str]
"""(kind, ln measured/predicted, source) of one run."""


def out_of_source_deviations(points: Sequence[Point]) -> list[tuple[float | None, float | None, float | None]]:
    """Per point: its deviation from the centre the table would give it without its source, at the
    kind, generation and mode level ((kind-or-wider, generation-or-wider, mode); None where no other
    source has a run of the mode)."""
    cache: dict[tuple[Any, str], float | None] = {}

    def centre(group: Any, source: str) -> float | None:
        if (group, source) not in cache:
            xs = [x for k, x, s in points if s != source and _group(k, group) == group]
            cache[group, source] = _quantile(xs, 0.5) if xs else None
        return cache[group, source]

    out = []
    for kind, x, source in points:
        m = centre(("mode", kind.mode), source)
        g = centre(("generation", kind.generation, kind.mode), source)
        g = m if g is None else g
        k = centre(("kind", kind), source)
        k = g if k is None else k
        out.append(tuple(None if c is None else x - c for c in (k, g, m)))
    return out


def _group(kind: Kind, like: tuple[Any, ...]) -> tuple[Any, ...]:
    """The group of the same level as `like` that `kind` belongs to."""
    if like[0] == "mode":
        return ("mode", kind.mode)
    if like[0] == "generation":
        return ("generation", kind.generation, kind.mode)
    return ("kind", kind)


def _pooled(level: Sequence[Sequence[float]], a: float) -> list[tuple[float, float]]:
    """(low, high) quantiles of the deviations at each level, each level never narrower than the one
    below, each side at least MIN_HALF_WIDTH (+-NO_SOURCE_SPREAD for a level with no deviation)."""
    pooled: list[tuple[float, float]] = []
    for devs in level:
        lo, hi = (_quantile(devs, a), _quantile(devs, 1 - a)) if devs else (-NO_SOURCE_SPREAD, NO_SOURCE_SPREAD)
        if pooled:
            lo, hi = min(lo, pooled[-1][0]), max(hi, pooled[-1][1])
        pooled.append((min(lo, -MIN_HALF_WIDTH), max(hi, MIN_HALF_WIDTH)))
    return pooled


def _section(points: Sequence[Point], coverage: Mapping[str, float]) -> dict[str, Any]:
    """Bands per kind, per (generation, family, mode) and per (family, mode) from the runs' (kind, ln
    ratio, source). Centres come from the runs of the kind, generation or mode; spreads from the
    out-of-source deviations of the runs of the same family in the mode (its pool, MIN_POOL_SOURCES)."""
    devs = out_of_source_deviations(points)
    kinds: dict[str, Any] = {}
    single: dict[str, int] = {}
    gens: dict[str, Any] = {}
    modes: dict[str, Any] = {}
    for mode in sorted({k.mode for k, _, _ in points}):
        idx = [i for i, (k, _, _) in enumerate(points) if k.mode == mode]
        by_gen: dict[str, list[int]] = {}
        for i in idx:
            by_gen.setdefault(points[i][0].generation, []).append(i)
        for family in sorted(set(FAMILIES) | {points[i][0].family for i in idx}):
            p = central_probability(coverage, mode, family)
            mine = [i for i in idx if points[i][0].family == family]
            pool = mine if len({points[i][2] for i in mine}) >= MIN_POOL_SOURCES else idx
            level = [[devs[i][j] for i in pool if devs[i][j] is not None] for j in range(3)]
            pooled = _pooled(level, (1 - p) / 2)
            by_kind: dict[Kind, list[int]] = {}
            for i in mine:
                by_kind.setdefault(points[i][0], []).append(i)
            for kind, ii in sorted(by_kind.items(), key=lambda kv: kv[0].key):
                if len(ii) < 2:
                    single[kind.key] = len(ii)
                    continue
                xs = [points[i][1] for i in ii]
                lo, hi = central_band(xs, level[0], p)
                kinds[kind.key] = _outward(lo, hi, len(ii), sources=len({points[i][2] for i in ii}),
                                           centre=round(math.exp(_quantile(xs, 0.5)), 4))
            for gen, ii in sorted(by_gen.items()):
                if len(ii) < 2:
                    continue
                c = _quantile([points[i][1] for i in ii], 0.5)
                gens[f"{gen}/{family}/{mode}"] = _outward(math.exp(c + pooled[1][0]), math.exp(c + pooled[1][1]),
                                                          len(ii), sources=len({points[i][2] for i in ii}),
                                                          centre=round(math.exp(c), 4))
            if len(idx) >= 2:
                c = _quantile([points[i][1] for i in idx], 0.5)
                modes[f"{family}/{mode}"] = _outward(math.exp(c + pooled[2][0]), math.exp(c + pooled[2][1]), len(idx),
                                                     sources=len({points[i][2] for i in idx}),
                                                     centre=round(math.exp(c), 4))
    return {"kinds": kinds, "single_run_kinds": single, "generations": gens, "modes": modes}


def build_table(rows: Sequence[Mapping[str, Any]], *, residuals: str, sources: Sequence[str] = (),
                held_only: bool = True, coverage: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The packaged band table from residual rows (keys as in tests/validation/residuals_*.json).
    `residuals` says what the predictions were: "out-of-source" (leave-one-source-out) or "in-sample".
    `held_only`: throughput bands only from runs held to the accuracy target ("held" not false);
    memory bands use every run that reports memory. Throughput bands take throughput metrics only;
    serving TTFT and TPOT/ITL rows make the "ttft" and "tpot" sections."""
    coverage = dict(COVERAGE if coverage is None else coverage)
    held = [r for r in rows if not held_only or r.get("held", True)]
    tput = [(residual_kind(r), math.log(throughput_ratio(r)), str(r["source"])) for r in held
            if str(r["metric"]) in THROUGHPUT_METRICS]
    mem = [(residual_kind(r), math.log(m), str(r["source"])) for r in rows if (m := memory_ratio(r)) is not None]
    latency = {name: [(residual_kind(r), math.log(latency_ratio(r)), str(r["source"])) for r in held
                      if str(r["metric"]) in metrics]
               for name, metrics in LATENCY_METRICS.items()}
    return {
        "schema": TABLE_SCHEMA,
        "residuals": residuals,
        "sources": list(sources),
        "held_only": held_only,
        "statistic": ("x = ln(measured/predicted) per run; e = x - the centre its kind would get without its source "
                      "(kind, else generation, else mode median of other sources' runs); per kind: median x + the "
                      "(1-P)/2 and (1+P)/2 quantiles of e pooled over the runs of the kind's family (dense, MoE) in "
                      f"the mode when they come from >= {MIN_POOL_SOURCES} sources, else over the mode's runs; each "
                      f"side >= {MIN_HALF_WIDTH:g} ln units; P per mode and family: "
                      + ", ".join(f"{m} {v:g}" for m, v in sorted(coverage.items()))
                      + "; kinds with < 2 runs: the generation's (else the mode's) median + quantiles of the "
                      "deviations from that pool's out-of-source centre, the family's pool; one source only: "
                      f"+-{NO_SOURCE_SPREAD:g} ln units; no run: {DEFAULT_RATIO[0]:g}-{DEFAULT_RATIO[1]:g}x"),
        "coverage": coverage,
        "min_half_width": MIN_HALF_WIDTH,
        "default_ratio": list(DEFAULT_RATIO),
        "default_memory_ratio": list(DEFAULT_MEMORY_RATIO),
        "throughput": _section(tput, coverage),
        "memory": _section(mem, coverage),
        **{name: _section(points, coverage) for name, points in latency.items()},
    }
