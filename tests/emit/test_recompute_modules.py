"""Recompute as Megatron-LM runs it: --recompute-modules (selective recompute by module) in the cost
model, the launch and the parser; selective recompute never combined with --recompute-num-layers."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
from typer.testing import CliRunner

from autoshard.api import evaluate, train_job
from autoshard.cli import app
from autoshard.costmodel.train.recompute import module_recompute
from autoshard.costmodel.train.layer import layer_cost
from autoshard.emit.megatron.command import megatron_command
from autoshard.emit.megatron.parse import parse_megatron
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import Precision
from autoshard.specs.model import LayerKind

QWEN = load_model("qwen3-30b-a3b")
LLAMA = load_model("llama-3.1-8b")
H100 = load_cluster("dgx-h100")


def _cfg(model, modules, *, tp=2, ep=4, seq=4096, mbs=1):
    job = train_job(model, seq_len=seq, global_batch_size=64)
    plan = evaluate(model, H100.with_gpus(8), job, tp=tp, pp=1, ep=ep if model.moe else 1, etp=1 if model.moe else None,
                    micro_batch_size=mbs, recompute=Recompute.SELECTIVE, recompute_modules=modules)
    return plan


@pytest.mark.parametrize(("model", "kind", "modules", "per_token"), [
    # layernorm: the two norm outputs, 2 B x h each, split by TP under sequence parallelism
    (LLAMA, LayerKind.DENSE, ("layernorm",), 2 * 2 * 4096 / 2),
    # mlp: SwiGLU gate + up inputs of the activation and its output, 3 x 2 B x ffn / TP
    (LLAMA, LayerKind.DENSE, ("mlp",), 3 * 2 * 14336 / 2),
    # moe_act: the experts' activation outputs, top_k x ETP / TP pairs x 2 B x expert ffn / ETP
    (QWEN, LayerKind.MOE, ("moe_act",), 8 * 1 / 2 * 2 * 768),
    # moe: permuted inputs (h), expert intermediates (3 x ffn) and FP32 router scores
    (QWEN, LayerKind.MOE, ("moe", "moe_act"), 8 / 2 * (2 * 2048 + 3 * 2 * 768) + 4 * 128),
])
def test_saved_activations_closed_form(model, kind, modules, per_token) -> None:
    plan = _cfg(model, ("core_attn", *modules))
    cfg, pool = plan.config, plan.cluster.primary
    r = module_recompute(model, kind, cfg.recompute_modules, gpu=pool.gpu, dims=cfg.dims,
                         micro_batch_size=1, seq_len=4096, sequence_parallel=cfg.sp, precision=cfg.precision)
    assert r.saved_bytes == pytest.approx(4096 * per_token)
    base = layer_cost(model, kind, pool, dataclasses.replace(cfg, recompute_modules=()), Recompute.SELECTIVE)
    mine = layer_cost(model, kind, pool, cfg, Recompute.SELECTIVE)
    assert base.activation_bytes - mine.activation_bytes == pytest.approx(r.saved_bytes)
    assert mine.recompute_s > base.recompute_s  # the recomputed forward costs time


def test_mla_up_projection_saves_q_k_v() -> None:
    v3 = load_model("deepseek-v3")
    r = module_recompute(v3, LayerKind.MOE, ("core_attn", "mla_up_proj"), gpu=H100.primary.gpu,
                         dims=ParallelDims(tp=4, dp=2, ep=8, etp=1), micro_batch_size=1, seq_len=4096,
                         sequence_parallel=True, precision=Precision.BF16)
    heads = 128 / 4
    assert r.saved_bytes == pytest.approx(4096 * 2 * heads * ((128 + 64) * 2 + (128 + 128)))


def test_mtp_modules_recompute_as_the_decoder() -> None:
    """The output layer carries DeepSeek-V3's MTP module, one decoder layer like the last (MoE): with
    --recompute-modules its decoder layer saves and re-runs what a decoder MoE layer does."""
    from autoshard.costmodel.train.types import TrainConfig

    v3 = load_model("deepseek-v3")
    pool = H100.primary
    base = TrainConfig(dims=ParallelDims(tp=4, dp=2, ep=8, etp=1), micro_batch_size=1, global_batch_size=8,
                       seq_len=4096, recompute=Recompute.SELECTIVE)
    mods = dataclasses.replace(base, recompute_modules=("core_attn", "moe", "mla_up_proj"))
    saved = (layer_cost(v3, LayerKind.MOE, pool, base, Recompute.SELECTIVE).activation_bytes
             - layer_cost(v3, LayerKind.MOE, pool, mods, Recompute.SELECTIVE).activation_bytes)
    extra = (layer_cost(v3, LayerKind.MOE, pool, mods, Recompute.SELECTIVE).recompute_s
             - layer_cost(v3, LayerKind.MOE, pool, base, Recompute.SELECTIVE).recompute_s)
    assert v3.mtp_num_layers == 1 and v3.mtp_layer_kind is LayerKind.MOE and saved > 0 and extra > 0
    out_base = layer_cost(v3, LayerKind.OUTPUT, pool, base, Recompute.SELECTIVE)
    out_mods = layer_cost(v3, LayerKind.OUTPUT, pool, mods, Recompute.SELECTIVE)
    assert out_base.activation_bytes - out_mods.activation_bytes == pytest.approx(saved)
    active = v3.mtp_module_params(active_only=True) / v3.layer_params(LayerKind.MOE, active_only=True)
    assert out_mods.recompute_s - out_base.recompute_s == pytest.approx(active * extra)


def test_modules_without_core_attn_do_not_recompute_attention() -> None:
    with_attn = _cfg(LLAMA, ("core_attn", "layernorm"))
    without = _cfg(LLAMA, ("layernorm",))
    assert without.prediction.time.recompute < with_attn.prediction.time.recompute
    assert without.prediction.peak_memory_bytes == pytest.approx(with_attn.prediction.peak_memory_bytes)


def test_modules_round_trip_through_the_launch() -> None:
    plan = _cfg(QWEN, ("moe_act", "layernorm"))
    command = megatron_command(plan)
    words = shlex.split(command.replace("\\\n", " "))
    i = words.index("--recompute-modules")
    assert words[i + 1:i + 3] == ["moe_act", "layernorm"] and words[i + 3].startswith("--")
    assert "--recompute-method" not in words and "--recompute-num-layers" not in words
    parsed = parse_megatron(command, vocab_size=QWEN.vocab_size).with_world_size(8)
    assert parsed.recompute_modules == ("moe_act", "layernorm")
    assert parsed.train_config().recompute_modules == plan.config.recompute_modules


def _cli(*args: str):
    return CliRunner().invoke(app, [*args])


def test_cli_recompute_modules() -> None:
    # 32 GPUs: at EP 4 the plan must fit for a launch command to be printed (8 GPUs hold 7.3 B expert
    # parameters each at 18 bytes/param over an expert-DP of 2: it does not fit, and prints none)
    base = ["evaluate", "qwen3-30b-a3b", "dgx-h100", "--gpus", "32", "--tp", "2", "--pp", "1", "--ep", "4",
            "--etp", "1", "--seq-len", "4096", "--global-batch-size", "64", "--json"]
    plain = json.loads(_cli(*base, "--recompute", "selective").stdout)
    mods = json.loads(_cli(*base, "--recompute-modules", "moe_act,layernorm").stdout)
    assert mods["plan"]["recompute"] == "selective"
    assert mods["predicted"]["memory_gib"]["breakdown"]["activations"] < plain["predicted"]["memory_gib"]["breakdown"]["activations"]
    assert "--recompute-modules moe_act layernorm" in mods["launch"]["megatron"].replace("\\\n    ", "")
    bad = _cli(*base, "--recompute-modules", "attention")
    assert bad.exit_code == 2 and "unknown module" in bad.stderr
    clash = _cli(*base, "--recompute-modules", "mlp", "--recompute", "full")
    assert clash.exit_code == 2 and "contradicts --recompute full" in clash.stderr


def test_selective_with_recompute_num_layers_is_refused() -> None:
    run = _cli("solve", "llama-3.1-70b", "dgx-h100", "--gpus", "64", "--recompute", "selective",
               "--recompute-num-layers", "2", "--workers", "1", "--time-limit", "5")
    assert run.exit_code == 2 and "one --recompute-granularity" in run.stderr


def test_solver_never_adds_block_recompute_to_selective() -> None:
    run = _cli("solve", "llama-3.1-70b", "dgx-h100", "--gpus", "32", "--recompute", "selective", "--tp", "8",
               "--workers", "1", "--time-limit", "10", "--json")
    assert run.exit_code == 0, run.stderr
    plan = json.loads(run.stdout)
    assert plan["plan"]["recompute"] == "selective" and plan["plan"]["recompute_num_layers"] == 0
    assert all(s["full_recompute_layers"] == 0 for s in plan["plan"]["stages"])
    launch = plan["launch"]["megatron"]
    assert "--recompute-granularity selective" in launch and "--recompute-method" not in launch


def test_hardware_flops_count_the_recomputed_modules() -> None:
    """hw TFLOP/s counts what is re-run: the attention core by default; with `moe` the routed experts'
    forward (top_k x 3 x h x ffn per token for SwiGLU), router and attention core too."""
    default = _cfg(QWEN, ())
    mods = _cfg(QWEN, ("core_attn", "moe"))
    extra_per_step = (mods.prediction.hw_tflops_per_gpu * mods.prediction.step_time_s
                      - default.prediction.hw_tflops_per_gpu * default.prediction.step_time_s) * 1e12 * 8
    tokens = 64 * 4096
    moe = QWEN.moe
    expected = QWEN.num_moe_layers * 2.0 * tokens * (moe.top_k * 3 * QWEN.hidden_size * moe.expert_ffn_hidden_size
                                                    + QWEN.hidden_size * moe.num_experts)
    assert extra_per_step == pytest.approx(expected, rel=1e-6)


def test_overlap_knobs_without_the_degrees_are_refused() -> None:
    res = _cli("evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--no-tp-comm-overlap")
    assert res.exit_code == 2 and "give its --tp and --pp" in res.stderr
