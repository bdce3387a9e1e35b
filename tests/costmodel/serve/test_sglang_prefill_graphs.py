"""SGLang's prefill servers capture no CUDA graphs: `ServerArgs._handle_disaggregation` sets
disable_cuda_graph for `--disaggregation-mode prefill` (sgl-project/sglang python/sglang/srt/
server_args.py: "Cuda graph is disabled for prefill server"), so an SGLang prefill instance holds no
graph pool and that memory goes to its KV cache; its aggregated engines and decode instances keep it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.ep_buffers import runs_cuda_graphs, vllm_runs_cuda_graphs
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype

DSV3 = load_model("deepseek-v3")
POOL = load_cluster("dgx-h100").with_gpus(16).pools[0]
FP8 = WeightDtype.FP8


@pytest.mark.parametrize(("engine", "role", "graphs"), [
    ("sglang", "prefill", False),
    ("sglang", "decode", True),
    ("sglang", "aggregated", True),
    ("vllm", "decode", True),
    ("vllm", "prefill", False),  # DeepEP high-throughput with DP > 1: vLLM's own rule
])
def test_which_engines_hold_a_graph_pool(engine, role, graphs):
    cfg = ServeConfig(dp_attention=16, expert_parallel=True, weight_dtype=FP8, engine=engine, role=role,
                      max_num_seqs=8)
    assert runs_cuda_graphs(DSV3, POOL.gpu, cfg) is graphs
    mem = serve_memory(DSV3, POOL, cfg, context_len=2000)
    assert (mem.cuda_graph_bytes > 0) is graphs


def test_sglang_prefill_cache_gains_the_graph_pool():
    """The same SGLang instance as a prefill and as a decode instance: same weights and buffers, the
    prefill one's KV cache larger by exactly the decode one's graph pool (the budget is shared)."""
    decode = ServeConfig(tp=1, dp_attention=16, expert_parallel=True, weight_dtype=FP8, engine="sglang",
                         role="decode", max_num_seqs=64)
    prefill = replace(decode, role="prefill")
    md = serve_memory(DSV3, POOL, decode, context_len=2000)
    mp = serve_memory(DSV3, POOL, prefill, context_len=2000)
    assert md.cuda_graph_bytes > 0 == mp.cuda_graph_bytes
    assert mp.weights_bytes == md.weights_bytes and mp.ep_buffer_bytes == md.ep_buffer_bytes
    assert mp.kv_cache_bytes - md.kv_cache_bytes == pytest.approx(md.cuda_graph_bytes, rel=1e-9)
    # graphs off in the config itself (a line that disables them) stay off for every engine
    assert not runs_cuda_graphs(DSV3, POOL.gpu, replace(decode, cuda_graphs=False))
    assert not vllm_runs_cuda_graphs(DSV3, POOL.gpu, replace(decode, engine="vllm", cuda_graphs=False))
