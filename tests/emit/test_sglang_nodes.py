"""A launch line whose TP group spans nodes, and SGLang's and vLLM's --nnodes rules.

SGLang 0.5.23 starts `--tp 16 --nnodes 2` (a 16-GPU TP group over two 8-GPU nodes): it only asserts
tp_size x pp_size is a multiple of nnodes and refuses multi-node --dp-size replicas
(srt/arg_groups/validation_hook.py:179-181, 199-202), and runs tp_size x pp_size / nnodes GPUs on each
node. `evaluate --from-sglang/--from-vllm` refused any TP past the NVLink domain as bad input (exit 2);
it now prices the line, its TP all-reduces over the inter-node network (`comm.group_link` crosses
nodes), with a note that it is slow and the shapes that avoid it: DeepSeek-V3 FP8 on 16 H100 (1,000 in /
1,000 out) at TP 16 runs 3,241 output tokens/s, TPOT 67.0 ms of which 23.7 ms TP all-reduce, where
TP 8 x PP 2 on the same GPUs runs 5,653."""

from __future__ import annotations

import pytest

from autoshard.api_serve import evaluate_vllm
from autoshard.emit.sglang import parse_sglang
from autoshard.errors import SpecError
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

DSV3 = load_model("deepseek-v3")
H100x16 = load_cluster("dgx-h100").with_gpus(16)
JOB = ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8)
VLLM = "vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 16 --max-model-len 2000"
LINE = "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --context-length 2000 "


def _sglang(flags: str):
    return evaluate_vllm(DSV3, H100x16, LINE + flags, job=JOB, sglang=True)


def test_tp_across_two_nodes_is_priced_over_the_network():
    plan = _sglang("--tp 16 --nnodes 2 --node-rank 0 --dist-init-addr 10.0.0.1:5000")
    assert (plan.tp, plan.pp, plan.dp) == (16, 1, 1)
    assert plan.throughput_tokens_per_s == pytest.approx(3240.7, rel=2e-3)
    assert plan.prediction.tpot_s == pytest.approx(0.06696, rel=2e-3)
    assert plan.prediction.decode.tp_comm_s == pytest.approx(0.0237, rel=5e-3)
    note = next(w for w in plan.warnings if w.startswith("TP 16 spans 2 NVLink domains of 8 GPUs"))
    assert "inter-node network" in note and "TP 8 x PP 2" in note and "(EP 16)" in note
    pp = _sglang("--tp 8 --pp-size 2 --nnodes 2")
    assert pp.throughput_tokens_per_s == pytest.approx(5652.9, rel=2e-3)
    assert pp.prediction.decode.tp_comm_s < plan.prediction.decode.tp_comm_s / 2
    assert not any("NVLink domains" in w for w in pp.warnings)
    # vLLM's line of the same engine reads the same way (--nnodes 2, or ray placing it)
    for how in ("--nnodes 2 --node-rank 0", "--distributed-executor-backend ray"):
        vllm = evaluate_vllm(DSV3, H100x16, f"{VLLM} {how}", job=JOB)
        assert vllm.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-12)


def test_vllm_nnodes_that_vllm_refuses():
    """vLLM 0.33.0 refuses a world size past the node's GPUs with --nnodes 1 and its default executor
    (config/parallel.py:1055-1078) and runs world_size / nnodes ranks a node (:838-840)."""
    with pytest.raises(SpecError, match=r"32 GPUs over --nnodes 2: .*16 a node, and dgx-h100's nodes have 8: "
                                        r"pass --nnodes 4 .* or --distributed-executor-backend ray"):
        evaluate_vllm(DSV3, load_cluster("dgx-h100").with_gpus(32), VLLM + " --pipeline-parallel-size 2 --nnodes 2",
                      job=JOB)
    # no --nnodes: as written vLLM refuses it on one node; priced as the engine the line describes, with a note
    plan = evaluate_vllm(DSV3, H100x16, VLLM, job=JOB)
    assert any(w.startswith("TP 16 x PP 1 = 16 GPUs over --nnodes 1") and "pass --nnodes 2" in w for w in plan.warnings)
    with pytest.raises(SpecError, match=r"16 GPUs over --nnodes 3: .*do not split evenly over them"):
        evaluate_vllm(DSV3, H100x16, VLLM + " --nnodes 3", job=JOB)


def test_nnodes_that_sglang_refuses():
    with pytest.raises(SpecError, match=r"16 GPUs do not split evenly over --nnodes 3"):
        parse_sglang(LINE + "--tp 16 --nnodes 3")
    with pytest.raises(SpecError, match=r"--dp-size 2 replicas with --nnodes 2: SGLang refuses"):
        parse_sglang(LINE + "--tp 8 --dp-size 2 --nnodes 2")
    with pytest.raises(SpecError, match=r"over --nnodes 2: 16 a node, and dgx-h100's nodes have 8: pass --nnodes 4"):
        _sglang("--tp 16 --pp-size 2 --nnodes 2")
    # no --nnodes: 16 GPUs asked of one node, as written; priced as the deployment it describes, with a note
    plan = _sglang("--tp 16")
    assert any(w.startswith("the line runs 16 GPUs (TP x PP x DP) over --nnodes 1: 16 a node, and dgx-h100's nodes "
                            "have 8: pass --nnodes 2") for w in plan.warnings)
    assert plan.throughput_tokens_per_s == pytest.approx(3240.7, rel=2e-3)


def test_nnodes_thinner_than_the_nodes_is_noted():
    plan = _sglang("--tp 16 --nnodes 4")  # 4 GPUs on each of 4 nodes
    assert any(w.startswith("--nnodes 4 runs 4 of each node's 8 GPUs: priced packed into 2 whole node(s)")
               for w in plan.warnings)
    assert plan.throughput_tokens_per_s == pytest.approx(_sglang("--tp 16 --nnodes 2").throughput_tokens_per_s,
                                                         rel=1e-12)
