"""SGLang's FP8 serving on GPUs without FP8 tensor cores, and reading back SGLang's FP8 name. SGLang's FP8
checkpoint loader needs compute capability 8.9 (ModelOptFp8Config.get_min_capability() is 89) and its FP8 MoE
runs e4m3 Triton kernels sm80 lacks, while vLLM runs FP8 weights on A100 through Marlin: `--target sglang`
with FP8 weights on A100 is refused, a vLLM plan there carries no SGLang line and says why. `--from-sglang`
read `--quantization modelopt_fp8` (the name autoshard writes for SGLang) as BF16: 70B FP8 on 4 H200 came
back at 210 output tokens/s instead of the plan's 309."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.emit.serve_args import weight_dtype_of
from autoshard.emit.sglang import parse_sglang, sglang_fp8_problem
from autoshard.specs import WeightDtype, load_cluster, load_model


def _run(args: list[str]) -> tuple[int, str]:
    out = CliRunner().invoke(app, args)
    return out.exit_code, out.output


def test_fp8_capability_rule() -> None:
    a100, h100, l40s = (load_cluster(c).primary.gpu for c in ("dgx-a100-80gb", "dgx-h100", "l40s-pcie"))
    llama31, llama2, mixtral = (load_model(m) for m in ("llama-3.1-70b", "llama-2-70b", "mixtral-8x7b"))
    assert "ModelOpt FP8 checkpoint" in sglang_fp8_problem([a100], llama31, WeightDtype.FP8)  # nvidia/...-FP8
    assert "FP8 MoE kernels" in sglang_fp8_problem([a100], mixtral, WeightDtype.FP8)
    # online FP8 on the BF16 checkpoint: Marlin on sm80 (Fp8Config's minimum capability is 80)
    assert sglang_fp8_problem([a100], llama2, WeightDtype.FP8) is None
    assert sglang_fp8_problem([a100], llama31, WeightDtype.BF16) is None
    assert sglang_fp8_problem([h100], llama31, WeightDtype.FP8) is None
    assert sglang_fp8_problem([l40s], mixtral, WeightDtype.FP8) is None


def test_a100_fp8_plans_run_vllm_only() -> None:
    base = ["solve", "llama-3.1-70b", "dgx-a100-80gb", "--gpus", "16", "--mode", "serve", "--weight-dtype", "fp8"]
    code, text = _run([*base, "--target", "sglang"])
    assert code == 2 and "SGLang cannot serve this model's FP8 weights on A100-SXM4-80GB" in " ".join(text.split())
    code, text = _run(["solve", "llama-2-70b", "dgx-a100-80gb", "--gpus", "8", "--mode", "serve", "--weight-dtype",
                       "fp8", "--target", "sglang", "--json"])
    assert code == 0 and "--quantization fp8" in json.loads(text)["launch"]["sglang"]  # online FP8: Marlin
    code, text = _run([*base, "--json"])
    plan = json.loads(text)
    assert code == 0 and "vllm" in plan["launch"] and "sglang" not in plan["launch"]
    assert "would not start" in plan["engine"]["other"]["note"]
    code, text = _run(["solve", "llama-3.1-70b", "dgx-h100", "--gpus", "16", "--mode", "serve", "--weight-dtype", "fp8",
                       "--json"])
    assert code == 0 and "sglang" in json.loads(text)["launch"]  # sm90: both engines


def test_sglang_fp8_name_reads_back_as_fp8() -> None:
    line = ("python -m sglang.launch_server --model-path nvidia/Llama-3.1-70B-Instruct-FP8 --tp-size 2 --pp-size 2 "
            "--context-length 33000 --quantization modelopt_fp8")
    parsed = parse_sglang(line)
    assert parsed.quantization == "modelopt" and weight_dtype_of(parsed.quantization)[0] is WeightDtype.FP8
    assert not any("modelled as bf16" in w for w in parsed.warnings)


def test_sglang_mem_fraction_round_trip() -> None:
    """--mem-fraction-static is weights + KV pool (emit.sglang.mem_fraction_static subtracts the activations
    and buffers); --from-sglang read it as the whole budget: Qwen3-235B on 8 H100 planned at 4,703 output
    tokens/s read its own line back at 3,989 (review of 2026-11-24). It adds them back on top now."""
    code, text = _run(["solve", "qwen3-235b-a22b", "dgx-h100", "--gpus", "8", "--mode", "serve", "--target", "sglang",
                       "--json"])
    plan = json.loads(text)
    line = plan["launch"]["sglang"]
    assert code == 0 and "--mem-fraction-static" in line
    code, text = _run(["evaluate", "qwen3-235b-a22b", "dgx-h100", "--gpus", "8", "--from-sglang", line, "--json"])
    back = json.loads(text)
    assert code == 0
    assert back["predicted"]["tokens_per_s"] == pytest.approx(plan["predicted"]["tokens_per_s"], rel=0.01)
