"""The result base shared by training and serving plans (autoshard.plans.base): one status rule, one
solver certificate and one `autoshard.plan/v1` JSON envelope, with the kind-specific blocks inside it."""

from __future__ import annotations

import dataclasses
import json

import pytest

import autoshard.plans as plans
import autoshard.plans.base as plans_base
import autoshard.plans.disagg as plans_disagg
import autoshard.plans.serve as plans_serve
import autoshard.plans.train as plans_train
from autoshard.api import evaluate, train_job
from autoshard.plans import SCHEMA, Plan, PlanBase, ServePlan, SolverStats, SolveStatus
from autoshard.search.serve.solve import evaluate_serve
from autoshard.specs import ServeJob, load_cluster, load_model

LLAMA8 = load_model("llama-3.1-8b")
H100_8 = load_cluster("dgx-h100").with_gpus(8)

ENVELOPE = ["schema", "status", "mode", "model", "cluster", "num_gpus", "plan", "predicted", "launch"]
SOLVER_KEYS = ["status", "wall_s", "objective", "bound", "gap", "conflicts", "branches", "candidates",
               "candidates_in_model", "pruned", "stop_reason", "gap_limit"]


@pytest.fixture(scope="module")
def train_plan() -> Plan:
    return evaluate(LLAMA8, H100_8, train_job(LLAMA8, seq_len=4096, global_batch_size=64), tp=2, pp=2)


@pytest.fixture(scope="module")
def serve_plan() -> ServePlan:
    return evaluate_serve(LLAMA8, H100_8, ServeJob(input_len=1000, output_len=1000), tp=2, dp=4, max_num_seqs=64)


def test_the_schema_tag_is_the_stable_contract():
    assert SCHEMA == "autoshard.plan/v1"  # ARCHITECTURE.md; extended, never renamed


def test_both_kinds_share_the_envelope(train_plan, serve_plan):
    assert isinstance(train_plan, PlanBase) and isinstance(serve_plan, PlanBase)
    t, s = train_plan.to_json(), serve_plan.to_json()
    assert list(t) == ENVELOPE + ["solver"]
    assert list(s) == ENVELOPE + ["warnings", "engine", "solver"]  # engine: which engine the figures are for
    assert t["schema"] == s["schema"] == "autoshard.plan/v1"
    assert (t["mode"], s["mode"]) == ("train", "serve")
    assert (t["num_gpus"], s["num_gpus"]) == (8, 8)
    assert (t["model"], t["cluster"]) == (s["model"], s["cluster"]) == (LLAMA8.name, H100_8.name)
    assert list(t["solver"]) == SOLVER_KEYS
    assert list(s["solver"]) == SOLVER_KEYS + ["objective_unit"]
    assert s["solver"]["objective_unit"] == "output tokens/s per GPU"  # an evaluated serving plan
    json.dumps(t), json.dumps(s)  # plain JSON, no enums or tuples left


@pytest.mark.parametrize(
    ("solver_status", "status", "word"),
    [("OPTIMAL", SolveStatus.OPTIMAL, "optimal"), ("FEASIBLE", SolveStatus.FEASIBLE, "feasible"),
     ("EVALUATED", SolveStatus.EVALUATED, "feasible"), ("UNKNOWN", SolveStatus.FEASIBLE, "feasible")],
)
def test_one_status_rule_for_both_kinds(train_plan, serve_plan, solver_status, status, word):
    for plan in (train_plan, serve_plan):
        p = dataclasses.replace(plan, solver=dataclasses.replace(plan.solver, status=solver_status))
        assert p.status() is status
        assert p.to_json()["status"] == word
        assert p.to_json()["solver"]["status"] == solver_status


def test_a_training_plan_that_does_not_fit_says_infeasible(train_plan):
    pred = train_plan.prediction
    pred = dataclasses.replace(pred, rank_capacity_bytes=tuple(m / 2 for m in pred.rank_memory_bytes))
    assert not pred.fits
    feasible = dataclasses.replace(train_plan, prediction=pred)
    assert feasible.to_json()["status"] == "infeasible"
    proven = dataclasses.replace(feasible, solver=dataclasses.replace(train_plan.solver, status="OPTIMAL"))
    assert proven.to_json()["status"] == "optimal"  # the solver's proof is reported as it is


def test_the_certificate_gap_is_relative_to_the_objective():
    stats = SolverStats(status="FEASIBLE", wall_s=1.5, objective=2.0, bound=1.5, candidates=7, pruned={"memory": 3},
                        stop_reason="time_limit", gap_limit=0.01)
    assert stats.gap == pytest.approx(0.25)
    assert SolverStats(status="OPTIMAL", wall_s=0, objective=40.0, bound=50.0).gap == pytest.approx(0.25)
    block = stats.to_json()
    assert list(block) == SOLVER_KEYS
    assert (block["gap"], block["candidates"], block["pruned"], block["stop_reason"], block["gap_limit"]) == (
        0.25, 7, {"memory": 3}, "time_limit", 0.01)
    assert block["pruned"] is not stats.pruned  # the JSON holds a copy


def test_the_package_re_exports_each_name_from_the_file_that_defines_it():
    for name in ("Plan", "layer_counts", "stage_devices"):
        assert hasattr(plans_train, name)
    for name in ("ServePlan", "model_path"):
        assert hasattr(plans_serve, name)
    assert [name for name in plans.__all__ if not hasattr(plans, name)] == []
    assert plans.SolverStats is plans_base.SolverStats and plans.SolveStatus is plans_base.SolveStatus
    assert plans.SCHEMA == plans_base.SCHEMA == "autoshard.plan/v1"
    assert plans.Plan is plans_train.Plan and plans.ServePlan is plans_serve.ServePlan
    assert plans.Role is plans_disagg.Role and plans.Disaggregation is plans_disagg.Disaggregation
