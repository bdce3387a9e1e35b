"""The MoE dispatcher and FP8 recipe, end to end: solver choice, plan JSON, Megatron flags, parser
round trip, CLI options and their errors."""

from __future__ import annotations

import dataclasses

import pytest
from test_megatron import make_plan, rule_violations, split_command

from autoshard.api import evaluate, train_job
from autoshard.costmodel.moe import dispatch_time_s
from autoshard.costmodel.train.step import predict_train
from autoshard.emit.megatron.command import megatron_command
from autoshard.emit.megatron.script import megatron_script
from autoshard.emit.megatron.parse import parse_megatron
from autoshard.errors import SpecError
from autoshard.parallel import Fp8Recipe, MoeDispatcher, ParallelDims
from autoshard.search.train.knobs import default_fp8_recipe, dispatcher_for
from autoshard.specs import Precision, load_cluster, load_model


def _with(plan, **kw):
    return dataclasses.replace(plan, config=dataclasses.replace(plan.config, **kw))


@pytest.mark.parametrize(("cluster", "backend"), [("dgx-h100", "deepep"), ("gb200-nvl72", "hybridep")])
@pytest.mark.parametrize("dispatcher", list(MoeDispatcher))
def test_dispatcher_flags_obey_megatron_rules_and_round_trip(cluster, backend, dispatcher):
    plan = _with(make_plan("qwen3-30b-a3b", cluster, tp=1, dp=8, ep=8), moe_dispatcher=dispatcher)
    for text in (megatron_command(plan), megatron_script(plan)):
        flags = split_command(text)[2]
        assert flags["--moe-token-dispatcher-type"] == [dispatcher.value]
        if dispatcher is MoeDispatcher.FLEX:
            assert flags["--moe-flex-dispatcher-backend"] == [backend]
        else:
            assert "--moe-flex-dispatcher-backend" not in flags
        assert rule_violations(text, world=plan.num_gpus, blackwell=cluster == "gb200-nvl72") == []
        assert parse_megatron(text).moe_dispatcher is dispatcher


@pytest.mark.parametrize("recipe", list(Fp8Recipe))
def test_fp8_recipe_flags_round_trip(recipe):
    cluster = "dgx-b200" if recipe is Fp8Recipe.MXFP8 else "dgx-h100"
    plan = _with(make_plan("llama-3.1-8b", cluster, tp=2, dp=4, precision="fp8"), fp8_recipe=recipe)
    text = megatron_command(plan)
    flags = split_command(text)[2]
    assert flags["--fp8-recipe"] == [recipe.value]
    assert ("--fp8-amax-history-len" in flags) == (recipe is Fp8Recipe.DELAYED)
    assert rule_violations(text, world=plan.num_gpus, blackwell=cluster == "dgx-b200") == []
    parsed = parse_megatron(text)
    assert parsed.fp8_recipe is recipe and parsed.precision is Precision.FP8


def test_parser_reads_megatron_defaults_and_deepep():
    base = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 1024 --num-attention-heads 16 "
            "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
            "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8")
    assert parse_megatron(base).moe_dispatcher is MoeDispatcher.ALLGATHER  # Megatron's default
    assert parse_megatron(base + " --moe-enable-deepep").moe_dispatcher is MoeDispatcher.FLEX
    fp8 = parse_megatron(base + " --fp8-format hybrid --fp8-param-gather")
    assert fp8.fp8_recipe is Fp8Recipe.DELAYED and fp8.fp8_param_gather
    assert fp8.with_world_size(8).train_config().fp8_param_gather


def test_solver_picks_the_cheapest_dispatcher():
    qwen = load_model("qwen3-235b-a22b")
    h100 = load_cluster("dgx-h100").with_gpus(256)
    # EP 32 crosses four nodes: DeepEP/HybridEP sends each token once per remote node
    assert dispatcher_for(qwen, h100, ParallelDims(tp=2, pp=8, dp=16, ep=32, etp=1), 4096) is MoeDispatcher.FLEX
    # inside one node flex still sends a token once per rank holding its experts (5.34 of top-8 over
    # EP 8), alltoall once per expert
    assert dispatcher_for(qwen, h100, ParallelDims(tp=2, pp=8, dp=16, ep=8, etp=1), 4096) is MoeDispatcher.FLEX
    # one expert per rank (Mixtral 8 experts, EP 8): the same bytes, so alltoall (no extra library)
    mixtral = load_model("mixtral-8x7b")
    assert dispatcher_for(mixtral, h100, ParallelDims(tp=1, pp=4, dp=64, ep=8, etp=1), 4096) is MoeDispatcher.ALLTOALL
    # EP 4 < top-8: gathering every token (3 T h each way) beats sending 8 copies (6 T h), but flex sends
    # a token to the 3.6 ranks holding its experts on average (2.7 T h leave the GPU): flex
    assert dispatcher_for(qwen, h100, ParallelDims(tp=1, pp=8, dp=32, ep=4), 4096) is MoeDispatcher.FLEX
    kw = dict(tokens=4096, hidden=qwen.hidden_size, top_k=8, num_experts=128, ep=4, etp=1, pool=h100.primary)
    assert dispatch_time_s(MoeDispatcher.ALLGATHER, **kw) < dispatch_time_s(MoeDispatcher.ALLTOALL, **kw)
    assert default_fp8_recipe(h100) is Fp8Recipe.DELAYED
    assert default_fp8_recipe(load_cluster("gb200-nvl72")) is Fp8Recipe.MXFP8


def test_evaluate_reports_the_knobs_in_plan_json():
    qwen = load_model("qwen3-30b-a3b")
    cluster = load_cluster("dgx-h100").with_gpus(16)
    job = train_job(qwen, seq_len=4096, global_batch_size=64, precision=Precision.FP8)
    plan = evaluate(qwen, cluster, job, tp=1, pp=1, ep=16, fp8_recipe=Fp8Recipe.TENSORWISE)
    p = plan.to_json()["plan"]
    assert p["moe_dispatcher"] == "flex" and p["fp8_recipe"] == "tensorwise"
    flags = split_command(megatron_command(plan))[2]
    assert flags["--moe-token-dispatcher-type"] == ["flex"] and flags["--fp8-recipe"] == ["tensorwise"]
    dense = evaluate(load_model("llama-3.1-8b"), load_cluster("dgx-h100").with_gpus(8),
                     train_job(load_model("llama-3.1-8b"), seq_len=4096, global_batch_size=32), tp=1, pp=1)
    assert dense.to_json()["plan"]["moe_dispatcher"] is None and dense.to_json()["plan"]["fp8_recipe"] is None


@pytest.mark.parametrize(("model", "cluster", "precision", "kw", "message"), [
    ("llama-3.1-8b", "dgx-h100", Precision.BF16, dict(moe_dispatcher=MoeDispatcher.FLEX), "has no experts"),
    ("llama-3.1-8b", "dgx-h100", Precision.BF16, dict(fp8_recipe=Fp8Recipe.DELAYED), "needs --precision fp8"),
    ("llama-3.1-8b", "dgx-h100", Precision.FP8, dict(fp8_recipe=Fp8Recipe.MXFP8), "needs Blackwell"),
])
def test_bad_knobs_are_spec_errors(model, cluster, precision, kw, message):
    spec = load_model(model)
    with pytest.raises(SpecError, match=message):
        evaluate(spec, load_cluster(cluster).with_gpus(8), train_job(spec, seq_len=4096, global_batch_size=32,
                                                                      precision=precision), tp=1, pp=1, **kw)


@pytest.mark.parametrize(("extra", "grads_fp32", "moments_bf16", "warning"), [
    ("", True, False, None),
    (" --grad-reduce-in-bf16", False, False, None),
    (" --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", True, True, None),
    (" --use-precision-aware-optimizer --exp-avg-dtype fp16 --exp-avg-sq-dtype fp16", True, True, None),
    (" --use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype bf16", True, True, "FP8 Adam moments"),
    (" --use-precision-aware-optimizer --exp-avg-dtype bf16", True, False, "one Adam moment in 16 bits"),
    (" --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", True, False, "need --use-precision-aware-optimizer"),
])
def test_gradient_and_moment_dtypes_are_read(extra, grads_fp32, moments_bf16, warning):
    base = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 1024 --num-attention-heads 16 "
            "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
            "--tokenizer-type NullTokenizer --vocab-size 32000 --use-distributed-optimizer")
    parsed = parse_megatron(base + extra)
    cfg = parsed.with_world_size(8).train_config()
    assert (cfg.grad_reduce_fp32, cfg.optimizer_moments_bf16) == (grads_fp32, moments_bf16)
    assert (warning is None) == (not any("moment" in w or "precision-aware" in w for w in parsed.warnings))
    if warning:
        assert any(warning in w for w in parsed.warnings)


@pytest.mark.parametrize("extra", [
    " --use-precision-aware-optimizer --exp-avg-dtype garbage --exp-avg-sq-dtype bf16",
    " --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype BF16",
    " --exp-avg-sq-dtype int8",
])
def test_unknown_moment_dtype_is_a_spec_error(extra):
    """Megatron-LM's argparse allows fp32/fp16/bf16/fp8 only; anything else was read as 16-bit moments."""
    base = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 1024 --num-attention-heads 16 "
            "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
            "--tokenizer-type NullTokenizer --vocab-size 32000 --use-distributed-optimizer")
    with pytest.raises(SpecError, match=r"--exp-avg(-sq)?-dtype '.*' is not one of Megatron-LM's choices"):
        parse_megatron(base + extra)


def test_moment_dtypes_do_not_halve_sgd_momentum():
    """Only Adam has exp_avg / exp_avg_sq: with --optimizer sgd the flags were read as 16-bit moments and
    halved SGD's FP32 momentum (8 -> 6 B/param of optimizer state)."""
    base = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 1024 --num-attention-heads 16 "
            "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
            "--tokenizer-type NullTokenizer --vocab-size 32000 --use-distributed-optimizer --optimizer sgd "
            "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")
    parsed = parse_megatron(base)
    assert parsed.with_world_size(8).train_config().optimizer_moments_bf16 is False
    assert any("--optimizer sgd keeps its FP32 state" in w for w in parsed.warnings)


def test_bf16_gradients_and_moments_round_trip_and_save_memory():
    """--grad-reduce-in-bf16 halves the gradient buffer (4 -> 2 B/param, DP 1); 16-bit Adam moments
    halve the moments (8 -> 4 B/param) and keep the FP32 master: 18 -> 12 B/param of model states."""
    plan = make_plan("llama-3.1-8b", "dgx-h100", tp=8, dp=1)
    lean = _with(plan, grad_reduce_fp32=False, optimizer_moments_bf16=True)
    text = megatron_command(lean)
    flags = split_command(text)[2]
    assert "--grad-reduce-in-bf16" in flags and flags["--exp-avg-dtype"] == ["bf16"]
    assert "--use-precision-aware-optimizer" in flags
    assert rule_violations(text, world=lean.num_gpus, blackwell=False) == []
    back = parse_megatron(text).with_world_size(8).train_config()
    assert (back.grad_reduce_fp32, back.optimizer_moments_bf16) == (False, True)
    assert "--grad-reduce-in-bf16" not in split_command(megatron_command(plan))[2]
    full = predict_train(plan.model, plan.cluster, plan.config, plan.stages).memory
    half = predict_train(lean.model, lean.cluster, lean.config, lean.stages).memory
    assert half.grads == pytest.approx(full.grads / 2)
    assert half.optimizer == pytest.approx(full.optimizer * 8 / 12)  # FP32 master 4 + moments 8 -> 4 + 4
    assert half.weights == pytest.approx(full.weights)
