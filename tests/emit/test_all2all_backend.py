"""vLLM's expert all-to-all backend follows the cost model: engines it prices with DeepEP's low-latency
kernels (expert parallelism over attention-DP ranks on Hopper/Blackwell: 256-token MoE passes and
DeepEP's buffers in memory) get `--all2all-backend deepep_low_latency`, prefill instances of a split
deployment `deepep_high_throughput`, every other engine vLLM's default; a parsed command with another
backend says it is not modelled."""

from __future__ import annotations

import shlex

import pytest

from autoshard.costmodel.serve.ep_buffers import uses_deepep_low_latency
from autoshard.api_serve import evaluate_vllm
from autoshard.emit.pd import pd_commands
from autoshard.emit.vllm.command import all2all_backend, vllm_node_commands
from autoshard.emit.vllm.parse import parse_vllm
from autoshard.search.serve.solve import solve_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype


def _backend(line: str) -> str | None:
    words = shlex.split(line)
    return words[words.index("--all2all-backend") + 1] if "--all2all-backend" in words else None


def _solve(model, cluster, gpus, mode, pins=None):
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8)
    return solve_serve(load_model(model), load_cluster(cluster).with_gpus(gpus), job, pins=pins, top_k=1,
                       time_limit_s=20, num_workers=2, disaggregate=mode)[0]


def test_split_deployment_decode_low_latency_prefill_throughput():
    plan = _solve("deepseek-v3", "dgx-h100", 96, "on")
    decode = plan.role("decode")
    assert decode.ep > 1 and decode.attention_dp > 1
    seen = set()
    for _, what, line in pd_commands(plan, "vllm"):
        if what == "router":
            continue
        role = plan.role(what.split()[0])
        cfg = role.prediction.config
        priced = uses_deepep_low_latency(plan.model, plan.cluster.pools[role.pool_index].gpu, cfg)
        expected = None if not priced else ("deepep_low_latency" if role.role == "decode" else "deepep_high_throughput")
        assert _backend(line) == expected, (what, line)
        seen.add((role.role, _backend(line)))
    assert ("decode", "deepep_low_latency") in seen
    for _, what, line in pd_commands(plan, "sglang"):  # SGLang's own flag (--moe-a2a-backend), not vLLM's
        assert "--all2all-backend" not in line


@pytest.mark.parametrize(
    ("model", "cluster", "gpus", "expected"),
    [
        ("llama-3.1-70b", "dgx-h100", 8, None),  # dense: no expert all-to-all
        ("mixtral-8x7b", "mi300x", 8, None),  # EP8 over DP8, but AMD runs MORI, not DeepEP: vLLM's default
        ("mixtral-8x7b", "dgx-h100", 8, "deepep_low_latency"),  # EP over attention DP on Hopper
    ],
)
def test_aggregated_engines_follow_the_priced_path(model, cluster, gpus, expected):
    plan = _solve(model, cluster, gpus, "off")
    assert uses_deepep_low_latency(plan.model, plan.pool.gpu, plan.prediction.config) == (expected is not None)
    if model.startswith("mixtral"):
        assert plan.expert_parallel and plan.dp > 1
    assert all2all_backend(plan) == expected
    assert all(_backend(line) == expected for line in vllm_node_commands(plan))


def test_parsed_command_with_another_backend_is_flagged():
    """The parser records the backend (vLLM's default when absent); `evaluate --from-vllm` notes a
    non-DeepEP backend where the model is MoE with EP over DP ranks on Hopper/Blackwell, nowhere else."""
    base = ("vllm serve mistralai/Mixtral-8x7B-v0.1 --tensor-parallel-size 2 --data-parallel-size 4 "
            "--enable-expert-parallel")
    assert parse_vllm(base).all2all_backend == "allgather_reducescatter"
    assert parse_vllm(base + " --all2all-backend pplx").all2all_backend == "pplx"
    job = ServeJob(input_len=1000, output_len=1000)
    h100, mi300x = load_cluster("dgx-h100").with_gpus(8), load_cluster("mi300x").with_gpus(8)

    def notes(cluster, command):
        return [w for w in evaluate_vllm(None, cluster, command, job=job).warnings if "all2all" in w]

    assert len(notes(h100, base)) == 1 and "allgather_reducescatter" in notes(h100, base)[0]
    assert "--all2all-backend pplx" in notes(h100, base + " --all2all-backend pplx")[0]
    assert notes(h100, base + " --all2all-backend deepep_low_latency") == []
    assert notes(mi300x, base) == []  # AMD: not priced with DeepEP
    assert notes(h100, base.replace("--data-parallel-size 4", "--data-parallel-size 1")) == []
    dense = "vllm serve meta-llama/Llama-3.1-70B --tensor-parallel-size 2 --data-parallel-size 4 --enable-expert-parallel"
    assert notes(h100, dense + " --max-model-len 2000") == []  # (vLLM's own 131,072 does not fit TP 2)
