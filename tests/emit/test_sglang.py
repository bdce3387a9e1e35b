"""SGLang emitter: golden commands and SGLang 0.5's launch rules.

Rules copied from SGLang 0.5.23's `ServerArgs` checks: GPUs = tp_size x pp_size x dp_size; attention DP
and EP are carved out of the TP group (tp_size % attn_dp_size == 0, ep_size <= tp_size); (tp_size x
pp_size) % nnodes == 0; --dp-size > 1 with --nnodes > 1 is rejected; --mem-fraction-static in (0, 1);
--quantization and --kv-cache-dtype are argparse choices. Regenerate the golden files with
`UPDATE_GOLDEN=1 python -m pytest tests/emit/test_sglang.py`.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from autoshard.costmodel.serve.engine_defaults import CUDA_CONTEXT_BYTES, sglang_baseline_bytes
from autoshard.emit.sglang import mem_fraction_static, sglang_command, sglang_node_commands
from autoshard.api import evaluate_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob

GOLDEN = Path(__file__).resolve().parent / "golden_serve"

# name: (model, cluster, gpus, weight dtype, kv dtype, tp, pp, dp, expert parallel, max_num_seqs)
CASES = {
    "llama8b-h100x1": ("llama-3.1-8b", "dgx-h100", 1, "bf16", "bf16", 1, 1, 1, False, 256),
    "llama70b-fp8-h100x8-tp4dp2": ("llama-3.1-70b", "dgx-h100", 8, "fp8", "fp8", 4, 1, 2, False, 512),
    "llama405b-h100x16-tp8pp2": ("llama-3.1-405b", "dgx-h100", 16, "bf16", "bf16", 8, 2, 1, False, 128),
    "llama405b-fp8-h100x32-tp8pp2dp2": ("llama-3.1-405b", "dgx-h100", 32, "fp8", "fp8", 8, 2, 2, False, 256),
    "llama70b-h100x32-tp4dp8": ("llama-3.1-70b", "dgx-h100", 32, "bf16", "bf16", 4, 1, 8, False, 256),
    "mixtral-h100x8-tp2dp4-ep8": ("mixtral-8x7b", "dgx-h100", 8, "bf16", "bf16", 2, 1, 4, True, 256),
    "deepseekv3-fp8-h200x16-tp8dp2-ep16": ("deepseek-v3", "dgx-h200", 16, "fp8", "bf16", 8, 1, 2, True, 128),
    "deepseekv3-fp8-h200x8-dp8-ep8": ("deepseek-v3", "dgx-h200", 8, "fp8", "bf16", 1, 1, 8, True, 192),
    "qwen235b-int4-l40sx8-tp4pp2": ("qwen3-235b-a22b", "l40s-pcie", 8, "int4", "fp8", 4, 2, 1, False, 64),
}

SGLANG_FLAGS = {
    "--model-path",
    "--tp-size",
    "--pp-size",
    "--dp-size",
    "--ep-size",
    "--attn-dp-size",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--mem-fraction-static",
    "--max-running-requests",
    "--chunked-prefill-size",
    "--context-length",
    "--kv-cache-dtype",
    "--quantization",
    "--moe-a2a-backend",
    "--deepep-mode",
    "--cuda-graph-max-bs-decode",
}
DEEPEP_ENV = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
KV_CACHE_DTYPES = {"auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"}
QUANTIZATIONS = {
    "awq",
    "fp8",
    "mxfp8",
    "gptq",
    "gptq_marlin",
    "awq_marlin",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "modelopt_fp8",
    "modelopt_fp4",
    "w8a8_int8",
    "w8a8_fp8",
    "moe_wna16",
    "w4afp8",
    "mxfp4",
}


def build(name):
    model, cluster, gpus, wd, kv, tp, pp, dp, ep, seqs = CASES[name]
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=wd, kv_cache_dtype=kv)
    return evaluate_serve(
        load_model(model),
        load_cluster(cluster).with_gpus(gpus),
        job,
        tp=tp,
        pp=pp,
        dp=dp,
        expert_parallel=ep,
        max_num_seqs=seqs,
    )


def flags(command: str) -> dict[str, str]:
    words = shlex.split(command)
    out: dict[str, str] = {}
    if words[0].startswith(DEEPEP_ENV + "="):  # the one variable autoshard's lines set (DeepEP's buffer)
        out[DEEPEP_ENV] = words.pop(0).split("=", 1)[1]
    assert words[:3] == ["python", "-m", "sglang.launch_server"]
    for name, value in zip(words[3::2], words[4::2], strict=True):
        assert name in SGLANG_FLAGS, name
        assert name not in out
        out[name] = value
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    text = "\n".join(sglang_node_commands(build(name))) + "\n"
    path = GOLDEN / f"{name}.sglang.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_node_command_follows_sglang_rules(name):
    plan = build(name)
    commands = sglang_node_commands(plan)
    assert sglang_command(plan) == commands[0] == plan.launch["sglang"]
    total = 0
    for command in commands:
        f = flags(command)
        tp, pp, dp = int(f["--tp-size"]), int(f["--pp-size"]), int(f.get("--dp-size", 1))
        nnodes = int(f.get("--nnodes", 1))
        assert (tp * pp) % nnodes == 0
        assert dp == 1 or nnodes == 1
        adp = int(f.get("--attn-dp-size", 1))
        assert tp % adp == 0
        ep = int(f.get("--ep-size", 1))
        assert ep <= tp and tp % ep == 0
        assert 0 < float(f["--mem-fraction-static"]) < 1
        assert f["--kv-cache-dtype"] in KV_CACHE_DTYPES
        assert f.get("--quantization", "fp8") in QUANTIZATIONS
        assert int(f["--context-length"]) == plan.max_model_len
        assert f["--model-path"] == plan.model_path
        if "--moe-a2a-backend" in f:  # DeepEP: EP over the whole TP group (SGLang forces ep_size = tp_size),
            # auto mode, and no rank's decode batch or captured graph beyond the low-latency buffer
            assert (f["--moe-a2a-backend"], f["--deepep-mode"], ep) == ("deepep", "auto", tp)
            cap = int(f[DEEPEP_ENV])
            assert cap % 128 == 0 and 128 <= cap <= 1024
            assert int(f["--cuda-graph-max-bs-decode"]) == int(f["--max-running-requests"]) // adp <= cap
        else:
            assert DEEPEP_ENV not in f and "--cuda-graph-max-bs-decode" not in f
        total += tp * pp * dp // nnodes  # GPUs this node runs
    assert total == plan.num_gpus


def test_expert_parallel_maps_to_attention_dp():
    f = flags(build("deepseekv3-fp8-h200x16-tp8dp2-ep16").launch["sglang"])
    assert (f["--tp-size"], f["--attn-dp-size"], f["--ep-size"], f["--nnodes"]) == ("16", "2", "16", "2")
    assert f["--max-running-requests"] == "256"  # 128 per attention-DP rank
    # on DeepEP (#13), its low-latency buffer sized for the 128 decode tokens per rank
    assert (f["--moe-a2a-backend"], f["--deepep-mode"], f[DEEPEP_ENV]) == ("deepep", "auto", "128")
    assert f["--cuda-graph-max-bs-decode"] == "128"


def test_deepseek_v3_fp8_on_8_h200_runs_deepep():
    """The golden line of DeepSeek-V3 FP8 on one 8 x H200 node, attention DP 8 x EP 8 at 192 requests per
    rank: --moe-a2a-backend deepep --deepep-mode auto, the buffer for 256 tokens per rank (192 rounded up
    to 128s), graphs captured up to 192; the plan is priced with DeepGEMM experts and counts that buffer."""
    plan = build("deepseekv3-fp8-h200x8-dp8-ep8")
    (line,) = sglang_node_commands(plan)
    f = flags(line)
    assert (f["--tp-size"], f["--attn-dp-size"], f["--ep-size"], f["--max-running-requests"]) == ("8", "8", "8", "1536")
    assert (f[DEEPEP_ENV], f["--cuda-graph-max-bs-decode"], f["--moe-a2a-backend"]) == ("256", "192", "deepep")
    assert plan.prediction.memory.ep_buffer_bytes == 3_816_818_816 + 1024 * 2**20  # vLLM's: 256 tokens + 1 GiB
    model, cluster, gpus, wd, kv, tp, pp, dp, ep, seqs = CASES["deepseekv3-fp8-h200x8-dp8-ep8"]
    sglang = evaluate_serve(load_model(model), load_cluster(cluster).with_gpus(gpus),
                            ServeJob(input_len=1000, output_len=1000, weight_dtype=wd, kv_cache_dtype=kv),
                            tp=tp, pp=pp, dp=dp, expert_parallel=ep, max_num_seqs=seqs, framework="sglang")
    cfg = sglang.prediction.config
    assert (cfg.engine, cfg.deep_gemm) == ("sglang", True)
    # the vLLM-priced plan runs vLLM 0.33.0's own budget for its deepep_low_latency line (256 a rank, the
    # buffer's size), which SGLang's line of it passes as 8 x 256; the SGLang-priced one keeps its 8,192
    # a rank (SGLang's buffer does not grow with it), whose larger activation peak leaves 0.015 less of
    # its baseline
    assert f["--chunked-prefill-size"] == "2048" and plan.max_num_batched_tokens == 256
    assert sglang.launch["sglang"] == line.replace("--mem-fraction-static 0.875", "--mem-fraction-static 0.860").replace(
        "--chunked-prefill-size 2048", "--chunked-prefill-size 65536")
    # DeepEP's low-latency layout at 256 tokens (h = 7,168, 256 experts): 2 x send + 2 x receive of
    # 256 x 256 x 14,560 B (combine messages 2h + 4h/128) + 2 x 1,024 B of signals, aligned up by 128;
    # plus the normal kernels' NVLink buffer: 10 channels x 8 ranks x 256 tokens x (7,168 FP8 + 8 + 128 x
    # (8 + 4) + 128 x 4) B + 10 x 8 x 5 ints, rounded up to 128 B
    low_latency = 4 * 256 * 256 * 14_560 + 2 * 1024 + 128
    nvl = -(-(10 * 8 * 256 * (7168 + 8 + 128 * 12 + 512) + 10 * 8 * 5 * 4) // 128) * 128
    assert sglang.prediction.memory.ep_buffer_bytes == low_latency + nvl == 4_005_728_000


def test_chunked_prefill_size_is_the_engines_budget():
    """SGLang reads --chunked-prefill-size per engine and gives each attention-DP rank
    chunked_prefill_size // attn_dp_size (sglang 0.5.23 srt/arg_groups/parallel_hook.py:324-332), while
    the plan (vLLM's --max-num-batched-tokens, one scheduler per DP rank) prices 8,192 prompt tokens per
    rank: the line passes 8 x 8,192 at attention DP 8 (it passed 8,192, 1,024 a rank), 2 x 8,192 at DP 2,
    the budget itself without attention DP; `--from-sglang` reads the per-rank budget back."""
    from autoshard.emit.sglang import parse_sglang

    # the attention-DP + EP plans are vLLM's on deepep_low_latency at vLLM 0.33.0's default budget, 256
    for name, adp, budget in (("deepseekv3-fp8-h200x8-dp8-ep8", 8, 256), ("deepseekv3-fp8-h200x16-tp8dp2-ep16", 2, 256),
                              ("mixtral-h100x8-tp2dp4-ep8", 4, 256), ("llama70b-fp8-h100x8-tp4dp2", 1, 8192)):
        plan = build(name)
        assert plan.max_num_batched_tokens == budget and plan.dp_attention == adp
        for line in sglang_node_commands(plan):
            assert flags(line)["--chunked-prefill-size"] == str(budget * adp)
            assert parse_sglang(line).max_num_batched_tokens == budget
    line = ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp-size 8 --dp-size 8 "
            "--enable-dp-attention --ep-size 8 --chunked-prefill-size 16384")  # the deprecated spelling
    assert parse_sglang(line).max_num_batched_tokens == 2048


def test_replicas_across_nodes_are_one_server_per_node():
    commands = sglang_node_commands(build("llama70b-h100x32-tp4dp8"))
    assert len(commands) == 4 and all("--dp-size 2" in c and "--nnodes" not in c for c in commands)
    spanning = sglang_node_commands(build("llama405b-fp8-h100x32-tp8pp2dp2"))
    assert len(spanning) == 4 and "$HEAD_IP_1:5000" in spanning[2]


def test_mem_fraction_static_leaves_the_activations_out():
    plan = build("llama8b-h100x1")
    mem = plan.prediction.memory
    fraction = mem_fraction_static(plan)
    assert fraction < plan.gpu_memory_utilization
    # a fraction of SGLang's baseline (the capacity less the CUDA context; one GPU: no NCCL communicator)
    base = sglang_baseline_bytes(plan.pool, plan.prediction.config)
    assert base == mem.capacity_bytes - CUDA_CONTEXT_BYTES
    assert fraction * base <= mem.weights_bytes + mem.kv_cache_bytes < (fraction + 0.001) * base
