"""`--time-limit` bounds the whole serving command: the prefill/decode tables and the Pareto front stop
at their deadline and say so. Nothing here times anything: the deadlines are already expired or run on
a fake clock that expires after a set number of checks (the wall-clock figures are printed by
examples/benchmark_solver.py --serve-limits)."""

from __future__ import annotations

import pytest

from autoshard.errors import SolverError
from autoshard.report.pareto import front_json, render_front, write_front_png
from autoshard.report.terminal import solver_text
from autoshard.search.deadline import Deadline
from autoshard.search.serve import solve as serve_solve
from autoshard.search.serve.disagg import TIME_CUT, tabulate_disagg
from autoshard.search.serve.front import serve_front
from autoshard.search.serve.ladder import ENUM_TIME_CUT
from autoshard.search.serve.space import enumerate_serve, promise_order
from autoshard.search.serve.solve import solve_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob
from autoshard.study.front import render_fronts, serve_fronts

LLAMA70 = load_model("llama-3.1-70b")
H100_16 = load_cluster("dgx-h100").with_gpus(16)
JOB = ServeJob(input_len=1000, output_len=1000)
SLA = JOB.model_copy(update={"tpot_target_s": 0.05})


class Ticks:
    """A fake `time.monotonic`: 0 for the first `n` reads, then far past any deadline."""

    def __init__(self, n: int) -> None:
        self.left = n

    def __call__(self) -> float:
        self.left -= 1
        return 0.0 if self.left >= 0 else 1e9


def cut_after(checks: int) -> Deadline:
    """A 1 s deadline that expires at its `checks`+1-th look at the clock (the constructor reads it once)."""
    return Deadline(1.0, clock=Ticks(checks + 1))


@pytest.fixture(scope="module")
def space():
    return enumerate_serve(LLAMA70, H100_16, SLA)


def rows(tables):
    return ([(r.engine, r.utilization, r.rate_milli, r.ttft_us) for r in tables.prefill],
            [(r.engine, r.rate_milli, r.tpot_us, r.first_us) for r in tables.decode])


def test_fake_clock_deadline():
    d = Deadline(2.0, start=10.0, clock=lambda: 11.5)
    assert d.remaining() == pytest.approx(0.5) and d.elapsed() == pytest.approx(1.5) and not d.expired()
    half = d.part(0.5)  # half of the 0.5 s left, on the same clock
    assert half.end == pytest.approx(11.75) and half.clock is d.clock
    assert Deadline(0.0, start=3.0, clock=lambda: 3.0).expired()
    assert not Deadline.never().part(0.3).expired()


def test_tables_stop_at_an_expired_deadline(space):
    tables = tabulate_disagg(LLAMA70, H100_16, SLA, space, deadline=Deadline(0.0))
    n = len(space.engines)
    assert n > 3
    assert (tables.prefill, tables.decode) == ([], [])
    assert tables.untabulated == n and tables.engines_done == 0
    assert tables.dropped[TIME_CUT] == n


@pytest.mark.parametrize("k", [1, 3])
def test_tables_cut_after_k_engines_are_the_first_k(space, k):
    full = tabulate_disagg(LLAMA70, H100_16, SLA, space, keep_all=True)
    part = tabulate_disagg(LLAMA70, H100_16, SLA, space, keep_all=True, deadline=cut_after(k))
    n = len(space.engines)
    assert (part.untabulated, part.engines_done, part.dropped[TIME_CUT]) == (n - k, k, n - k)
    first = set(space.engines[:k])
    p, d = rows(full)
    assert rows(part) == ([r for r in p if r[0] in first], [r for r in d if r[0] in first])
    assert full.untabulated == 0 and TIME_CUT not in full.dropped


def test_tables_unchanged_when_the_deadline_is_not_hit(space):
    plain = tabulate_disagg(LLAMA70, H100_16, SLA, space)
    timed = tabulate_disagg(LLAMA70, H100_16, SLA, space, deadline=Deadline(3600.0))
    assert rows(timed) == rows(plain) and timed.dropped == plain.dropped
    assert timed.engines_done == len(space.engines)


def test_results_identical_to_before_when_the_limit_is_not_hit():
    """Golden figures of the commit before the deadline reached the tables and the front."""
    plans = solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=2, time_limit_s=30, num_workers=1,
                        disaggregate="auto")
    # (the aggregated rows' concurrency is found between ladder rungs since: 2P3D at 804 per GPU was the
    # pick while TP4 PP1 stopped at 128 requests per engine, 782)
    assert [p.describe() for p in plans] == ["TP4 PP1 DP4", "TP4 PP2 DP2"]
    assert [p.tokens_per_s_per_gpu for p in plans] == [867.1048284236622, 843.5794873687007]
    assert [(p.solver.status, p.solver.stop_reason, p.solver.candidates_in_model) for p in plans] == [
        ("OPTIMAL", "optimal", 122)] * 2
    # candidates counts what candidates_in_model counts (rows), plus every pruned engine and row: 359
    # (it counted the 36 engines enumerated, fewer than the 122 rows in the model)
    assert [p.solver.candidates for p in plans] == [122 + sum(plans[0].solver.pruned.values())] * 2 == [359] * 2
    front = serve_front(LLAMA70, H100_16, JOB, time_limit_s=30)
    assert (len(front.points), len(front.front)) == (256, 30)
    best = front.best_at(0.05)
    assert best.label == "1P1D P:TP1 PP2 D:TP4 PP1 x233"
    assert best.tokens_per_s_per_gpu == pytest.approx(873.856601898841, rel=1e-12)
    assert front.best_at(0.02).tokens_per_s_per_gpu == pytest.approx(367.72142471296695, rel=1e-12)
    assert front.complete and front.cut_text() == "" and front.evaluated == front.candidates > 0
    assert front_json(front)["complete"] is True and front_json(front)["note"] is None


def _cut_tables(k):
    """`tabulate_disagg` as the solve calls it, its deadline replaced by one that cuts after k engines."""
    def tabulate(model, cluster, job, space, *, deadline=None, **kw):
        return tabulate_disagg(model, cluster, job, space, deadline=cut_after(k), **kw)
    return tabulate


def test_a_plan_from_cut_tables_is_feasible_with_the_reason(monkeypatch, space):
    n = len(space.engines)
    monkeypatch.setattr(serve_solve, "tabulate_disagg", _cut_tables(n // 2))
    plan = solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=1, time_limit_s=30, num_workers=1,
                       disaggregate="on")[0]
    s = plan.solver
    assert (s.status, s.stop_reason) == ("FEASIBLE", "time_limit")
    assert s.pruned[TIME_CUT] == n - n // 2
    js = plan.to_json()["solver"]
    assert (js["status"], js["stop_reason"], js["pruned"][TIME_CUT]) == ("FEASIBLE", "time_limit", n - n // 2)
    text = solver_text(s, time_limit_s=2)
    assert "not proven optimal" in text and f"{n - n // 2} engine(s) not tabulated" in text
    assert not text.startswith("solver: optimal")
    # never better than the plan over every engine
    full = solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=1, time_limit_s=30, num_workers=1,
                       disaggregate="on")
    assert plan.tokens_per_s_per_gpu <= full[0].tokens_per_s_per_gpu


def test_auto_mode_with_cut_tables_is_not_proven(monkeypatch, space):
    monkeypatch.setattr(serve_solve, "tabulate_disagg", _cut_tables(0))  # no split engine tabulated
    plan = solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=1, time_limit_s=30, num_workers=1,
                       disaggregate="auto")[0]
    assert not plan.disaggregated
    assert (plan.solver.status, plan.solver.stop_reason) == ("FEASIBLE", "time_limit")
    assert plan.solver.pruned[TIME_CUT] == len(space.engines)


def test_split_only_with_nothing_tabulated_says_time_ran_out(monkeypatch, space):
    monkeypatch.setattr(serve_solve, "tabulate_disagg", _cut_tables(0))
    with pytest.raises(SolverError, match=rf"{len(space.engines)} of {len(space.engines)} engines not tabulated"):
        solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=1, time_limit_s=30, num_workers=1,
                    disaggregate="on")


def test_front_at_an_expired_deadline_is_empty_and_says_so():
    """The front's enumeration watches the deadline too: it keeps its first engine (as the solve's does)
    and counts the candidates it never examined; no engine is evaluated."""
    front = serve_front(LLAMA70, H100_16, JOB, deadline=Deadline(0.0))
    cut = enumerate_serve(LLAMA70, H100_16, JOB, deadline=Deadline(0.0))
    left = cut.reasons()[ENUM_TIME_CUT]
    assert len(cut.engines) == 1 and left > len(enumerate_serve(LLAMA70, H100_16, JOB).engines)
    assert (front.points, front.front, front.evaluated, front.candidates, front.unexamined) == ((), (), 0, 2, left)
    assert not front.complete
    assert front.cut_text() == (f"front over 0 of 2 deployments (candidate engines, aggregated and split, {left} more "
                                "candidate engine(s) not examined), cut at the time limit")
    js = front_json(front)
    assert (js["complete"], js["engines_evaluated"], js["engines"]) == (False, 0, 2)
    assert js["note"] == front.cut_text()


def test_front_cut_after_k_engines():
    """Aggregated engines only (the whole deadline is theirs): k checks pass, then every later one fails."""
    full = serve_front(LLAMA70, H100_16, JOB, disaggregate="off")
    n, space = full.candidates, enumerate_serve(LLAMA70, H100_16, JOB)
    k = 2
    # reads: the deadline's own, one per candidate of the enumeration (all pass), then one per engine (k pass)
    clock = Ticks(1 + space.enumerated + k)
    part = serve_front(LLAMA70, H100_16, JOB, disaggregate="off", deadline=Deadline(1.0, clock=clock))
    assert (part.evaluated, part.candidates, part.unexamined) == (k, n, 0) and not part.complete
    engines = [space.engines[i] for i in promise_order(LLAMA70, H100_16, JOB, space)[:k]]
    labels = {e.label() for e in engines}
    expect = [p for p in full.points if p.label.rsplit(" x", 1)[0] in labels]
    assert expect and list(part.points) == expect
    assert f"front over {k} of {n} deployments" in part.cut_text()


def test_partial_front_is_labelled_in_terminal_and_png(monkeypatch, tmp_path):
    from rich.console import Console
    import matplotlib.axes

    front = serve_front(LLAMA70, H100_16, JOB, deadline=Deadline(0.0))
    console = Console(record=True, width=200)
    render_front(front, console, title="t")
    assert "partial: front over 0 of" in console.export_text()
    titles = []
    real = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, t, **kw: (titles.append(t), real(self, t, **kw)))
    write_front_png({"x": front}, tmp_path / "p.png", title="Llama")
    assert titles == [f"Llama\n{front.cut_text()}"]
    complete = serve_front(LLAMA70, H100_16, JOB, disaggregate="off")
    console = Console(record=True, width=200)
    render_front(complete, console, title="t")
    assert "partial" not in console.export_text()


def test_study_keeps_a_cut_front_and_labels_it():
    fronts = serve_fronts(LLAMA70, {"dgx-h100": load_cluster("dgx-h100")}, [16], JOB, {"dgx-h100": None},
                          time_limit_s=0.0)
    assert len(fronts) == 1 and not fronts[0].front.complete and fronts[0].front.evaluated == 0
    from rich.console import Console

    console = Console(record=True, width=200)
    render_fronts(fronts, console, None)
    assert "partial: dgx-h100 x16: front over 0 of" in console.export_text()



def test_front_cut_in_the_split_part_keeps_the_aggregated_points():
    """Reads: the deadline's own, one per candidate of the enumeration, part()'s, one per aggregated engine (all pass), then k tabulated split
    engines; the pairing's checks all fail, so only the tabulated engines with no decode row to pair
    (a PP the split decode rule refuses) count as evaluated, and no split point shows."""
    free = JOB
    space = enumerate_serve(LLAMA70, H100_16, free)
    engines = space.engines  # the split tables' order
    n, k = len(engines), 8
    decoders = {r.engine for r in tabulate_disagg(LLAMA70, H100_16, free, space, keep_all=True).decode}
    without = sum(e not in decoders for e in engines[:k])
    assert 0 < without < k  # both kinds among the first k
    agg = serve_front(LLAMA70, H100_16, JOB, disaggregate="off")
    part = serve_front(LLAMA70, H100_16, JOB, deadline=Deadline(1.0, clock=Ticks(2 + space.enumerated + n + k)))
    assert (part.evaluated, part.candidates) == (n + without, 2 * n) and not part.complete
    assert list(part.points) == list(agg.points)
    assert f"front over {n + without} of {2 * n} deployments" in part.cut_text()
