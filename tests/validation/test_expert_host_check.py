"""expert_host_check.py (#10): the numbers behind README's verdict on the per-expert host-launch floor at
published per-op costs, against the gaps the layer-level host floor (README item AC) leaves.

If the cost model's expert GEMM times or the leave-one-source-out residuals move, these fail and the
README paragraph ("Accuracy against published runs", Qwen3 intra-node rows) must be redone."""

from __future__ import annotations

import pytest
from expert_host_check import EXPERT_HOST_OPS, HOST_OP_S, closing_op_s, expert_host_rows, main

TP4 = "moezoo-qwen3-235b-h100-intranode-ep8-tp4-pp8"
PP32 = "moezoo-qwen3-235b-h100-intranode-ep8-pp32-a2a"
GB200 = "moezoo-qwen3-235b-gb200-bf16"
QWEN30 = "mlmrecipe-qwen3-30b-h100-bf16-ep8"


@pytest.fixture(scope="module")
def rows():
    return {r.id: r for r in expert_host_rows()}


def test_the_two_rows_as_the_issue_states_them(rows):
    # 128 experts over EP 8 = 16 local; 4096 tokens / TP x top-8 over 16 experts: 512 and 1,024 rows
    assert (rows[TP4].local_experts, rows[TP4].rows_per_expert) == (16, 512)
    assert (rows[PP32].local_experts, rows[PP32].rows_per_expert) == (16, 1024)
    # measured step / (micro-batches per pipeline x decoder layers per rank): 29.0 s / (256 x 94/8)
    assert rows[TP4].measured_layer_s == pytest.approx(29.0 / (256 * 94 / 8))
    assert rows[PP32].measured_layer_s == pytest.approx(24.2 / (512 * 94 / 32))
    # 3.02 and 2.82 ms until item Z priced the unfused loss they ran (ModelZoo 8017e11): under PP 32 it sits
    # alone on the last stage and set most of that row's gap; 2.74 and 0.61 ms until item AB's refit; 2.69 and
    # 0.53 ms until item AC's host floor (8 ms a layer for 16 local experts) lifted the TP 4 row's 5.8 ms of GPU work;
    # 0.97 and 0.82 ms until item AF's refit raised H100's BF16 level 0.55 -> 0.60 (the GPU's work priced shorter);
    # 1.02 and 1.17 ms until item AG (the fold without ModelZoo's runs now also fits H100 on DGX Cloud Benchmarking
    # v24.11's 88 runs; the PP 32 row, whose last stage holds the loss alone, moved, the TP 4 row did not); 1.02 and
    # 1.45 ms at item AG, back to 1.02 and 1.17 ms since item AH weighed each source by the root of its run count
    assert rows[TP4].gap_s == pytest.approx(1.02e-3, abs=0.05e-3)
    assert rows[PP32].gap_s == pytest.approx(1.17e-3, abs=0.05e-3)


def test_published_host_cost_closes_almost_none_of_the_gap(rows):
    assert sum(EXPERT_HOST_OPS) * HOST_OP_S == pytest.approx(120e-6)
    for rid in (TP4, PP32):
        assert rows[rid].floor_s < 0.05 * rows[rid].gap_s
    # ...and it would move no other held BF16 MoE run by more than 0.05 ms per layer and micro-batch but
    # Qwen3-30B-A3B on 32 H100 (16 local experts of 768 columns), which has no gap left since item AC (0.84 ms
    # before, 0.93 before item AB): predicted 0.14 ms slow a layer (0.17 before item AF; its floor 0.082 ms then)
    assert all(r.floor_s < 0.05e-3 for r in rows.values() if r.id != QWEN30)
    assert rows[QWEN30].floor_s == pytest.approx(0.187e-3, abs=0.005e-3) and rows[QWEN30].gap_s == pytest.approx(-0.14e-3, abs=0.02e-3)


def test_closing_what_is_left_needs_twice_the_published_cost(rows):
    tp4, pp32 = rows[TP4].needed_op_s, rows[PP32].needed_op_s
    # 19.7 and 24.4 us since item AF (19.8 and 22.9 since item AC, 29.4 and 21.1 before it; both > 25 us before item Z)
    assert tp4 > 1.9 * HOST_OP_S and pp32 > 2.2 * HOST_OP_S
    # the same 16 experts issue the same ops in both runs: one host cost fits neither exactly
    assert pp32 / tp4 > 1.1  # tp4 needed 1.39x pp32's before item AC
    assert rows[QWEN30].needed_op_s is None  # predicted slow since item AC: nothing to close
    # the least cost that closes a row predicted > 10 % fast is the TP 4 row's own (10.1 % of its layer left)
    assert rows[TP4].gap_s > 0.1 * rows[TP4].measured_layer_s
    assert closing_op_s(list(rows.values())) == tp4 == pytest.approx(19.8e-6, abs=0.1e-6)


def test_the_closing_cost_breaks_the_gb200_row_with_the_same_eager_experts(rows):
    # Qwen3 on GB200 (BF16): the same 16 local experts on the same eager GroupedLinear path
    # (its CUDA graphs cover attn, moe_router, moe_preprocess only)
    gb200 = rows[GB200]
    assert gb200.local_experts == 16 and gb200.floor_s == 0.0
    cost = closing_op_s(list(rows.values()))
    assert rows[TP4].error_at(cost) == pytest.approx(0.0, abs=1e-6)
    assert rows[QWEN30].error_at(cost) > 0.2  # Qwen3-30B-A3B on H100 goes 22 % slow (30 % before item AC)
    assert rows[PP32].error_at(cost) < 0.0  # the PP 32 row still 3 % fast: one cost fits neither
    assert gb200.error_at(cost) > 0.15  # +20 % slow with it (+41 % before item AF's GB200 refit); +15 % out of source
    assert gb200.gap_s < 0 and gb200.needed_op_s is None  # no gap of its own to close


def test_script_prints_every_row(capsys):
    main()
    out = capsys.readouterr().out
    assert TP4 in out and PP32 in out and "needs us/op" in out
