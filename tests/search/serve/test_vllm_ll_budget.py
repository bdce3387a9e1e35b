"""vLLM 0.33.0 engines on `--all2all-backend deepep_low_latency`: plan, price and line are one.

vLLM 0.33.0 sizes DeepEP's low-latency buffer at the engine's --max-num-batched-tokens per rank
(fused_moe/layer.py:286,373 -> all2all_utils.py:260 -> all2all.py:327-352) and runs a step's MoE in one
pass. The planner chooses that budget (`search.serve.budget`); these tests check that every row of the
solver's table is exactly the cost model at the row's budget, that the budget carries the row's
steady-state step, and that every vLLM DeepEP low-latency line autoshard emits passes the budget whose
buffer the plan's memory holds."""

from __future__ import annotations

import shlex

import pytest

from autoshard.costmodel.serve.ep_buffers import (
    VLLM_DEEPEP_NVL_BYTES, deepep_ll_buffer_bytes, uses_deepep_low_latency, vllm_deepep_ll_budget,
)
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.predict import kv_limited_concurrency, predict_serve
from autoshard.emit.pd import pd_commands
from autoshard.emit.vllm import vllm_node_commands
from autoshard.search.serve.budget import LL_BUDGETS, ll_budget_choices, steady_step_tokens
from autoshard.search.serve.solve import solve_serve
from autoshard.search.serve.space import Engine, _config, enumerate_serve, tabulate
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

QWEN = load_model("qwen3-235b-a22b")
DSV3 = load_model("deepseek-v3")
H100 = load_cluster("dgx-h100")
FP8 = WeightDtype.FP8


def _flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


@pytest.mark.parametrize(("model", "gpus"), [(QWEN, 8), (DSV3, 16)])
def test_table_rows_are_the_cost_model_at_their_budget(model, gpus):
    cluster = H100.with_gpus(gpus)
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=FP8)
    rows, _ = tabulate(model, cluster, job, enumerate_serve(model, cluster, job))
    pool = cluster.pools[0]
    ll = 0
    for row in rows:
        cfg = row.config
        if not uses_deepep_low_latency(model, pool.gpu, cfg):
            continue
        ll += 1
        budget = cfg.max_num_batched_tokens
        assert budget in LL_BUDGETS or budget > LL_BUDGETS[-1]
        assert budget >= steady_step_tokens(cfg, job) and budget >= cfg.max_num_seqs
        mem = serve_memory(model, pool, cfg, context_len=job.context_len)
        assert mem == row.prediction.memory
        assert mem.ep_buffer_bytes == deepep_ll_buffer_bytes(model, budget, cfg.ep) + VLLM_DEEPEP_NVL_BYTES
        assert mem.problem() is None and kv_limited_concurrency(mem, job) >= cfg.max_num_seqs
        pred = predict_serve(model, pool, job, cfg, concurrency=cfg.max_num_seqs)
        assert pred.throughput_tokens_per_s == row.prediction.throughput_tokens_per_s
        assert pred.ttft_s == row.prediction.ttft_s and pred.tpot_s == row.prediction.tpot_s
        # the row's budget is one the ladder offers for its batch, and no other offered budget beats it
        smallest = _config(model, pool, job, row.engine, max_num_seqs=cfg.max_num_seqs)
        offered = ll_budget_choices(model, pool.gpu, smallest)
        assert budget in {c.max_num_batched_tokens for c in offered}
        for other in offered:
            mem = serve_memory(model, pool, other, context_len=job.context_len)
            if mem.problem() is None and kv_limited_concurrency(mem, job) >= cfg.max_num_seqs:
                alt = predict_serve(model, pool, job, other, concurrency=cfg.max_num_seqs)
                assert alt.throughput_tokens_per_s <= pred.throughput_tokens_per_s * (1 + 1e-6)
    assert ll > 0


def test_smallest_aggregated_budget_carries_the_steady_step():
    """Decode tokens plus the prompt tokens per step at <= 80 % of their room: 96 requests per rank at
    1000/1000, 96 + 120 -> 256; 200, 200 + 250 -> 512; 300, 300 + 375 -> 1024; 1024 at 2000/500,
    1024 + 5120 -> 8192."""
    pool = H100.with_gpus(8).pools[0]
    for (inp, out), seqs, budget in ((((1000, 1000)), 96, 256), ((1000, 1000), 200, 512), ((1000, 1000), 300, 1024),
                                     ((2000, 500), 1024, 8192)):
        job = ServeJob(input_len=inp, output_len=out, weight_dtype=FP8)
        cfg = _config(QWEN, pool, job, Engine(0, 2, 1, 4, True), max_num_seqs=seqs)
        assert cfg.max_num_batched_tokens == budget
        assert [c.max_num_batched_tokens for c in ll_budget_choices(QWEN, pool.gpu, cfg)] == [
            b for b in LL_BUDGETS if b >= budget]
    # a decode instance carries no prompt tokens: its decode tokens rounded up to 256
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=FP8)
    dec = _config(QWEN, pool, job, Engine(0, 2, 1, 4, True), max_num_seqs=300, split=True, role="decode")
    assert dec.max_num_batched_tokens == vllm_deepep_ll_budget(300) == 512
    assert ll_budget_choices(QWEN, pool.gpu, dec) == [dec]


def _check_ll_line(line: str, plan_budget: int, seqs: int, drafts: int) -> bool:
    words = shlex.split(line)
    if "--all2all-backend" not in words or _flag(words, "--all2all-backend") != "deepep_low_latency":
        return False
    assert int(_flag(words, "--max-num-batched-tokens")) == plan_budget
    assert int(_flag(words, "--max-num-seqs")) == seqs and seqs * (1 + drafts) <= plan_budget
    return True


@pytest.mark.parametrize(("model", "gpus", "disaggregate"),
                         [(QWEN, 8, "off"), (DSV3, 16, "off"), (DSV3, 96, "on")])
def test_every_emitted_deepep_ll_line_fits_the_plans_memory(model, gpus, disaggregate):
    cluster = H100.with_gpus(gpus)
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=FP8)
    plans = solve_serve(model, cluster, job, pins=None, top_k=2, time_limit_s=20, num_workers=2,
                        disaggregate=disaggregate)
    seen = 0
    for plan in plans:
        if plan.disaggregated:
            for _, what, line in pd_commands(plan, "vllm"):
                if what.startswith("decode"):
                    role = plan.role("decode")
                    cfg, mem = role.prediction.config, role.prediction.memory
                    seen += _check_ll_line(line, cfg.max_num_batched_tokens, role.max_num_seqs, role.speculative_tokens)
                    assert mem.ep_buffer_bytes == deepep_ll_buffer_bytes(
                        model, cfg.max_num_batched_tokens, role.ep) + VLLM_DEEPEP_NVL_BYTES
                    assert mem.problem() is None and mem.kv_cache_tokens >= role.prediction.concurrency * job.context_len
            continue
        cfg, mem = plan.prediction.config, plan.prediction.memory
        for line in vllm_node_commands(plan):
            if _check_ll_line(line, cfg.max_num_batched_tokens, plan.max_num_seqs, cfg.speculative_tokens):
                seen += 1
                assert mem.ep_buffer_bytes == deepep_ll_buffer_bytes(
                    model, cfg.max_num_batched_tokens, plan.ep) + VLLM_DEEPEP_NVL_BYTES
                assert mem.problem() is None
                assert mem.kv_cache_tokens >= plan.prediction.concurrency * job.context_len
    assert seen > 0
