"""Serving search: vLLM rules with reasons, CP-SAT choice against brute force, determinism, top-k,
targets, request-rate mode, infeasibility messages and the plan's JSON."""

from __future__ import annotations

import json
import re
import time

import pytest

from autoshard.errors import InfeasibleError, SpecError
from autoshard.plans.base import SCHEMA
from autoshard.api import evaluate_serve, evaluate_vllm, solve_serve
from autoshard.search.serve.solve import model_for_path
from autoshard.search.serve.space import TIE_SCALE, enumerate_serve, tabulate
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.units import time_to_us

LLAMA8 = load_model("llama-3.1-8b")
LLAMA70 = load_model("llama-3.1-70b")
LLAMA405 = load_model("llama-3.1-405b")
MIXTRAL = load_model("mixtral-8x7b")
QWEN_MOE = load_model("qwen3-30b-a3b")
H100_8 = load_cluster("dgx-h100").with_gpus(8)
H100_16 = load_cluster("dgx-h100").with_gpus(16)
JOB = ServeJob(input_len=1000, output_len=1000)


def solve(model, cluster, job=JOB, *, pins=None, top_k=1):
    return solve_serve(model, cluster, job, pins=pins, top_k=top_k, time_limit_s=10, num_workers=1, seed=0)


def brute_force(model, cluster, job, pins=None):
    space = enumerate_serve(model, cluster, job, pins=pins)
    rows, _ = tabulate(model, cluster, job, space, pins=pins)
    ok = [
        r
        for r in rows
        if (job.tpot_target_s is None or r.tpot_us <= time_to_us(job.tpot_target_s))
        and (job.ttft_target_s is None or r.ttft_us <= time_to_us(job.ttft_target_s))
    ]
    if job.request_rate is None:
        return max(r.objective for r in ok), ok
    return min(r.objective for r in ok), ok


# --------------------------------------------------------------------------- the candidate space


def test_every_pruned_candidate_has_a_reason():
    space = enumerate_serve(LLAMA70, H100_8, JOB)
    assert space.engines and space.pruned
    assert space.enumerated == len(space.engines) + len(space.pruned)
    reasons = " | ".join(r for _, r in space.pruned)
    assert "TP 16 would leave the 8-GPU NVLink domain" in reasons
    assert "GiB per GPU" in reasons  # TP1 cannot hold 70B in BF16
    assert all(reason for _, reason in space.pruned)


def test_vllm_rules_hold_for_every_engine():
    for model in (LLAMA70, MIXTRAL, QWEN_MOE):
        space = enumerate_serve(model, H100_16, JOB)
        for e in space.engines:
            assert model.num_attention_heads % e.tp == 0
            assert model.kv_heads % e.tp == 0 or e.tp % model.kv_heads == 0
            assert e.tp <= 8  # TP inside one node
            assert e.gpus <= 16 and (e.gpus <= 8 and 8 % e.gpus == 0 or e.gpus % 8 == 0)
            if e.expert_parallel:
                assert model.is_moe and model.moe.num_experts % e.ep == 0


def test_heads_rule_prunes_tp_that_does_not_divide():
    data = load_model("llama-2-7b").model_dump()
    data.update(hidden_size=2560, num_attention_heads=20, num_kv_heads=20)
    model = type(LLAMA8).model_validate(data)
    space = enumerate_serve(model, H100_8, JOB)
    assert "TP 8 does not divide the 20 attention heads" in {r for _, r in space.pruned}
    assert {e.tp for e in space.engines} == {1, 2, 4}


def test_kv_heads_rule():
    data = LLAMA8.model_dump()
    data.update(num_kv_heads=4)
    model = type(LLAMA8).model_validate(data)
    space = enumerate_serve(model, H100_8, JOB)
    assert {e.tp for e in space.engines} == {1, 2, 4, 8}  # 8 % 4 == 0: heads replicate, allowed
    data.update(num_attention_heads=48, num_kv_heads=6, hidden_size=6144)
    model = type(LLAMA8).model_validate(data)
    reasons = {r for _, r in enumerate_serve(model, H100_8, JOB).pruned}
    assert "TP 4 and the 6 KV heads must divide one another" in reasons


def test_expert_parallelism_only_for_moe():
    assert not any(e.expert_parallel for e in enumerate_serve(LLAMA70, H100_8, JOB).engines)
    moe = enumerate_serve(MIXTRAL, H100_8, JOB).engines
    assert any(e.expert_parallel for e in moe)
    assert all(8 % e.ep == 0 for e in moe if e.expert_parallel)


def test_pins_are_honoured_and_reasoned():
    plan = solve(LLAMA70, H100_8, pins={"tp": 4, "pp": 1})[0]
    assert (plan.tp, plan.pp) == (4, 1)
    space = enumerate_serve(LLAMA70, H100_8, JOB, pins={"tp": 4})
    assert any(r == "pinned tp=4" for _, r in space.pruned)
    with pytest.raises(SpecError, match="cannot pin"):
        enumerate_serve(LLAMA70, H100_8, JOB, pins={"vpp": 2})
    with pytest.raises(InfeasibleError):
        solve(LLAMA70, H100_8, pins={"tp": 1, "pp": 1})


# --------------------------------------------------------------------------- the solver


@pytest.mark.parametrize(
    ("model", "job"),
    [
        (LLAMA70, JOB),
        (LLAMA70, ServeJob(input_len=1000, output_len=1000, tpot_target_s=0.03)),
        (LLAMA8, ServeJob(input_len=2000, output_len=200, ttft_target_s=0.2, tpot_target_s=0.02)),
        (MIXTRAL, ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8)),
        (LLAMA8, ServeJob(input_len=1000, output_len=1000, request_rate=20)),
    ],
)
def test_cp_sat_choice_matches_brute_force(model, job):
    best, ok = brute_force(model, H100_8, job)
    plan = solve(model, H100_8, job)[0]
    assert plan.solver.status == "OPTIMAL"
    assert plan.solver.gap == pytest.approx(0.0, abs=1e-9)
    chosen = [
        r
        for r in ok
        if r.engine.tp == plan.tp
        and r.engine.pp == plan.pp
        and r.engine.ep == plan.ep
        and r.config.max_num_seqs == plan.max_num_seqs
    ]
    assert chosen and chosen[0].objective == best
    assert plan.meets_targets()
    if job.request_rate is None:
        assert plan.solver.objective == pytest.approx(best / 1000)
    else:
        assert plan.solver.objective == -(-best // TIE_SCALE)


def test_deterministic():
    a = [p.to_json() for p in solve(MIXTRAL, H100_8, top_k=3)]
    b = [p.to_json() for p in solve(MIXTRAL, H100_8, top_k=3)]
    for x, y in zip(a, b, strict=True):
        x["solver"].pop("wall_s"), y["solver"].pop("wall_s")
    assert a == b


def test_top_k_plans_are_distinct_and_ordered():
    plans = solve(LLAMA70, H100_8, top_k=4)
    assert len(plans) == 4
    degrees = {(p.tp, p.pp, p.dp, p.ep) for p in plans}
    assert len(degrees) == 4
    objectives = [p.solver.objective for p in plans]
    assert objectives == sorted(objectives, reverse=True)


def test_tpot_target_trades_throughput_for_latency():
    free = solve(LLAMA70, H100_8)[0]
    tight = solve(LLAMA70, H100_8, ServeJob(input_len=1000, output_len=1000, tpot_target_s=0.025))[0]
    assert tight.prediction.tpot_s <= 0.025 < free.prediction.tpot_s
    assert tight.throughput_tokens_per_s < free.throughput_tokens_per_s


def test_request_rate_minimises_gpus():
    cluster = load_cluster("dgx-h100").with_gpus(64)
    low = solve(LLAMA8, cluster, ServeJob(input_len=1000, output_len=1000, request_rate=1))[0]
    high = solve(LLAMA8, cluster, ServeJob(input_len=1000, output_len=1000, request_rate=100))[0]
    assert low.num_gpus == 1
    assert high.num_gpus > low.num_gpus
    assert high.throughput_tokens_per_s / 1000 >= 100
    smaller = [r for r in brute_force(LLAMA8, cluster, high.job)[1] if r.gpus < high.num_gpus]
    assert not smaller  # nothing with fewer GPUs sustains the rate


def test_solves_fast():
    start = time.perf_counter()
    solve(
        load_model("deepseek-v3"),
        load_cluster("dgx-h200").with_gpus(16),
        ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8),
        top_k=2,
    )
    assert time.perf_counter() - start < 5


def test_expert_parallel_plan_uses_vllm_ep_semantics():
    plan = solve(MIXTRAL, H100_8, pins={"ep": 8})[0]
    assert plan.expert_parallel and plan.ep == plan.tp * plan.dp == 8
    assert "--enable-expert-parallel" in plan.launch["vllm"]
    assert f"--ep-size {plan.ep}" in plan.launch["sglang"]


# --------------------------------------------------------------------------- infeasible


def test_weights_that_do_not_fit_say_needs_and_has_and_the_fix():
    with pytest.raises(InfeasibleError) as err:
        solve(LLAMA405, H100_8)
    msg = str(err.value)
    assert "weights alone need 756 GiB at bf16; this node has 637 GiB" in msg
    assert "quantize the weights to fp8" in msg and "--gpus 16" in msg


def test_long_context_suggests_a_shorter_max_model_len():
    with pytest.raises(InfeasibleError, match=r"shorten max_model_len to at most \d+ tokens"):
        solve(LLAMA70, load_cluster("dgx-h100").with_gpus(2), ServeJob(max_model_len=131072))


def test_unreachable_targets_name_the_best_reachable():
    with pytest.raises(InfeasibleError, match=r"no plan meets TPOT <= 1 ms \(the fastest plan, .* reaches"):
        solve(LLAMA8, H100_8, ServeJob(tpot_target_s=0.001))
    with pytest.raises(InfeasibleError, match="TTFT <= 1 ms"):
        solve(LLAMA8, H100_8, ServeJob(ttft_target_s=0.001))


def test_unreachable_rate_says_how_many_gpus():
    with pytest.raises(InfeasibleError, match=r"needs about \d+ GPUs .* has 8"):
        solve(LLAMA70, H100_8, ServeJob(request_rate=1000))


def test_context_beyond_the_model_is_a_spec_error():
    with pytest.raises(SpecError, match="max_position_embeddings"):
        solve(load_model("llama-2-7b"), H100_8, ServeJob(max_model_len=8192))


# --------------------------------------------------------------------------- plan and JSON


def test_plan_json_schema():
    plan = solve(LLAMA70, H100_8)[0]
    doc = json.loads(json.dumps(plan.to_json()))
    assert doc["schema"] == SCHEMA and doc["mode"] == "serve" and doc["status"] == "optimal"
    assert doc["num_gpus"] == plan.tp * plan.pp * plan.dp <= 8
    p = doc["plan"]
    for key in (
        "tp",
        "pp",
        "dp",
        "cp",
        "ep",
        "etp",
        "vpp",
        "micro_batch_size",
        "global_batch_size",
        "num_microbatches",
        "sequence_parallel",
        "recompute",
        "zero_stage",
        "stages",
    ):
        assert key in p
    assert p["cp"] == 1 and p["vpp"] == 1 and p["recompute"] == "none"
    names = [n for s in p["stages"] for n in s["layers"]]
    assert names == list(LLAMA70.layer_names)
    pred = doc["predicted"]
    for key in (
        "step_time_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "tflops_per_gpu",
        "hw_tflops_per_gpu",
        "mfu",
        "time_breakdown_s",
        "memory_gib",
    ):
        assert key in pred
    serve = pred["serve"]
    for key in (
        "throughput_tokens_per_s",
        "ttft_s",
        "tpot_s",
        "max_concurrency",
        "kv_cache_gib",
        "max_model_len",
    ):
        assert key in serve
    assert serve["max_model_len"] == 2000
    assert serve["throughput_tokens_per_s"] == pytest.approx(pred["tokens_per_s"])
    assert 0 < pred["mfu"] < 1
    assert set(doc["launch"]) == {"vllm", "sglang"}
    assert set(doc["solver"]) >= {"status", "wall_s", "objective", "bound", "gap"}


def test_evaluate_a_given_plan_and_a_vllm_command():
    plan = evaluate_serve(LLAMA70, H100_8, JOB, tp=4, dp=2, max_num_seqs=128)
    assert plan.solver.status == "EVALUATED" and plan.to_json()["status"] == "feasible"
    assert (plan.tp, plan.pp, plan.dp, plan.num_gpus) == (4, 1, 2, 8)
    assert plan.prediction.concurrency == 128
    again = evaluate_vllm(LLAMA70, H100_8, plan.launch["vllm"], job=JOB)
    assert (again.tp, again.pp, again.dp, again.max_num_seqs) == (4, 1, 2, 128)
    assert again.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s)
    fp8 = evaluate_vllm(
        LLAMA70,
        H100_8,
        "vllm serve x -tp 8 --quantization fp8 --kv-cache-dtype fp8 --max-model-len 4096 --swap-space 4",
        job=JOB,
    )
    assert fp8.job.weight_dtype is WeightDtype.FP8 and fp8.job.max_model_len == 4096
    assert any("--swap-space" in w for w in fp8.warnings)


def test_evaluate_rejects_illegal_and_oversized_plans():
    with pytest.raises(SpecError, match="does not divide"):
        evaluate_serve(LLAMA70, H100_8, JOB, tp=3)
    with pytest.raises(InfeasibleError, match="needs 16 GPUs"):
        evaluate_serve(LLAMA70, H100_8, JOB, tp=8, dp=2)
    with pytest.raises(InfeasibleError, match="GiB per GPU"):
        evaluate_serve(LLAMA70, H100_8, JOB, tp=1)


def test_model_is_read_from_the_command_when_not_given():
    assert model_for_path("meta-llama/Llama-3.1-70B-Instruct").name == "llama-3.1-70b"
    assert model_for_path("mistralai/Mixtral-8x7B-Instruct-v0.1").name == "mixtral-8x7b"
    assert model_for_path("meta-llama/Llama-2-7b-chat-hf").name == "llama-2-7b"
    plan = evaluate_vllm(None, H100_8, "vllm serve meta-llama/Llama-3.1-8B-Instruct -tp 2", job=JOB)
    assert plan.model.name == "llama-3.1-8b" and plan.tp == 2
    with pytest.raises(SpecError, match="cannot tell which model"):
        evaluate_vllm(None, H100_8, "vllm serve foo/bar", job=JOB)


def test_unreachable_rate_counts_whole_engines():
    """A pinned TP2 PP3 engine (6 GPUs) sustains just under 6 requests/s: one engine is not enough and
    two need 12 GPUs (two 8-GPU nodes), not the 7 that the best rate per GPU alone suggests (the 8 GPUs
    the node has would then look sufficient)."""
    with pytest.raises(InfeasibleError) as err:
        solve(LLAMA70, H100_8, ServeJob(input_len=1000, output_len=1000, request_rate=6),
              pins={"tp": 2, "pp": 3})
    msg = str(err.value)
    assert "needs about 16 GPUs" in msg and "has 8" in msg and "at least 16 GPUs" in msg


def test_unreachable_rate_by_default_says_how_many_gpus():
    """With --disaggregate auto (the CLI default) a rate nothing sustains says how many GPUs it needs, not
    only that no prefill/decode split meets it (and not to pass the `auto` already in effect)."""
    with pytest.raises(InfeasibleError) as err:
        solve_serve(LLAMA70, H100_8, ServeJob(request_rate=1000), pins=None, top_k=1, time_limit_s=10,
                    num_workers=1, disaggregate="auto")
    msg = str(err.value)
    assert re.search(r"needs about \d+ GPUs .* has 8", msg) and "--disaggregate auto" not in msg
