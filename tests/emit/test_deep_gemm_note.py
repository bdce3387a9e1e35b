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
    """Disaggregated plans carry the note too, for the role whose experts are priced there: Qwen3-235B
    FP8 on 8 H100 splits into an attention-DP 2 + EP 2 prefill instance (DeepEP's path: no note) and a
    TP 4 decode instance (fused_moe at TP 4: DeepGEMM)."""
    from autoshard.search.serve.solve import solve_serve
    from autoshard.specs import load_cluster, load_model
    from autoshard.specs.job import ServeJob, WeightDtype

    plan = solve_serve(load_model("qwen3-235b-a22b"), load_cluster("dgx-h100").with_gpus(8),
                       ServeJob(input_len=2000, output_len=200, weight_dtype=WeightDtype.FP8), pins=None, top_k=1,
                       time_limit_s=30, num_workers=1, disaggregate="on")[0]
    shapes = {r.role: (r.tp, r.ep, r.attention_dp) for r in plan.roles}
    assert shapes["prefill"][1] > 1 and shapes["prefill"][2] > 1
    assert shapes["decode"][0] not in (1, 8) and shapes["decode"][1] == 1
    notes = [w for w in plan.warnings if "priced on DeepGEMM" in w]
    assert len(notes) == 1 and notes[0].startswith("the decode instances' block-FP8 experts")
