"""`--time-limit` bounds the whole serving command: the engine enumeration and the aggregated rows stop at
their deadline too (the prefill/decode tables and the front: test_deadline.py), a plan chosen from what was
tabulated is FEASIBLE with stop_reason time_limit and the engines left out counted, a spent limit still
gives a first plan within a bounded grace, and the default SLA's two solves share the limit. Nothing here
times anything: the deadlines run on fake clocks (the wall-clock figures of whole commands are printed by
examples/benchmark_solver.py --serve-limits)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from autoshard import api_serve
from autoshard.cli import app
from autoshard.errors import InfeasibleError, SolverError
from autoshard.report.terminal import solver_text
from autoshard.search.deadline import Deadline
from autoshard.search.serve import solve as serve_solve
from autoshard.search.serve.disagg import TIME_CUT, tabulate_disagg
from autoshard.search.serve.ladder import ENUM_TIME_CUT, ROWS_TIME_CUT
from autoshard.search.serve.model import FirstPlan, build_model
from autoshard.search.serve.solve import FIRST_ROW_GRACE_S, solve_serve
from autoshard.search.serve.space import enumerate_serve, promise_order, tabulate
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob
from test_deadline import cut_after  # the fake clock both deadline test files use

LLAMA70 = load_model("llama-3.1-70b")
H100_16 = load_cluster("dgx-h100").with_gpus(16)
JOB = ServeJob(input_len=1000, output_len=1000)
SLA = JOB.model_copy(update={"tpot_target_s": 0.05})


def frozen(seconds: float = 0.0) -> Deadline:
    """A deadline `seconds` long on a clock that never moves (0.0: spent from the start, and any grace
    after it never expires)."""
    return Deadline(seconds, clock=lambda: 0.0)


@pytest.fixture(scope="module")
def space():
    return enumerate_serve(LLAMA70, H100_16, SLA)


@pytest.fixture(scope="module")
def full_rows(space):
    return tabulate(LLAMA70, H100_16, SLA, space)


def table(rows):
    return [(r.engine, r.config.max_num_seqs, r.config.max_num_batched_tokens, r.replicas, r.objective, r.tpot_us,
             r.ttft_us) for r in rows]


# --------------------------------------------------------------------------- enumeration


def test_enumeration_at_a_spent_deadline_keeps_its_first_engine_and_counts_the_rest(space):
    cut = enumerate_serve(LLAMA70, H100_16, SLA, deadline=frozen())
    assert cut.engines == space.engines[:1]
    assert cut.enumerated == space.enumerated  # every candidate counted, examined or not
    seen = sum(reason != ENUM_TIME_CUT for _, reason in cut.pruned)  # examined before the first engine
    assert cut.pruned[:seen] == space.pruned[:seen]
    assert cut.reasons()[ENUM_TIME_CUT] == space.enumerated - seen - 1 > len(space.engines)


def test_enumeration_unchanged_when_the_deadline_is_not_hit(space):
    timed = enumerate_serve(LLAMA70, H100_16, SLA, deadline=Deadline(3600.0))
    assert (timed.engines, timed.pruned, timed.enumerated) == (space.engines, space.pruned, space.enumerated)


def test_enumeration_with_no_engine_yet_does_not_stop():
    """Past the deadline the enumeration goes on until it has an engine: with none at all (405B on one
    GPU) it examines every candidate and says why each fails, never "time limit"."""
    big, one = load_model("llama-3.1-405b"), load_cluster("dgx-h100").with_gpus(1)
    plain = enumerate_serve(big, one, JOB)
    cut = enumerate_serve(big, one, JOB, deadline=frozen())
    assert plain.engines == cut.engines == [] and cut.pruned == plain.pruned
    assert ENUM_TIME_CUT not in cut.reasons()


# --------------------------------------------------------------------------- aggregated rows


@pytest.mark.parametrize("k", [1, 4])
def test_rows_cut_after_k_engines_are_the_k_most_promising(space, full_rows, k):
    rows, dropped = tabulate(LLAMA70, H100_16, SLA, space, deadline=cut_after(k))
    n = len(space.engines)
    assert n > 2 * k
    first = {space.engines[i] for i in promise_order(LLAMA70, H100_16, SLA, space)[:k]}
    assert table(rows) == [t for t in table(full_rows[0]) if t[0] in first]
    assert dropped[ROWS_TIME_CUT] == n - k
    assert ROWS_TIME_CUT not in full_rows[1]


def test_rows_unchanged_when_the_deadline_is_not_hit(space, full_rows):
    rows, dropped = tabulate(LLAMA70, H100_16, SLA, space, deadline=Deadline(3600.0), grace=Deadline(3600.0))
    assert table(rows) == table(full_rows[0]) and dropped == full_rows[1]


def test_rows_past_the_deadline_go_on_to_a_first_row_within_the_grace():
    """At 15 requests/s the most promising engine (TP8 PP1) cannot be deployed (its replicas would need more
    than 16 GPUs): past the deadline the rows go on to the second one (TP4 PP1), which can, and stop there."""
    job = JOB.model_copy(update={"request_rate": 15.0})
    space = enumerate_serve(LLAMA70, H100_16, job)
    full, _ = tabulate(LLAMA70, H100_16, job, space)
    order = [space.engines[i] for i in promise_order(LLAMA70, H100_16, job, space)]
    n, index = len(space.engines), next(i for i, e in enumerate(order) if any(r.engine == e for r in full))
    assert index == 1 and n > 3 and [e.label() for e in order[:2]] == ["TP8 PP1", "TP4 PP1"]
    rows, dropped = tabulate(LLAMA70, H100_16, job, space, deadline=frozen(), grace=frozen(FIRST_ROW_GRACE_S))
    assert table(rows) == [t for t in table(full) if t[0] == order[index]] != []
    assert dropped[ROWS_TIME_CUT] == n - index - 1
    assert dropped["the request rate needs more GPUs than the pool has"] > 0  # the first engine's rows
    # the grace spent too: nothing tabulated at all
    rows, dropped = tabulate(LLAMA70, H100_16, job, space, deadline=frozen(), grace=frozen())
    assert rows == [] and dropped[ROWS_TIME_CUT] == n


def _cut_rows(k, grace=None):
    """`tabulate` as the solve calls it, its deadline replaced by one that cuts after k engines."""
    def cut(model, cluster, job, space, *, deadline=None, grace_=None, **kw):
        kw.pop("grace", None)
        return tabulate(model, cluster, job, space, deadline=cut_after(k), grace=grace, **kw)
    return cut


def test_a_plan_from_cut_rows_is_feasible_with_the_reason(monkeypatch, space):
    n = len(space.engines)
    full = solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=1, time_limit_s=30, num_workers=1,
                       disaggregate="off")[0]
    assert (full.solver.status, full.solver.stop_reason) == ("OPTIMAL", "optimal")
    k = 1  # the most promising engine, TP8 PP1: the best, TP4 PP1 (the second), is left out
    order = [space.engines[i].label() for i in promise_order(LLAMA70, H100_16, SLA, space)]
    assert full.describe().startswith("TP4 PP1") and order[:2] == ["TP8 PP1", "TP4 PP1"]
    monkeypatch.setattr(serve_solve, "tabulate", _cut_rows(k))
    plan = solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=1, time_limit_s=30, num_workers=1,
                       disaggregate="off")[0]
    s = plan.solver
    assert (s.status, s.stop_reason) == ("FEASIBLE", "time_limit")
    assert s.pruned[ROWS_TIME_CUT] == n - k == 12
    js = plan.to_json()["solver"]
    assert (js["status"], js["stop_reason"], js["pruned"][ROWS_TIME_CUT]) == ("FEASIBLE", "time_limit", n - k)
    text = solver_text(s, time_limit_s=2)
    assert text.startswith("solver: best of what was tabulated, not proven optimal (the 2 s time limit ran out "
                           f"with {n - k} engine(s) not tabulated as aggregated replicas, no bound on them)")
    assert plan.describe().startswith("TP8 PP1") and plan.prediction.tpot_s <= 0.05
    assert plan.tokens_per_s_per_gpu < full.tokens_per_s_per_gpu


def test_cut_rows_none_meeting_the_targets_say_time_ran_out_not_infeasible(monkeypatch, space):
    """With every engine tabulated, a TPOT no engine reaches is infeasible (exit 1, what is missing); with
    the rows cut short, the engines left out might reach it: "raise --time-limit", not "infeasible"."""
    fast = SLA.model_copy(update={"tpot_target_s": 0.004})
    with pytest.raises(InfeasibleError):
        solve_serve(LLAMA70, H100_16, fast, pins=None, top_k=1, time_limit_s=30, num_workers=1, disaggregate="off")
    n = len(space.engines)
    monkeypatch.setattr(serve_solve, "tabulate", _cut_rows(2))
    with pytest.raises(SolverError, match=rf"no deployment meeting the targets found within the 30 s time limit "
                                          rf"\({n - 2} of {n} engines not tabulated as aggregated replicas before it\)"):
        solve_serve(LLAMA70, H100_16, fast, pins=None, top_k=1, time_limit_s=30, num_workers=1, disaggregate="off")


def test_rows_cut_to_nothing_say_time_ran_out(monkeypatch, space):
    n = len(space.engines)
    monkeypatch.setattr(serve_solve, "tabulate", _cut_rows(0, grace=frozen()))
    with pytest.raises(SolverError, match=rf"\({n} of {n} engines not tabulated as aggregated replicas before it\)"):
        solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=1, time_limit_s=30, num_workers=1, disaggregate="off")


# --------------------------------------------------------------------------- a spent limit


@pytest.mark.parametrize("disaggregate", ["off", "auto"])
def test_a_spent_limit_still_gives_a_first_plan_within_the_grace(space, disaggregate):
    """The deadline is spent before the solve starts (the clock never moves, so the grace never ends):
    the enumeration (cut only at the grace's end) is complete, the split tables get nothing, the rows stop
    at the most promising engine (TP8 PP1), whose row reaches 50 ms, CP-SAT stops at its first plan that
    serves. The plan says all of it."""
    n = len(space.engines)
    plan = solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=1, time_limit_s=0.0, num_workers=1,
                       disaggregate=disaggregate, deadline=frozen())[0]
    s = plan.solver
    assert (s.status, s.stop_reason) == ("FEASIBLE", "time_limit")
    assert plan.describe().startswith("TP8 PP1") and plan.prediction.tpot_s <= 0.05 and not plan.disaggregated
    assert s.pruned[ROWS_TIME_CUT] == n - 1 and ENUM_TIME_CUT not in s.pruned
    assert s.pruned.get(TIME_CUT, 0) == (n if disaggregate == "auto" else 0)
    text = solver_text(s, time_limit_s=0.0)
    assert f"ran out with {n - 1} engine(s) not tabulated as aggregated replicas" in text


def test_the_first_plan_callback_skips_the_empty_pick(space):
    """In the model over both kinds a solution may deploy nothing (objective 0); the first plan kept
    when there is no time to search serves something."""
    from autoshard.search.cpsat import new_solver

    rows, _ = tabulate(LLAMA70, H100_16, JOB, space)
    tables = tabulate_disagg(LLAMA70, H100_16, JOB, space)
    built = build_model(rows, space.engines, JOB, tables, H100_16)
    solver = new_solver(num_workers=1, seed=0)
    solver.parameters.max_time_in_seconds = 30
    first = FirstPlan(built.objective, maximize=True)
    solver.solve(built.cp, first)
    assert solver.value(built.objective) > 0


# --------------------------------------------------------------------------- the default SLA's two solves


class _Recorder:
    """Stands in for `search.serve.solve.solve_serve`: records the deadline of each call and answers with
    a real plan (or raises what `fail` gives for that call)."""

    def __init__(self, fail=()):
        self.deadlines, self.fail, self.real = [], dict(fail), serve_solve.solve_serve

    def __call__(self, model, cluster, job, **kw):
        self.deadlines.append(kw["deadline"])
        if (exc := self.fail.get(len(self.deadlines))) is not None:
            raise exc
        kw["deadline"] = Deadline(30.0)
        return self.real(model, cluster, job, **kw)


def _plan_serving(**kw):
    small, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100").with_gpus(8)
    return api_serve.plan_serving(small, cluster, ServeJob(input_len=1000, output_len=1000), top_k=1, pins=None,
                                  time_limit_s=kw.pop("time_limit_s", 20.0), num_workers=1, seed=0,
                                  disaggregate="off", **kw)


def test_the_two_solves_share_the_limit(monkeypatch):
    import time

    rec = _Recorder()
    monkeypatch.setattr(api_serve._search, "solve_serve", rec)
    t0 = time.monotonic()
    found = _plan_serving(started_at=t0)
    alt, main = rec.deadlines
    assert main.start == alt.start == t0 and main.end == pytest.approx(t0 + 20.0)
    # the throughput-optimal solve ends at ALTERNATIVE_SHARE of what was left when it started
    assert alt.end - t0 == pytest.approx(api_serve.ALTERNATIVE_SHARE * 20.0, abs=0.5)
    assert alt.end < main.end
    assert found.alternative is not None and found.plans[0].job.tpot_target_s == 0.05


def test_an_alternative_cut_by_the_limit_leaves_the_interactive_answer(monkeypatch):
    monkeypatch.setattr(api_serve._search, "solve_serve", _Recorder({1: SolverError("no deployment found")}))
    found = _plan_serving()
    assert found.alternative is None and found.plans[0].job.tpot_target_s == 0.05
    assert found.sla_note.endswith("the time limit ran out before the throughput-optimal plan was found")


def test_an_interactive_solve_cut_by_the_limit_falls_back_to_the_throughput_optimal_plan(monkeypatch):
    monkeypatch.setattr(api_serve._search, "solve_serve", _Recorder({2: SolverError("no deployment found")}))
    found = _plan_serving()
    assert found.alternative is None and found.plans[0].job.tpot_target_s is None
    assert found.sla_note.startswith("the time limit ran out before a plan at the interactive default TPOT <= 50 ms "
                                     "(no deployment found); showing the throughput-optimal plan")


def test_both_solves_cut_by_the_limit_is_an_error(monkeypatch):
    first = SolverError("no deployment found within the 2 s time limit")
    monkeypatch.setattr(api_serve._search, "solve_serve", _Recorder({1: first, 2: InfeasibleError("x")}))
    with pytest.raises(SolverError, match="no deployment found within the 2 s time limit"):
        _plan_serving()


def test_json_says_the_interactive_sla_when_the_alternative_was_cut(monkeypatch):
    monkeypatch.setattr(api_serve._search, "solve_serve", _Recorder({1: SolverError("no deployment found")}))
    result = CliRunner().invoke(app, ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                      "--disaggregate", "off", "--json"])
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert obj["sla"]["tpot_ms"] == 50.0 and obj["sla"]["default"] is True
    assert "throughput_optimal" not in obj
    assert obj["predicted"]["serve"]["tpot_target_s"] == 0.05 and obj["predicted"]["serve"]["tpot_s"] <= 0.05 and obj["predicted"]["serve"]["meets_targets"]


class _Scripted:
    """A CP-SAT stand-in answering each solve with the next (status, objective) of its script; records
    the time limit and whether a solution callback was passed."""

    def __init__(self, *script):
        from ortools.sat.python import cp_model

        self.parameters, self.script, self.calls = cp_model.CpSolver().parameters, list(script), []

    def solve(self, model, callback=None):
        status, self.objective_value = self.script.pop(0)
        self.calls.append((self.parameters.max_time_in_seconds, callback is not None))
        return status


def test_a_search_cut_on_the_empty_pick_goes_on_to_a_plan_that_serves(space):
    from ortools.sat.python import cp_model

    from autoshard.search.serve.model import solve_for_plan

    built = build_model(*tabulate(LLAMA70, H100_16, JOB, space)[:1], space.engines, JOB)
    fake = _Scripted((cp_model.FEASIBLE, 0.0), (cp_model.FEASIBLE, 812.0))
    fake.parameters.max_time_in_seconds = 2.0
    assert solve_for_plan(built, fake, maximize=True, short=False, grace_s=0.8) == cp_model.FEASIBLE
    assert fake.calls == [(2.0, False), (0.8, True)]  # the second within the grace, stopping at a plan
    # nothing but the empty pick within the grace too: no solution, not a plan serving nothing
    fake = _Scripted((cp_model.FEASIBLE, 0.0), (cp_model.FEASIBLE, 0.0))
    assert solve_for_plan(built, fake, maximize=True, short=False, grace_s=0.8) == cp_model.UNKNOWN
    # no grace left (a later plan of a top-k): no second search
    fake = _Scripted((cp_model.FEASIBLE, 0.0))
    assert solve_for_plan(built, fake, maximize=True, short=False, grace_s=0.0) == cp_model.UNKNOWN
    # a request rate (GPUs minimized): every solution deploys something
    fake = _Scripted((cp_model.FEASIBLE, 0.0))
    assert solve_for_plan(built, fake, maximize=False, short=False, grace_s=0.8) == cp_model.FEASIBLE
    # too little time to search: one run, the grace's length, stopping at the first plan that serves
    fake = _Scripted((cp_model.FEASIBLE, 640.0))
    fake.parameters.max_time_in_seconds = 0.01
    assert solve_for_plan(built, fake, maximize=True, short=True, grace_s=0.8) == cp_model.FEASIBLE
    assert fake.calls == [(0.8, True)]


def test_a_top_k_solve_out_of_time_keeps_the_plans_found(monkeypatch):
    """The second of two solves ends with no solution (its time ran out): the first plan comes back
    (this raised "no deployment found" before). A request rate: no tie-break solve in between."""
    from ortools.sat.python import cp_model

    job = JOB.model_copy(update={"request_rate": 5.0})
    real, made = serve_solve.new_solver, []

    def factory(**kw):
        made.append(kw)
        return real(**kw) if len(made) == 1 else _Scripted((cp_model.UNKNOWN, 0.0))

    monkeypatch.setattr(serve_solve, "new_solver", factory)
    plans = solve_serve(LLAMA70, H100_16, job, pins=None, top_k=2, time_limit_s=30, num_workers=1,
                        disaggregate="off")
    assert len(made) == 2 and len(plans) == 1 and plans[0].solver.status == "OPTIMAL"


def test_a_search_cut_below_a_known_row_goes_on_to_reach_it(space):
    """A time-cut solution worse than the best aggregated row that meets the targets (a plan the solve
    already has) is not kept while the grace lasts: the search goes on to one at least that good."""
    from ortools.sat.python import cp_model

    from autoshard.search.serve.model import solve_for_plan

    built = build_model(*tabulate(LLAMA70, H100_16, JOB, space)[:1], space.engines, JOB)
    fake = _Scripted((cp_model.FEASIBLE, 500.0), (cp_model.FEASIBLE, 804.0))
    assert solve_for_plan(built, fake, maximize=True, short=False, grace_s=0.8, floor=800) == cp_model.FEASIBLE
    assert [c[1] for c in fake.calls] == [False, True] and fake.objective_value == 804.0
    fake = _Scripted((cp_model.FEASIBLE, 500.0))  # no grace: kept, a plan that serves
    assert solve_for_plan(built, fake, maximize=True, short=False, grace_s=0.0, floor=800) == cp_model.FEASIBLE


def test_auto_mode_cut_short_keeps_the_better_kind():
    """Auto mode's pick is compared with the best plan of the other kind: when a cut search picked the
    worse kind, the better one is the plan (FEASIBLE, with the cut search's certificate), and the sentence
    says which won by how much; a proven pick is never swapped."""
    from autoshard.search.serve.result import with_choice

    split = solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=1, time_limit_s=30, num_workers=1,
                        disaggregate="on")[0]
    agg = solve_serve(LLAMA70, H100_16, SLA, pins=None, top_k=1, time_limit_s=30, num_workers=1,
                      disaggregate="off")[0]
    assert agg.solver.objective > split.solver.objective  # TP4 PP1 (867 per GPU) beats 2P3D (804) here
    cut = dataclasses.replace(split, solver=dataclasses.replace(split.solver, status="FEASIBLE",
                                                                stop_reason="time_limit", pruned={ROWS_TIME_CUT: 3}))
    kept = with_choice(SLA, cut, agg)
    assert not kept.disaggregated and kept.describe() == agg.describe()
    assert (kept.solver.status, kept.solver.stop_reason, kept.solver.pruned) == ("FEASIBLE", "time_limit",
                                                                                  {ROWS_TIME_CUT: 3})
    assert kept.solver.objective == agg.solver.objective
    assert kept.choice.startswith(f"aggregated: {agg.throughput_tokens_per_s / 16:,.0f} output tokens/s per GPU")
    proven = with_choice(SLA, split, agg)  # OPTIMAL: not swapped (its model could not place the other kind)
    assert proven.disaggregated and proven.choice.startswith("disaggregated:")
