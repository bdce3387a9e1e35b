"""Cost studies: the arithmetic, the buyer's answers, the Pareto front, skipped sizes, the report
files and the `autoshard study` command. Solves use tiny models, one CP-SAT worker and short limits."""

from __future__ import annotations

import csv
import json
import random

import pytest
from conftest import gpu, node, tiny_model
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.errors import InfeasibleError, SpecError
from autoshard.study.report import write_outputs
from autoshard.specs import ClusterSpec
from autoshard.study.costs import (
    TrainRow,
    cheapest_within_deadline,
    fastest_within_budget,
    pareto_front,
    serve_costs,
    train_costs,
)
from autoshard.study.run import run_study

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def priced_cluster(name: str = "priced", *, price: float | None = 2.0, hbm: float = 80.0, per_node: int = 4,
                   nodes: int = 2) -> ClusterSpec:
    data = {"name": name, "gpu": gpu(hbm=hbm), "node": node(per_node), "num_nodes": nodes}
    if price is not None:
        data["price_per_gpu_hour"] = price
    return ClusterSpec.model_validate(data)


def row(cluster: str, gpus: int, days: float, usd: float | None) -> TrainRow:
    return TrainRow(cluster=cluster, gpu="X", num_gpus=gpus, plan="TP1 PP1 DP1 mbs1", degrees={}, status="optimal",
                    gap=0.0, solve_s=0.0, mfu=0.5, tokens_per_s=1.0, days=days, gpu_hours=days * 24 * gpus,
                    price_per_gpu_hour=None if usd is None else 1.0, total_usd=usd, usd_per_million_tokens=None)


# ----------------------------------------------------------------------------- pure functions


def brute_front(points: list[tuple[float, float]]) -> set[int]:
    def dominated(i: int) -> bool:
        xi, yi = points[i]
        return any(x <= xi and y <= yi and (x < xi or y < yi) for j, (x, y) in enumerate(points) if j != i)

    return {i for i in range(len(points)) if not dominated(i)}


def test_pareto_front_matches_brute_force():
    rng = random.Random(7)
    for _ in range(400):
        n = rng.randint(0, 12)
        # a coarse grid makes ties on one or both coordinates common
        points = [(float(rng.randint(1, 6)), float(rng.randint(1, 6))) for _ in range(n)]
        front = pareto_front(points)
        assert set(front) == brute_front(points), points
        assert len(front) == len(set(front))
        assert [points[i] for i in front] == sorted(points[i] for i in front)  # ordered by x, then y


def test_pareto_front_hand_made():
    points = [(10, 100), (20, 50), (15, 120), (30, 50), (40, 10), (10, 100)]
    assert pareto_front(points) == [0, 5, 1, 4]  # (15,120) and (30,50) are dominated; the tie stays


def test_cheapest_within_deadline_and_fastest_within_budget():
    rows = [row("a", 64, 100.0, 5e6), row("a", 128, 55.0, 5.5e6), row("b", 64, 80.0, 4e6), row("b", 256, 30.0, 9e6),
            row("c", 512, 20.0, None)]
    assert cheapest_within_deadline(rows, 60.0) is rows[1]
    assert cheapest_within_deadline(rows, None) is rows[2]
    assert cheapest_within_deadline(rows, 10.0) is None
    assert fastest_within_budget(rows, 6e6) is rows[1]
    assert fastest_within_budget(rows, None) is rows[4]  # no budget: the fastest, priced or not
    assert fastest_within_budget(rows, 1e6) is None
    for deadline in (25.0, 40.0, 60.0, 90.0, 200.0):
        ok = [r for r in rows if r.total_usd is not None and r.days <= deadline]
        assert cheapest_within_deadline(rows, deadline) is min(ok, key=lambda r: r.total_usd, default=None)
    for budget in (4e6, 5e6, 6e6, 1e7):
        ok = [r for r in rows if r.total_usd is not None and r.total_usd <= budget]
        assert fastest_within_budget(rows, budget) is min(ok, key=lambda r: r.days, default=None)


def test_cost_arithmetic_is_exact():
    tokens, tps, gpus, price = 15e12, 3.7e6, 4096, 2.9
    days, gpu_hours, total, per_m = train_costs(tokens=tokens, tokens_per_s=tps, num_gpus=gpus,
                                                price_per_gpu_hour=price)
    assert days == tokens / tps / 86400
    assert gpu_hours == pytest.approx(gpus * days * 24, rel=1e-12)
    assert total == gpu_hours * price
    assert per_m == total / (tokens / 1e6)
    assert train_costs(tokens=tokens, tokens_per_s=tps, num_gpus=gpus, price_per_gpu_hour=None)[2:] == (None, None)
    per_hour, per_m_out = serve_costs(gpus_used=8, served_tokens_per_s=5000.0, price_per_gpu_hour=3.0)
    assert per_hour == 24.0
    assert per_m_out == 24.0 / (5000.0 * 3600) * 1e6


# ----------------------------------------------------------------------------- studies (tiny solves)


@pytest.fixture(scope="module")
def tiny_study():
    model = tiny_model(layers=4, hidden=512, heads=8, kv=8)
    clusters = [priced_cluster("fast", price=2.0), priced_cluster("free", price=None),
                priced_cluster("small", price=1.0, hbm=2.0)]
    return run_study(model, clusters, [4, 6, 8], tokens=1e9, prices={"fast": 2.9}, seq_len=1024,
                     global_batch_size=16, time_limit_s=10, jobs=1, deadline_days=1e9, budget_usd=1e12)


def test_study_rows_costs_and_price_override(tiny_study):
    res = tiny_study
    fast = [r for r in res.rows if r.cluster == "fast"]
    assert [r.num_gpus for r in fast] == [4, 8]
    for r in fast:
        assert r.price_per_gpu_hour == 2.9  # the override beats the cluster's $2.00
        assert r.days == 1e9 / r.tokens_per_s / 86400
        assert r.total_usd == r.gpu_hours * 2.9
        assert r.plan.startswith("TP") and "mbs" in r.plan
    free = [r for r in res.rows if r.cluster == "free"]
    assert free and all(r.total_usd is None and r.usd_per_million_tokens is None for r in free)
    assert any("No price for free" in n for n in res.notes)
    assert all(r.cluster == "fast" for r in res.pareto)  # unpriced rows stay off the dollar front
    assert {a.key for a in res.answers} == {"cheapest_within_deadline", "fastest_within_budget"}
    assert res.answers[0].row is min(fast, key=lambda r: r.total_usd)


def test_study_lists_sizes_that_cannot_run(tiny_study):
    reasons = {(s.cluster, s.num_gpus): s.reason for s in tiny_study.skipped}
    assert "not a whole number of 4-GPU nodes" in reasons[("fast", 6)]
    assert "no plan fits" in reasons[("small", 4)]  # 2 GiB GPUs: the solver's InfeasibleError message
    assert ("small", 8) in reasons
    assert not [r for r in tiny_study.rows if r.cluster == "small"]


def test_study_files(tiny_study, tmp_path):
    paths = write_outputs(tiny_study, tmp_path / "out")
    assert sorted(p.name for p in paths) == ["pareto.png", "study.csv", "study.json", "study.md"]
    with (tmp_path / "out" / "study.csv").open() as fh:
        lines = list(csv.DictReader(fh))
    assert len(lines) == len(tiny_study.rows) + len(tiny_study.skipped)
    ok = [x for x in lines if x["status"] != "skipped"]
    assert all(float(x["total_usd"]) > 0 for x in ok if x["cluster"] == "fast")
    assert {x["skipped_reason"] != "" for x in lines if x["status"] == "skipped"} == {True}
    obj = json.loads((tmp_path / "out" / "study.json").read_text())
    assert {"inputs", "rows", "answers", "pareto", "skipped", "assumptions"} <= set(obj)
    assert obj["schema"] == "autoshard.study/v1"
    assert obj["inputs"]["prices_usd_per_gpu_hour"]["fast"] == 2.9
    md = (tmp_path / "out" / "study.md").read_text()
    assert md.index("## Answers") < md.index("## All options") < md.index("## Pareto front")
    assert "## Sizes that cannot run" in md and "## Assumptions" in md
    png = (tmp_path / "out" / "pareto.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 5000


def test_process_pool_gives_the_same_rows(tiny_study):
    model = tiny_model(layers=4, hidden=512, heads=8, kv=8)
    res = run_study(model, [priced_cluster("fast", price=2.0)], [4, 8], tokens=1e9, prices={"fast": 2.9},
                    seq_len=1024, global_batch_size=16, time_limit_s=10, jobs=2)
    serial = [(r.num_gpus, r.plan, r.tokens_per_s) for r in tiny_study.rows if r.cluster == "fast"]
    assert [(r.num_gpus, r.plan, r.tokens_per_s) for r in res.rows] == serial


def test_no_size_fits_raises_infeasible():
    with pytest.raises(InfeasibleError, match="no studied size"):
        run_study(tiny_model(), [priced_cluster("small", hbm=2.0)], [4], tokens=1e9, time_limit_s=5, jobs=1)


def test_bad_inputs_are_spec_errors():
    model = tiny_model()
    with pytest.raises(SpecError, match="--tokens"):
        run_study(model, [priced_cluster()], [4], jobs=1)  # tiny has no training.tokens
    with pytest.raises(SpecError, match="not one of the studied clusters"):
        run_study(model, [priced_cluster()], [4], tokens=1e9, prices={"nope": 1.0}, jobs=1)
    with pytest.raises(SpecError, match="training studies only"):
        run_study(model, [priced_cluster()], [4], mode="serve", deadline_days=3, jobs=1)
    with pytest.raises(SpecError, match="serving studies only"):
        run_study(model, [priced_cluster()], [4], tokens=1e9, request_rate=3.0, jobs=1)


# ----------------------------------------------------------------------------- the command

TINY = ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8,16", "--jobs", "1", "--time-limit", "10"]


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert "Traceback" not in result.stdout + result.stderr
    return result


def test_cli_json_and_files(tmp_path):
    out = tmp_path / "study"
    result = invoke(*TINY, "--json", "--out", str(out), "--price", "dgx-h100=2.5", "--deadline-days", "1e6")
    assert result.exit_code == 0, result.stderr
    obj = json.loads(result.stdout)  # exactly one JSON object on stdout
    assert [r["num_gpus"] for r in obj["rows"]] == [8, 16]
    assert all(r["price_per_gpu_hour"] == 2.5 for r in obj["rows"])
    assert obj["answers"]["cheapest_within_deadline"]["row"] is not None
    assert {p.name for p in out.iterdir()} == {"study.csv", "study.json", "study.md", "pareto.png"}


def test_cli_table_then_exit_codes():
    result = invoke(*TINY, "--gpus", "8,12")
    assert result.exit_code == 0, result.stderr
    assert "Cheapest option" in result.stdout and "dgx-h100" in result.stdout
    assert "12 GPUs is not a whole number of 8-GPU nodes" in result.stdout
    bad = invoke("study", "llama-3.1-70b", "--cluster", "dgx-h100", "--gpus", "8", "--jobs", "1")
    assert bad.exit_code == 2 and "--tokens" in bad.stderr  # 70B has no training.tokens
    bad = invoke(*TINY, "--price", "dgx-b200=4")
    assert bad.exit_code == 2 and "not one of the studied clusters" in bad.stderr
    bad = invoke("study", "llama-3.1-8b", "--cluster", "no-such-cluster", "--gpus", "8", "--jobs", "1")
    assert bad.exit_code == 2
    none_fit = invoke("study", "llama-3.1-405b", "--cluster", "dgx-h100", "--gpus", "8", "--jobs", "1",
                      "--time-limit", "5")
    assert none_fit.exit_code == 1 and "no plan fits" in none_fit.stderr


def test_cli_serve_study():
    result = invoke("study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--mode", "serve",
                    "--request-rate", "5", "--jobs", "1", "--json")
    assert result.exit_code == 0, result.stderr
    obj = json.loads(result.stdout)
    (r,) = obj["rows"]
    assert r["gpus_used"] >= 1 and r["served_tokens_per_s"] == pytest.approx(5 * obj["inputs"]["job"]["output_len"])
    per_m = r["usd_per_hour"] / (r["served_tokens_per_s"] * 3600) * 1e6
    assert r["usd_per_million_output_tokens"] == pytest.approx(per_m)
    assert "fewest_gpus_for_rate" in obj["answers"]


def test_heterogeneous_cluster_runs_at_its_own_size_with_a_weighted_price():
    cluster = ClusterSpec.model_validate({
        "name": "mixed", "inter_pool_gbps": 25,
        "pools": [{"name": "fast", "gpu": gpu("H100"), "node": node(4), "num_nodes": 1, "price_per_gpu_hour": 3.0},
                  {"name": "slow", "gpu": gpu("A100", tflops=312.0), "node": node(4), "num_nodes": 1,
                   "price_per_gpu_hour": 1.0}],
    })
    res = run_study(tiny_model(layers=4, hidden=512, heads=8, kv=8), [cluster], [8, 16], tokens=1e9, seq_len=1024,
                    global_batch_size=16, time_limit_s=10, jobs=1)
    (r,) = res.rows
    assert r.num_gpus == 8 and r.price_per_gpu_hour == 2.0 and r.gpu == "H100+A100"
    (s,) = res.skipped
    assert s.num_gpus == 16 and "heterogeneous" in s.reason


def test_plan_summary_names_the_fully_recomputed_layers():
    """'mbs4+42' read as a sum: the layers fully recomputed per stage are said as the terminal says them."""
    from types import SimpleNamespace

    from autoshard.study.runner import _plan_summary

    def plan(recompute: str, layers: int, zero: int = 1):
        dims = SimpleNamespace(describe=lambda: "TP2 PP1 DP64")
        cfg = SimpleNamespace(dims=dims, micro_batch_size=4, recompute=SimpleNamespace(value=recompute),
                              zero_stage=zero)
        return SimpleNamespace(config=cfg, recompute_num_layers=layers)

    assert _plan_summary(plan("none", 42)) == "TP2 PP1 DP64 mbs4 +42 full/stage"
    assert _plan_summary(plan("selective", 3, zero=3)) == "TP2 PP1 DP64 mbs4 rc-selective +3 full/stage ZeRO-3"
    assert _plan_summary(plan("none", 0)) == "TP2 PP1 DP64 mbs4"


# ----------------------------------------------------------------------------- the study's time limit


def test_the_sizes_share_the_whole_study_limit():
    """--time-limit bounds the whole study: each size's solve gets the budget over the rounds of solves
    (sizes / parallel processes, rounded up); it used to be a limit per size (30 sizes at --time-limit 2
    took 27 s)."""
    from autoshard.study.run import MIN_TASK_TIME_LIMIT_S, task_time_limit

    assert task_time_limit(60.0, 32, 2) == pytest.approx(60.0 / 16)
    assert task_time_limit(60.0, 3, 4) == pytest.approx(60.0)  # one round
    assert task_time_limit(10.0, 5, 2) == pytest.approx(10.0 / 3)
    with pytest.raises(SpecError, match=r"32 size\(s\) on 2 parallel process\(es\) need at least 0.5 s each, 8 s of "
                                        r"solving, and the limit leaves 4.0 s after start-up: .*more --jobs") as exc:
        task_time_limit(4.0, 32, 2)
    with pytest.raises(SpecError, match=r"leaves 0.3 s after start-up: raise --time-limit$"):
        task_time_limit(0.3, 1, 2)  # one round: more processes cannot help
    assert exc.value.source == "--time-limit" and MIN_TASK_TIME_LIMIT_S == 0.5


def test_study_records_each_sizes_share_of_the_limit(tiny_study):
    inputs = tiny_study.inputs
    assert inputs["time_limit_s"] == 10
    # 6 (cluster, size) solves (size 6 is no whole number of 4-GPU nodes) on one process: 10 / 6 s each,
    # less the time spent before them
    assert 1.5 < inputs["task_time_limit_s"] <= 10 / 6
    assert any(f"within {inputs['task_time_limit_s']:.3g} s (the study's 10 s shared by its sizes)" in n
               for n in tiny_study.assumptions)


def test_a_study_limit_too_short_for_its_sizes_is_refused():
    result = CliRunner().invoke(app, ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--cluster", "dgx-b200",
                                      "--gpus", "8,16,32,64,128,256", "--time-limit", "1", "--jobs", "1"])
    assert result.exit_code == 2
    assert "--time-limit: 12 size(s) on 1 parallel process(es) need at least 0.5 s each, 6 s of solving" in result.output


def test_time_a_size_overran_comes_off_the_later_sizes(monkeypatch):
    """Each size starts with the study's time left over the rounds still to run (never more than the even
    share): a solve that overruns its limit (the first-plan grace, the float re-check) shortens the sizes
    after it instead of pushing the study's end; a size whose turn comes with under MIN_TASK_S left is not
    started, and says why. It used to submit every size with the even share: 32 sizes at 10 s ran 13.5 s."""
    import autoshard.study.runner as runner

    clock = [100.0]
    given: list[float] = []
    overrun = [0.5]

    def fake_solve(key, n, limit):
        given.append(limit)
        clock[0] += limit + overrun[0]  # every solve overruns its limit
        return key, n, {"ok": True}, None

    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(runner, "_solve_task", fake_solve)
    tasks = [("c", n) for n in (1, 2, 3, 4, 5, 6)]
    init = (None, None, None, 2.0, 0.0)  # the even share: 12 s over 6 sizes on one process
    found = runner._run_tasks(tasks, init, 1, None, cap=2.0, end=112.0)
    assert given[0] == pytest.approx(2.0)  # on time: the even share
    assert given[1] == pytest.approx(9.5 / 5)  # 2.5 s spent: the 9.5 s left over the 5 sizes to go
    assert all(b < a for a, b in zip(given, given[1:]))
    assert clock[0] <= 112.0 + 0.5  # only the last size's own overrun is past the end
    assert [r[3] for r in found].count(None) == len(given) == 6

    clock[0], overrun[0] = 100.0, 2.0
    given.clear()
    found = runner._run_tasks(tasks, (None, None, None, 4.0, 0.0), 1, None, cap=4.0, end=108.0)  # 2 s overruns
    skipped = [r for r in found if r[3] == runner.TIME_OUT_REASON]
    assert given == pytest.approx([8 / 6, (8 - 8 / 6 - 2) / 5, 0.4333333333], abs=1e-6)
    assert len(skipped) == 3 and "raise --time-limit" in runner.TIME_OUT_REASON
    assert clock[0] <= 108.0 + 2.0 and all(g >= runner.MIN_TASK_S for g in given)
    # the largest sizes go first, so the ones left out are the smallest
    assert sorted(r[1] for r in skipped) == sorted(n for _, n in tasks)[:len(skipped)]


def test_status_column_claims_optimal_only_when_proven():
    """A solve the clock cut can stop with its bound at its objective (gap 0.0) without having proven it:
    the table said "optimal" there while study.json said "feasible"."""
    import dataclasses

    from autoshard.study.report import _status
    from autoshard.study.run import _pct

    proven = row("a", 8, 1.0, 1.0)
    assert _status(proven) == "optimal"
    assert _status(dataclasses.replace(proven, status="feasible", gap=0.0)) == "not proven"
    assert _status(dataclasses.replace(proven, status="feasible", gap=6.6e-6)) == "gap 0.00066%"
    assert _status(dataclasses.replace(proven, status="feasible", gap=0.066)) == "gap 6.6%"
    assert _pct(6.6e-6) == "0.00066%" and _pct(0.066) == "6.6%"  # the note's gap in the table's unit


def test_front_dollars_are_at_the_studied_size():
    """The serving front's $/M pays for every GPU of the studied size, as the rows do: a 6-GPU deployment in
    an 8-GPU size runs once and leaves 2 GPUs idle, paid for (review of 2026-11-24: $1.175/M read beside a
    cheapest answer of $1.309/M); a 4-GPU one runs twice and loses nothing; one larger than the size does
    not fit it."""
    from autoshard.search.serve.front import FrontPoint
    from autoshard.study.front import ClusterFront

    cf = ClusterFront("dgx-h100", 8, 3.0, front=None)
    per_gpu = 874.0
    used = 3.0 / (874.0 * 3600) * 1e6  # per GPU the deployment runs on

    def point(gpus: int) -> FrontPoint:
        return FrontPoint("aggregated", "x", per_gpu, 20.0, 0.05, 0.1, gpus)

    assert cf.usd_per_million_of(point(6)) == pytest.approx(used * 8 / 6)
    assert cf.usd_per_million_of(point(4)) == pytest.approx(used)
    assert cf.usd_per_million_of(point(16)) is None and cf.rented(point(16))[0] == 0
