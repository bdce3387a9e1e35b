"""Prediction bands: the range a measured value is expected in, from out-of-source validation
residuals of runs of the same kind (GPU generation x dense/MoE x precision x train/serve), and the
physical-sanity check of a prediction against the best published MFU of its GPU.

The statistic (built by `build_table`, shipped as `bands_table.json` by
`tests/validation/make_bands.py`):

- each validation run gives q = measured / predicted throughput (predicted / measured for a time
  metric), taken as x = ln q;
- a kind with >= 2 runs: median c, empirical 10th and 90th percentiles (linear interpolation);
  both distances from c are multiplied by the small-sample factor
  k(n) = t(0.90, n-1) * sqrt(1 + 1/n) / z(0.90) (the normal-theory prediction interval for one new
  run over the population 10-90 interval: k(2) = 2.94, k(5) = 1.31, k(10) = 1.13, k(30) = 1.04),
  where n counts the independent sources behind the runs (at least 2, at most the runs): runs of
  one source share its systematic error, as a user's own cluster will have its own; then each side
  is at least MIN_HALF_WIDTH (3 %) from c;
- a kind with fewer than 2 runs falls back, always to something wider: the envelope (lowest low,
  highest high) of every band and every run of the same GPU generation and mode, at least 10 %
  either side of their median; else the envelope of every band (kinds and generations) and run of
  the mode, at least 20 % either side;
  else DEFAULT_RATIO (measured between 0.5x and 1.5x of the prediction);
- memory: the same statistic on q = measured / predicted peak memory of the runs that report it;
- a training band's top is capped at the sanity ceiling (best published MFU + 10 %, `sanity_for`);
  a band wholly above it keeps its width and moves under it.

A band is a statement about where the measured value falls: it need not contain the point
prediction (a kind the model is known to over-predict gets a band below it).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "Band", "Kind", "Sanity", "gpu_generation", "small_sample_factor", "ratio_band", "build_table", "load_table",
    "lookup", "band_for", "band_of", "mark_ties", "tied", "tie_text", "band_text", "sanity_for", "sanity_line",
    "MIN_HALF_WIDTH", "DEFAULT_RATIO", "DEFAULT_MEMORY_RATIO", "SANITY_MARGIN",
]

TABLE_PATH = Path(__file__).with_name("bands_table.json")
MFU_REFERENCE_PATH = Path(__file__).with_name("mfu_reference.json")
TABLE_SCHEMA = "autoshard.bands/v1"

MIN_HALF_WIDTH = 0.03
"""Smallest distance of either band edge from the median residual, in ln units (about 3 %)."""
DEFAULT_RATIO = (0.5, 1.5)
"""measured / predicted throughput assumed when no run of the mode exists at all."""
DEFAULT_MEMORY_RATIO = (0.8, 1.2)
"""measured / predicted peak memory assumed when no run of the mode reports memory."""
FALLBACK_FLOOR = {"generation": 0.10, "mode": 0.20}
"""Least half-width (ln units, about 10 % and 20 %) of a fallback band around its pool's median: a kind
never measured is at least this uncertain however tight the measured kinds around it are."""
SANITY_MARGIN = 0.10
"""A predicted MFU more than 10 % above the best published one for its GPU and precision is flagged."""

_Z90 = 1.2815515655446004
_T90 = (3.078, 1.886, 1.638, 1.533, 1.476, 1.440, 1.415, 1.397, 1.383, 1.372, 1.363, 1.356, 1.350, 1.345, 1.341,
        1.337, 1.333, 1.330, 1.328, 1.325, 1.323, 1.321, 1.319, 1.318, 1.316, 1.315, 1.314, 1.313, 1.311, 1.310)
"""One-sided 90 % quantile of Student's t for 1-30 degrees of freedom (standard tables)."""

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


def gpu_generation(name: str) -> str:
    """The GPU generation of a GPU name ("H100-SXM5-80GB" -> "hopper"); an unknown GPU is its own
    generation (its name, lower case), which no measured run backs."""
    upper = name.upper().replace("NVIDIA ", "").replace("AMD ", "").replace("INSTINCT ", "").strip()
    for prefix, gen in sorted(_GENERATIONS, key=lambda p: -len(p[0])):
        if upper.startswith(prefix):
            return gen
    return name.lower()


def small_sample_factor(n: int) -> float:
    """k(n) = t(0.90, n-1) sqrt(1 + 1/n) / z(0.90): how much wider than the sample's own 10-90 range
    the range for one new run must be, from n runs (normal-theory prediction interval)."""
    if n < 2:
        raise ValueError("the small-sample factor needs at least 2 runs")
    df = n - 1
    if df <= len(_T90):
        t = _T90[df - 1]
    else:  # Cornish-Fisher expansion of the t quantile, exact to 3 decimals beyond 30 degrees of freedom
        z = _Z90
        t = z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
    return t * math.sqrt(1 + 1 / n) / _Z90


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ratio_band(ratios: Sequence[float], sources: int | None = None) -> tuple[float, float]:
    """(low, high) of measured/predicted for one new run of a kind from its runs' ratios (>= 2 runs).
    `sources`: how many independent sources the runs come from; runs of one source share its
    systematic error, so the small-sample factor counts sources (at least 2), not runs."""
    xs = [math.log(r) for r in ratios]
    c = _quantile(xs, 0.5)
    k = small_sample_factor(max(2, min(len(xs), len(xs) if sources is None else sources)))
    lo = c + k * (_quantile(xs, 0.10) - c)
    hi = c + k * (_quantile(xs, 0.90) - c)
    return math.exp(min(lo, c - MIN_HALF_WIDTH)), math.exp(max(hi, c + MIN_HALF_WIDTH))


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


def _outward(lo: float, hi: float, runs: int) -> dict[str, Any]:
    """A table entry, rounded outwards to 4 decimals (never narrower than computed)."""
    return {"low": math.floor(lo * 1e4) / 1e4, "high": math.ceil(hi * 1e4) / 1e4, "runs": runs}


def _entry(ratios: Sequence[float], sources: int) -> dict[str, Any]:
    return {**_outward(*ratio_band(ratios, sources), len(ratios)), "sources": sources}


def _envelope(ratios: Sequence[float], sources: int, bands: Iterable[Mapping[str, Any]],
              floor: float) -> dict[str, Any]:
    """The widest of a pooled band, every band inside the pool, every run of the pool, and `floor`
    (ln units) either side of the pool's median."""
    lo, hi = ratio_band(ratios, sources)
    for b in bands:
        lo, hi = min(lo, b["low"]), max(hi, b["high"])
    c = math.exp(_quantile([math.log(r) for r in ratios], 0.5))
    lo, hi = min(lo, *ratios, c * math.exp(-floor)), max(hi, *ratios, c * math.exp(floor))
    return _outward(lo, hi, len(ratios))


def _section(pairs: Sequence[tuple[Kind, float, str]]) -> dict[str, Any]:
    """Bands per kind, per (generation, mode) and per mode from (kind, ratio, source) triples."""
    by_kind: dict[str, list[tuple[float, str]]] = {}
    by_gen: dict[str, list[tuple[float, str]]] = {}
    by_mode: dict[str, list[tuple[float, str]]] = {}
    for kind, r, source in pairs:
        by_kind.setdefault(kind.key, []).append((r, source))
        by_gen.setdefault(f"{kind.generation}/{kind.mode}", []).append((r, source))
        by_mode.setdefault(kind.mode, []).append((r, source))

    def ratios(v: list[tuple[float, str]]) -> list[float]:
        return [r for r, _ in v]

    def sources(v: list[tuple[float, str]]) -> int:
        return len({s for _, s in v})

    kinds = {k: _entry(ratios(v), sources(v)) for k, v in sorted(by_kind.items()) if len(v) >= 2}
    single = {k: len(v) for k, v in sorted(by_kind.items()) if len(v) < 2}
    gens = {g: _envelope(ratios(v), sources(v),
                         [b for k, b in kinds.items() if f"{k.split('/')[0]}/{k.split('/')[3]}" == g],
                         FALLBACK_FLOOR["generation"])
            for g, v in sorted(by_gen.items()) if len(v) >= 2}
    modes = {m: _envelope(ratios(v), sources(v),
                          [b for k, b in [*kinds.items(), *gens.items()] if k.split("/")[-1] == m],
                          FALLBACK_FLOOR["mode"])
             for m, v in sorted(by_mode.items()) if len(v) >= 2}
    return {"kinds": kinds, "single_run_kinds": single, "generations": gens, "modes": modes}


def build_table(rows: Sequence[Mapping[str, Any]], *, residuals: str, sources: Sequence[str] = (),
                held_only: bool = True) -> dict[str, Any]:
    """The packaged band table from residual rows (keys as in tests/validation/residuals_*.json).
    `residuals` says what the predictions were: "out-of-source" (leave-one-source-out) or "in-sample".
    `held_only`: throughput bands only from runs held to the accuracy target ("held" not false);
    memory bands use every run that reports memory."""
    tput = [(residual_kind(r), throughput_ratio(r), str(r["source"])) for r in rows
            if not held_only or r.get("held", True)]
    mem = [(residual_kind(r), m, str(r["source"])) for r in rows if (m := memory_ratio(r)) is not None]
    return {
        "schema": TABLE_SCHEMA,
        "residuals": residuals,
        "sources": list(sources),
        "held_only": held_only,
        "statistic": ("measured/predicted per run; per kind: median and 10th-90th percentile of ln(ratio), "
                      "distances from the median x k(n) = t(0.90,n-1) sqrt(1+1/n)/z(0.90), each side >= "
                      f"{MIN_HALF_WIDTH:g} ln units; fallback: envelope of the generation's bands and runs "
                      f"(>= {FALLBACK_FLOOR['generation']:g} ln units either side of their median), then of the mode's "
                      f"(>= {FALLBACK_FLOOR['mode']:g}), then {DEFAULT_RATIO[0]:g}-{DEFAULT_RATIO[1]:g}x"),
        "min_half_width": MIN_HALF_WIDTH,
        "default_ratio": list(DEFAULT_RATIO),
        "default_memory_ratio": list(DEFAULT_MEMORY_RATIO),
        "throughput": _section(tput),
        "memory": _section(mem),
    }


@functools.cache
def load_table(path: Path = TABLE_PATH) -> dict[str, Any]:
    """The packaged band table (an empty one when the file is absent: every band is the default)."""
    if not path.is_file():
        return build_table([], residuals="none")
    table = json.loads(path.read_text())
    if table.get("schema") != TABLE_SCHEMA:
        raise ValueError(f"{path}: schema {table.get('schema')!r}, expected {TABLE_SCHEMA!r}")
    return table


@dataclass(frozen=True, slots=True)
class Lookup:
    low: float
    high: float
    """measured / predicted range."""
    runs: int
    """Runs of exactly this kind."""
    level: str
    """"kind", "generation", "mode" or "default"."""
    basis: str


def lookup(kind: Kind, table: Mapping[str, Any] | None = None, *, section: str = "throughput") -> Lookup:
    """The measured/predicted range for a kind of run, falling back to wider pools where the kind has
    fewer than two measured runs."""
    table = load_table() if table is None else table
    sec = table[section]
    exact = sec["kinds"].get(kind.key)
    n = exact["runs"] if exact else sec["single_run_kinds"].get(kind.key, 0)
    if exact:
        return Lookup(exact["low"], exact["high"], n, "kind", f"{kind.describe()}, {n} measured runs")
    what = f"only 1 measured {kind.describe()} run" if n == 1 else f"no measured {kind.describe()} run"
    mode = _MODES.get(kind.mode, kind.mode)
    gen = sec["generations"].get(f"{kind.generation}/{kind.mode}")
    if gen:
        return Lookup(gen["low"], gen["high"], n, "generation",
                      f"{what}: widest band of {kind.generation} {mode} runs ({gen['runs']} measured)")
    pooled = sec["modes"].get(kind.mode)
    if pooled:
        return Lookup(pooled["low"], pooled["high"], n, "mode",
                      f"{what}: widest band of all {mode} runs ({pooled['runs']} measured)")
    default = table["default_memory_ratio" if section == "memory" else "default_ratio"]
    return Lookup(default[0], default[1], n, "default",
                  f"no measured {mode} run: default band {default[0]:g}-{default[1]:g}x of the prediction")


# ----------------------------------------------------------------------------- bands of plans


@dataclass(frozen=True, slots=True)
class Band:
    """Expected ranges around one prediction. Each range is (low, high) in the metric's own unit."""

    tokens_per_s: tuple[float, float]
    step_time_s: tuple[float, float]
    memory_gib_peak: tuple[float, float]
    basis: str
    """The kind of run the band comes from and how many measured runs back it."""
    runs: int
    """Measured runs of this kind behind the band (0: no run of this kind exists; the band is the
    widest one we have)."""
    tied_with_best: bool | None = None
    """In a --top listing: whether this plan's throughput band overlaps the best plan's (a statistical
    tie); None for the best plan itself and for single plans."""

    def to_json(self) -> dict[str, Any]:
        """The `predicted.band` block of the plan JSON."""
        out: dict[str, Any] = {
            "tokens_per_s": list(self.tokens_per_s), "step_time_s": list(self.step_time_s),
            "memory_gib_peak": list(self.memory_gib_peak), "basis": self.basis, "runs": self.runs,
        }
        if self.tied_with_best is not None:
            out["tied_with_best"] = self.tied_with_best
        return out


def _plan_kind(plan: Any) -> Kind:
    """The kind of a training plan (Plan) or serving plan (ServePlan)."""
    family = "moe" if plan.model.is_moe else "dense"
    if getattr(plan, "mode", "train") == "serve":
        return Kind(gpu_generation(plan.pool.gpu.name), family, plan.job.weight_dtype.value, "serve")
    pools = {s.pool for s in plan.stages}
    gens = {gpu_generation(plan.cluster.pools[p].gpu.name) for p in pools}
    gen = gens.pop() if len(gens) == 1 else "mixed"
    return Kind(gen, family, plan.config.precision.value, "train")


def band_for(plan: Any, table: Mapping[str, Any] | None = None) -> Band:
    """The band of a training plan (Plan) or serving plan (ServePlan) from the band table."""
    kind = _plan_kind(plan)
    t = lookup(kind, table)
    m = lookup(kind, table, section="memory")
    basis = t.basis
    if (table or load_table()).get("residuals") == "in-sample":
        basis += ", in-sample residuals"
    low, high = t.low, t.high
    if kind.mode == "serve":
        tps, step, peak = plan.throughput_tokens_per_s, plan.prediction.tpot_s, plan.prediction.memory.used_bytes
    else:
        pred = plan.prediction
        tps, step, peak = pred.tokens_per_s, pred.step_time_s, pred.peak_memory_bytes
        # no measured value is expected above the sanity ceiling (the best published MFU + 10 %):
        # cap the band there, keeping its width when it lies wholly above
        s = sanity_for(plan)
        if s.reference_mfu is not None and s.mfu > 0:
            ceiling = s.reference_mfu * (1 + SANITY_MARGIN) / s.mfu
            if high > ceiling:
                low, high = (low, ceiling) if low < ceiling else (ceiling * low / high, ceiling)
                basis += (f"; capped at {100 * s.reference_mfu * (1 + SANITY_MARGIN):.1f} % MFU, the best "
                          f"published {100 * s.reference_mfu:.1f} % + {100 * SANITY_MARGIN:.0f} %")
    basis += f"; memory: {m.basis}"
    gib = peak / 2 ** 30
    return Band(tokens_per_s=(tps * low, tps * high), step_time_s=(step / high, step / low),
                memory_gib_peak=(gib * m.low, gib * m.high), basis=basis, runs=t.runs)


def band_of(plan: Any) -> Band:
    """The band attached to a plan, or the one the table gives it."""
    return plan.band if plan.band is not None else band_for(plan)


def tied(best: Band, other: Band, *, best_gpus: int = 1, other_gpus: int = 1) -> bool:
    """Whether two plans' throughput bands (per GPU) overlap: neither is reliably faster."""
    b = (best.tokens_per_s[0] / best_gpus, best.tokens_per_s[1] / best_gpus)
    o = (other.tokens_per_s[0] / other_gpus, other.tokens_per_s[1] / other_gpus)
    return o[1] >= b[0] and o[0] <= b[1]


def mark_ties(plans: Sequence[Any]) -> list[Any]:
    """The plans (best first) with their bands attached, runner-ups marked tied or not with the best."""
    if not plans:
        return []
    best = replace(plans[0], band=band_of(plans[0]))
    out = [best]
    for p in plans[1:]:
        band = band_of(p)
        mark = tied(best.band, band, best_gpus=best.num_gpus, other_gpus=p.num_gpus)
        out.append(replace(p, band=replace(band, tied_with_best=mark)))
    return out


def _sig3(x: float) -> str:
    """A figure to three significant digits with thousands separators (1146 -> "1,150")."""
    if x <= 0:
        return "0"
    e = math.floor(math.log10(x))
    return f"{round(x, 2 - e):,.{max(0, 2 - e)}f}"


def band_text(plan: Any) -> str:
    """One terminal line: "likely 1,000-1,180 tokens/s per GPU (hopper dense bf16 training, 7 measured runs)"."""
    band = band_of(plan)
    n = plan.num_gpus
    lo, hi = band.tokens_per_s[0] / n, band.tokens_per_s[1] / n
    unit = "output tokens/s per GPU" if getattr(plan, "mode", "train") == "serve" else "tokens/s per GPU"
    return f"likely {_sig3(lo)}-{_sig3(hi)} {unit} ({band.basis.split('; memory:')[0]})"


# ----------------------------------------------------------------------------- physical sanity


@dataclass(frozen=True, slots=True)
class Sanity:
    mfu: float
    reference_mfu: float | None
    """Best published MFU for the GPU and precision (None: no published run to compare with)."""
    flagged: bool
    reference: str
    """Which run the reference is and how it relates to this plan."""
    citation: str

    def message(self, *, cite: bool = True) -> str:
        if self.reference_mfu is None:
            return f"no published MFU to check against: {self.reference}"
        pct = f"{100 * self.mfu:.1f} % MFU"
        where = f"{self.reference}; {self.citation}" if cite else self.reference
        if self.flagged:
            return (f"predicted {pct} is more than {100 * SANITY_MARGIN:.0f} % above the best published "
                    f"{100 * self.reference_mfu:.1f} % ({where}): treat this prediction with suspicion")
        return f"predicted {pct}, best published {100 * self.reference_mfu:.1f} % ({self.reference})"

    def to_json(self) -> dict[str, Any]:
        """The `predicted.sanity` block of a training plan's JSON."""
        return {"mfu": self.mfu, "reference_mfu": self.reference_mfu, "flagged": self.flagged,
                "margin": SANITY_MARGIN, "reference": self.reference, "citation": self.citation,
                "message": self.message()}


@functools.cache
def load_mfu_reference(path: Path = MFU_REFERENCE_PATH) -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(path.read_text())["references"])


def _reference(gpu: str, precision: str, family: str,
               refs: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any] | None, str]:
    """The best published reference bounding a plan, and how it relates to it. MoE plans may use a
    dense reference (dense runs reach higher MFU), FP8 plans a BF16 one (FP8 MFU is against twice the
    peak); never the other way round. Same GPU class first, then the same generation."""
    gen = gpu_generation(gpu)
    families = [family] + (["dense"] if family == "moe" else [])
    precisions = [precision] + (["bf16"] if precision != "bf16" else [])
    upper = gpu.upper()
    for scope in ("gpu", "generation"):
        for prec in precisions:
            for fam in families:
                found = [r for r in refs if r["precision"] == prec and r["family"] == fam and (
                    any(upper.startswith(p) for p in r["gpus"]) if scope == "gpu"
                    else gpu_generation(r["gpus"][0]) == gen)]
                if found:
                    best = max(found, key=lambda r: r["mfu"])
                    notes = [n for n, same in ((f"{fam} run", fam == family), (f"{prec} run", prec == precision),
                                               (f"on {best['gpus'][0]}", scope == "gpu")) if not same]
                    return best, ", ".join(notes)
    return None, ""


def sanity_for(plan: Any) -> Sanity:
    """Compare a training plan's predicted MFU with the best published MFU for its GPU, precision
    and dense/MoE (the reference table `mfu_reference.json`, each row cited)."""
    pred = plan.prediction
    pools = sorted({s.pool for s in plan.stages})
    gpu = plan.cluster.pools[pools[0]].gpu
    precision = plan.config.precision.value
    if precision == "fp8" and not gpu.fp8_tflops:
        precision = "bf16"  # no FP8 tensor cores: the plan's MFU is against the BF16 peak
    family = "moe" if plan.model.is_moe else "dense"
    ref, note = _reference(gpu.name, precision, family, load_mfu_reference())
    if ref is None:
        return Sanity(pred.mfu, None, False, f"no published {family} {precision} run on {gpu.name} or its generation", "")
    what = ref["run"]
    if note:
        what += f" ({note}: an upper bound for this plan)"
    return Sanity(pred.mfu, ref["mfu"], pred.mfu > ref["mfu"] * (1 + SANITY_MARGIN), what, ref["citation"])


def tie_text(plan: Any) -> str:
    """"tied" / "slower" for a runner-up whose band overlaps / clears the best plan's; "" otherwise."""
    mark = band_of(plan).tied_with_best
    return "" if mark is None else ("tied" if mark else "slower")


def sanity_line(plan: Any) -> str | None:
    """The terminal warning for a flagged training plan, else None."""
    s = sanity_for(plan)
    return f"physical sanity: {s.message(cite=False)} (citation in --json predicted.sanity)" if s.flagged else None
