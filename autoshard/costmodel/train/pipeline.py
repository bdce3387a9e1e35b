"""Pipeline schedules: step time of 1F1B and interleaved 1F1B from per-stage times, and the layouts
frameworks accept.

A pipeline of p ranks, each hosting v model chunks ("virtual stages"), runs m micro-batches. With
T_r the time rank r spends on one micro-batch (forward + backward over all its chunks):

    step = m * max_r T_r + (sum_r T_r - max_r T_r) / v

For equal stages this is (m + (p-1)/v) * T: the bubble fraction (p-1)/(v*m) of Narayanan et al. 2021
(sec. 2.2). For uneven stages with v = 1 it is the fill/drain of every stage plus (m-1) times the
slowest one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RANK_CHUNK_SPREAD", "Op", "ScheduleTime", "schedule_time", "bubble_fraction", "even_split", "lopsided",
           "simulate", "simulated_schedule"]

RANK_CHUNK_SPREAD = 1
"""Most decoder layers by which one rank's interleaved chunks may differ for the closed form above to
hold. It prices a rank's chunks as equal shares of its time: with chunks of 1, 1, 18 layers (a layout
Megatron accepts) the event simulation of Megatron's order takes 37-41 % longer, because every
virtual-stage step waits for the slowest rank at that chunk; with chunks within one layer of each
other the two agree within 3.5 % (tests/costmodel/test_pipeline_lopsided.py). The solver keeps to it;
a given layout beyond it is priced by the event simulation (`step.predict_train`), except under the EP
all-to-all overlap, whose pairing of forwards with backwards (costmodel.train.a2a_overlap) is priced on
the closed form's steady state and which the simulation does not model."""


@dataclass(frozen=True, slots=True)
class ScheduleTime:
    step_s: float
    busy_s: float
    """m x the slowest rank's per-micro-batch time."""
    bubble_s: float
    bottleneck_rank: int


def schedule_time(
    rank_times_s: Sequence[float], *, num_microbatches: int, vpp: int = 1, steady_times_s: Sequence[float] | None = None,
) -> ScheduleTime:
    """`steady_times_s`: each rank's mean per-micro-batch time over the whole run where it differs from
    `rank_times_s` (the EP all-to-all overlap pairs most forwards with a backward, which the fill and
    drain cannot: costmodel.train.a2a_overlap); the slowest of them sets the busy time, the unpaired
    times the fill and drain."""
    if not rank_times_s:
        raise ValueError("a pipeline needs at least one rank")
    if num_microbatches < 1 or vpp < 1:
        raise ValueError("num_microbatches and vpp must be positive")
    steady = list(steady_times_s if steady_times_s is not None else rank_times_s)
    if len(steady) != len(rank_times_s):
        raise ValueError("steady_times_s needs one time per rank")
    rank = steady.index(max(steady))
    busy = num_microbatches * steady[rank]
    bubble = (sum(rank_times_s) - rank_times_s[rank]) / vpp
    return ScheduleTime(step_s=busy + bubble, busy_s=busy, bubble_s=bubble, bottleneck_rank=rank)


def bubble_fraction(*, pp: int, num_microbatches: int, vpp: int = 1) -> float:
    """Bubble time over ideal time for equal stages: (p-1)/(v*m)."""
    return (pp - 1) / (vpp * num_microbatches)


def even_split(num_items: int, num_parts: int) -> list[int]:
    """Sizes of `num_parts` contiguous parts, as even as possible, larger parts last (so the first
    stage, which holds the most in-flight activations, is never the larger one)."""
    if num_parts < 1 or num_items < num_parts:
        raise ValueError(f"cannot split {num_items} items into {num_parts} non-empty parts")
    base, extra = divmod(num_items, num_parts)
    return [base + (1 if i >= num_parts - extra else 0) for i in range(num_parts)]


def lopsided(chunk_decoders: Sequence[int], *, pp: int, vpp: int) -> bool:
    """Whether an interleaved layout (decoder layers per model chunk, chunk c of rank r at c * pp + r)
    gives some rank chunks more than RANK_CHUNK_SPREAD layers apart; never for vpp 1."""
    if vpp <= 1:
        return False
    return any(max(chunk_decoders[r::pp]) - min(chunk_decoders[r::pp]) > RANK_CHUNK_SPREAD for r in range(pp))


@dataclass(frozen=True, slots=True)
class Op:
    rank: int
    kind: str  # "F" or "B"
    microbatch: int
    chunk: int
    start: float
    end: float


def _order(rank: int, pp: int, vpp: int, m: int) -> list[tuple[str, int, int]]:
    """Megatron's per-rank sequence of (kind, microbatch, chunk)."""
    total = m * vpp
    # interleaved: groups of PP micro-batches (Megatron-Core's microbatch_group_size_per_vp_stage
    # default) run through chunk 0, then chunk 1, ...; Megatron-Core refuses a last group smaller than
    # PP, and so does TrainConfig, so m is a multiple of PP here
    seq = [(mb, c) for g in range(0, m, pp) for c in range(vpp) for mb in range(g, min(g + pp, m))]

    def fwd(i: int) -> tuple[int, int]:
        return seq[i]

    def bwd(i: int) -> tuple[int, int]:
        mb, chunk = seq[i]
        return mb, vpp - 1 - chunk

    if vpp == 1:
        warmup = min(pp - rank - 1, m)
    else:
        warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
    ops: list[tuple[str, int, int]] = []
    f = b = 0
    for _ in range(warmup):
        ops.append(("F", *fwd(f)))
        f += 1
    while f < total:
        ops.append(("F", *fwd(f)))
        f += 1
        ops.append(("B", *bwd(b)))
        b += 1
    while b < total:
        ops.append(("B", *bwd(b)))
        b += 1
    return ops


def simulate(chunk_fwd_s: Sequence[float], chunk_bwd_s: Sequence[float], *, pp: int, vpp: int, m: int) -> list[Op]:
    """Start/end of every operation. chunk_*_s are indexed by model chunk (chunk c of rank r is
    model chunk c*pp + r). Dependencies: a forward needs the previous model chunk's forward of the
    same micro-batch, a backward the next model chunk's backward (and the last chunk its own forward)."""
    orders = [_order(r, pp, vpp, m) for r in range(pp)]
    pos = [0] * pp
    free = [0.0] * pp
    done: dict[tuple[str, int, int], float] = {}
    ops: list[Op] = []
    last = pp * vpp - 1
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            if pos[r] >= len(orders[r]):
                continue
            kind, mb, chunk = orders[r][pos[r]]
            model_chunk = chunk * pp + r
            if kind == "F":
                dep = ("F", mb, model_chunk - 1) if model_chunk > 0 else None
                dur = chunk_fwd_s[model_chunk]
            else:
                dep = ("B", mb, model_chunk + 1) if model_chunk < last else ("F", mb, model_chunk)
                dur = chunk_bwd_s[model_chunk]
            if dep is not None and dep not in done:
                continue
            start = max(free[r], done[dep] if dep else 0.0)
            end = start + dur
            done[(kind, mb, model_chunk)] = end
            free[r] = end
            ops.append(Op(r, kind, mb, chunk, start, end))
            pos[r] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (inconsistent order)")
    return ops


def simulated_schedule(closed: ScheduleTime, chunk_time_s: Sequence[float], *, pp: int, vpp: int,
                       num_microbatches: int) -> ScheduleTime:
    """The schedule of an interleaved layout whose ranks hold chunks more than RANK_CHUNK_SPREAD layers
    apart (`lopsided`), which the closed form `closed` prices as equal shares: the event simulation of
    Megatron's order over each chunk's time with its sends (a third forward, two thirds backward, as
    the schedule chart draws it), the makespan beyond the busy time charged as bubble; the closed form
    where the simulation comes out no longer. With equal chunks and a multiple of PP micro-batches (all
    TrainConfig admits under interleaving, as Megatron-Core does) the simulation is the closed form
    exactly (tests/costmodel/test_interleaved_microbatches.py); the RuntimeError fallback guards an order
    this simulator cannot run (some counts Megatron-Core refuses deadlock it)."""
    try:
        ops = simulate([t / 3 for t in chunk_time_s], [2 * t / 3 for t in chunk_time_s], pp=pp, vpp=vpp,
                       m=num_microbatches)
    except RuntimeError:
        return closed
    makespan = max(op.end for op in ops)
    if makespan <= closed.step_s:
        return closed
    return ScheduleTime(step_s=makespan, busy_s=closed.busy_s, bubble_s=makespan - closed.busy_s,
                        bottleneck_rank=closed.bottleneck_rank)
