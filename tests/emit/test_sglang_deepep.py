"""SGLang decode instances on DeepEP's low-latency kernels: the buffer holds
SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK tokens per rank (default 128) and a decode batch or
captured CUDA graph with more tokens per rank fails DeepEP's assert, so the emitted decode lines size
the buffer to the planned tokens per rank and cap the captured graphs at the planned requests; the
plan's memory holds the buffers for 256 tokens per rank (vLLM's chunk), so a plan beyond that runs
fewer requests under SGLang and says so."""

from __future__ import annotations

import dataclasses
import shlex
from types import SimpleNamespace

import pytest

from autoshard.emit.k8s import k8s_manifests
from autoshard.costmodel.serve.ep_buffers import VLLM_MOE_DP_CHUNK_SIZE
from autoshard.emit.pd import (
    SGLANG_DEEPEP_LL_ENV, SGLANG_DEEPEP_LL_MAX, pd_commands, sglang_deepep_decode, sglang_deepep_prefill,
)
from autoshard.search.serve.solve import solve_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype


@pytest.mark.parametrize(
    ("seqs", "drafts", "expected"),
    [
        (1, 0, (1, 128)),
        (100, 0, (100, 128)),
        (128, 0, (128, 128)),
        (129, 0, (129, 256)),
        (224, 0, (224, 256)),
        (256, 0, (256, 256)),
        (257, 0, (256, 256)),  # beyond the 256 tokens per rank the plan's memory holds buffers for
        (1024, 0, (256, 256)),
        (64, 1, (64, 128)),  # MTP: two tokens per request per step
        (100, 1, (100, 256)),
        (384, 1, (128, 256)),
    ],
)
def test_buffer_and_requests_per_rank(seqs, drafts, expected):
    assert sglang_deepep_decode(SimpleNamespace(max_num_seqs=seqs, speculative_tokens=drafts)) == expected


@pytest.fixture(scope="module")
def plan():
    """DeepSeek-V3 FP8 on 12 nodes of 8 x H100, 1000/1000: DP32/EP32 decode instances over 4 nodes."""
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8)
    return solve_serve(
        load_model("deepseek-v3"), load_cluster("dgx-h100").with_gpus(96), job,
        pins=None, top_k=1, time_limit_s=20, num_workers=2, disaggregate="on",
    )[0]


def _env(words: list[str]) -> dict[str, str]:
    return dict(w.split("=", 1) for w in words if "=" in w and w.split("=", 1)[0].isupper())


def test_sglang_decode_lines_size_the_low_latency_buffer(plan):
    decode = plan.role("decode")
    assert decode.ep > 1 and decode.gpus_per_instance > 8  # multi-node EP: DeepEP
    seqs, cap = sglang_deepep_decode(decode)
    # the vLLM plan's decode runs 256 requests per rank with one MTP draft (512 tokens, its vLLM budget):
    # SGLang's line keeps the 256 tokens per rank autoshard sizes its buffer for, 128 requests, and says so
    per_request = 1 + decode.speculative_tokens
    assert seqs == min(decode.max_num_seqs, SGLANG_DEEPEP_LL_MAX // per_request) and cap % 128 == 0
    assert cap - 128 < seqs * per_request <= cap
    seen = 0
    for _, what, line in pd_commands(plan, "sglang"):
        words = shlex.split(line)
        if what.startswith("decode"):
            seen += 1
            assert _env(words)[SGLANG_DEEPEP_LL_ENV] == str(cap)
            assert words[words.index("--cuda-graph-max-bs-decode") + 1] == str(seqs)
            assert words[words.index("--max-running-requests") + 1] == str(seqs * decode.attention_dp)
            assert words[words.index("--moe-a2a-backend") + 1] == "deepep"
            assert ("instead of the planned" in what) == (seqs < decode.max_num_seqs)
        elif what.startswith("prefill"):
            # prefill runs DeepEP's normal kernels on whole batches: a multi-node EP prefill instance
            # (DP16/EP16 here) sets the buffer to its running requests' tokens, as its memory counts
            # it (sglang_deepep_prefill), and captures no decode graphs
            prefill = plan.role("prefill")
            assert prefill.ep > 1 and prefill.gpus_per_instance > 8
            assert _env(words)[SGLANG_DEEPEP_LL_ENV] == str(sglang_deepep_prefill(prefill))
            assert "--cuda-graph-max-bs-decode" not in line
        else:  # the router
            assert SGLANG_DEEPEP_LL_ENV not in line
    assert seen == decode.instances * decode.gpus_per_instance // 8
    for _, _, line in pd_commands(plan, "vllm"):  # vLLM sizes its buffer by --max-num-batched-tokens instead
        assert SGLANG_DEEPEP_LL_ENV not in line and "--cuda-graph-max-bs-decode" not in line


def test_k8s_decode_containers_carry_the_buffer_size(plan):
    decode = plan.role("decode")
    seqs, cap = sglang_deepep_decode(decode)
    files = k8s_manifests(plan, "sglang")
    decode_files = [f for f in files if "-decode-" in f]
    assert len(decode_files) == decode.instances
    for name in decode_files:
        lws = files[name][0]
        for template in ("leaderTemplate", "workerTemplate"):
            container = lws["spec"]["leaderWorkerTemplate"][template]["spec"]["containers"][0]
            assert container["env"] == [{"name": SGLANG_DEEPEP_LL_ENV, "value": str(cap)}]
            assert f"--cuda-graph-max-bs-decode {seqs}" in container["command"][2]
    prefill_cap = str(sglang_deepep_prefill(plan.role("prefill")))
    for name in files:
        if "-prefill-" in name:  # a multi-node EP prefill instance: its own cap, no decode graphs
            lws = files[name][0]
            container = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
            assert container["env"] == [{"name": SGLANG_DEEPEP_LL_ENV, "value": prefill_cap}]
        elif "-decode-" not in name:
            assert SGLANG_DEEPEP_LL_ENV not in str(files[name])
    assert SGLANG_DEEPEP_LL_ENV not in str(k8s_manifests(plan, "vllm"))


def test_a_batch_beyond_the_limit_is_capped_and_said(plan):
    decode = plan.role("decode")
    per_request = 1 + decode.speculative_tokens
    assert SGLANG_DEEPEP_LL_MAX == VLLM_MOE_DP_CHUNK_SIZE == 256  # the cap the memory is priced at
    for planned in (256 // per_request, 1500):
        big = dataclasses.replace(decode, max_num_seqs=planned)
        wide = dataclasses.replace(plan, roles=tuple(big if r.role == "decode" else r for r in plan.roles))
        runs = min(planned, 256 // per_request)
        lines = [(what, shlex.split(line)) for _, what, line in pd_commands(wide, "sglang")
                 if what.startswith("decode")]
        assert lines
        for what, words in lines:
            assert _env(words)[SGLANG_DEEPEP_LL_ENV] == "256"
            assert words[words.index("--cuda-graph-max-bs-decode") + 1] == str(runs)
            assert words[words.index("--max-running-requests") + 1] == str(runs * decode.attention_dp)
            note = f"{runs} requests per rank instead of the planned {planned}"
            assert (note in what) == (planned > runs), what
