"""The interleaved schedule needs a multiple of PP micro-batches per DP rank. Megatron-Core runs them in
groups of PP through each model chunk (microbatch_group_size_per_vp_stage's default) and raises on a last
group smaller than PP (schedules.py, "dependency bubbles"; earlier versions asserted m % PP == 0). The
solver used to offer such plans (Llama-3.1-70B, 14-sequence batch: TP8 PP2 VPP8 at 7 micro-batches) and
price them by the closed form, which their holes would have beaten by 8-32 %: now TrainConfig refuses
them, the search prunes them and `--from-megatron` refuses a group size it does not model."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.costmodel.train.pipeline import schedule_time, simulate
from autoshard.costmodel.train.types import ParallelDims, TrainConfig
from autoshard.search.train.space import Pins, enumerate_train
from autoshard.specs import TrainJob, load_cluster, load_model


@pytest.mark.parametrize(("pp", "vpp", "dp", "gbs"), [(2, 8, 2, 14), (4, 3, 1, 6), (4, 2, 2, 20), (3, 2, 1, 16)])
def test_train_config_refuses_interleaving_without_a_multiple_of_pp(pp, vpp, dp, gbs) -> None:
    dims = ParallelDims(tp=1, pp=pp, dp=dp, vpp=vpp)
    with pytest.raises(ValueError, match=f"multiple of PP {pp}, got {gbs // dp}"):
        TrainConfig(dims=dims, micro_batch_size=1, global_batch_size=gbs, seq_len=4096)
    # without interleaving any count runs (1F1B has no groups)
    plain = TrainConfig(dims=ParallelDims(tp=1, pp=pp, dp=dp), micro_batch_size=1, global_batch_size=gbs, seq_len=4096)
    assert plain.num_microbatches == gbs // dp
    # the next multiple of PP runs interleaved
    m = -(-(gbs // dp) // pp) * pp
    assert TrainConfig(dims=dims, micro_batch_size=1, global_batch_size=m * dp, seq_len=4096).num_microbatches == m


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("vpp", [2, 3, 4])
def test_megatron_order_is_the_closed_form_at_a_multiple_of_pp(pp, vpp) -> None:
    """Equal chunks (forward 1, backward 2 per chunk): Megatron's interleaved order, simulated, ends at
    exactly (m + (p - 1) / v) x T, Narayanan et al. 2021's bubble, for every admitted m."""
    chunks = pp * vpp
    for m in range(pp, 4 * pp + 1, pp):
        ops = simulate([1.0] * chunks, [2.0] * chunks, pp=pp, vpp=vpp, m=m)
        closed = schedule_time([3.0 * vpp] * pp, num_microbatches=m, vpp=vpp).step_s
        assert max(o.end for o in ops) == pytest.approx(closed, abs=1e-9), m


def test_megatron_refused_counts_leave_holes_or_deadlock() -> None:
    """Why the counts are refused: PP 4 VPP 3 at 6 micro-batches runs 32 % past the closed form, and at 5
    this order deadlocks."""
    ops = simulate([1.0] * 12, [2.0] * 12, pp=4, vpp=3, m=6)
    closed = schedule_time([9.0] * 4, num_microbatches=6, vpp=3).step_s
    assert max(o.end for o in ops) / closed == pytest.approx(1.317, abs=0.002)
    with pytest.raises(RuntimeError, match="deadlocked"):
        simulate([1.0] * 12, [2.0] * 12, pp=4, vpp=3, m=5)


def test_the_search_offers_only_admitted_counts() -> None:
    model, cluster = load_model("llama-3.1-70b"), load_cluster("dgx-h100").with_gpus(32)
    space = enumerate_train(model, cluster, TrainJob(seq_len=8192, global_batch_size=14), pins=Pins(tp=8, pp=2))
    interleaved = [c for c in space.candidates if c.dims.vpp > 1]
    assert interleaved and all(c.num_microbatches % c.dims.pp == 0 for c in interleaved)
    assert {c.dims.dp for c in interleaved} == {1}  # DP 2 would give 7 micro-batches
    assert space.pruned["interleaving needs a multiple of PP micro-batches"] > 0


def test_cli_refusals_name_the_fix(tmp_path) -> None:
    runner = CliRunner()
    # pinned to the count Megatron refuses: infeasible, with the fix for the pin
    out = runner.invoke(app, ["solve", "llama-3.1-70b", "dgx-h100", "--gpus", "32", "--tp", "8", "--pp", "2",
                              "--vpp", "8", "--dp", "2", "--global-batch-size", "14"])
    assert out.exit_code == 1, out.output
    assert "multiple of PP micro-batches per DP rank" in " ".join(out.output.split())
    out = runner.invoke(app, ["evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", "32", "--tp", "8", "--pp", "2",
                              "--vpp", "8", "--global-batch-size", "14"])
    assert out.exit_code == 2, out.output
    assert "multiple of PP 2, got 7" in " ".join(out.output.split())
    launch = ("torchrun --nproc-per-node 8 --nnodes 4 pretrain_gpt.py --num-layers 80 --hidden-size 8192 "
              "--ffn-hidden-size 28672 --num-attention-heads 64 --group-query-attention --num-query-groups 8 "
              "--seq-length 8192 --max-position-embeddings 8192 --tensor-model-parallel-size 8 "
              "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 5 --micro-batch-size 1 "
              "--global-batch-size 16 --bf16 --sequence-parallel --use-distributed-optimizer --swiglu "
              "--normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights "
              "--disable-bias-linear --microbatch-group-size-per-virtual-pipeline-stage {}")
    script = tmp_path / "launch.sh"
    script.write_text(launch.format(4))  # a group of 4 (valid in Megatron-Core) is not what autoshard prices
    out = runner.invoke(app, ["evaluate", "llama-3.1-70b", "dgx-h100", "--from-megatron", str(script)])
    assert out.exit_code == 2, out.output
    assert "--microbatch-group-size-per-virtual-pipeline-stage 4 is not modelled" in " ".join(out.output.split())
    script.write_text(launch.format(2))  # the default, spelt out
    out = runner.invoke(app, ["evaluate", "llama-3.1-70b", "dgx-h100", "--from-megatron", str(script)])
    assert out.exit_code in (0, 1), out.output  # predicted (1: it may not fit)
    assert "TP8 PP2 VPP8" in out.output
