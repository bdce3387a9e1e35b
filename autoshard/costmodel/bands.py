"""Prediction bands: the range a measured value is expected in, from out-of-source validation
residuals of runs of the same kind (GPU generation x dense/MoE x precision x train/serve), and the
physical-sanity check of a prediction against the best measured MFU of its GPU class.

The statistic and the table's construction are in `autoshard.costmodel.band_table`, the
physical-sanity check in `autoshard.costmodel.sanity`; this file looks bands up for plans (falling
back to wider pools where a kind has fewer than two runs), caps training bands at the sanity
ceiling, and marks statistical ties among a --top listing.

A band is a statement about where the measured value falls: it need not contain the point
prediction (a kind the model is known to over-predict gets a band below it).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autoshard.costmodel.band_table import _MODES, LATENCY_METRICS, TABLE_SCHEMA, Kind, build_table, gpu_generation
from autoshard.costmodel.sanity import SANITY_MARGIN, sanity_for

__all__ = ["Band", "load_table", "lookup", "band_for", "band_of", "mark_ties", "tied", "tie_text", "band_text"]

TABLE_PATH = Path(__file__).with_name("bands_table.json")


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
    empty = {"kinds": {}, "single_run_kinds": {}, "generations": {}, "modes": {}}
    sec = table.get(section) or empty
    exact = sec["kinds"].get(kind.key)
    n = exact["runs"] if exact else sec["single_run_kinds"].get(kind.key, 0)
    if exact:
        return Lookup(exact["low"], exact["high"], n, "kind", f"{kind.describe()}, {n} measured runs")
    what = f"only 1 measured {kind.describe()} run" if n == 1 else f"no measured {kind.describe()} run"
    mode = _MODES.get(kind.mode, kind.mode)
    gen = sec["generations"].get(f"{kind.generation}/{kind.family}/{kind.mode}")
    if gen:
        return Lookup(gen["low"], gen["high"], n, "generation",
                      f"{what}: wider band of all {kind.generation} {mode} runs ({gen['runs']} measured)")
    pooled = sec["modes"].get(f"{kind.family}/{kind.mode}")
    if pooled:
        return Lookup(pooled["low"], pooled["high"], n, "mode",
                      f"{what}: wider band of all {mode} runs ({pooled['runs']} measured)")
    if section == "memory":
        default = tuple(table["default_memory_ratio"])
    elif section in LATENCY_METRICS:  # a time: the throughput default inverted
        default = (1 / table["default_ratio"][1], 1 / table["default_ratio"][0])
    else:
        default = tuple(table["default_ratio"])
    return Lookup(default[0], default[1], n, "default",
                  f"no measured {mode} run: default band {default[0]:.3g}-{default[1]:.3g}x of the prediction")


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
    ttft_s: tuple[float, float] | None = None
    """Serving: the mean time to first token's range (its own band, from measured TTFTs); None for training."""
    tpot_s: tuple[float, float] | None = None
    """Serving: the mean time per output token's range (from measured TPOT/ITL); None for training."""

    def to_json(self) -> dict[str, Any]:
        """The `predicted.band` block of the plan JSON."""
        out: dict[str, Any] = {
            "tokens_per_s": list(self.tokens_per_s), "step_time_s": list(self.step_time_s),
            "memory_gib_peak": list(self.memory_gib_peak), "basis": self.basis, "runs": self.runs,
        }
        if self.tied_with_best is not None:
            out["tied_with_best"] = self.tied_with_best
        for name in ("ttft_s", "tpot_s"):
            if getattr(self, name) is not None:
                out[name] = list(getattr(self, name))
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
        # no measured value is expected above the sanity ceiling (the best measured useful MFU + 10 %):
        # cap the band there, keeping its width when it lies wholly above
        s = sanity_for(plan)
        if s.reference_mfu is not None and s.compared > 0:
            ceiling = s.reference_mfu * (1 + SANITY_MARGIN) / s.compared
            if high > ceiling:
                low, high = (low, ceiling) if low < ceiling else (ceiling * low / high, ceiling)
                basis += (f"; capped at {100 * s.reference_mfu * (1 + SANITY_MARGIN):.1f} % useful MFU, the best "
                          f"measured {100 * s.reference_mfu:.1f} % + {100 * SANITY_MARGIN:.0f} %")
    basis += f"; memory: {m.basis}"
    latency: dict[str, tuple[float, float]] = {}
    if kind.mode == "serve":
        for name, value in (("ttft", plan.prediction.ttft_s), ("tpot", plan.prediction.tpot_s)):
            got = lookup(kind, table, section=name)
            latency[f"{name}_s"] = (value * got.low, value * got.high)
            basis += f"; {name.upper()}: {got.basis}"
    gib = peak / 2 ** 30
    memory = (gib * m.low, gib * m.high)
    if kind.mode == "serve":
        # a serving engine sizes its KV cache to its memory budget and refuses to start past the GPU's HBM:
        # no measured peak lies above the capacity (the band read 57.3-86.0 GiB on an 79.6 GiB H100)
        cap = plan.prediction.memory.capacity_bytes / 2 ** 30
        memory = (min(memory[0], cap), min(memory[1], cap))
    return Band(tokens_per_s=(tps * low, tps * high), step_time_s=(step / high, step / low),
                memory_gib_peak=memory, basis=basis, runs=t.runs, **latency)


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
    text = f"likely {_sig3(lo)}-{_sig3(hi)} {unit} ({band.basis.split('; memory:')[0]})"
    if band.ttft_s is not None and band.tpot_s is not None:
        text += (f"; mean TTFT likely {_sig3(band.ttft_s[0])}-{_sig3(band.ttft_s[1])} s, mean TPOT "
                 f"{_sig3(1e3 * band.tpot_s[0])}-{_sig3(1e3 * band.tpot_s[1])} ms")
    return text


def tie_text(plan: Any) -> str:
    """"tied" / "slower" for a runner-up whose band overlaps / clears the best plan's; "" otherwise."""
    mark = band_of(plan).tied_with_best
    return "" if mark is None else ("tied" if mark else "slower")
