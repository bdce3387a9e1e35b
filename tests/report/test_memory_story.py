"""Issue #14: the memory story. The four tenants with bytes per parameter against the closed forms
(Megatron: 2 + 4 + 12 = 18 bytes/param; 6 + 12/DP with the distributed optimizer; 2 + 16/DP with
ZeRO-2; 18/DP with ZeRO-3), then reserve and fragmentation, peak and headroom."""

from __future__ import annotations

import pytest

from autoshard.costmodel.train.memory import layer_param_shards
from autoshard.parallel import Recompute
from autoshard.report.memory import memory_rows, memory_table, nominal_bytes_per_param
from autoshard.specs.model import LayerKind
from autoshard.units import GIB
from report_fixtures import plan_70b, plan_7b_one_gpu, render, assert_fits, make_plan  # noqa: F401  (pytest fixtures)


def _rows(plan):
    return {r.name: r for r in memory_rows(plan)}


def test_single_gpu_llama_2_7b_is_18_bytes_per_param(plan_7b_one_gpu, render, assert_fits):
    plan = plan_7b_one_gpu
    rows = _rows(plan)
    n = plan.model.num_params
    assert rows["weights"].per_param == pytest.approx(2.0)
    assert rows["gradients"].per_param == pytest.approx(4.0)
    assert rows["optimizer state"].per_param == pytest.approx(12.0)
    assert rows["model states"].per_param == pytest.approx(18.0)
    assert rows["weights"].bytes == pytest.approx(2 * n)  # the whole model on one GPU
    assert rows["model states"].bytes == pytest.approx(18 * n)
    assert "2 + 4 + 12 = 18" in rows["model states"].formula

    # reserve, fragmentation, peak and headroom add up, with the GPU's efficiency figures
    eff = plan.cluster.pools[0].gpu.efficiency
    allocated = rows["allocated"].bytes
    assert allocated == pytest.approx(sum(rows[k].bytes for k in ("weights", "gradients", "optimizer state",
                                                                   "activations")))
    assert rows["reserve"].bytes == pytest.approx(eff.reserved_memory_gib * GIB)
    # Megatron's states (contiguous param/grad buffers, optimizer shards) are static: fragmentation
    # is charged on the activations (full recompute: saved layer inputs + one layer's working set) only
    assert rows["fragmentation"].bytes == pytest.approx(eff.fragmentation * rows["activations"].bytes)
    assert rows["activations"].bytes > 0
    assert rows["peak"].bytes == pytest.approx(plan.prediction.peak_memory_bytes)
    assert rows["peak"].bytes == pytest.approx(allocated + rows["reserve"].bytes + rows["fragmentation"].bytes)
    left = "headroom" if plan.prediction.fits else "SHORT BY"
    assert rows[left].bytes == pytest.approx(abs(rows["capacity"].bytes - rows["peak"].bytes))

    text = render(lambda p, console: console.print(memory_table(p)), plan, width=80)
    assert_fits(text, 80)
    firsts = [line.split()[0] for line in text.splitlines() if line.strip()]
    assert firsts[3:6] == ["weights", "gradients", "optimizer"]
    assert f"{rows['model states'].bytes / GIB:.2f}" in text and "18.00" in text


@pytest.mark.parametrize(("zero", "form", "value"), [
    (0, "2 + 4 + 12 = 18", 18.0), (1, "6 + 12/DP = 7.5", 7.5), (2, "2 + 16/DP = 4", 4.0), (3, "18/DP = 2.25", 2.25),
])
def test_zero_stages_closed_forms(zero, form, value, make_plan):
    """Llama-2-7B on 8 GPUs, DP 8: the bytes per parameter of each ZeRO stage."""
    plan = make_plan("llama-2-7b", "dgx-h100", 8, tp=1, pp=1, micro_batch_size=1, seq_len=4096, global_batch_size=64,
                     recompute=Recompute.FULL, zero_stage=zero)
    w, g, o = nominal_bytes_per_param(plan)
    assert w + g + o == pytest.approx(value)
    rows = _rows(plan)
    assert form in rows["model states"].formula
    assert rows["optimizer state"].per_param == pytest.approx(12 / 8 if zero >= 1 else 12)
    if zero < 3:
        assert rows["gradients"].per_param == pytest.approx(4 / 8 if zero >= 2 else 4)
        assert rows["model states"].per_param == pytest.approx(value)
    else:  # ZeRO-3 also holds the gathered layers: more than 18/DP, by exactly those layers
        largest = max(max(layer_param_shards(plan.model, k, plan.config.dims).total for k in plan.model.layer_kinds
                          if k in (LayerKind.DENSE, LayerKind.MOE)), 0)
        held = plan.model.num_params
        assert rows["weights"].bytes == pytest.approx(2 / 8 * held + 2 * 2 * largest)
        assert rows["gradients"].bytes == pytest.approx(4 / 8 * held + 4 * largest)
        assert "2 layers gathered" in rows["weights"].formula


def test_pipeline_rank_names_the_fullest_rank(plan_70b):
    from autoshard.report.memory import fullest_rank

    pred = plan_70b.prediction
    r = fullest_rank(plan_70b)
    assert pred.rank_memory_bytes[r] == pytest.approx(pred.peak_memory_bytes)
    table = memory_table(plan_70b)
    assert f"pipeline rank {r}" in str(table.title)
    rows = _rows(plan_70b)
    dp = plan_70b.config.dims.dp * plan_70b.config.dims.cp
    # the plan's CP 2 x DP 2: the optimizer shards over both, and the formula says so (it said 12/DP = 12/4
    # beside a plan of DP 2; DP 1 x CP 32 read "12/DP = 12/32", found by a review helper)
    assert plan_70b.config.dims.cp == 2 and "12/(DP x CP) = 12/%d" % dp in rows["optimizer state"].formula
    assert "bytes/param 6 + 12/(DP x CP) = " in rows["model states"].formula
    assert rows["optimizer state"].per_param == pytest.approx(12 / dp)
    assert rows["weights"].per_param == pytest.approx(2.0) and rows["gradients"].per_param == pytest.approx(4.0)


def test_moe_experts_shard_over_expert_dp(make_plan):
    """Mixtral 8x7B, TP2 PP4 EP4 on 64 GPUs: dense parameters shard over DP 8, routed experts over
    expert-DP 2; the bytes per parameter held are the weighted mean of 6 + 12/8 and 6 + 12/2."""
    plan = make_plan("mixtral-8x7b", "dgx-h100", 64, tp=2, pp=4, ep=4, micro_batch_size=1,
                     recompute=Recompute.SELECTIVE)
    assert plan.config.dims.expert_dp == 2
    assert sum(nominal_bytes_per_param(plan)) == pytest.approx(7.5)
    assert sum(nominal_bytes_per_param(plan, expert=True)) == pytest.approx(12.0)
    rows = _rows(plan)
    f = rows["model states"].formula
    assert "dense 6 + 12/DP = 7.5" in f and "experts 6 + 12/EDP = 12" in f
    share = float(f.rsplit("%", 1)[0].rsplit(" ", 1)[1]) / 100
    assert rows["model states"].per_param == pytest.approx(share * 7.5 + (1 - share) * 12.0, abs=0.05)


@pytest.mark.parametrize(("extra", "grads", "optimizer", "states", "labels"), [
    ("", 4.0, 1.5, "6 + 12/DP = 7.5", ("FP32 grads: 4", "FP32 master + Adam m, v: 12/DP")),
    (" --grad-reduce-in-bf16", 2.0, 1.5, "4 + 12/DP = 5.5", ("BF16 grads: 2", "FP32 master + Adam m, v: 12/DP")),
    (" --grad-reduce-in-bf16 --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16",
     2.0, 1.0, "4 + 8/DP = 5", ("BF16 grads: 2", "FP32 master + Adam m, v in BF16: 8/DP")),
])
def test_formulas_follow_bf16_gradients_and_moments(extra, grads, optimizer, states, labels):
    """A Megatron command with --grad-reduce-in-bf16 / 16-bit Adam moments on 8 GPUs (DP 8, distributed
    optimizer): the rows' formulas give the bytes per parameter the rows hold (they said FP32 grads: 4
    and 12/DP over 2 and 8/DP bytes)."""
    from autoshard.api import evaluate_megatron

    command = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 4096 "
               "--num-attention-heads 32 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 "
               "--global-batch-size 8 --bf16 --tokenizer-type NullTokenizer --vocab-size 32000 "
               "--use-distributed-optimizer")
    plan, _ = evaluate_megatron(command + extra, None, "dgx-h100", None)
    rows = _rows(plan)
    assert (rows["gradients"].per_param, rows["optimizer state"].per_param) == pytest.approx((grads, optimizer))
    assert rows["model states"].formula == f"bytes/param {states}"
    assert rows["gradients"].formula == labels[0]
    assert rows["optimizer state"].formula.startswith(labels[1])


def test_fp8_param_gather_formula_counts_fp8_weights():
    """--fp8-param-gather on H100: the weights are held in FP8 (1 B) plus Transformer Engine's transposed
    FP8 copy of the decoder GEMM weights; the rows said "BF16 params: 2" and 6 + 12/DP over 1-byte weights."""
    from autoshard.api import evaluate_megatron

    command = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 4096 "
               "--num-attention-heads 32 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 "
               "--global-batch-size 8 --bf16 --tokenizer-type NullTokenizer --vocab-size 32000 "
               "--use-distributed-optimizer --fp8-format hybrid --fp8-param-gather")
    plan, _ = evaluate_megatron(command, None, "dgx-h100", None)
    rows = _rows(plan)
    held = rows["weights"].bytes / rows["weights"].per_param
    copies = rows["weights"].bytes - 1 * held
    assert rows["weights"].formula == f"FP8 params: 1 + {copies / GIB:.2f} GiB FP8 weight copies (Transformer Engine)"
    assert rows["model states"].formula == f"bytes/param 5 + 12/DP = 6.5, + {copies / held:.2f} FP8 weight copies"
    assert rows["model states"].per_param == pytest.approx(6.5 + copies / held)
