"""An SGLang-priced plan's vLLM figure and vLLM line (#13): a vLLM 0.33.0 line on DeepEP's low-latency
kernels sizes its buffer at --max-num-batched-tokens, a budget vLLM plans choose (`search.serve.budget`).
The SGLang plan's own budget (8,192 a rank) would ask vLLM for a 32.5 GiB buffer per GPU on Qwen3-235B
and price vLLM at about half the throughput; the comparison is engine against engine only when the
vLLM side runs the budget the vLLM planner picks for the same deployment."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from autoshard import api
from autoshard.api_engines import launched_by
from autoshard.api_serve import with_engine_check
from autoshard.specs import load_cluster, load_model

QWEN = load_model("qwen3-235b-a22b")
H100x8 = load_cluster("dgx-h100").with_gpus(8)


@functools.cache
def _sglang_plan():
    job = api.serve_job_for(QWEN, weight_dtype="fp8")
    return api.plan_serving(QWEN, H100x8, job, top_k=1, pins=None, time_limit_s=30, num_workers=1, seed=0,
                            framework="sglang").plans[0]


@functools.cache
def _vllm_plan_of_same_degrees():
    plan = _sglang_plan()
    return api.solve_serve(QWEN, H100x8, plan.job, top_k=1, pins={"tp": plan.tp, "pp": plan.pp, "dp": plan.dp},
                           time_limit_s=30, num_workers=1, seed=0, disaggregate="off", framework="vllm")[0]


def test_vllm_figure_is_the_vllm_plan_of_the_same_deployment():
    """TP 4 x attention DP 2 x EP 8, 238 requests per rank (SGLang: 9,520 tokens/s): the vLLM row of that
    deployment, at the same 238 requests, runs the budget the vLLM planner keeps for that many, 1,024
    (9,343 tokens/s, TPOT 50.9 ms: just past the 50 ms target, which the vLLM plan pinned to those
    degrees meets at 227 requests, 9,174 tokens/s, on a budget of 512); at the SGLang plan's own 8,192
    budget the buffer would leave room for far fewer requests."""
    sg, vl = _sglang_plan(), _vllm_plan_of_same_degrees()
    assert (sg.tp, sg.pp, sg.dp, sg.ep, sg.max_num_seqs, sg.max_num_batched_tokens) == (4, 1, 2, 8, 238, 8192)
    assert (vl.tp, vl.pp, vl.dp, vl.ep, vl.max_num_seqs, vl.max_num_batched_tokens) == (4, 1, 2, 8, 227, 512)
    assert vl.prediction.tpot_s <= sg.job.tpot_target_s and vl.throughput_tokens_per_s == pytest.approx(9174.3, abs=0.5)
    other = sg.engine_other
    assert other["engine"] == "vllm" and other["max_num_batched_tokens"] == 1024
    assert other["tokens_per_s"] == pytest.approx(9342.7, abs=0.5)
    assert other["tpot_s"] == pytest.approx(0.05095, abs=5e-6) and other["tpot_s"] > sg.job.tpot_target_s
    assert "at --max-num-batched-tokens 1,024)" in other["note"] and "-1.9 % vs SGLang" in other["note"]
    assert sg.to_json()["engine"]["other"]["max_num_batched_tokens"] == 1024
    # the SGLang plan's own figures and budget are SGLang's
    assert sg.prediction.config.engine == "sglang" and sg.throughput_tokens_per_s == pytest.approx(9520.3, abs=0.5)


def test_vllm_line_runs_that_budget_and_reads_back_to_that_figure():
    """The plan's vLLM line passes --max-num-batched-tokens 1024, and `evaluate --from-vllm` of that line
    at the plan's running requests predicts the figure the plan states for vLLM."""
    sg = _sglang_plan()
    line = sg.launch["vllm"]
    assert "--all2all-backend deepep_low_latency" in line and "--max-num-batched-tokens 1024 " in line
    assert "--max-num-seqs 238 " in line
    back = api.evaluate_vllm(QWEN, H100x8, line, job=sg.job, concurrency=sg.prediction.concurrency * sg.dp)
    assert back.max_num_batched_tokens == 1024 and back.prediction.concurrency == 238
    assert back.throughput_tokens_per_s == pytest.approx(sg.engine_other["tokens_per_s"], rel=1e-9)
    # the script and manifests written for vLLM run the same line; SGLang's keep SGLang's own settings
    assert "--max-num-batched-tokens 1024 " in api.serve_launch_script(sg, "vllm")
    assert "--max-num-batched-tokens" not in api.serve_launch_script(sg, "sglang")
    assert launched_by(sg, "sglang") is sg
    assert launched_by(sg, "vllm").max_num_batched_tokens == 1024


def test_vllm_plans_and_other_engines_keep_their_own_budget():
    """A vLLM plan already runs the budget it chose: its SGLang figure adds no budget and its lines are
    its own; an SGLang plan whose vLLM line is not on DeepEP's low-latency kernels (no expert
    parallelism) keeps the plan's budget for vLLM."""
    vl = _vllm_plan_of_same_degrees()
    checked = with_engine_check(vl)
    assert "max_num_batched_tokens" not in checked.engine_other and launched_by(checked, "vllm") is checked
    sg = _sglang_plan()
    tp8 = api.evaluate_serve(QWEN, H100x8, sg.job, tp=8, pp=1, dp=1, max_num_seqs=64, framework="sglang")
    tp8 = with_engine_check(tp8)
    assert "max_num_batched_tokens" not in tp8.engine_other
    assert f"--max-num-batched-tokens {tp8.max_num_batched_tokens} " in tp8.launch["vllm"]


def test_engine_check_does_not_change_the_sglang_plan():
    """Everything but the other engine's block and the vLLM lines is the plan as solved."""
    sg = _sglang_plan()
    again = with_engine_check(dataclasses.replace(sg, engine_other=None))
    assert again.engine_other == sg.engine_other and again.launch == sg.launch
    assert again.launch["sglang"] == api.with_serve_launch(sg).launch["sglang"]


def test_split_sglang_plan_vllm_decode_instances_take_their_own_budget():
    """DeepSeek-V3 FP8 on 32 H100 split for SGLang (decode: TP 2 x attention DP 8 x EP 16, 115 requests
    per rank with one MTP draft; SGLang's budget 8,192): vLLM's decode line at 8,192 would hold a 115 GiB
    DeepEP buffer per GPU ("would not start"); a vLLM decode instance takes the smallest budget its
    decode tokens allow, 230 -> 256, so its line passes that and the vLLM figures exist."""
    from autoshard.costmodel.serve.ep_buffers import vllm_deepep_ll_budget
    from autoshard.emit.pd import pd_commands
    from autoshard.specs.job import ServeJob, WeightDtype

    dsv3, h100x32 = load_model("deepseek-v3"), load_cluster("dgx-h100").with_gpus(32)
    plan = api.solve_serve(dsv3, h100x32, ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8),
                           pins=None, top_k=1, time_limit_s=20, num_workers=1, disaggregate="on",
                           framework="sglang")[0]
    decode = plan.role("decode")
    cfg = decode.prediction.config
    assert cfg.engine == "sglang" and cfg.max_num_batched_tokens == 8192 and decode.ep == 16
    budget = vllm_deepep_ll_budget(cfg.max_num_seqs, cfg.speculative_tokens)
    assert budget == 256 and cfg.max_num_seqs * (1 + cfg.speculative_tokens) <= budget
    checked = with_engine_check(plan)
    other = checked.engine_other
    assert "would not start" not in other["note"] and other["decode_tpot_s"] > 0
    lines = [line for _, what, line in pd_commands(plan, "vllm") if what.startswith("decode")]
    assert lines and all("--all2all-backend deepep_low_latency" in x and "--max-num-batched-tokens 256 " in x
                         and f"--max-num-seqs {cfg.max_num_seqs} " in x for x in lines)
    prefill = [line for _, what, line in pd_commands(plan, "vllm") if what.startswith("prefill")]
    assert prefill and all("--max-num-batched-tokens 8192 " in x for x in prefill)  # HT buffer: no budget tie
    assert not any("--max-num-batched-tokens" in line for _, _, line in pd_commands(plan, "sglang"))
