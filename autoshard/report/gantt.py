"""ASCII Gantt chart of a pipeline schedule (1F1B or interleaved 1F1B), simulated from per-chunk
forward/backward times with Megatron-LM's operation order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Op", "simulate", "render_gantt"]


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

    def fwd(i: int) -> tuple[int, int]:
        if vpp == 1:
            return i, 0
        group, within = divmod(i, pp * vpp)
        chunk = within // pp
        return group * pp + within % pp, chunk

    def bwd(i: int) -> tuple[int, int]:
        mb, chunk = fwd(i)
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


def render_gantt(ops: Sequence[Op], *, pp: int, width: int = 100) -> str:
    """One row per pipeline rank: digits are forward micro-batches (mod 10), letters backward
    ones (a = 0 …), '.' is idle time (the bubble)."""
    end = max(o.end for o in ops)
    scale = width / end
    rows = []
    for r in range(pp):
        cells = ["."] * width
        for o in ops:
            if o.rank != r:
                continue
            a, b = int(o.start * scale), max(int(o.start * scale) + 1, int(o.end * scale))
            ch = str(o.microbatch % 10) if o.kind == "F" else "abcdefghij"[o.microbatch % 10]
            for i in range(a, min(b, width)):
                cells[i] = ch
        busy = sum(o.end - o.start for o in ops if o.rank == r)
        rows.append(f"rank {r:>3} |{''.join(cells)}| idle {100 * (1 - busy / end):4.1f}%")
    return "\n".join(rows)
