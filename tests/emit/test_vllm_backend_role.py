"""`evaluate --from-vllm` prices the all-to-all backend a vLLM line runs (vLLM 0.33.0 runs one backend
per engine, every step on it): `deepep_high_throughput` as DeepEP's normal kernels on every step, their
fixed 1-2 GiB buffers and no CUDA graphs (the prefill role's pricing), not as the low-latency engine;
a `deepep_low_latency` line without --max-num-batched-tokens at vLLM's own default of 256."""

from __future__ import annotations

import pytest

from autoshard.api_serve import evaluate_vllm
from autoshard.costmodel.serve.ep_buffers import VLLM_DEEPEP_NVL_BYTES, deepep_ll_buffer_bytes
from autoshard.errors import SpecError
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

DSV3 = load_model("deepseek-v3")
H100x16 = load_cluster("dgx-h100").with_gpus(16)
JOB = ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8)
LINE = ("vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 1 --data-parallel-size 16 "
        "--enable-expert-parallel --all2all-backend {backend} --max-model-len 2000 --max-num-seqs 128 "
        "--max-num-batched-tokens 256")


def _evaluate(backend: str, line: str = LINE):
    return evaluate_vllm(DSV3, H100x16, line.format(backend=backend), job=JOB)


def test_high_throughput_line_is_priced_on_the_normal_kernels():
    ht, ll = _evaluate("deepep_high_throughput"), _evaluate("deepep_low_latency")
    hcfg, lcfg = ht.prediction.config, ll.prediction.config
    assert (hcfg.role, lcfg.role) == ("prefill", "aggregated")
    # DeepEP's normal-mode Buffer: 1 GiB NVLink + 1 GiB RDMA across the two nodes; no CUDA graph pool
    assert ht.prediction.memory.ep_buffer_bytes == 2 * VLLM_DEEPEP_NVL_BYTES
    assert ht.prediction.memory.cuda_graph_bytes == 0.0 < ll.prediction.memory.cuda_graph_bytes
    assert ll.prediction.memory.ep_buffer_bytes == deepep_ll_buffer_bytes(DSV3, 256, 16) + VLLM_DEEPEP_NVL_BYTES
    assert ht.prediction.decode.ep_comm_s != ll.prediction.decode.ep_comm_s  # another dispatch path
    assert any("deepep_high_throughput: priced as vLLM runs it" in w for w in ht.warnings)
    assert not any("deepep" in w for w in ll.warnings)
    # its relaunch line names the backend it was priced for, and reads back to the same figures
    assert "--all2all-backend deepep_high_throughput" in ht.launch["vllm"]
    again = evaluate_vllm(DSV3, H100x16, ht.launch["vllm"], job=JOB)
    assert again.throughput_tokens_per_s == pytest.approx(ht.throughput_tokens_per_s, rel=1e-12)


def test_other_backends_keep_their_not_modelled_note():
    agrs = _evaluate("allgather_reducescatter")  # priced as it runs (`costmodel.serve.vllm_dp_moe`)
    assert (agrs.prediction.config.role, agrs.prediction.config.all2all_backend) == ("aggregated", "allgather_reducescatter")
    assert any("allgather_reducescatter" in w and "priced as it runs" in w for w in agrs.warnings)
    assert agrs.prediction.memory.ep_buffer_bytes == 0
    plan = _evaluate("flashinfer_nvlink_two_sided")
    assert (plan.prediction.config.all2all_backend, plan.prediction.config.moe_dp_chunk) == (None, 256)
    assert any("flashinfer_nvlink_two_sided" in w and "not modelled" in w for w in plan.warnings)


def test_low_latency_line_without_a_budget_runs_vllms_256():
    line = LINE.replace(" --max-num-batched-tokens 256", "").replace(" --max-num-seqs 128", "")
    plan = _evaluate("deepep_low_latency", line)
    cfg = plan.prediction.config
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == (256, 256)  # vLLM caps the default seqs at it
    assert plan.prediction.memory.ep_buffer_bytes == deepep_ll_buffer_bytes(DSV3, 256, 16) + VLLM_DEEPEP_NVL_BYTES
    with pytest.raises(SpecError, match="--max-num-batched-tokens 512"):
        _evaluate("deepep_low_latency", line.replace("--max-model-len 2000", "--max-model-len 2000 --max-num-seqs 300"))


def test_deepep_backend_without_expert_parallelism_is_the_naive_gather():
    """Without --enable-expert-parallel vLLM's DP on an MoE model gathers through the naive prepare/finalize
    whatever the backend (`costmodel.serve.vllm_dp_moe`): a DeepEP backend there is noted, priced as the
    default all-gather / reduce-scatter, and the relaunch line drops it."""
    line = (LINE.replace("--enable-expert-parallel ", "").replace("--data-parallel-size 16", "--data-parallel-size 2")
            .replace("--tensor-parallel-size 1", "--tensor-parallel-size 8"))
    noted, plain = _evaluate("deepep_low_latency", line), _evaluate("allgather_reducescatter", line)
    assert any("without --enable-expert-parallel" in w and "priced as allgather_reducescatter" in w for w in noted.warnings)
    assert not any("without --enable-expert-parallel" in w for w in plain.warnings)
    assert noted.prediction.decode == plain.prediction.decode and noted.prediction.config.expert_tp == 16
    assert "--all2all-backend" not in noted.launch["vllm"] and "--data-parallel-size 2" in noted.launch["vllm"]
