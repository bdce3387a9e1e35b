"""Cost-study results and their arithmetic: the rows of a study (`TrainRow`, `ServeRow`, `Skipped`,
`Answer`, `StudyResult`), days and dollars per plan, a cluster's price per GPU-hour, the Pareto front
of time vs cost and the buyer's answers (cheapest within a deadline, fastest within a budget).

Pure arithmetic, no solving; `autoshard.study.run` runs the study.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from autoshard.specs.cluster import ClusterSpec

__all__ = [
    "SCHEMA", "SECONDS_PER_DAY", "TrainRow", "ServeRow", "Row", "Skipped", "Answer", "StudyResult",
    "train_costs", "serve_costs", "cluster_price", "pareto_front", "cheapest_within_deadline",
    "fastest_within_budget", "money", "where", "train_ranges", "likely", "pool_prices", "deployment_price",
    "days_bound", "usd_bound", "unsettled_by",
]

SCHEMA = "autoshard.study/v1"
SECONDS_PER_DAY = 86_400.0


# ----------------------------------------------------------------------------- rows


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainRow:
    """The best training plan for one (cluster kind, GPU count), with its time and cost."""

    cluster: str
    gpu: str
    num_gpus: int
    plan: str
    """Short summary, e.g. "TP8 PP4 DP4 mbs1"."""
    degrees: dict[str, Any]
    status: str
    """"optimal" or "feasible" (time or gap limit; see `gap`)."""
    gap: float
    solve_s: float
    mfu: float
    tokens_per_s: float
    days: float
    gpu_hours: float
    price_per_gpu_hour: float | None
    total_usd: float | None
    usd_per_million_tokens: float | None
    days_low: float | None = None
    """Likely range of the days and dollars, from the plan's prediction band (None: no band)."""
    days_high: float | None = None
    total_usd_low: float | None = None
    total_usd_high: float | None = None
    band_basis: str = ""
    """What backs the range (kind of run and measured runs)."""
    useful_mfu: float | None = None
    """Useful MFU (causal attention counted once, `costmodel.sanity.useful_mfu`): no plan beats its days
    x this (every GPU at its peak), a bound where the solver's own is none (gap 100 %)."""
    sanity: str = ""
    """Why the predicted MFU is suspect (useful MFU more than 10 % above the best measured for
    the GPU class, precision and dense/MoE: costmodel.bands.sanity_for); "" if not."""

    @property
    def x(self) -> float:
        return self.days

    @property
    def y(self) -> float | None:
        return self.total_usd


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeRow:
    """The best serving plan for one (cluster kind, GPU count) and what a million output tokens cost."""

    cluster: str
    gpu: str
    num_gpus: int
    """GPUs of the cluster offered to the solver."""
    plan: str
    gpus_used: int
    """GPUs the deployment needs (the fewest that sustain the request rate, when one is given)."""
    status: str
    throughput_tokens_per_s: float
    """Output tokens/s the deployment can deliver."""
    served_tokens_per_s: float
    """Output tokens/s actually served: the request rate x output length when a rate is given."""
    requests_per_s: float
    ttft_s: float
    tpot_s: float
    meets_targets: bool
    price_per_gpu_hour: float | None
    usd_per_hour: float | None
    usd_per_million_output_tokens: float | None
    throughput_tokens_per_s_low: float | None = None
    """Likely range of the throughput and the cost per token, from the plan's prediction band."""
    throughput_tokens_per_s_high: float | None = None
    usd_per_million_output_tokens_low: float | None = None
    usd_per_million_output_tokens_high: float | None = None
    band_basis: str = ""

    @property
    def x(self) -> float:
        return self.tpot_s * 1e3

    @property
    def y(self) -> float | None:
        return self.usd_per_million_output_tokens


Row = TrainRow | ServeRow


@dataclass(frozen=True, slots=True)
class Skipped:
    cluster: str
    num_gpus: int
    reason: str
    timed_out: bool = False
    """The time limit ran out before any plan of this size (unknown), rather than none fitting."""


@dataclass(frozen=True, slots=True)
class Answer:
    key: str
    """cheapest_within_deadline, fastest_within_budget, cheapest_per_token, fewest_gpus_for_rate."""
    title: str
    row: Row | None
    text: str
    unsettled_by: Row | None = None
    """A row the solver has not settled whose bound could beat `row` (None: the answer is settled)."""


@dataclass(slots=True)
class StudyResult:
    mode: str
    inputs: dict[str, Any]
    rows: list[Row]
    skipped: list[Skipped]
    answers: list[Answer]
    pareto: list[Row]
    notes: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    serve_front: list[dict[str, Any]] | None = None
    """A serving study's fronts (`study.front.fronts_json`), in study.json and --json alike."""

    def is_pareto(self, row: Row) -> bool:
        return any(row is p for p in self.pareto)

    def to_json(self) -> dict[str, Any]:
        def row_json(r: Row) -> dict[str, Any]:
            return {**asdict(r), "pareto": self.is_pareto(r)}

        return {
            "schema": SCHEMA,
            "mode": self.mode,
            "inputs": self.inputs,
            "answers": {a.key: {"title": a.title, "text": a.text, "row": asdict(a.row) if a.row else None,
                                # serving rows carry no proven bound to settle an answer with: null
                                "settled": a.unsettled_by is None if self.mode == "train" else None,
                                "unsettled_by": None if a.unsettled_by is None else {
                                    "cluster": a.unsettled_by.cluster, "num_gpus": a.unsettled_by.num_gpus,
                                    "gap": getattr(a.unsettled_by, "gap", None),
                                    "days_bound": days_bound(a.unsettled_by),
                                    "total_usd_bound": usd_bound(a.unsettled_by)}}
                        for a in self.answers},
            "rows": [row_json(r) for r in self.rows],
            "pareto": [asdict(r) for r in self.pareto],
            "skipped": [asdict(s) for s in self.skipped],
            "notes": list(self.notes),
            "assumptions": list(self.assumptions),
            "wall_s": self.wall_s,
            **({"serve_front": self.serve_front} if self.serve_front is not None else {}),
        }


# ----------------------------------------------------------------------------- arithmetic and answers


def train_costs(*, tokens: float, tokens_per_s: float, num_gpus: int,
                price_per_gpu_hour: float | None) -> tuple[float, float, float | None, float | None]:
    """(days, GPU-hours, total dollars, dollars per million tokens) to train `tokens`."""
    seconds = tokens / tokens_per_s
    days = seconds / SECONDS_PER_DAY
    gpu_hours = num_gpus * seconds / 3600.0
    if price_per_gpu_hour is None:
        return days, gpu_hours, None, None
    total = gpu_hours * price_per_gpu_hour
    return days, gpu_hours, total, total / (tokens / 1e6)


def serve_costs(*, gpus_used: int, served_tokens_per_s: float,
                price_per_gpu_hour: float | None) -> tuple[float | None, float | None]:
    """(dollars per hour, dollars per million output tokens served)."""
    if price_per_gpu_hour is None:
        return None, None
    per_hour = gpus_used * price_per_gpu_hour
    return per_hour, per_hour / (served_tokens_per_s * 3600.0) * 1e6


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (both minimized; a point is
    dominated when another is <= on both and < on one), sorted by x then y. Equal points all stay."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front: list[int] = []
    best_y = float("inf")
    for i in order:
        x, y = points[i]
        if y < best_y:
            front.append(i)
            best_y = y
        elif front and points[front[-1]] == (x, y):
            front.append(i)  # an exact tie with a point on the front
    return front


def cheapest_within_deadline(rows: Sequence[TrainRow], deadline_days: float | None) -> TrainRow | None:
    """The lowest total cost among priced rows finishing within the deadline (any, without one)."""
    ok = [r for r in rows if r.total_usd is not None and (deadline_days is None or r.days <= deadline_days)]
    return min(ok, key=lambda r: (r.total_usd, r.days, r.num_gpus), default=None)


def fastest_within_budget(rows: Sequence[TrainRow], budget_usd: float | None) -> TrainRow | None:
    """The fewest days among rows costing at most the budget (any row, priced or not, without one)."""
    ok = [r for r in rows if budget_usd is None or (r.total_usd is not None and r.total_usd <= budget_usd)]
    return min(ok, key=lambda r: (r.days, r.total_usd if r.total_usd is not None else float("inf"), r.num_gpus),
               default=None)


def train_ranges(*, tokens: float, band: tuple[float, float], num_gpus: int,
                 price_per_gpu_hour: float | None) -> tuple[float, float, float | None, float | None]:
    """(days low, days high, dollars low, dollars high) from a likely (low, high) tokens/s range."""
    fast = train_costs(tokens=tokens, tokens_per_s=band[1], num_gpus=num_gpus, price_per_gpu_hour=price_per_gpu_hour)
    slow = train_costs(tokens=tokens, tokens_per_s=band[0], num_gpus=num_gpus, price_per_gpu_hour=price_per_gpu_hour)
    return fast[0], slow[0], fast[2], slow[2]


def likely(row: Row) -> str:
    """" (likely 38.1-47.0 days, $1.20M-$1.48M)" for a row with a band, else ""."""
    if isinstance(row, TrainRow):
        if row.days_low is None or row.days_high is None:
            return ""
        usd = (f", {money(row.total_usd_low)}-{money(row.total_usd_high)}"
               if row.total_usd_low is not None else "")
        return f" (likely {row.days_low:,.1f}-{row.days_high:,.1f} days{usd})"
    lo, hi = row.usd_per_million_output_tokens_low, row.usd_per_million_output_tokens_high
    if lo is None or hi is None:
        return ""
    cap_lo, cap_hi = row.throughput_tokens_per_s_low, row.throughput_tokens_per_s_high
    if f"{lo:.3f}" == f"{hi:.3f}" and cap_lo is not None and cap_hi is not None:
        # the whole capacity band exceeds the demand: the GPUs serve the request rate at any point of it
        return (f" (capacity likely {cap_lo:,.0f}-{cap_hi:,.0f} output tokens/s, above the "
                f"{row.served_tokens_per_s:,.0f} demanded throughout)")
    return f" (likely ${lo:.3f}-${hi:.3f} per million)"


def money(usd: float | None) -> str:
    if usd is None:
        return "n/a"
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(usd) >= div:
            return f"${usd / div:.2f}{unit}"
    return f"${usd:.2f}"


def where(row: Row) -> str:
    return f"{row.num_gpus:,} x {row.gpu} ({row.cluster})"


def days_bound(row: Row) -> float | None:
    """The fewest days the solver has not ruled out for a training row: its days less the remaining gap
    (the step-time bound; a proven row's own days). None for serving rows."""
    if not isinstance(row, TrainRow):
        return None
    return row.days * _bound_share(row)


def usd_bound(row: Row) -> float | None:
    """The least total cost the solver has not ruled out for a training row (dollars scale with days)."""
    if not isinstance(row, TrainRow) or row.total_usd is None:
        return None
    return row.total_usd * _bound_share(row)


def _bound_share(row: TrainRow) -> float:
    """The share of its days (and dollars) a row may still shrink to: 1 proven; else the solver's
    step-time bound (1 - gap), never below every GPU at its dense peak (its useful MFU: 405B on 1,024
    H100 at gap 100 % has no solver bound, but cannot train 15T tokens in under ~400 days)."""
    if row.status == "optimal":
        return 1.0
    return max(1.0 - row.gap, min(1.0, row.useful_mfu or 0.0))


def unsettled_by(rows: Sequence[TrainRow], answer: TrainRow | None, *, cheapest: bool, deadline: float | None,
                 budget: float | None) -> TrainRow | None:
    """The row, other than `answer`, whose bound could beat it (the cheapest bound within the deadline,
    or the fastest bound within the budget; without an answer, any bound that meets them), or None when
    none can: then the answer is settled. With
    `--time-limit 10` on the README's 405B study 16,384 H100 at $71.12M was stated the cheapest within 90
    days beside 8,192 B200 at gap 31.3 %, whose cost bound is $52.9M."""
    def could(r: TrainRow) -> bool:
        d, usd = days_bound(r), usd_bound(r)
        if r is answer or d is None or (r.status == "optimal" or not r.gap):
            return False
        if cheapest:
            beats = answer is None or (answer.total_usd is not None and usd is not None and usd < answer.total_usd)
            return usd is not None and beats and (deadline is None or d <= deadline)
        return (answer is None or d < answer.days) and (budget is None or (usd is not None and usd <= budget))

    rivals = [r for r in rows if could(r)]
    if cheapest:
        return min(rivals, key=lambda r: usd_bound(r) or 0.0, default=None)
    return min(rivals, key=lambda r: days_bound(r) or 0.0, default=None)


def _unsettled_text(r: TrainRow | None) -> str:
    if r is None:
        return ""
    return (f" Not settled: {where(r)} is unproven (gap {r.gap:.1%}) and could take {days_bound(r):,.1f} days"
            f" and {money(usd_bound(r))}; a longer --time-limit settles it.")


def _train_answers(rows: list[TrainRow], deadline: float | None, budget: float | None) -> list[Answer]:
    out = []
    best = cheapest_within_deadline(rows, deadline)
    title = f"Cheapest within {deadline:g} days" if deadline is not None else "Cheapest option"
    if best is not None:
        text = (f"{title}: {where(best)}, {best.plan}: {best.days:,.1f} days, {money(best.total_usd)} "
                f"(${best.usd_per_million_tokens:.3f} per million tokens){likely(best)}.")
    elif not any(r.total_usd is not None for r in rows):
        text = f"{title}: unknown, no studied cluster has a price (pass --price CLUSTER=USD_PER_GPU_HOUR)."
    else:
        quickest = min(rows, key=lambda r: r.days)
        text = (f"{title}: no option finishes within {deadline:g} days; the fastest, {where(quickest)}, "
                f"takes {quickest.days:,.1f} days ({money(quickest.total_usd)}).")
    rival = unsettled_by(rows, best, cheapest=True, deadline=deadline, budget=budget)
    out.append(Answer("cheapest_within_deadline", title, best, text + _unsettled_text(rival), rival))
    fast = fastest_within_budget(rows, budget)
    title = f"Fastest within {money(budget)}" if budget is not None else "Fastest option"
    if fast is not None:
        text = f"{title}: {where(fast)}, {fast.plan}: {fast.days:,.1f} days, {money(fast.total_usd)}{likely(fast)}."
    elif not any(r.total_usd is not None for r in rows):
        text = f"{title}: unknown, no studied cluster has a price (pass --price CLUSTER=USD_PER_GPU_HOUR)."
    else:
        cheap = min((r for r in rows if r.total_usd is not None), key=lambda r: r.total_usd or 0.0)
        text = (f"{title}: no option costs {money(budget)} or less; the cheapest, {where(cheap)}, costs "
                f"{money(cheap.total_usd)} and takes {cheap.days:,.1f} days.")
    rival = unsettled_by(rows, fast, cheapest=False, deadline=deadline, budget=budget)
    out.append(Answer("fastest_within_budget", title, fast, text + _unsettled_text(rival), rival))
    return out


def _serve_answers(rows: list[ServeRow], request_rate: float | None) -> list[Answer]:
    out = []
    priced = [r for r in rows if r.usd_per_million_output_tokens is not None]
    cheap = min(priced, key=lambda r: (r.usd_per_million_output_tokens, r.gpus_used), default=None)
    title = "Cheapest per million output tokens"
    if cheap is not None:
        text = (f"{title}: {cheap.gpus_used} x {cheap.gpu} ({cheap.cluster}), {cheap.plan}: "
                f"${cheap.usd_per_million_output_tokens:.3f} per million output tokens{likely(cheap)}, "
                f"TPOT {cheap.tpot_s * 1e3:.1f} ms.")
    else:
        text = f"{title}: unknown, no studied cluster has a price (pass --price CLUSTER=USD_PER_GPU_HOUR)."
    out.append(Answer("cheapest_per_token", title, cheap, text))
    if request_rate is not None:
        few = min(rows, key=lambda r: (r.gpus_used, r.usd_per_hour or float("inf")), default=None)
        title = f"Fewest GPUs sustaining {request_rate:g} requests/s"
        text = (f"{title}: {few.gpus_used} x {few.gpu} ({few.cluster}), {few.plan}, {money(few.usd_per_hour)}/hour."
                if few else f"{title}: none of the studied sizes can.")
        out.append(Answer("fewest_gpus_for_rate", title, few, text))
    return out


def cluster_price(spec: ClusterSpec) -> float | None:
    """Dollars per GPU-hour: the pools' prices weighted by their GPUs (None if a pool has none)."""
    prices = [p.price_per_gpu_hour for p in spec.pools]
    if any(p is None for p in prices):
        return None
    return sum((p.price_per_gpu_hour or 0.0) * p.num_gpus for p in spec.pools) / spec.num_gpus


def pool_prices(spec: ClusterSpec, override: float | None = None) -> tuple[float | None, ...]:
    """Dollars per GPU-hour of each pool: the cluster file's, or a --price override for every pool."""
    return tuple(override if override is not None else p.price_per_gpu_hour for p in spec.pools)


def deployment_price(prices: Sequence[float | None], pool_gpus: dict[int, int]) -> float | None:
    """Dollars per GPU-hour of a deployment using `pool_gpus` (pool index: GPUs): the prices of the
    pools it runs on, weighted by its GPUs there (None if one of them has no price). A 1P1D on 6 H100
    of mixed-h100-a100 is $3.00, not the cluster's $2.19 average over its idle A100s."""
    used = {i: g for i, g in pool_gpus.items() if g > 0}
    if not used or any(prices[i] is None for i in used):
        return None
    return sum((prices[i] or 0.0) * g for i, g in used.items()) / sum(used.values())
