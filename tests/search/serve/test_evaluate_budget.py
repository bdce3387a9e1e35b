"""`evaluate --from-vllm` on a line whose step budget (--max-num-batched-tokens) cannot carry its batch says
so instead of pricing it silently:

- a DeepEP low-latency engine, whose buffer vLLM 0.33.0 sizes at the budget, with a budget whose buffer
  does not fit is refused (exit 1) naming the buffer and the largest budget that fits, found by bisection
  and checked here by brute force on both sides of it;
- a budget too small for the running requests' decode tokens plus the prompt tokens they bring is priced
  at the requests it carries (vLLM's scheduler serves the decodes first and admits prompts into what is
  left: R requests need R x (1 + input/output) tokens a step), with a warning (the engine still starts).
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autoshard import api
from autoshard.cli import app
from autoshard.costmodel.serve.ep_buffers import VLLM_DEEPEP_NVL_BYTES, deepep_ll_buffer_bytes
from autoshard.costmodel.serve.predict import predict_serve
from autoshard.errors import InfeasibleError
from autoshard.specs import load_cluster, load_model
from autoshard.units import GIB

DSV3 = load_model("deepseek-v3")
LLAMA70 = load_model("llama-3.1-70b")
H100_16 = load_cluster("dgx-h100").with_gpus(16)
H100_8 = load_cluster("dgx-h100").with_gpus(8)


def ll_line(budget: int, seqs: int = 256) -> str:
    return ("vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 1 --data-parallel-size 16 "
            "--enable-expert-parallel --all2all-backend deepep_low_latency "
            f"--max-num-batched-tokens {budget} --max-num-seqs {seqs} --max-model-len 2000")  # the job's shape


def llama_line(budget: int, seqs: int = 256, pp: int = 1) -> str:
    return (f"vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 --pipeline-parallel-size {pp} "
            f"--max-num-seqs {seqs} --max-num-batched-tokens {budget}")


def _dsv3(budget: int, seqs: int = 256):
    return api.evaluate_vllm(DSV3, H100_16, ll_line(budget, seqs), job=api.serve_job_for(DSV3))


# --------------------------------------------------------------------------- DeepEP low-latency buffer


def test_a_deepep_buffer_that_does_not_fit_is_refused_with_the_largest_budget_that_does():
    with pytest.raises(InfeasibleError) as err:
        _dsv3(8192)
    text = str(err.value)
    buffer = (deepep_ll_buffer_bytes(DSV3, 8192, 16) + VLLM_DEEPEP_NVL_BYTES) / GIB
    assert f"{buffer:.1f}" == "114.8"
    assert text.startswith("vLLM sizes its DeepEP low-latency buffer at --max-num-batched-tokens 8,192: 114.8 GiB "
                           "per GPU; weights (55.8 GiB)")
    assert "need 174.9 GiB per GPU; gpu_memory_utilization leaves 73.2 GiB" in text
    assert text.endswith("pass --max-num-batched-tokens 1053 or less (the largest that fits: its buffer takes 15.6 "
                         "GiB and leaves a KV cache for 1 request(s) of 2,000 tokens per DP rank)")
    # brute force on both sides of the bisection's answer
    plan = _dsv3(1053)
    assert plan.max_num_batched_tokens == 1053 and plan.prediction.memory.problem() is None
    with pytest.raises(InfeasibleError, match="pass --max-num-batched-tokens 1053 or less"):
        _dsv3(1054)
    assert plan.prediction.concurrency == 1 < _dsv3(256).prediction.concurrency  # a smaller buffer: more KV cache


def test_no_budget_fits_says_so():
    """--max-num-seqs 4,096 makes vLLM's least budget 4,096, whose buffer (57.9 GiB) alone nearly fills the
    73.2 GiB left: no budget fits, and the fix is fewer running requests or more GPUs."""
    with pytest.raises(InfeasibleError) as err:
        _dsv3(8192, seqs=4096)
    assert str(err.value).endswith("no smaller budget fits either (at 4,096, vLLM's least since it must be >= "
                                   "--max-num-seqs, the buffer takes 57.9 GiB): lower --max-num-seqs or use more GPUs "
                                   "per engine")


def test_cli_exit_1_naming_the_budget():
    result = CliRunner().invoke(app, ["evaluate", "deepseek-v3", "dgx-h100", "--gpus", "16", "--from-vllm",
                                      ll_line(8192)])
    assert result.exit_code == 1
    assert "pass --max-num-batched-tokens 1053 or less" in " ".join(result.output.split())


# --------------------------------------------------------------------------- what the budget carries


def _llama(budget: int, seqs: int = 256, pp: int = 1, input_len: int = 4000, output_len: int = 200):
    job = api.serve_job_for(LLAMA70, input_len, output_len)
    return api.evaluate_vllm(LLAMA70, H100_8, llama_line(budget, seqs, pp), job=job)


def test_a_budget_too_small_for_the_batch_is_priced_at_what_it_carries_with_a_warning():
    """TP4, 4,000 in / 200 out: each running request brings 20 prompt tokens a step besides its decode
    token. At --max-num-batched-tokens 300 the KV cache holds 122 requests (2,562 tokens a step; 119 at 8,192,
    whose larger activations take some of it), and the budget carries floor(300 / 21) = 14."""
    roomy = _llama(8192)
    assert roomy.prediction.concurrency == 119 and not any("cannot carry" in w for w in roomy.warnings)
    plan = _llama(300)
    note = next(w for w in plan.warnings if "cannot carry" in w)
    assert note.startswith("--max-num-batched-tokens 300 cannot carry 122 running requests per DP rank: each step "
                           "must hold their decode tokens plus the prompt tokens they bring (4,000 in / 200 out: "
                           "2,562 tokens per step)")
    assert "predicted at 14 running requests per DP rank" in note
    assert note.endswith("pass --max-num-batched-tokens 2,562 or more to run all 122")
    assert plan.prediction.concurrency == 14
    pool = H100_8.pools[0]
    same = predict_serve(LLAMA70, pool, plan.job, plan.prediction.config, concurrency=14)
    assert plan.prediction.throughput_tokens_per_s == same.throughput_tokens_per_s
    assert plan.prediction.tpot_s == same.tpot_s and plan.prediction.ttft_s == same.ttft_s
    # 14 running requests at a 40 ms TPOT, not 122 at 226 ms with a 219 s TTFT (the silent price before)
    assert plan.throughput_tokens_per_s == pytest.approx(14 / plan.prediction.tpot_s, rel=1e-9)
    assert plan.throughput_tokens_per_s < 0.7 * roomy.throughput_tokens_per_s


def test_the_budget_applies_per_pipeline_micro_batch():
    """PP2: each micro-batch step holds half the running requests, so 300 tokens carry floor(600 / 21) = 28."""
    plan = _llama(300, pp=2)
    assert plan.prediction.concurrency == 28
    assert any("tokens per step per micro-batch of PP 2" in w for w in plan.warnings)


@pytest.mark.parametrize(("budget", "running"), [(210, 10), (209, 9)])
def test_the_boundary_is_exact(budget, running):
    """10 requests of 4,000 in / 200 out need exactly 10 x 21 = 210 tokens a step."""
    plan = _llama(budget, seqs=10)
    assert plan.prediction.concurrency == running
    assert any("cannot carry" in w for w in plan.warnings) is (running < 10)


def test_sglang_lines_are_not_checked_this_way():
    """SGLang runs prefill and decode batches apart (no mixed chunk by default): its --chunked-prefill-size
    does not bound the decode batch, so no such warning."""
    job = api.serve_job_for(LLAMA70, 4000, 200)
    plan = api.evaluate_vllm(LLAMA70, H100_8, "python -m sglang.launch_server --model-path "
                             "meta-llama/Llama-3.1-70B-Instruct --tp 4 --chunked-prefill-size 300", job=job,
                             sglang=True)
    assert not any("cannot carry" in w for w in plan.warnings)
