"""The serving Pareto front: no evaluated deployment beats it, it is strictly monotone, the SLA cut
is the brute-force best under the TPOT, it agrees with the CP-SAT plan, and the PNG is written."""

from __future__ import annotations

import pytest

from autoshard.report.pareto import front_json, sla_cuts, write_front_png
from autoshard.search.serve.solve import solve_serve
from autoshard.search.serve.front import serve_front
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob

LLAMA70 = load_model("llama-3.1-70b")
H100_16 = load_cluster("dgx-h100").with_gpus(16)
JOB = ServeJob(input_len=1000, output_len=1000)


@pytest.fixture(scope="module")
def front():
    return serve_front(LLAMA70, H100_16, JOB)


def test_front_dominates_every_point(front):
    assert {p.kind for p in front.front} <= {"aggregated", "disaggregated"}
    assert {p.kind for p in front.points} == {"aggregated", "disaggregated"}
    for p in front.points:
        assert any(
            f.tokens_per_s_per_user >= p.tokens_per_s_per_user * (1 - 1e-12)
            and f.tokens_per_s_per_gpu >= p.tokens_per_s_per_gpu * (1 - 1e-12)
            for f in front.front
        ), p
    users = [p.tokens_per_s_per_user for p in front.front]
    gpus = [p.tokens_per_s_per_gpu for p in front.front]
    assert users == sorted(users, reverse=True)
    assert all(b > a for a, b in zip(gpus, gpus[1:], strict=False))
    for p in front.points:
        assert p.tokens_per_s_per_user == pytest.approx(1 / p.tpot_s)


@pytest.mark.parametrize("tpot_ms", [20.0, 33.0, 50.0, 100.0, 37.5])
def test_sla_cut_is_the_brute_force_best(front, tpot_ms):
    best = front.best_at(tpot_ms / 1e3)
    ok = [p for p in front.points if p.tpot_s <= tpot_ms / 1e3]
    if not ok:
        assert best is None
        return
    assert best.tokens_per_s_per_gpu == max(p.tokens_per_s_per_gpu for p in ok)
    cuts = dict(sla_cuts(front, tpot_ms / 1e3))
    assert cuts[tpot_ms] is best


def test_front_matches_the_aggregated_solver():
    job = JOB.model_copy(update={"tpot_target_s": 0.05})
    plan = solve_serve(
        LLAMA70, H100_16, job, pins=None, top_k=1, time_limit_s=10, num_workers=1, disaggregate="off"
    )[0]
    agg = serve_front(LLAMA70, H100_16, job, disaggregate="off")
    assert {p.kind for p in agg.points} == {"aggregated"}
    # the plan's engine fills the 16 GPUs with replicas, so per GPU it is the front's cut
    assert plan.num_gpus == 16
    assert agg.best_at(0.05).tokens_per_s_per_gpu == pytest.approx(plan.tokens_per_s_per_gpu, rel=1e-9)


def test_ttft_target_filters_points(front):
    tight = JOB.model_copy(update={"ttft_target_s": 0.3})
    cut = serve_front(LLAMA70, H100_16, tight)
    assert cut.points and all(p.ttft_s <= 0.3 for p in cut.points)
    # the target binds: without it some deployments run past 0.3 s, and meeting it costs throughput
    # (points are dropped or run at a lower load)
    assert any(p.ttft_s > 0.3 for p in front.points)
    assert sum(p.tokens_per_s_per_gpu for p in cut.points) < sum(p.tokens_per_s_per_gpu for p in front.points)


def test_png_and_json(front, tmp_path):
    path = write_front_png({"dgx-h100": front}, tmp_path / "f" / "pareto.png", title="t", tpot_target_s=0.05)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    obj = front_json(front, 0.05)
    assert len(obj["front"]) == len(front.front) and obj["points_evaluated"] == len(front.points)
    assert [c["tpot_ms"] for c in obj["sla_cuts"]] == [20.0, 33.0, 50.0, 100.0]


def test_split_points_at_the_target_reach_the_solvers_split():
    """The front's decode instances are searched between the ladder's rungs at the job's TPOT target too:
    Llama-3.1-70B on 32 H100 at 30 ms, the best split point ran its decode instances at 96 requests, 668
    tokens/s per GPU, while the solver's split reached 727 per cluster GPU (the front counts the GPUs a
    deployment runs on, so it is never below)."""
    cluster = load_cluster("dgx-h100").with_gpus(32)
    job = JOB.model_copy(update={"tpot_target_s": 0.03})
    plan = solve_serve(LLAMA70, cluster, job, pins=None, top_k=1, time_limit_s=30, num_workers=1,
                       disaggregate="on")[0]
    best = serve_front(LLAMA70, cluster, job, disaggregate="on").best_at(0.03)
    assert best.kind == "disaggregated" and best.tpot_s <= 0.03
    assert best.tokens_per_s_per_gpu >= plan.throughput_tokens_per_s / cluster.num_gpus * (1 - 1e-9) > 700
