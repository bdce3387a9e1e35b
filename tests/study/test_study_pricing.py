"""Cost studies price what a deployment runs on (review of 2026-11-24): a mixed cluster's serving rows and
fronts at the pools used, the fronts' SLA cuts the cheapest deployment on the GPUs rented (so never dearer
at a looser SLA, and in line with the study's rows), the fronts in study.json as in --json."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.search.serve.front import Front, FrontPoint
from autoshard.specs import load_cluster, load_model
from autoshard.study.costs import deployment_price, pool_prices
from autoshard.study.front import ClusterFront, serve_fronts
from autoshard.study.run import _serve_job, run_study

LLAMA70 = load_model("llama-3.1-70b")


def test_deployment_price_weights_the_pools_it_uses():
    mixed = load_cluster("mixed-h100-a100")
    prices = pool_prices(mixed)
    assert prices == (3.0, 1.79)
    assert deployment_price(prices, {0: 6}) == 3.0  # the cluster's mean, $2.19, charged the idle A100s
    assert deployment_price(prices, {0: 2, 1: 4}) == pytest.approx((2 * 3.0 + 4 * 1.79) / 6)
    assert deployment_price(pool_prices(mixed, 2.5), {0: 6, 1: 8}) == 2.5  # a --price sets every pool
    assert deployment_price((3.0, None), {0: 4}) == 3.0 and deployment_price((3.0, None), {0: 4, 1: 4}) is None


def test_mixed_cluster_serving_rows_are_priced_at_the_h100_pool():
    res = run_study("llama-3.1-70b", ["mixed-h100-a100", "mixed-3pool"], [96], mode="serve", request_rate=5,
                    tpot_ms=50, jobs=1, time_limit_s=60)
    for r in res.rows:  # both pick a 1P1D on 6 H100 at 5 requests/s x 1,000 output tokens
        assert r.plan.startswith("1P1D") and r.gpus_used == 6 and r.gpu == "H100-SXM5-80GB"
        assert r.price_per_gpu_hour == 3.0  # was the clusters' means, $2.19 and $2.03
        assert r.usd_per_hour == pytest.approx(18.0)
        assert r.usd_per_million_output_tokens == pytest.approx(18.0 / (5000 * 3600) * 1e6)  # $1.000
    # serving rows have no proven bound: their answers are neither settled nor unsettled (it read true)
    assert [(a["settled"], a["unsettled_by"]) for a in res.to_json()["answers"].values()] == [(None, None)] * 2


def _point(label: str, per_gpu: float, tpot_ms: float, gpus: int, pools=()) -> FrontPoint:
    return FrontPoint("aggregated", label, per_gpu, 1e3 / tpot_ms, tpot_ms / 1e3, 0.1, gpus, pools)


def test_rented_gpus_of_a_point_on_a_mixed_cluster():
    split = _point("h100 1P1D", 874.0, 44.0, 6, ((0, 6),))
    cross = _point("h100->a100 1P2D", 500.0, 60.0, 10, ((0, 2), (1, 8)))
    cf = ClusterFront("mixed-h100-a100", 96, 2.19, Front((split, cross), (split,)), pool_gpus=(32, 64),
                      pool_prices=(3.0, 1.79))
    assert cf.rented(split) == (5, 32, 96.0)  # 5 copies on the 32 H100, 2 idle; not 16 copies on 96
    assert cf.usd_per_million_of(split) == pytest.approx(96.0 / (5 * 6 * 874.0 * 3600) * 1e6)
    assert cf.tokens_per_s_per_gpu_rented(split) == pytest.approx(5 * 6 * 874.0 / 32)
    copies, rented, usd = cf.rented(cross)
    assert (copies, rented) == (8, 96) and usd == pytest.approx(32 * 3.0 + 64 * 1.79)


def test_sla_cut_is_the_cheapest_on_the_gpus_rented_and_never_dearer_when_looser():
    """On 8 GPUs a 6-GPU 1P1D at 874 tok/s/GPU runs once (2 GPUs idle, $1.57/M); two TP4 replicas at 867
    fill the 8 ($0.961/M). The front (per GPU used) has only the 1P1D at 50 ms: the cut used to take it."""
    split = _point("1P1D", 874.0, 44.4, 6)
    tp4 = _point("TP4 x173", 867.0, 49.9, 4)
    tp2 = _point("TP2 x600", 1000.0, 95.0, 2)
    front = Front((split, tp4, tp2), (split, tp2))
    cf = ClusterFront("dgx-h100", 8, 3.0, front, pool_gpus=(8,), pool_prices=(3.0,))
    assert front.best_at(0.05) is split  # the most per GPU used
    assert cf.cheapest_at(0.05) is tp4
    assert cf.usd_per_million_of(tp4) == pytest.approx(3.0 * 8 / (8 * 867.0 * 3600) * 1e6)
    assert cf.usd_per_million_of(split) == pytest.approx(3.0 * 8 / (6 * 874.0 * 3600) * 1e6)
    assert cf.cheapest_at(0.045) is split and cf.cheapest_at(0.1) is tp2 and cf.cheapest_at(0.02) is None
    got = [cf.usd_per_million_of(p) for _, p in cf.cuts(None) if p is not None]
    assert got == sorted(got, reverse=True)
    unpriced = ClusterFront("x", 8, None, front, pool_gpus=(8,), pool_prices=(None,))
    assert unpriced.cheapest_at(0.05) is tp4 and unpriced.usd_per_million_of(tp4) is None  # per GPU rented


def test_study_front_cuts_match_the_rows_on_16_h100():
    """70B on 16 H100, TPOT <= 50 ms: the cuts read $1.27/M at 50 ms above $1.09/M at 33 ms, and the study's
    own row (4 x TP4 at 49.9 ms) $0.961/M. Now the cuts fall as the SLA loosens and the 50 ms one is the row."""
    res = run_study("llama-3.1-70b", ["dgx-h100"], [16], mode="serve", tpot_ms=50, jobs=1, time_limit_s=60)
    (row,) = res.rows
    assert row.plan == "TP4 PP1 DP4" and row.usd_per_million_output_tokens == pytest.approx(0.961, abs=5e-4)
    job = _serve_job(LLAMA70, None, None, 50.0, None)
    (cf,) = serve_fronts(LLAMA70, {"dgx-h100": load_cluster("dgx-h100")}, [16], job, {"dgx-h100": 3.0})
    cuts = {ms: cf.usd_per_million_of(p) for ms, p in cf.cuts(0.05)}
    assert cuts == pytest.approx({20.0: 2.494, 33.0: 1.090, 50.0: 0.961, 100.0: 0.830}, abs=5e-4)
    assert cuts[50.0] == pytest.approx(row.usd_per_million_output_tokens, rel=1e-9)
    assert cf.rented(cf.cheapest_at(0.05)) == (4, 16, 48.0)


def test_mixed_cluster_front_rents_the_h100_pool_at_its_price():
    job = _serve_job(LLAMA70, None, 5.0, 50.0, None)
    spec = load_cluster("mixed-h100-a100")
    (cf,) = serve_fronts(LLAMA70, {"mixed-h100-a100": spec}, [96], job, {"mixed-h100-a100": 2.19},
                         pool_prices={"mixed-h100-a100": pool_prices(spec)})
    p = cf.cheapest_at(0.05)
    assert p.label == "h100 TP4 PP1 x173" and cf.rented(p) == (8, 32, 96.0)
    assert cf.usd_per_million_of(p) == pytest.approx(0.961, abs=5e-4)  # $0.697 at the $2.19 mean on 96


def test_out_writes_the_serving_fronts_into_study_json(tmp_path):
    args = ["study", "llama-3.1-70b", "--mode", "serve", "--cluster", "dgx-h100", "--gpus", "8", "--tpot-ms", "50",
            "--jobs", "1"]
    out = tmp_path / "s"
    result = CliRunner().invoke(app, [*args, "--json", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)["serve_front"]
    written = json.loads((out / "study.json").read_text())["serve_front"]
    assert written == printed and [c["tpot_ms"] for c in written[0]["sla_cuts"]] == [20.0, 33.0, 50.0, 100.0]
    cut = next(c for c in written[0]["sla_cuts"] if c["tpot_ms"] == 50.0)
    assert cut["best"]["copies"] == 2 and cut["best"]["gpus_rented"] == 8
    assert cut["usd_per_million_output_tokens"] == pytest.approx(0.961, abs=5e-4)
    plain = tmp_path / "t"  # without --json too
    assert CliRunner().invoke(app, [*args, "--out", str(plain)]).exit_code == 0
    assert json.loads((plain / "study.json").read_text())["serve_front"][0]["sla_cuts"] == written[0]["sla_cuts"]


# ----------------------------------------------------------------------------- answers the solver has not settled


def _row(cluster: str, gpus: int, days: float, usd: float, status: str = "optimal", gap: float = 0.0,
         useful_mfu: float | None = 0.4):
    from autoshard.study.costs import TrainRow

    return TrainRow(cluster=cluster, gpu="X", num_gpus=gpus, plan="TP8", degrees={}, status=status, gap=gap, solve_s=1.0,
                    mfu=0.45, tokens_per_s=1.0, days=days, gpu_hours=0.0, price_per_gpu_hour=1.0, total_usd=usd,
                    usd_per_million_tokens=1.0, useful_mfu=useful_mfu)


def test_an_answer_an_unproven_row_could_beat_is_marked_unsettled_naming_it(tmp_path):
    """--time-limit 10 on the README's 405B study: 16,384 H100 at $71.12M stated the cheapest within 90 days
    beside 8,192 B200 at gap 31.3 %, whose bound is 68.7 % of its $77.0M and 78.4 days: $52.9M, 53.9 days."""
    from autoshard.study.costs import StudyResult, _train_answers, days_bound, usd_bound
    from autoshard.study.report import write_markdown

    h100 = _row("dgx-h100", 16384, 60.3, 71.12e6)
    b200 = _row("dgx-b200", 8192, 78.4, 77.0e6, status="feasible", gap=0.313)
    far = _row("dgx-h100", 1024, 1393.0, 102.7e6, status="feasible", gap=1.0, useful_mfu=0.3)  # >= 417.9 days
    assert usd_bound(b200) == pytest.approx(52.9e6, rel=1e-3) and days_bound(b200) == pytest.approx(53.86, abs=0.01)
    assert days_bound(far) == pytest.approx(1393.0 * 0.3)  # no solver bound: every GPU at its peak
    cheap, fast = _train_answers([h100, b200, far], 90.0, 100e6)
    assert cheap.row is h100 and cheap.unsettled_by is b200
    assert cheap.text.endswith("Not settled: 8,192 x X (dgx-b200) is unproven (gap 31.3%) and could take 53.9 days "
                               "and $52.90M; a longer --time-limit settles it.")
    assert fast.row is h100 and fast.unsettled_by is b200  # 53.9 days < 60.3, within $100M
    # proven, or a bound that cannot beat it (past the deadline, or dearer): settled
    settled, _ = _train_answers([h100, _row("dgx-b200", 8192, 78.4, 77.0e6), far], 90.0, 100e6)
    assert settled.unsettled_by is None and "Not settled" not in settled.text
    assert _train_answers([h100, _row("b", 8, 150.0, 60e6, "feasible", 0.2)], 90.0, None)[0].unsettled_by is None
    inputs = {"model": "llama-3.1-405b", "params": 405e9, "clusters": ["dgx-h100", "dgx-b200"], "sizes": [8192, 16384],
              "tokens": 15e12, "job": {"seq_len": 8192, "global_batch_size": 2048, "precision": "bf16"},
              "deadline_days": 90.0, "budget_usd": 100e6}
    res = StudyResult(mode="train", inputs=inputs, rows=[h100, b200], skipped=[], answers=[cheap, fast], pareto=[])
    obj = res.to_json()["answers"]["cheapest_within_deadline"]
    assert obj["settled"] is False and obj["unsettled_by"]["cluster"] == "dgx-b200"
    assert obj["unsettled_by"]["total_usd_bound"] == pytest.approx(52.9e6, rel=1e-3)
    assert res.to_json()["answers"]["fastest_within_budget"]["settled"] is False
    assert "Not settled: 8,192 x X (dgx-b200)" in write_markdown(res, tmp_path / "s.md").read_text()
    # no option within the deadline yet, but an unproven one could be
    none, _ = _train_answers([_row("a", 8, 120.0, 1e6), _row("b", 8, 100.0, 2e6, "feasible", 0.2)], 90.0, None)
    assert none.row is None and none.unsettled_by is not None and none.unsettled_by.cluster == "b"


def test_a_study_the_clock_cut_is_unknown_not_infeasible(monkeypatch):
    """Every size of a study timed out (`study deepseek-v3 ... --gpus 1024,2048 --time-limit 2` on 2 cores): solve's
    SolverError (JSON status "unknown", exit 1), not "no studied size can run" (InfeasibleError). The solves are
    made to time out (or not fit) here, so that the test does not hang on the machine's speed."""
    import autoshard.search.train.solve as train_solve
    from autoshard.errors import InfeasibleError, SolverError

    def timed_out(model, cluster, job, *, options):
        raise SolverError(f"no plan found within the {options.time_limit_s:g} s time limit")

    monkeypatch.setattr(train_solve, "solve_train", timed_out)
    with pytest.raises(SolverError, match=r"no plan of deepseek-v3 was found within the study's 4 s --time-limit "
                                          r"\(4 of 4 size\(s\) timed out; raise --time-limit\)") as exc:
        run_study("deepseek-v3", ["dgx-h100", "dgx-b200"], [1024, 2048], tokens=1e13, time_limit_s=4, jobs=1)
    assert not isinstance(exc.value, InfeasibleError)
    result = CliRunner().invoke(app, ["study", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "1024",
                                      "--tokens", "1e13", "--time-limit", "2", "--jobs", "1", "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["status"] == "unknown"

    def some_fit_nothing(model, cluster, job, *, options):
        if cluster.num_gpus == 1024:
            raise InfeasibleError("needs more memory")
        return timed_out(model, cluster, job, options=options)

    monkeypatch.setattr(train_solve, "solve_train", some_fit_nothing)
    with pytest.raises(SolverError, match=r"\(1 of 2 size\(s\) timed out"):  # unknown while one may still fit
        run_study("deepseek-v3", ["dgx-h100"], [1024, 2048], tokens=1e13, time_limit_s=4, jobs=1)
    with pytest.raises(InfeasibleError, match="no studied size can run"):  # every size fits nothing
        run_study("deepseek-v3", ["dgx-h100"], [1024], tokens=1e13, time_limit_s=4, jobs=1)


def test_a_cluster_priced_twice_is_refused_and_the_price_source_is_the_real_file(tmp_path):
    twice = CliRunner().invoke(app, ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--price",
                                     "dgx-h100=2", "--price", "dgx-h100=5", "--jobs", "1"])
    assert twice.exit_code == 2 and "'dgx-h100' is priced twice ('dgx-h100=5' after 2)" in twice.stderr
    mine = tmp_path / "h" / "x.yaml"  # a user's file whose cluster is named dgx-h100 too
    mine.parent.mkdir()
    mine.write_text(load_cluster_text("dgx-h100"))
    res = run_study("llama-3.1-8b", ["dgx-h100", str(mine)], [8], tokens=1e9, prices={"dgx-h100": 2.0},
                    time_limit_s=20, jobs=1)
    assert res.assumptions[0] == "dgx-h100: H100-SXM5-80GB, $2.00 per GPU-hour (--price override)."
    assert res.assumptions[1] == f"{mine}: H100-SXM5-80GB, $3.00 per GPU-hour ({mine})."  # not clusters/dgx-h100.yaml
    from autoshard.errors import SpecError

    other = tmp_path / "y.yaml"
    other.write_text(mine.read_text())
    with pytest.raises(SpecError, match=r"'dgx-h100' names 2 studied clusters .*: give the --cluster value"):
        run_study("llama-3.1-8b", [str(other), str(mine)], [8], tokens=1e9, prices={"dgx-h100": 2.0},
                  time_limit_s=20, jobs=1)
    # one cluster priced under its --cluster value and its name: refused, not the last one winning ($3.00 won)
    with pytest.raises(SpecError, match=rf"'dgx-h100' prices the cluster '{mine}' a second time"):
        run_study("llama-3.1-8b", [str(mine)], [8], tokens=1e9, prices={str(mine): 3.0, "dgx-h100": 2.0},
                  time_limit_s=20, jobs=1)


def load_cluster_text(name: str) -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parents[2] / "clusters" / f"{name}.yaml").read_text()
