"""SGLang's TP-sharded MoE layers run Triton's fused_moe for block-scaled FP8 experts: its
`Fp8MoEMethod.create_moe_runner` resolves --moe-runner-backend auto to DeepGEMM only behind DeepEP or
Mooncake all-to-all. `evaluate --from-sglang` therefore prices those experts with `deep_gemm=False`,
where the same engine launched by vLLM (DeepGEMM installed) hands >= 128-token steps to DeepGEMM."""

from __future__ import annotations

import dataclasses

import pytest

from autoshard import api
from autoshard.costmodel.serve.predict import predict_serve
from autoshard.emit.sglang.parse import parse_sglang

SGLANG = "python -m sglang.launch_server --model-path Qwen/Qwen3-235B-A22B-FP8 --tp 4"
VLLM = "vllm serve Qwen/Qwen3-235B-A22B-FP8 --tensor-parallel-size 4"


@pytest.mark.parametrize(("extra", "deep_gemm"), [
    ("", False),
    (" --moe-runner-backend triton", False),
    (" --moe-runner-backend deep_gemm", True),
    (" --moe-a2a-backend deepep", True),
    (" --moe-runner-backend=deep_gemm", True),
])
def test_parse_reads_the_moe_runner(extra: str, deep_gemm: bool) -> None:
    parsed = parse_sglang(SGLANG + extra)
    assert parsed.deep_gemm is deep_gemm
    assert not any("moe-runner-backend" in w or "moe-a2a-backend" in w for w in parsed.warnings)


def test_unmodelled_runner_is_said() -> None:
    parsed = parse_sglang(SGLANG + " --moe-runner-backend flashinfer_cutlass")
    assert parsed.deep_gemm is False
    assert any("flashinfer_cutlass is not modelled" in w for w in parsed.warnings)


def _evaluate(command: str, *, sglang: bool):
    return api.evaluate_serve_command(command, "qwen3-235b-a22b", "dgx-h100", None, input_len=2048,
                                      output_len=128, sglang=sglang)


def test_sglang_tp4_block_fp8_experts_priced_on_triton() -> None:
    sg, vl = _evaluate(SGLANG, sglang=True), _evaluate(VLLM, sglang=False)
    # vLLM 0.33.0 puts Triton first for TP-sharded block-FP8 experts on Hopper (oracle/fp8.py:122-132)
    assert sg.prediction.config.deep_gemm is False and vl.prediction.config.deep_gemm is False
    # the SGLang engine is the vLLM one with Triton experts, NVLS off as SGLang sets it: nothing else differs
    same = predict_serve(sg.model, sg.pool, sg.job, dataclasses.replace(vl.prediction.config, deep_gemm=False,
                                                                        nccl_nvls=False, engine="sglang"))
    assert sg.prediction.tokens_per_s_per_gpu == pytest.approx(same.tokens_per_s_per_gpu, rel=1e-12)
    # at TP 4 the experts are 384 wide per GPU: vLLM v0.11.0 keeps them on Triton too (N <= 512)
    assert sg.prediction.ttft_s == pytest.approx(vl.prediction.ttft_s, rel=1e-12)
    # SGLang's DeepGEMM runner takes them (no width rule): 2,048-token prompts prefill in >= 128-token steps
    sg_dg = _evaluate(SGLANG + " --moe-runner-backend deep_gemm", sglang=True)
    assert sg_dg.prediction.config.deep_gemm is True
    assert sg_dg.prediction.ttft_s < sg.prediction.ttft_s / 1.02


def test_tp2_block_fp8_experts_priced_on_triton_in_both_engines() -> None:
    """At TP 2 (768-wide experts per GPU) vLLM 0.11.0 with DeepGEMM took the >= 128-token steps; vLLM
    0.33.0 runs Triton for TP-sharded block-FP8 experts on Hopper, as SGLang's default runner does: the
    same prefill (the engines still differ in NVLS, which prefill does not see here)."""
    sg = _evaluate(SGLANG.replace("--tp 4", "--tp 2 --pp-size 2"), sglang=True)
    vl = _evaluate(VLLM.replace("--tensor-parallel-size 4", "--tensor-parallel-size 2 --pipeline-parallel-size 2"),
                   sglang=False)
    assert (sg.tp, sg.pp, vl.tp, vl.pp) == (2, 2, 2, 2)
    assert vl.prediction.config.deep_gemm is False
    dg = predict_serve(vl.model, vl.pool, vl.job, dataclasses.replace(vl.prediction.config, deep_gemm=True))
    assert vl.prediction.ttft_s > dg.ttft_s * 1.02  # what DeepGEMM (vLLM 0.11.0's pick) would have saved


@pytest.mark.parametrize(("extra", "noted"), [
    (" --attn-dp-size 2 --ep-size 8", True),  # SGLang's all-gather path: not what is priced
    (" --attn-dp-size 2 --ep-size 8 --moe-a2a-backend deepep", False),  # DeepEP, as priced
    (" --ep-size 8", False),  # no attention DP: experts over the TP group, no dispatch to price
])
def test_attention_dp_without_deepep_is_said(extra: str, noted: bool) -> None:
    parsed = parse_sglang(SGLANG.replace("--tp 4", "--tp 8") + extra)
    assert any("is not modelled" in w and "--moe-a2a-backend" in w for w in parsed.warnings) is noted
