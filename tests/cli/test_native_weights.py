"""Serving plans price the weights the launch command loads.

A model whose own repository holds only quantized weights (DeepSeek-V3's and Kimi K2's block-scaled FP8,
an imported AWQ config.json) is served as those weights by default, and a weight dtype the launch command
would not load from it is refused: `vllm serve deepseek-ai/DeepSeek-V3` loads FP8 whatever the plan says,
so a BF16 plan (twice the weight memory) would not describe the run. It used to be planned as BF16."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoshard.api import serve_job_for
from autoshard.api_serve import repo_weights
from autoshard.cli import app
from autoshard.emit.vllm.command import native_checkpoint
from autoshard.errors import SpecError
from autoshard.specs import load_model
from autoshard.specs.job import WeightDtype

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
FAST = ["--time-limit", "5", "--workers", "1"]


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def awq_config(tmp: Path) -> Path:
    cfg = json.loads((HF / "qwen2.5-72b-instruct.json").read_text())
    cfg["_name_or_path"] = "Qwen/Qwen2.5-72B-Instruct-AWQ"
    cfg["quantization_config"] = {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm",
                                  "zero_point": True}
    path = tmp / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_deepseek_v3_serves_its_fp8_weights_by_default() -> None:
    model = load_model("deepseek-v3")
    own = native_checkpoint(model)
    assert own is not None and own.repo == "deepseek-ai/DeepSeek-V3" and own.weights is WeightDtype.FP8
    assert serve_job_for(model).weight_dtype is WeightDtype.FP8
    code, out, _ = run("solve", "deepseek-v3", "dgx-h200", "--gpus", "16", "--mode", "serve", "--json",
                       "--disaggregate", "off", *FAST)
    assert code == 0
    plan = json.loads(out)
    assert plan["plan"]["weight_dtype"] == "fp8"
    assert "vllm serve deepseek-ai/DeepSeek-V3 " in plan["launch"]["vllm"]


def test_bf16_from_an_fp8_only_repository_is_refused() -> None:
    code, _, err = run("solve", "deepseek-v3", "dgx-h200", "--gpus", "16", "--mode", "serve",
                       "--weight-dtype", "bf16", *FAST)
    assert code == 2
    assert "--weight-dtype" in err and "deepseek-ai/DeepSeek-V3 publishes fp8 weights, not bf16" in err
    assert "use --weight-dtype fp8" in err


def test_models_without_a_quantized_own_repository_keep_bf16() -> None:
    model = load_model("qwen3-235b-a22b")  # lists FP8 and GPTQ-Int4 checkpoints under other repos
    assert model.checkpoints and native_checkpoint(model) is None
    assert serve_job_for(model).weight_dtype is WeightDtype.BF16
    assert serve_job_for(model, weight_dtype="int4").weight_dtype is WeightDtype.INT4


def test_imported_kimi_k2_plans_fp8() -> None:
    model = load_model(HF / "kimi-k2-instruct.json")
    assert serve_job_for(model).weight_dtype is WeightDtype.FP8
    with pytest.raises(SpecError, match="moonshotai/Kimi-K2-Instruct publishes fp8 weights"):
        serve_job_for(model, weight_dtype="bf16")


def test_imported_awq_config_plans_int4_and_refuses_fp8(tmp_path: Path) -> None:
    path = awq_config(tmp_path)
    code, out, _ = run("solve", str(path), "dgx-h100", "--gpus", "8", "--mode", "serve", "--json",
                       "--disaggregate", "off", *FAST)
    assert code == 0
    plan = json.loads(out)
    assert plan["plan"]["weight_dtype"] == "int4"
    assert "Qwen/Qwen2.5-72B-Instruct-AWQ" in plan["launch"]["vllm"]
    assert "--quantization awq_marlin" in plan["launch"]["vllm"]
    code, _, err = run("solve", str(path), "dgx-h100", "--gpus", "8", "--mode", "serve",
                       "--weight-dtype", "fp8", *FAST)
    assert code == 2 and "publishes int4 weights (awq_marlin), not fp8" in err


def test_study_refuses_bf16_from_an_fp8_only_repository(tmp_path: Path) -> None:
    code, _, err = run("study", "deepseek-v3", "--cluster", "dgx-h200", "--gpus", "16", "--mode", "serve",
                       "--precision", "bf16", "--time-limit", "5", "--jobs", "1")
    assert code == 2 and "--precision" in err and "not bf16" in err


# --- evaluate --from-vllm/--from-sglang without --quantization: the engines read the repository's
# quantization_config, so the weights are the listed checkpoint's, else what the release's name says
# (they were priced as BF16: Qwen3-Coder-480B-FP8 on 8 H200 "did not fit" at 131.5 GiB of weights)
@pytest.mark.parametrize(("repo", "want"), [
    ("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", (WeightDtype.FP8, "fp8")),
    ("RedHatAI/Qwen2.5-72B-Instruct-FP8-dynamic", (WeightDtype.FP8, "fp8")),
    ("Qwen/Qwen2.5-72B-Instruct-AWQ", (WeightDtype.INT4, "awq_marlin")),
    ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4", (WeightDtype.INT4, "gptq_marlin")),
    ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int8", (WeightDtype.INT8, "gptq_marlin")),
    ("RedHatAI/Meta-Llama-3.1-70B-Instruct-quantized.w4a16", (WeightDtype.INT4, "compressed-tensors")),
    ("nvidia/DeepSeek-R1-0528-FP4", (WeightDtype.NVFP4, "modelopt_fp4")),
    ("nvidia/Llama-3.3-70B-Instruct-NVFP4", (WeightDtype.NVFP4, "modelopt_fp4")),
    ("Qwen/Qwen2.5-72B-Instruct", None),
    ("meta-llama/Llama-3.1-8B", None),
    ("mistralai/Mixtral-8x22B-v0.1", None),
])
def test_repo_names_state_their_weights(repo: str, want) -> None:
    assert repo_weights(repo) == want


def test_from_vllm_loads_the_listed_checkpoint_as_its_dtype() -> None:
    code, out, _ = run("evaluate", str(HF / "kimi-k2-instruct.json"), "dgx-h200", "--gpus", "16", "--json",
                       "--from-vllm", "vllm serve moonshotai/Kimi-K2-Instruct --trust-remote-code "
                       "--tensor-parallel-size 8 --pipeline-parallel-size 2 --max-model-len 32768")
    assert code == 0
    plan = json.loads(out)
    assert plan["plan"]["weight_dtype"] == "fp8"
    assert not any("its name says" in w for w in plan["warnings"])  # listed: no guess


def test_from_vllm_reads_the_weights_from_the_release_name() -> None:
    cmd = ("vllm serve Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8 --max-model-len 131072 --enable-expert-parallel "
           "--data-parallel-size 8 --enable-auto-tool-choice --tool-call-parser qwen3_coder")
    code, out, err = run("evaluate", str(HF / "qwen3-coder-480b-a35b.json"), "dgx-h200", "--gpus", "8", "--json",
                         "--from-vllm", cmd)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["plan"]["weight_dtype"] == "fp8"
    assert any("its name says fp8 weights: priced as fp8; pass --quantization" in w for w in plan["warnings"])


@pytest.mark.parametrize(("repo", "flag"), [
    # RedHatAI's llm-compressor releases are compressed-tensors, not fp8: vLLM refuses a --quantization
    # that differs from the checkpoint's quant_method, so a method guessed from the name is not written
    ("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8-dynamic", None),
    ("Qwen/Qwen2.5-72B-Instruct-AWQ", None),
    # the listed checkpoint's method is a stated fact: written as before
    ("nvidia/Llama-3.1-70B-Instruct-FP8", "modelopt"),
])
def test_a_guessed_method_is_not_written_back(repo: str, flag: str | None) -> None:
    code, out, err = run("evaluate", "llama-3.1-70b", "dgx-h100", "--json", "--from-vllm",
                         f"vllm serve {repo} --tensor-parallel-size 4")
    assert code == 0, err
    launch = json.loads(out)["launch"]
    assert launch["vllm"].startswith(f"vllm serve {repo} ")
    if flag is None:
        assert "--quantization" not in launch["vllm"] and "--quantization" not in launch["sglang"]
    else:
        assert launch["vllm"].endswith(f"--quantization {flag}")
        assert "--quantization modelopt_fp8" in launch["sglang"]
