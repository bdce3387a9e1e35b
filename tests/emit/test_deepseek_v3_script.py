"""DeepSeek-V3's Megatron-LM launch describes DeepSeek-V3 (arXiv 2412.19437 Sections 2.1.2, 2.2, 3.3;
Hugging Face config.json): sigmoid router scores, group-limited routing (8 groups, top 4), the
auxiliary-loss-free expert bias, one MTP module, blockwise FP8, and reads back to the same model."""

from __future__ import annotations

import json
import shlex

import pytest

from autoshard.api import evaluate, train_job
from autoshard.costmodel.flops import model_flops_per_step, mtp_forward_flops
from autoshard.costmodel.train.step import predict_train
from autoshard.emit.megatron.command import megatron_command
from autoshard.emit.megatron.parse import model_shape_differences, parse_megatron
from autoshard.parallel import Fp8Recipe, Recompute
from autoshard.specs import load_cluster, load_model
from autoshard.specs.model import LayerKind, RouterScore

V3 = load_model("deepseek-v3")


def _plan(precision: str = "fp8"):
    job = train_job(V3, seq_len=4096, global_batch_size=1024, precision=precision)
    return evaluate(V3, load_cluster("dgx-h100").with_gpus(1024), job, tp=1, pp=16, ep=64, etp=1,
                    recompute=Recompute.FULL)


def _flags(command: str) -> dict[str, list[str]]:
    words = shlex.split(command.replace("\\\n", " "))
    out: dict[str, list[str]] = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            vals = []
            for v in words[i + 1:]:
                if v.startswith("--"):
                    break
                vals.append(v)
            out[w] = vals
    return out


def test_model_spec_holds_the_published_routing_and_mtp() -> None:
    moe = V3.moe
    assert moe is not None
    assert (moe.score_function, moe.num_groups, moe.topk_groups, moe.expert_bias) == (RouterScore.SIGMOID, 8, 4, True)
    assert moe.topk_scaling_factor == 2.5
    assert V3.mtp_num_layers == 1 and V3.mtp_layer_kind is LayerKind.MOE
    # 671B main model; the MTP module adds one MoE layer (11.3B) + norms + the 2h x h projection (0.1B);
    # the checkpoint's 685B also stores copies of the shared embedding and head (2 x 0.93B)
    assert V3.num_params == pytest.approx(671e9, rel=0.005)
    extra = V3.num_params_with_mtp - V3.num_params
    assert extra == V3.moe_layer_params() + 2 * 7168 + 2 * 7168 * 7168
    assert V3.num_params_with_mtp + 2 * 129280 * 7168 == pytest.approx(685e9, rel=0.01)


def test_mtp_flops_are_one_more_layer_and_head() -> None:
    tokens, seq = 4096, 4096
    no_mtp = V3.model_copy(update={"mtp_num_layers": 0})
    total = model_flops_per_step(V3, seq_len=seq, global_batch_size=1)
    assert total - model_flops_per_step(no_mtp, seq_len=seq, global_batch_size=1) == pytest.approx(
        3 * mtp_forward_flops(V3, tokens=tokens, seq_len=seq))
    # one MoE layer + logits + projection: about 1/60 of the main model's forward plus a head
    assert 0.02 < mtp_forward_flops(V3, tokens=tokens, seq_len=seq) / (total / 3) < 0.04


def test_mtp_sits_on_the_last_stage() -> None:
    plan = _plan()
    mem = plan.prediction.rank_memory_bytes
    no_mtp = evaluate(V3.model_copy(update={"mtp_num_layers": 0}), plan.cluster,
                      train_job(V3, seq_len=4096, global_batch_size=1024, precision="fp8"),
                      tp=1, pp=16, ep=64, etp=1, recompute=plan.config.recompute)
    base = no_mtp.prediction.rank_memory_bytes
    assert mem[-1] > base[-1] + 1e9  # the MTP module's states and activations
    assert mem[:-1] == pytest.approx(base[:-1])
    assert plan.prediction.step_time_s > no_mtp.prediction.step_time_s


def test_launch_says_deepseek_v3() -> None:
    plan = _plan()
    assert plan.config.fp8_recipe is Fp8Recipe.BLOCKWISE
    f = _flags(megatron_command(plan))
    assert f["--moe-router-score-function"] == ["sigmoid"]
    assert f["--moe-router-num-groups"] == ["8"] and f["--moe-router-group-topk"] == ["4"]
    assert "--moe-router-enable-expert-bias" in f and f["--moe-router-bias-update-rate"] == ["1e-3"]
    assert f["--moe-router-load-balancing-type"] == ["seq_aux_loss"] and f["--moe-aux-loss-coeff"] == ["1e-4"]
    assert f["--moe-router-topk-scaling-factor"] == ["2.5"]
    assert f["--mtp-num-layers"] == ["1"]
    assert f["--fp8-recipe"] == ["blockwise"] and f["--fp8-format"] == ["e4m3"]
    assert f["--moe-layer-freq"] == ["([0]*3+[1]*58)"]
    assert f["--expert-tensor-parallel-size"] == ["1"]


def test_launch_reads_back_to_the_same_model_and_prediction() -> None:
    plan = _plan()
    parsed = parse_megatron(megatron_command(plan), vocab_size=V3.vocab_size).with_world_size(plan.num_gpus)
    assert model_shape_differences(V3, parsed.model) == []
    assert parsed.model.moe == V3.moe and parsed.model.mtp_num_layers == 1
    cfg = parsed.train_config()
    assert (cfg.dims.world_size, cfg.dims.expert_tp, cfg.dims.ep, cfg.sp) == (1024, 1, 64, False)
    assert (cfg.recompute, cfg.zero_stage, cfg.precision, cfg.fp8_recipe) == (
        plan.config.recompute, plan.config.zero_stage, plan.config.precision, plan.config.fp8_recipe)
    again = predict_train(parsed.model, plan.cluster, cfg, parsed.layout())
    assert again.step_time_s == pytest.approx(plan.prediction.step_time_s, rel=1e-9)
    assert again.rank_memory_bytes == pytest.approx(plan.prediction.rank_memory_bytes, rel=1e-9)


def test_bf16_plan_has_no_fp8_flags() -> None:
    f = _flags(megatron_command(_plan("bf16")))
    assert "--fp8-recipe" not in f and "--fp8-format" not in f


def test_models_json_reports_mtp_parameters() -> None:
    from typer.testing import CliRunner

    from autoshard.cli import app

    res = CliRunner().invoke(app, ["models", "--json"])
    v3 = next(m for m in json.loads(res.stdout)["models"] if m["name"] == "deepseek-v3")
    assert v3["params"] == V3.num_params and v3["mtp_layers"] == 1
    assert v3["params_with_mtp"] - v3["params"] == V3.mtp_module_params()
