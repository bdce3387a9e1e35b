"""Serving `evaluate` reads the request shape (--input-len, --output-len, --concurrency) and the
launch's --max-model-len / --max-num-seqs (vLLM) or --context-length / --max-running-requests
(SGLang); FP4 (NVFP4/MXFP4) weights run on Blackwell's FP4 tensor cores."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.costmodel.serve.weights import total_weight_bytes
from autoshard.emit.sglang.parse import parse_sglang
from autoshard.emit.sglang import runs_deepep, sglang_node_commands
from autoshard.search.serve.solve import evaluate_serve
from autoshard.api import serve_job_for
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype

LLAMA70 = load_model("llama-3.1-70b")
VLLM = "vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 8"
SGLANG = "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct --tp-size 8"


def _eval(*args: str) -> tuple[int, dict | None, str]:
    res = CliRunner().invoke(app, ["evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", "8", "--json", *args])
    try:
        return res.exit_code, json.loads(res.stdout), res.stderr
    except ValueError:
        return res.exit_code, None, res.stderr


def test_request_shape_from_the_command_line() -> None:
    code, plan, _ = _eval("--input-len", "4000", "--output-len", "200", "--from-vllm", VLLM + " --max-model-len 8192")
    assert code == 0
    serve = plan["predicted"]["serve"]
    assert (serve["input_len"], serve["output_len"], serve["max_model_len"]) == (4000, 200, 8192)


def test_default_shape_shrinks_to_the_max_model_len() -> None:
    """--max-model-len 1024 cannot hold the 1000 + 1000 default: predicted at 512 + 512, said so."""
    code, plan, _ = _eval("--from-vllm", VLLM + " --max-model-len 1024")
    assert code == 0
    serve = plan["predicted"]["serve"]
    assert (serve["input_len"], serve["output_len"], serve["max_model_len"]) == (512, 512, 1024)
    assert any("does not fit the command's max model length 1024" in w for w in plan["warnings"])


def test_given_shape_longer_than_max_model_len_is_refused() -> None:
    code, _, stderr = _eval("--input-len", "2000", "--output-len", "2000", "--from-vllm", VLLM + " --max-model-len 1024")
    assert code == 2 and "max-model-len 1024" in stderr


def test_concurrency_sets_the_operating_point() -> None:
    low = _eval("--concurrency", "1", "--from-vllm", VLLM)[1]
    high = _eval("--concurrency", "64", "--from-vllm", VLLM)[1]
    assert low["plan"]["concurrency_per_dp_rank"] == 1 and high["plan"]["concurrency_per_dp_rank"] == 64
    lo, hi = low["predicted"]["serve"], high["predicted"]["serve"]
    assert hi["throughput_tokens_per_s"] > 10 * lo["throughput_tokens_per_s"]
    assert lo["tpot_s"] < hi["tpot_s"]


def test_max_num_seqs_caps_concurrency() -> None:
    plan = _eval("--concurrency", "512", "--from-vllm", VLLM + " --max-num-seqs 48")[1]
    assert plan["plan"]["concurrency_per_dp_rank"] == 48
    assert any("exceeds what max-num-seqs" in w for w in plan["warnings"])


def test_sglang_command_is_read() -> None:
    code, plan, _ = _eval("--input-len", "2000", "--output-len", "500", "--from-sglang",
                          SGLANG + " --context-length 4096 --max-running-requests 96 --kv-cache-dtype fp8_e4m3")
    assert code == 0
    assert plan["plan"]["tp"] == 8 and plan["plan"]["concurrency_per_dp_rank"] <= 96
    assert '"kv_cache_dtype": "fp8"' in json.dumps(plan)


def test_serving_options_need_a_serving_plan() -> None:
    res = CliRunner().invoke(app, ["evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", "8", "--tp", "8", "--pp", "1",
                                   "--concurrency", "8"])
    assert res.exit_code == 2 and "--from-vllm or --from-sglang" in res.stderr


@pytest.mark.parametrize(("model", "gpus", "kwargs"), [
    ("llama-3.1-70b", 8, dict(tp=8)),
    ("llama-3.1-8b", 8, dict(tp=2, dp=4)),
    ("qwen3-30b-a3b", 8, dict(tp=4, dp=2, expert_parallel=True)),
])
def test_sglang_launch_reads_back_to_the_plan(model: str, gpus: int, kwargs: dict) -> None:
    spec = load_model(model)
    plan = evaluate_serve(spec, load_cluster("dgx-h100").with_gpus(gpus), serve_job_for(spec), **kwargs)
    (command,) = sglang_node_commands(plan)
    parsed = parse_sglang(command)
    assert (parsed.tp, parsed.pp, parsed.dp, parsed.enable_expert_parallel) == (
        plan.tp, plan.pp, plan.dp, plan.expert_parallel)
    assert parsed.max_model_len == plan.max_model_len
    # an SGLang line on DeepEP runs at most the 256 requests per rank its low-latency buffer holds (#13)
    assert parsed.max_num_seqs == (min(plan.max_num_seqs, 256) if runs_deepep(plan) else plan.max_num_seqs)
    assert parsed.max_num_batched_tokens == plan.max_num_batched_tokens


@pytest.mark.parametrize(("dtype", "bytes_per"), [(WeightDtype.NVFP4, 0.5625), (WeightDtype.MXFP4, 0.53125)])
def test_fp4_weight_bytes(dtype: WeightDtype, bytes_per: float) -> None:
    """E2M1 values (0.5 B) plus block scales: NVFP4 one E4M3 byte per 16, MXFP4 one E8M0 byte per 32."""
    assert dtype.bytes_per_param == bytes_per
    bf16 = total_weight_bytes(LLAMA70, WeightDtype.BF16)
    fp4 = total_weight_bytes(LLAMA70, dtype)
    assert fp4 < bf16 * bytes_per / 2 * 1.05 + 2 * LLAMA70.vocab_size * LLAMA70.hidden_size * 2


def test_fp4_runs_on_fp4_tensor_cores_only_on_blackwell() -> None:
    # vLLM cannot quantize to NVFP4 online: the model needs a published NVFP4 checkpoint to launch from
    # (a stand-in repo here; the physics does not depend on which one)
    from autoshard.specs.model import Checkpoint

    model = LLAMA70.model_copy(update={"checkpoints": (*LLAMA70.checkpoints, Checkpoint(
        weights=WeightDtype.NVFP4, repo="example/Llama-3.1-70B-NVFP4", quantization="modelopt_fp4"))})

    def tok_s(cluster: str, dtype: str) -> float:
        job = serve_job_for(model, weight_dtype=dtype)
        return evaluate_serve(model, load_cluster(cluster).with_gpus(8), job, tp=8,
                              concurrency=256).prediction.tokens_per_s_per_gpu

    b300 = {d: tok_s("dgx-b300", d) for d in ("bf16", "fp8", "nvfp4")}
    assert b300["nvfp4"] > b300["fp8"] > b300["bf16"]
    h100 = {d: tok_s("dgx-h100", d) for d in ("fp8", "nvfp4")}
    assert h100["nvfp4"] < h100["fp8"] * 1.5  # weight-only (W4A16) on Hopper: no FP4 math
