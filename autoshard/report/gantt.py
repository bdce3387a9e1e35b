"""ASCII Gantt chart of a pipeline schedule (1F1B or interleaved 1F1B), simulated from per-chunk
forward/backward times with Megatron-LM's operation order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoshard.costmodel.train.pipeline import Op, simulate

__all__ = ["Op", "Chart", "simulate", "draw_schedule"]


@dataclass(frozen=True, slots=True)
class Chart:
    """A drawn schedule: one row per pipeline rank, and what the drawing left out."""

    rows: tuple[str, ...]
    omitted_periods: int
    """Identical steady-state periods cut out at the `//` mark (0: the whole schedule is drawn)."""
    period_microbatches: int
    """Micro-batches each rank starts per period (1 for 1F1B, PP for interleaved 1F1B)."""
    cell_s: float
    """Time one character stands for at the start of the row."""
    labelled: bool
    """True when every operation is wide enough to carry its micro-batch number."""
    chunks: tuple[tuple[int, ...], ...] = ()
    """Per row, per character: the model chunk (0 .. VPP-1) of the operation drawn there, -1 elsewhere
    (a colour terminal tells the chunks of an interleaved schedule apart with it)."""


def _ops_text(kind: str, label: str, span: int, show: bool, tight: bool) -> str:
    """Forward: the micro-batch number (`12 `); backward: `b` and the number, its length drawn with
    `=` (`b12===`). Operations too short for their number: `-` (forward) or `=` (backward). Unless
    `tight` (the natural scale, where every operation is at least as wide as its label), a label
    needs one spare character so that neighbours never run together."""
    spare = 0 if tight else 1
    if kind == "F":
        return label.ljust(span) if show and span >= len(label) + spare else "-" * span
    text = "b" + label
    return text.ljust(span, "=") if show and span >= len(text) + spare else "=" * span


def draw_schedule(chunk_fwd_s: Sequence[float], chunk_bwd_s: Sequence[float], *, pp: int, vpp: int, m: int,
                  width: int, idle: Sequence[float] | None = None, max_bands: int = 3) -> Chart:
    """The schedule of `m` micro-batches drawn in at most `width` characters per row.

    At its natural scale a chunk's forward takes len(str(m)) + 1 characters so every number fits.
    When that is too wide, the steady state (every rank repeating the same pattern, shifted by one
    micro-batch, or PP micro-batches when interleaved) is cut at `//`: the rows show the warm-up, one
    steady-state period and the cool-down, the cool-down numbered with the real micro-batches. If it
    is still too wide it is drawn in up to `max_bands` bands of rows (continued after `>`), and past
    that scaled down to one band, where short operations lose their numbers.
    `idle` (per rank, a fraction of the step) is printed at the end of each row; by default the
    simulated one."""
    digits = len(str(m))
    shift = 1 if vpp == 1 else pp
    m_sim = m
    if m > 4 * pp and (vpp == 1 or m % pp == 0):
        m_sim = 4 * pp  # warm-up, >= 2 periods, cool-down: the rest of the steady state is the same
    ops = simulate(chunk_fwd_s, chunk_bwd_s, pp=pp, vpp=vpp, m=m_sim)
    end = max(o.end for o in ops)
    rank_t = [sum(chunk_fwd_s[c * pp + r] + chunk_bwd_s[c * pp + r] for c in range(vpp)) for r in range(pp)]
    period = shift * max(rank_t)
    first_b = min(o.start for o in ops if o.rank == 0 and o.kind == "B")
    last_f = max(o.start for o in ops if o.rank == 0 and o.kind == "F")
    cut_at = first_b + period
    k_sim = max(0, int((last_f - cut_at) / period + 1e-9))
    if m_sim < m and k_sim < 1:  # too few simulated micro-batches to cut cleanly: simulate them all
        m_sim, k_sim = m, 0
        ops = simulate(chunk_fwd_s, chunk_bwd_s, pp=pp, vpp=vpp, m=m)
        end = max(o.end for o in ops)
    if idle is None:
        idle = [1 - sum(o.end - o.start for o in ops if o.rank == r) / end for r in range(pp)] if m_sim == m else \
            [1 - m * t / (m * max(rank_t) + (sum(rank_t) - max(rank_t)) / vpp) for t in rank_t]
    cell = sorted(chunk_fwd_s)[len(chunk_fwd_s) // 2] or max(chunk_fwd_s) or 1.0
    lw = len(str(pp - 1))
    room = max(10, width - (lw + 2) - 8)  # "r |" ... "| 12.3%"
    scale = (digits + 1) / cell  # characters per second at the natural scale
    compress = m_sim < m or (end * scale > room and k_sim >= 1)
    skipped = k_sim * period if compress else 0.0
    drawn = end - skipped
    natural = drawn * scale + (2 if compress else 0)
    labelled = natural <= max_bands * room * 0.9  # bands end between labels
    if not labelled:
        scale = (room - (2 if compress else 0)) / drawn
    offset = m - m_sim  # micro-batches the tail is behind the real schedule

    def segment(r: int, t0: float, t1: float, renumber: int) -> tuple[str, list[int]]:
        n = max(1, round((t1 - t0) * scale))
        cells, owner = ["."] * n, [-1] * n
        for o in sorted((o for o in ops if o.rank == r and o.end > t0 and o.start < t1), key=lambda o: o.start):
            x0 = round((max(o.start, t0) - t0) * scale)
            x1 = max(x0 + 1, round((min(o.end, t1) - t0) * scale))
            x0, x1 = min(x0, n - 1), min(x1, n)
            text = _ops_text(o.kind, str(o.microbatch + 1 + renumber), x1 - x0, o.start >= t0, labelled)
            cells[x0:x1] = list(text)
            owner[x0:x1] = [o.chunk] * (x1 - x0)
        return "".join(cells), owner

    bodies, owners = [], []
    for r in range(pp):
        if compress:
            (a, oa), (b, ob) = segment(r, 0.0, cut_at, 0), segment(r, cut_at + skipped, end, offset)
            bodies.append(a + "//" + b)
            owners.append(oa + [-1, -1] + ob)
        else:
            body, owner = segment(r, 0.0, end, 0)
            bodies.append(body)
            owners.append(owner)
    rows: list[str] = []
    chunks: list[tuple[int, ...]] = []
    while bodies[0]:
        cut = _band_cut(bodies, room)
        last = cut >= len(bodies[0])
        if rows:
            rows.append("")
            chunks.append(())
        for r in range(pp):
            tail = f"| {100 * idle[r]:4.1f}%" if last else ">"
            head = f"{r:>{lw}} |"
            rows.append(f"{head}{bodies[r][:cut]}{tail}")
            chunks.append(tuple([-1] * len(head) + owners[r][:cut] + [-1] * len(tail)))
        bodies = [b[cut:] for b in bodies]
        owners = [o[cut:] for o in owners]
    omitted = (k_sim + offset // shift) if compress else 0
    return Chart(rows=tuple(rows), omitted_periods=omitted, period_microbatches=shift, cell_s=1 / scale,
                 labelled=labelled, chunks=tuple(chunks))


def _band_cut(bodies: Sequence[str], room: int) -> int:
    """Where to end a band of at most `room` characters: not inside any rank's label."""
    n = len(bodies[0])
    if n <= room:
        return n
    for cut in range(room, room // 2, -1):
        if not any(b[cut].isdigit() and (b[cut - 1].isdigit() or b[cut - 1] == "b") for b in bodies):
            return cut
    return room
