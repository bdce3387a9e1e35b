"""A serving plan whose block-FP8 experts are priced on DeepGEMM says so. vLLM 0.33.0's FP8 MoE oracle
runs TP-sharded block-FP8 experts on Hopper on Triton ("prefer Triton for TP and FI CUTLASS for EP",
fused_moe/oracle/fp8.py:122-132): only its expert-parallel engines are priced on DeepGEMM, the nearest
kernel modelled to FlashInfer's CUTLASS one; SGLang's TP MoE path runs Triton's fused_moe too, which
prices differently (tests/emit/test_sglang_moe_runner.py)."""

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
    (VLLM + " --pipeline-parallel-size 2", False, 2, False),  # vLLM 0.33.0: Triton for TP on Hopper
    (VLLM + " --pipeline-parallel-size 2 --enable-expert-parallel", False, 2, True),  # EP: FI CUTLASS ~ DeepGEMM
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


def test_a_split_plan_of_tp_sharded_experts_runs_triton() -> None:
    """Qwen3-30B-A3B FP8 on 8 H100 split into prefill and decode instances: TP-sharded roles run vLLM
    0.33.0's Triton path for block-FP8 experts on Hopper (no DeepGEMM, no note), attention-DP + EP roles
    DeepEP's path (no note). Under vLLM 0.11.0 the TP 1 prefill instances took DeepGEMM (the experts'
    768-wide intermediate passes its shape rule) and carried the note."""
    from autoshard.search.serve.solve import solve_serve
    from autoshard.specs import load_cluster, load_model
    from autoshard.specs.job import ServeJob, WeightDtype

    plan = solve_serve(load_model("qwen3-30b-a3b"), load_cluster("dgx-h100").with_gpus(8),
                       ServeJob(input_len=2000, output_len=200, weight_dtype=WeightDtype.FP8), pins=None, top_k=1,
                       time_limit_s=30, num_workers=1, disaggregate="on")[0]
    assert plan.disaggregated and any(not r.prediction.config.expert_parallel for r in plan.roles)
    for role in plan.roles:
        cfg = role.prediction.config
        assert cfg.deep_gemm is (cfg.expert_parallel or False)
    assert not [w for w in plan.warnings if "priced on DeepGEMM" in w]
