"""vLLM emitter (golden commands, vLLM's flag rules) and the `vllm serve` parser (round trips, aliases,
removed and unknown flags, bad input).

The rules below are copied from vLLM 0.33.0's argument parser and config checks (flag names,
BooleanOptionalAction negations, "--nnodes > 1 requires (DP*PP*TP) % nnodes == 0", "--max-num-batched-tokens
>= --max-num-seqs", known --quantization / --kv-cache-dtype values). Regenerate the golden files with
`UPDATE_GOLDEN=1 python -m pytest tests/emit/test_vllm.py`.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from autoshard.emit.vllm.parse import parse_vllm
from autoshard.emit.vllm import vllm_command, vllm_node_commands
from autoshard.errors import SpecError
from autoshard.api import evaluate_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

GOLDEN = Path(__file__).resolve().parent / "golden_serve"

# name: (model, cluster, gpus, weight dtype, kv dtype, tp, pp, dp, expert parallel, max_num_seqs)
CASES = {
    "llama8b-h100x1": ("llama-3.1-8b", "dgx-h100", 1, "bf16", "bf16", 1, 1, 1, False, 256),
    "llama70b-fp8-h100x8-tp4dp2": ("llama-3.1-70b", "dgx-h100", 8, "fp8", "fp8", 4, 1, 2, False, 512),
    "llama405b-h100x16-tp8pp2": ("llama-3.1-405b", "dgx-h100", 16, "bf16", "bf16", 8, 2, 1, False, 128),
    "llama405b-fp8-h100x32-tp8pp2dp2": ("llama-3.1-405b", "dgx-h100", 32, "fp8", "fp8", 8, 2, 2, False, 256),
    "llama70b-h100x32-tp4dp8": ("llama-3.1-70b", "dgx-h100", 32, "bf16", "bf16", 4, 1, 8, False, 256),
    "mixtral-h100x8-tp2dp4-ep8": ("mixtral-8x7b", "dgx-h100", 8, "bf16", "bf16", 2, 1, 4, True, 256),
    "deepseekv3-fp8-h200x16-tp8dp2-ep16": ("deepseek-v3", "dgx-h200", 16, "fp8", "bf16", 8, 1, 2, True, 128),
    "qwen235b-int4-l40sx8-tp4pp2": ("qwen3-235b-a22b", "l40s-pcie", 8, "int4", "fp8", 4, 2, 1, False, 64),
}

VLLM_FLAGS = {  # vLLM 0.33.0 flags this emitter may write (primary spellings)
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--data-parallel-size-local",
    "--data-parallel-start-rank",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--enable-expert-parallel",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--headless",
    "--distributed-executor-backend",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--kv-cache-dtype",
    "--quantization",
    "--all2all-backend",  # choices include deepep_low_latency / deepep_high_throughput (vLLM 0.33.0)
    "--speculative-config",
}
SWITCHES = {"--enable-expert-parallel", "--headless"}
KV_CACHE_DTYPES = {"auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"}
QUANTIZATIONS = {
    "awq",
    "awq_marlin",
    "fp8",
    "gptq",
    "gptq_marlin",
    "int8_per_channel_weight_only",
    "compressed-tensors",
    "modelopt",
}


def build(name):
    model, cluster, gpus, wd, kv, tp, pp, dp, ep, seqs = CASES[name]
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=wd, kv_cache_dtype=kv)
    return evaluate_serve(
        load_model(model),
        load_cluster(cluster).with_gpus(gpus),
        job,
        tp=tp,
        pp=pp,
        dp=dp,
        expert_parallel=ep,
        max_num_seqs=seqs,
    )


def flags(command: str) -> dict[str, str | bool]:
    words = shlex.split(command)
    assert words[:2] == ["vllm", "serve"] and not words[2].startswith("-")
    out: dict[str, str | bool] = {}
    i = 3
    while i < len(words):
        name = words[i]
        assert name in VLLM_FLAGS, name
        assert name not in out, f"{name} given twice"
        if name in SWITCHES:
            out[name] = True
            i += 1
        else:
            out[name] = words[i + 1]
            i += 2
    return out


def check_vllm_rules(command: str, world: int, node_rank: int) -> None:
    f = flags(command)
    tp, pp = int(f["--tensor-parallel-size"]), int(f["--pipeline-parallel-size"])
    dp = int(f.get("--data-parallel-size", 1))
    assert tp * pp * dp == world  # GPUs = TP x PP x DP
    assert 0 < float(f["--gpu-memory-utilization"]) <= 1
    assert int(f["--max-num-batched-tokens"]) >= int(f["--max-num-seqs"]) >= 1
    assert f["--kv-cache-dtype"] in KV_CACHE_DTYPES
    assert f.get("--quantization", "fp8") in QUANTIZATIONS
    if "--nnodes" in f:
        nnodes = int(f["--nnodes"])
        assert nnodes > 1 and world % nnodes == 0
        assert int(f["--node-rank"]) == node_rank < nnodes
        assert f["--distributed-executor-backend"] in ("mp", "uni", "external_launcher")
        assert ("--headless" in f) == (node_rank > 0)
    if "--data-parallel-size-local" in f:
        assert 1 <= int(f["--data-parallel-size-local"]) <= dp
        assert ("--headless" in f) == (node_rank > 0) == ("--data-parallel-start-rank" in f)
    if pp > 1:
        assert f.get("--distributed-executor-backend") != "uni"


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    plan = build(name)
    text = "\n".join(vllm_node_commands(plan)) + "\n"
    path = GOLDEN / f"{name}.vllm.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_node_command_follows_vllm_rules(name):
    plan = build(name)
    commands = vllm_node_commands(plan)
    assert len(commands) == max(1, plan.num_gpus // plan.pool.node.gpus_per_node)
    assert vllm_command(plan) == commands[0] == plan.launch["vllm"]
    for rank, command in enumerate(commands):
        check_vllm_rules(command, plan.num_gpus, rank)
    with pytest.raises(ValueError, match="node_rank"):
        vllm_command(plan, node_rank=len(commands))


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip(name):
    plan = build(name)
    for rank, command in enumerate(vllm_node_commands(plan)):
        p = parse_vllm(command)
        assert (p.tp, p.pp, p.dp, p.ep) == (plan.tp, plan.pp, plan.dp, plan.ep)
        assert p.model == plan.model_path
        assert p.max_model_len == plan.max_model_len
        assert p.gpu_memory_utilization == pytest.approx(plan.gpu_memory_utilization)
        assert (p.max_num_seqs, p.max_num_batched_tokens) == (plan.max_num_seqs, plan.max_num_batched_tokens)
        assert p.weight_dtype is plan.job.weight_dtype and p.kv_dtype is plan.job.kv_cache_dtype
        assert p.headless == (rank > 0) and p.warnings == ()


def test_multi_node_forms():
    spanning = vllm_node_commands(build("llama405b-h100x16-tp8pp2"))
    assert len(spanning) == 2 and "--nnodes 2 --node-rank 1" in spanning[1]
    dp_nodes = vllm_node_commands(build("llama70b-h100x32-tp4dp8"))
    assert len(dp_nodes) == 4
    assert "--data-parallel-size 8" in dp_nodes[0] and "--data-parallel-size-local 2" in dp_nodes[0]
    assert "--headless --data-parallel-start-rank 6" in dp_nodes[3]


def test_model_path_is_the_hugging_face_repo():
    assert build("llama8b-h100x1").launch["vllm"].startswith("vllm serve meta-llama/Llama-3.1-8B ")


# --------------------------------------------------------------------------- parser


def test_parser_reads_aliases_inline_values_and_human_ints():
    p = parse_vllm(
        "CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve meta-llama/Llama-3.1-70B -tp=4 -pp 1 -dp 2 -ep "
        "--max_model_len 32k --gpu-memory-utilization=0.85 --max-num-seqs 128 "
        "--max-num-batched-tokens 16K -q fp8 --kv-cache-dtype fp8_e4m3 \\\n --enforce-eager"
    )
    assert (p.model, p.tp, p.pp, p.dp, p.enable_expert_parallel, p.ep) == (
        "meta-llama/Llama-3.1-70B",
        4,
        1,
        2,
        True,
        8,
    )
    assert p.max_model_len == 32000 and p.max_num_batched_tokens == 16384
    assert p.gpu_memory_utilization == 0.85 and p.max_num_seqs == 128
    assert p.weight_dtype is WeightDtype.FP8 and p.kv_dtype is WeightDtype.FP8
    assert p.warnings == ()


def test_parser_reads_the_api_server_entry_point_and_negations():
    p = parse_vllm(
        "python -m vllm.entrypoints.openai.api_server --model /models/llama --tensor-parallel-size 2 "
        "--enable-expert-parallel --no-enable-expert-parallel --max-model-len auto -O3 "
        "--compilation-config '{\"level\": 3}' --served-model-name a b"
    )
    assert p.model == "/models/llama" and p.tp == 2
    assert not p.enable_expert_parallel and p.max_model_len is None
    assert p.gpu_memory_utilization == 0.92  # vLLM's default
    assert parse_vllm("vllm serve m --enable-expert-parallel --disable-expert-parallel").ep == 1


def test_removed_and_unknown_flags_warn_with_the_replacement():
    p = parse_vllm(
        "vllm serve m -tp 2 --swap-space 16 --use-v2-block-manager --num-scheduler-steps 8 "
        "--tnsr-prll-size 4 --max-num-seq 64"
    )
    text = " | ".join(p.warnings)
    assert "--swap-space: not a vLLM 0.33.0 flag any more" in text
    assert "--num-scheduler-steps" in text and "multi-step scheduling" in text
    # far from any flag (a newer vLLM's own?): ignored with a hint
    assert "--tnsr-prll-size: unknown vLLM 0.33.0 flag (did you mean --tensor-parallel-size" in text
    assert "--max-num-seq: accepted by vLLM only as an abbreviation of --max-num-seqs" in text
    assert p.tp == 2 and p.max_num_seqs == 64
    # a misspelling of a flag vLLM has is refused: vLLM would refuse it, and without it the plan is another
    # (--tensor-paralel-size 4 was priced as TP 1 with a note)
    with pytest.raises(SpecError, match=r"--tensor-paralel-size is not a vLLM 0.33.0 flag: did you mean "
                                        r"--tensor-parallel-size\?"):
        parse_vllm("vllm serve m --tensor-paralel-size 4")
    assert any(
        "--speculative-config" in w for w in parse_vllm("vllm serve m --num-speculative-tokens 5").warnings
    )


def test_parser_warns_on_approximated_dtypes():
    p = parse_vllm("vllm serve m --quantization mxfp4 --kv-cache-dtype nvfp4")
    assert p.weight_dtype is WeightDtype.MXFP4 and p.kv_dtype is WeightDtype.FP8  # FP4 weights are modelled
    assert len(p.warnings) == 1  # the nvfp4 KV cache is approximated as fp8
    assert parse_vllm("vllm serve m --quantization modelopt_fp4").weight_dtype is WeightDtype.NVFP4


@pytest.mark.parametrize(
    ("command", "match"),
    [
        ("", "empty command"),
        ("python train.py --tp 2", "not a vLLM launch line"),
        ("vllm serve --tensor-parallel-size 2", "no model given"),
        ("vllm serve m --tensor-parallel-size two", "expects an integer"),
        ("vllm serve m --tensor-parallel-size 0", "at least 1"),
        ("vllm serve m --gpu-memory-utilization 1.5", r"must be in \(0, 1\]"),
        ("vllm serve m --max-num-seqs", "expects a value"),
        ("vllm serve m --enforce-eager=1", "takes no value"),
        ("vllm serve m --max-num-seqs 512 --max-num-batched-tokens 256", "must be >= --max-num-seqs"),
        ("vllm serve m -dp 2 --data-parallel-size-local 4", "exceeds --data-parallel-size"),
        ("vllm serve 'm", "quotes"),
    ],
)
def test_bad_input_is_a_spec_error(command, match):
    with pytest.raises(SpecError, match=match):
        parse_vllm(command)


def test_parsed_job_overrides():
    job = ServeJob(input_len=1000, output_len=1000)
    p = parse_vllm("vllm serve m --max-model-len 8192 --quantization awq_marlin")
    applied = p.apply_to(job)
    assert applied.max_model_len == 8192 and applied.weight_dtype is WeightDtype.INT4
    with pytest.raises(SpecError, match="shorter than the job"):
        parse_vllm("vllm serve m --max-model-len 1024").apply_to(job)
