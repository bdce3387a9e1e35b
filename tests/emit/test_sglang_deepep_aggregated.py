"""Aggregated SGLang attention-DP + EP engines on DeepEP (#13): the buffer sizes SGLang allocates
(DeepEP's normal-kernel configs and low-latency layout, worked by hand), the rule of which engines run
it, the line's words in the script and the Kubernetes manifests, and what `evaluate --from-sglang` says
about DeepEP settings it reads."""

from __future__ import annotations

import shlex

import pytest
import yaml

from autoshard import api
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.engines import engine_config, sglang_deepep, sglang_deepep_seqs, sglang_priced
from autoshard.costmodel.serve.ep_buffers import (
    DEEPEP_EP_RANKS,
    deepep_ll_buffer_bytes,
    deepep_normal_buffer_bytes,
    deepep_sglang_engine_bytes,
    sglang_deepep_tokens,
)
from autoshard.emit.k8s import k8s_manifests
from autoshard.emit.sglang import SGLANG_DEEPEP_ENV, parse_sglang, runs_deepep, sglang_env, sglang_node_commands
from autoshard.errors import SpecError
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

DSV3 = load_model("deepseek-v3")
H200 = load_cluster("dgx-h200")
H100_GPU = load_cluster("dgx-h100").primary.gpu
A100_GPU = load_cluster("dgx-a100-80gb").primary.gpu
MI300X_GPU = load_cluster("mi300x").primary.gpu
FP8 = WeightDtype.FP8


@pytest.mark.parametrize(("seqs", "drafts", "tokens"), [
    (1, 0, 128), (128, 0, 128), (129, 0, 256), (256, 0, 256), (257, 0, 256), (5000, 0, 256),
    (64, 1, 128), (65, 1, 256), (100, 2, 256),
])
def test_buffer_tokens_per_rank(seqs, drafts, tokens):
    assert sglang_deepep_tokens(seqs, drafts) == tokens


@pytest.mark.parametrize("bad", [(0, 0), (-3, 0), (4, -1), (2.5, 0), (None, 0)])
def test_buffer_tokens_hostile(bad):
    with pytest.raises(ValueError):
        sglang_deepep_tokens(*bad)


def _normal_by_hand(hidden_bytes: int, ranks: int, nvl_recv: int, rdma: list[tuple[int, int]]) -> tuple[int, int]:
    """DeepEP csrc/config.hpp `get_nvl_buffer_size_hint` / `get_rdma_buffer_size_hint`, 20 SMs (10
    channels), 8 NVLink peers, SourceMeta 8 B, top-k 128 x (int64 + float), 128 float scales."""
    rdma_ranks, nvl_ranks = max(ranks // 8, 1), min(ranks, 8)
    row = hidden_bytes + 8 + 128 * 8 + 128 * 4 + 128 * 4
    nvl = 10 * nvl_ranks * (2 * rdma_ranks + 3) * 4 + 10 * nvl_ranks * nvl_recv * row
    nvl = -(-nvl // 128) * 128
    best = 0
    for send, recv in rdma:
        recv = -(-recv // send) * send
        n = 10 * rdma_ranks * 18 * 2 * 4 + 10 * rdma_ranks * recv * (row + 16) * 2 + 1048576
        best = max(best, -(-n // 128) * 128)
    return nvl, best if ranks > 8 else 0


@pytest.mark.parametrize(("ranks", "nvl_recv", "rdma"), [
    (8, 256, []),
    (16, 288, [(20, 128), (28, 128)]),  # dispatch and combine configs for 16 ranks
    (32, 288, [(32, 128), (20, 128)]),
    (128, 560, [(32, 128), (12, 128)]),
])
def test_normal_kernel_buffers_by_hand(ranks, nvl_recv, rdma):
    assert deepep_normal_buffer_bytes(7168, ranks) == _normal_by_hand(7168, ranks, nvl_recv, rdma)


@pytest.mark.parametrize("ranks", [1, 3, 12, 48, 96, 256])
def test_ep_sizes_without_a_deepep_config(ranks):
    assert ranks not in DEEPEP_EP_RANKS
    with pytest.raises(ValueError, match="no config"):
        deepep_normal_buffer_bytes(7168, ranks)


def test_sglang_engine_memory_term():
    """What SGLang's DeepEP buffer adds per GPU: the NVLink buffer of the normal kernels plus the larger
    of their RDMA buffer and the low-latency layout at the line's tokens per rank; none for vLLM's rule."""
    for dpa, seqs in ((8, 100), (8, 200), (16, 64), (32, 256)):
        cfg = ServeConfig(dp_attention=dpa, expert_parallel=True, weight_dtype=FP8, max_num_seqs=seqs,
                          engine="sglang")
        nvl, rdma = deepep_normal_buffer_bytes(7168, dpa)  # FP8 dispatch: 1 byte per element
        ll = deepep_ll_buffer_bytes(DSV3, sglang_deepep_tokens(seqs), dpa)
        assert deepep_sglang_engine_bytes(DSV3, H100_GPU, cfg) == nvl + max(rdma, ll)
        assert ll > rdma  # the low-latency layout is the larger RDMA buffer at these sizes
    bf16 = ServeConfig(dp_attention=8, expert_parallel=True, max_num_seqs=64, engine="sglang")
    assert deepep_sglang_engine_bytes(DSV3, H100_GPU, bf16) == (
        deepep_normal_buffer_bytes(2 * 7168, 8)[0] + deepep_ll_buffer_bytes(DSV3, 128, 8))
    for gpu in (A100_GPU, MI300X_GPU):  # no DeepEP low-latency kernels there: nothing counted
        cfg = ServeConfig(dp_attention=8, expert_parallel=True, weight_dtype=FP8, engine="sglang")
        assert deepep_sglang_engine_bytes(DSV3, gpu, cfg) == 0.0
    assert deepep_sglang_engine_bytes(DSV3, H100_GPU, ServeConfig(tp=8, expert_parallel=True, engine="sglang")) == 0


@pytest.mark.parametrize(("tp", "dpa", "gpu", "deepep"), [
    (1, 8, H100_GPU, True),
    (4, 4, H100_GPU, True),  # EP 16 over two nodes
    (1, 8, A100_GPU, False),  # DeepEP's low-latency kernels need SM90+
    (1, 8, MI300X_GPU, False),
    (3, 16, H100_GPU, False),  # EP 48: DeepEP has no config
    (8, 1, H100_GPU, False),  # no attention DP: EP inside the TP group, no all-to-all
])
def test_which_aggregated_engines_run_deepep(tp, dpa, gpu, deepep):
    cfg = ServeConfig(tp=tp, dp_attention=dpa, expert_parallel=True, weight_dtype=FP8)
    assert sglang_deepep(cfg, 8, split=False, gpu=gpu) is deepep
    assert sglang_priced(cfg, 8, gpu=gpu) is (deepep or dpa == 1)
    sg = engine_config(cfg, "sglang", gpus_per_node=8, gpu=gpu)
    assert sg.deep_gemm is deepep
    assert sglang_deepep_seqs(DSV3, gpu, sg) == (256 if deepep else None)


@pytest.fixture(scope="module")
def plan():
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=FP8)
    return api.evaluate_serve(DSV3, H200.with_gpus(8), job, tp=1, dp=8, expert_parallel=True, max_num_seqs=100,
                              framework="sglang")


def test_script_and_manifest_carry_the_buffer_size(plan, tmp_path):
    assert runs_deepep(plan) and sglang_env(plan) == ((SGLANG_DEEPEP_ENV, "128"),)
    (line,) = sglang_node_commands(plan)
    assert line.startswith(f"{SGLANG_DEEPEP_ENV}=128 python -m sglang.launch_server ")
    assert sglang_node_commands(plan, env=False) == [line.split(" ", 1)[1]]
    assert "--moe-a2a-backend" not in sglang_node_commands(plan, deepep=False)[0]
    script = api.serve_launch_script(plan, "sglang")
    assert line in script and shlex.split(line)  # the script runs the line, prefix and all
    (objects,) = k8s_manifests(plan, "sglang").values()
    container = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["env"] == [{"name": SGLANG_DEEPEP_ENV, "value": "128"}]
    command = container["command"][2]
    assert SGLANG_DEEPEP_ENV not in command and "--moe-a2a-backend deepep --deepep-mode auto" in command
    assert "--cuda-graph-max-bs-decode 100" in command
    api.write_k8s_manifests(plan, tmp_path)
    assert all(yaml.safe_load_all(f.read_text()) for f in tmp_path.glob("*.yaml"))
    # vLLM's manifests of the same plan carry no SGLang variable
    assert SGLANG_DEEPEP_ENV not in str(k8s_manifests(plan, "vllm"))


def test_evaluate_reads_the_deepep_line_back(plan):
    (line,) = sglang_node_commands(plan)
    back = api.evaluate_serve_command(line, "deepseek-v3", "dgx-h200", 8, input_len=1000, output_len=1000,
                                      concurrency=plan.prediction.concurrency * plan.dp, sglang=True)
    assert back.prediction.config.deep_gemm is True and back.max_num_seqs == 100
    assert back.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-9)
    assert back.prediction.memory.ep_buffer_bytes == plan.prediction.memory.ep_buffer_bytes
    assert not any("not read" in w or "assert" in w for w in back.warnings)


BASE = ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp-size 8 --attn-dp-size 8 "
        "--ep-size 8 --quantization fp8 --moe-a2a-backend deepep")


@pytest.mark.parametrize(("command", "note"), [
    (BASE + " --max-running-requests 2048", "256 running requests per attention-DP rank exceed the 128 tokens"),
    (f"{SGLANG_DEEPEP_ENV}=64 " + BASE + " --max-running-requests 1024", "exceed the 64 tokens"),
    (BASE + " --max-running-requests 512 --cuda-graph-max-bs-decode 200", "--cuda-graph-max-bs-decode 200 exceeds"),
    (BASE + " --deepep-mode low_latency", "--deepep-mode low_latency: priced as auto"),
])
def test_parse_says_what_deepep_would_refuse(command, note):
    assert any(note in w for w in parse_sglang(command).warnings), parse_sglang(command).warnings


@pytest.mark.parametrize("value", ["0", "2048", "lots", "-5"])
def test_parse_rejects_a_bad_buffer_size(value):
    with pytest.raises(SpecError, match=SGLANG_DEEPEP_ENV):
        parse_sglang(f"{SGLANG_DEEPEP_ENV}={value} " + BASE)
