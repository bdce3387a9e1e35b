"""A serving plan whose block-FP8 experts are priced on DeepGEMM says so: only vLLM with DeepGEMM
installed runs them there (fused_moe hands >= 128-token steps of experts wider than 512 per GPU to it); a PyPI install and
SGLang's TP MoE path run Triton's fused_moe, which prices differently (tests/emit/test_sglang_moe_runner.py)."""

from __future__ import annotations

import pytest

from autoshard import api

SGLANG = "python -m sglang.launch_server --model-path Qwen/Qwen3-235B-A22B-FP8 --tp {tp}"
VLLM = "vllm serve Qwen/Qwen3-235B-A22B-FP8 --tensor-parallel-size {tp}"


def _noted(command: str, *, sglang: bool, model: str = "qwen3-235b-a22b", cluster: str = "dgx-h100") -> bool:
    plan = api.evaluate_serve_command(command, model, cluster, None, input_len=2048, output_len=128, sglang=sglang)
    return any("priced on DeepGEMM" in w for w in plan.warnings)


@pytest.mark.parametrize(("command", "sglang", "tp", "noted"), [
    (VLLM, False, 4, False),  # 384 wide: vLLM v0.11.0 keeps Triton for N <= 512 (_valid_deep_gemm)
    (VLLM, False, 8, False),  # TP 8: Triton (192 wide; vLLM PR #29346)
    (VLLM + " --pipeline-parallel-size 2", False, 2, True),  # 768 wide per GPU at TP 2: DeepGEMM priced
    (SGLANG, True, 4, False),  # SGLang's TP MoE: Triton, and priced so
    (SGLANG + " --moe-runner-backend deep_gemm", True, 4, True),
])
def test_the_note_follows_the_priced_kernel(command: str, sglang: bool, tp: int, noted: bool) -> None:
    assert _noted(command.format(tp=tp), sglang=sglang) is noted


def test_no_note_without_block_fp8_experts() -> None:
    assert not _noted("vllm serve Qwen/Qwen3-235B-A22B --tensor-parallel-size 4 --pipeline-parallel-size 2",
                      sglang=False)  # BF16 experts at TP 4
    assert not _noted("vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 --quantization fp8",
                      sglang=False, model="llama-3.1-70b")  # dense


def test_a_split_plan_names_the_role_priced_on_deep_gemm() -> None:
    """Disaggregated plans carry the note too, for the role whose experts are priced there: Qwen3-30B-A3B
    FP8 on 8 H100 splits into TP 1 prefill instances (fused_moe at TP 1: DeepGEMM, the experts' 768-wide
    intermediate passes vLLM's shape rule) and an attention-DP + EP decode instance (DeepEP's path: no
    note). Qwen3-235B's TP 4 roles no longer qualify: 1,536 / 4 = 384 columns per GPU is below
    DeepGEMM's 512 (vLLM v0.11.0 deep_gemm_moe.py), so they run Triton and carry no note."""
    from autoshard.search.serve.solve import solve_serve
    from autoshard.specs import load_cluster, load_model
    from autoshard.specs.job import ServeJob, WeightDtype

    plan = solve_serve(load_model("qwen3-30b-a3b"), load_cluster("dgx-h100").with_gpus(8),
                       ServeJob(input_len=2000, output_len=200, weight_dtype=WeightDtype.FP8), pins=None, top_k=1,
                       time_limit_s=30, num_workers=1, disaggregate="on")[0]
    shapes = {r.role: (r.tp, r.ep, r.attention_dp) for r in plan.roles}
    assert shapes["prefill"] == (1, 1, 1)
    assert shapes["decode"][1] > 1 and shapes["decode"][2] > 1
    notes = [w for w in plan.warnings if "priced on DeepGEMM" in w]
    assert len(notes) == 1 and notes[0].startswith("the prefill instances' block-FP8 experts")
