"""Plans Megatron-LM would stop at start-up or on its first step are not planned, and commands it would
refuse are not read as if they ran (costmodel.train.rules). Each case here was a plan `solve` wrote or a
command `--from-megatron` priced (review of 2026-11-24): the flex dispatcher on GPUs without NVLink or
without NVIDIA's DeepEP, recompute modules TransformerConfig refuses, MoE with TP and no sequence
parallelism, a sequence that sequence parallelism cannot split, the blockwise FP8 recipe on Ada, and
start-up asserts of arguments.py."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.costmodel.train.rules import config_problems, flex_dispatcher_problem
from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import Fp8Recipe, MoeDispatcher, ParallelDims
from autoshard.search.train.knobs import dispatcher_for, fp8_recipe_for
from autoshard.specs import Precision, load_cluster, load_model


def _run(args: list[str]) -> tuple[int, str]:
    out = CliRunner().invoke(app, args)
    return out.exit_code, " ".join(out.output.split())


@pytest.mark.parametrize("cluster", ["mi300x", "h100-pcie", "l40s-pcie"])
def test_flex_is_chosen_only_on_nvlink(cluster: str) -> None:
    qwen = load_model("qwen3-235b-a22b")
    dims = ParallelDims(tp=1, pp=8, dp=32, ep=4)  # flex's grid on DGX H100 (tests/emit/test_moe_fp8_knobs.py)
    assert dispatcher_for(qwen, load_cluster("dgx-h100").with_gpus(256), dims, 4096) is MoeDispatcher.FLEX
    spec = load_cluster(cluster)
    assert flex_dispatcher_problem(spec) is not None
    assert dispatcher_for(qwen, spec, dims, 4096) is not MoeDispatcher.FLEX
    code, text = _run(["solve", "qwen3-30b-a3b", cluster, "--gpus", "16", "--moe-dispatcher", "flex"])
    assert code == 2 and "the flex dispatcher (DeepEP/HybridEP) needs NVIDIA GPUs on NVLink" in text


@pytest.mark.parametrize(("args", "message"), [
    (["llama-3.1-8b", "dgx-h100", "--recompute-modules", "mla_up_proj"], "mla_up_proj needs multi-latent attention"),
    (["llama-3.1-8b", "dgx-h100", "--recompute-modules", "moe_act"], "moe_act needs experts"),
    (["llama-3.1-8b", "dgx-h100", "--precision", "fp8", "--recompute-modules", "layernorm"],
     "delayed-scaling recipe does not support moe_act or layernorm recompute"),
    (["llama-3.1-8b", "l40s-pcie", "--precision", "fp8", "--fp8-recipe", "blockwise"],
     "blockwise needs compute capability 9.0 or newer (Hopper, Blackwell), the cluster has L40S-48GB"),
])
def test_solve_refuses_pins_megatron_refuses(args: list[str], message: str) -> None:
    code, text = _run(["solve", *args, "--gpus", "16"])
    assert code == 2 and message in text, text


def test_the_same_pins_run_where_megatron_takes_them() -> None:
    code, text = _run(["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "16", "--precision", "fp8", "--fp8-recipe",
                       "tensorwise", "--recompute-modules", "layernorm", "--time-limit", "20"])
    assert code == 0 and "--recompute-modules layernorm" in text and "--fp8-recipe tensorwise" in text
    # a model's own recipe where the GPUs run it, the cluster's default where they do not
    dsv3 = load_model("deepseek-v3")
    assert fp8_recipe_for(dsv3, load_cluster("dgx-h100")) is Fp8Recipe.BLOCKWISE
    assert fp8_recipe_for(dsv3, load_cluster("l40s-pcie")) is Fp8Recipe.DELAYED


def test_moe_tp_needs_sequence_parallelism() -> None:
    mixtral = load_model("mixtral-8x7b")
    cfg = TrainConfig(dims=ParallelDims(tp=2, pp=1, dp=4, ep=8, etp=1), micro_batch_size=1, global_batch_size=64,
                      seq_len=4096, sequence_parallel=False, tp_comm_overlap=False)
    assert [r for r, _ in config_problems(mixtral, cfg)] == ["MoE with TP > 1 needs sequence parallelism"]
    code, text = _run(["evaluate", "mixtral-8x7b", "dgx-h100", "--gpus", "64", "--tp", "2", "--pp", "1", "--ep", "8",
                       "--no-sequence-parallel"])
    assert code == 2 and "an MoE model with TP 2 needs sequence parallelism" in text
    # pins that contradict the model: bad input (exit 2), as --vpp with --pp 1 is; it was exit 1, "no plan"
    for cmd in ("evaluate", "solve"):
        code, text = _run([cmd, "mixtral-8x7b", "dgx-h100", "--gpus", "64", "--tp", "2", "--no-sequence-parallel"])
        assert code == 2 and "an MoE model needs sequence parallelism at TP > 1" in text


def test_sequence_parallelism_needs_the_sequence_to_split() -> None:
    code, text = _run(["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp", "1", "--seq-len",
                       "65538", "--global-batch-size", "64"])
    assert code == 2 and "splits the 65538 tokens of a CP rank over TP 8" in text
    code, text = _run(["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "64", "--tp", "8", "--seq-len", "65538"])
    assert code == 2 and "or --no-sequence-parallel (dense models)" in text  # the pin alone cannot work
    code, text = _run(["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "64", "--tp", "8", "--seq-len", "65538",
                       "--no-sequence-parallel", "--time-limit", "20"])
    assert code == 0  # Megatron runs a dense model at TP 8 without SP
    plan = __import__("json").loads(CliRunner().invoke(app, ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "64",
                                                             "--seq-len", "65538", "--json"]).output)["plan"]
    assert plan["sequence_parallel"] and plan["tp"] > 1  # 65538 = 2 x 32769: TP 2, never 4 or 8, with CP 1
    assert 65538 % (plan["tp"] * plan["cp"]) == 0, plan


BASE = ("torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
        "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
        "--seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 64 --bf16 "
        "--swiglu --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights "
        "--disable-bias-linear --tensor-model-parallel-size 2 --sequence-parallel ")


@pytest.mark.parametrize(("extra", "message"), [
    ("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4 --no-overlap-p2p-communication",
     "the interleaved schedule with --no-overlap-p2p-communication needs PP > 2"),
    ("--overlap-grad-reduce --overlap-param-gather", "--overlap-param-gather needs --use-distributed-optimizer"),
    ("--use-distributed-optimizer --overlap-param-gather", "--overlap-param-gather needs --overlap-grad-reduce"),
    ("--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16",
     "--use-precision-aware-optimizer needs --use-distributed-optimizer"),
    ("--context-parallel-size 4 --seq-length 8196", "CP 4 needs seq_len divisible by 2*CP = 8"),
    ("--tp-comm-overlap --tensor-model-parallel-size 1", "--tp-comm-overlap needs sequence parallelism"),
])
def test_from_megatron_refuses_what_megatron_refuses(tmp_path, extra: str, message: str) -> None:
    script = tmp_path / "launch.sh"
    script.write_text(BASE + extra)
    code, text = _run(["evaluate", "llama-3.1-8b", "dgx-h100", "--from-megatron", str(script)])
    assert code == 2 and message in text, text
    assert "refuse" in text


def test_precision_enum_used_by_rules() -> None:  # the FP8 rules read the job's precision, not a string
    cfg = TrainConfig(dims=ParallelDims(tp=1, pp=1, dp=8), micro_batch_size=1, global_batch_size=8, seq_len=4096,
                      precision=Precision.FP8, fp8_recipe=Fp8Recipe.DELAYED, recompute_modules=("layernorm",))
    assert [r for r, _ in config_problems(load_model("llama-3.1-8b"), cfg)] == ["recompute modules Megatron-Core refuses"]
