"""The step budget (--max-num-batched-tokens) of a vLLM engine on DeepEP's low-latency kernels is chosen by
one rule: the planner's rows (`search.serve.space._row`) and an SGLang plan's vLLM figure and lines
(`api_engines.vllm_budget_row`) both keep it with `search.serve.ladder.best_row` over `row_objective`
(first the rows that meet the targets, then the best objective, the smallest budget among equals)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autoshard.api_engines import vllm_budget_row
from autoshard.search.serve.budget import vllm_ll_engine
from autoshard.search.serve.ladder import best_row, row_objective
from autoshard.search.serve.solve import evaluate_serve
from autoshard.search.serve.space import TIE_SCALE, enumerate_serve, tabulate
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob

QWEN = load_model("qwen3-235b-a22b")
H100_64 = load_cluster("dgx-h100").with_gpus(64)


@pytest.mark.parametrize(("job", "tps", "least"), [
    (ServeJob(input_len=4000, output_len=200, ttft_target_s=2.0), (8,), 10),  # prompt-heavy: the budget sets TTFT
    (ServeJob(input_len=2000, output_len=500, request_rate=2.0), (1, 2, 4, 8), 5),  # fewest GPUs, then tokens/s
], ids=["ttft", "rate"])
def test_planner_and_sglang_plan_keep_the_same_vllm_budget(job, tps, least):
    rows, _ = tabulate(QWEN, H100_64, job, enumerate_serve(QWEN, H100_64, job))
    pool = H100_64.pools[0]
    budgets, compared = set(), 0
    for r in rows:
        e = r.engine
        if not (vllm_ll_engine(QWEN, pool.gpu, r.config) and e.tp in tps):  # a quick, varied sample
            continue
        seqs = r.config.max_num_seqs
        plan = evaluate_serve(QWEN, H100_64, job, tp=e.tp, pp=e.pp, dp=e.dp_attention, expert_parallel=True,
                              max_num_seqs=seqs, concurrency=seqs * e.dp_attention, framework="sglang")
        if plan.prediction.concurrency < seqs:  # SGLang's KV cache runs fewer: a different deployment
            continue
        vllm = vllm_budget_row(plan)
        assert vllm is not None
        assert vllm.config.max_num_batched_tokens == r.config.max_num_batched_tokens, (e.label(), seqs)
        assert vllm.objective == r.objective
        budgets.add(r.config.max_num_batched_tokens)
        compared += 1
    assert compared >= least and len(budgets) >= 3  # the choice is not always the same budget


def _row(meets: bool, objective: int, name: str):
    return SimpleNamespace(tpot_us=10 if meets else 10**9, ttft_us=0, objective=objective, name=name)


def test_best_row_targets_first_then_objective_then_the_first_listed():
    tput = ServeJob(input_len=100, output_len=100, tpot_target_s=0.001)
    rows = [None, _row(False, 900, "fast, misses"), _row(True, 500, "256"), _row(True, 700, "512"),
            _row(True, 700, "1024"), None]
    assert best_row(tput, rows).name == "512"  # meets, highest objective, first of the tie
    assert best_row(tput, [rows[1]]).name == "fast, misses"  # none meets: the best that does not
    assert best_row(tput, [None, None]) is None
    rate = tput.model_copy(update={"request_rate": 1.0})  # minimized: fewest GPUs
    assert best_row(rate, rows).name == "256"


def test_row_objective_closed_forms():
    plain = ServeJob(input_len=100, output_len=100)
    assert row_objective(plain, 64, 16, 12_345.6789, TIE_SCALE) == 192_901  # 12,345.68 x 1000 / 64
    rate = plain.model_copy(update={"request_rate": 3.0})
    assert row_objective(rate, 64, 16, 12_345.6789, TIE_SCALE) == 16 * TIE_SCALE - 771
    assert row_objective(rate, 64, 1, 1e13, TIE_SCALE) == TIE_SCALE * 1 - (TIE_SCALE - 1)  # capped below a GPU
