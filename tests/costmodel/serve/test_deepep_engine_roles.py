"""Which DeepEP kernels and buffers each serving engine runs, by engine and role, from the engines'
code (vLLM 0.33.0, SGLang 0.5.23; file/line citations in `autoshard.costmodel.serve.ep_buffers` and
`ep_dispatch`):
- a vLLM prefill instance (`--all2all-backend deepep_high_throughput`) holds DeepEP's normal-kernel
  buffers, 1 GiB NVLink + 1 GiB RDMA across nodes (`DeepEPHTAll2AllManager._make_all2all_kwargs`),
  no low-latency layout, and no CUDA graph pool (vLLM turns graphs off on that backend);
- vLLM keeps one backend per engine: an aggregated engine (`deepep_low_latency`) runs a prompt alone and
  a mixed step on the low-latency kernels, a prefill instance every step on the normal ones;
- SGLang without attention DP but on DeepEP (its split instances over nodes) scatters the tokens over
  the TP ranks, each dispatching its 1/TP: priced as attention-DP ranks of one GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoshard.costmodel.moe import busiest_rank_factor
from autoshard.costmodel.serve.comm_memory import NON_TORCH_BYTES
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.ep_buffers import (
    deepep_ll_buffer_bytes,
    deepep_ll_engine_bytes,
    deepep_normal_buffer_bytes,
    deepep_sglang_engine_bytes,
    scattered_deepep,
    sglang_deepep_tokens,
    vllm_deepep_ht_bytes,
    vllm_runs_cuda_graphs,
)
from autoshard.costmodel.serve.ep_dispatch import deepep_normal_step, ht_dispatch_combine_s
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.sharding import FP8_WITH_BLOCK_SCALES, _links, ep_dispatch_s
from autoshard.costmodel.serve.step import prefill_time, step_time
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype
from autoshard.specs.layers import LayerKind
from autoshard.units import GIB, MIB

DSV3 = load_model("deepseek-v3")
QWEN235 = load_model("qwen3-235b-a22b")
H100 = load_cluster("dgx-h100")
FP8 = WeightDtype.FP8
LL_DSV3_256 = 3_816_818_816
"""DeepEP's LowLatencyLayout for DeepSeek-V3 (hidden 7168, 256 experts) at 256 tokens per rank, by
hand: dispatch message 16 + max(2 x 7168, 7168 + 4 x 56) = 14,352 B, combine 4 x 56 + 2 x 7168 =
14,560 B; send = max(256 x 14,352, 256 x 256 x 14,560) = 954,204,160, receive 256 x 256 x 14,560 =
954,204,160; 2 x send + 2 x receive + 2 x 1,024 signalling = 3,816,818,688, rounded (n + 128) // 128 x 128."""


def _cfg(dp: int, role: str, **kw) -> ServeConfig:
    return ServeConfig(dp_attention=dp, expert_parallel=True, weight_dtype=FP8, role=role, **kw)


def test_vllm_high_throughput_buffers_are_vllms_fixed_sizes():
    """1,024 MiB of NVLink buffer, the same again of RDMA buffer when the EP group leaves the node, for
    any model: vLLM passes VLLM_DEEPEP_BUFFER_SIZE_MB for both and no low-latency mode."""
    assert vllm_deepep_ht_bytes(_cfg(8, "prefill"), 8) == 1024 * MIB == 2**30
    assert vllm_deepep_ht_bytes(_cfg(16, "prefill"), 8) == 2048 * MIB == 2**31
    assert vllm_deepep_ht_bytes(_cfg(4, "prefill"), 4) == 2**30  # GB200: 4 GPUs a node
    assert vllm_deepep_ht_bytes(_cfg(8, "prefill"), 4) == 2**31
    gpu = H100.primary.gpu
    for model in (DSV3, QWEN235):
        assert deepep_ll_engine_bytes(model, gpu, _cfg(16, "prefill"), gpus_per_node=8) == 2**31
        assert deepep_ll_engine_bytes(model, gpu, _cfg(8, "prefill"), gpus_per_node=8) == 2**30
    assert deepep_ll_buffer_bytes(DSV3, 256, 16) == LL_DSV3_256
    for role in ("aggregated", "decode"):  # the low-latency backend at a 256 budget: 3.55 GiB + 1 GiB
        assert deepep_ll_engine_bytes(DSV3, gpu, _cfg(16, role, max_num_batched_tokens=256)) == LL_DSV3_256 + 2**30
        assert deepep_ll_engine_bytes(DSV3, gpu, _cfg(16, role, moe_dp_chunk=256)) == LL_DSV3_256 + 2**30  # vLLM 0.11


def test_vllm_prefill_instance_kv_cache_gains_exactly_the_buffers_and_graphs():
    """DeepSeek-V3 FP8, DP16/EP16 over two H100 nodes: a prefill instance holds 2 GiB of DeepEP buffers
    where a decode instance of the same shape holds 4.55 GiB, and no CUDA graph pool; its KV cache is
    larger by exactly that (7.70 -> 10.52 GiB per GPU, +37 %). The decode side at the same 8,192 budget
    with vLLM 0.11.0's 256-token buffer (`moe_dp_chunk`), so that only the buffers and graphs differ."""
    pool = H100.with_gpus(16).pools[0]
    decode = serve_memory(DSV3, pool, _cfg(16, "decode", max_num_seqs=4, moe_dp_chunk=256), context_len=3000)
    prefill = serve_memory(DSV3, pool, _cfg(16, "prefill", max_num_seqs=4), context_len=3000)
    assert decode.ep_buffer_bytes == LL_DSV3_256 + 2**30
    assert prefill.ep_buffer_bytes == 2**31
    assert prefill.non_torch_bytes - prefill.ep_buffer_bytes == decode.non_torch_bytes - decode.ep_buffer_bytes
    assert decode.non_torch_bytes - decode.ep_buffer_bytes >= NON_TORCH_BYTES
    assert decode.cuda_graph_bytes > 0 and prefill.cuda_graph_bytes == 0.0
    gained = LL_DSV3_256 + 2**30 - 2**31 + decode.cuda_graph_bytes
    assert prefill.kv_cache_bytes - decode.kv_cache_bytes == pytest.approx(gained, rel=1e-12)
    assert decode.kv_cache_bytes / GIB == pytest.approx(7.70, abs=0.01)
    assert prefill.kv_cache_bytes / GIB == pytest.approx(10.52, abs=0.01)
    gpu = pool.gpu
    assert not vllm_runs_cuda_graphs(DSV3, gpu, _cfg(16, "prefill"))
    assert vllm_runs_cuda_graphs(DSV3, gpu, _cfg(16, "decode"))
    assert vllm_runs_cuda_graphs(DSV3, gpu, ServeConfig(tp=8, role="prefill"))  # no DeepEP: graphs kept


def test_sglang_prefill_instance_keeps_its_auto_mode_buffer():
    """SGLang's prefill lines run `--deepep-mode auto`, which allocates the low-latency layout too
    (`DeepEPBuffer.get_deepep_buffer`): the role changes nothing there."""
    gpu = H100.primary.gpu
    cfg = _cfg(16, "prefill", engine="sglang", max_num_seqs=4)
    nvl, rdma = deepep_normal_buffer_bytes(7168, 16)
    ll = deepep_ll_buffer_bytes(DSV3, sglang_deepep_tokens(4), 16)
    assert deepep_ll_engine_bytes(DSV3, gpu, cfg) == nvl + max(rdma, ll)
    assert deepep_ll_engine_bytes(DSV3, gpu, replace(cfg, role="aggregated")) == nvl + max(rdma, ll)


def test_vllm_engines_keep_one_backend_for_every_step():
    """The prompt-alone step (TTFT) of an aggregated vLLM engine runs the low-latency kernels its line
    passes; a prefill instance's the normal kernels: per MoE layer, ep_dispatch_s with that choice."""
    pool = H100.with_gpus(16).pools[0]
    agg = _cfg(16, "aggregated")
    link = _links(pool, agg)[1]
    ll = ep_dispatch_s(DSV3, LayerKind.MOE, agg, link, routed=2000, pool=pool)
    ht = ep_dispatch_s(DSV3, LayerKind.MOE, agg, link, routed=2000, pool=pool, high_throughput=True)
    assert ll > 2 * ht
    assert prefill_time(DSV3, pool, agg, prompt_len=2000).ep_comm_s == pytest.approx(DSV3.num_moe_layers * ll)
    pre = replace(agg, role="prefill")
    assert prefill_time(DSV3, pool, pre, prompt_len=2000).ep_comm_s == pytest.approx(DSV3.num_moe_layers * ht)
    mixed = step_time(DSV3, pool, agg, decode_seqs=64, prefill_tokens=2000, prefills=1, prefill_len=2000,
                      context_len=2000, balanced_prefill=True)
    assert mixed.ep_comm_s == pytest.approx(
        DSV3.num_moe_layers * ep_dispatch_s(DSV3, LayerKind.MOE, agg, link, routed=2064, pool=pool))
    assert not deepep_normal_step(DSV3, pool, agg, prefill=True)
    assert deepep_normal_step(DSV3, pool, pre, prefill=True) and deepep_normal_step(DSV3, pool, pre, prefill=False)


def test_sglang_scattered_instance_dispatches_a_tp_ranks_share():
    """SGLang TP16/EP16 without attention DP over two H100 nodes, on DeepEP (a split instance): each of
    the 16 ranks dispatches 1/16 of the step's tokens, the normal kernels on a step with prompt tokens
    and the low-latency ones on a decode step, exactly as a DP16 engine of one-GPU ranks with that
    share; SGLang's buffer is held. Aggregated SGLang engines without attention DP run no DeepEP."""
    pool = H100.with_gpus(16).pools[0]
    cfg = ServeConfig(tp=16, expert_parallel=True, weight_dtype=FP8, engine="sglang", role="prefill",
                      max_num_seqs=4)
    assert scattered_deepep(DSV3, pool.gpu, cfg)
    ranks = ServeConfig(dp_attention=16, expert_parallel=True, weight_dtype=FP8, engine="sglang")
    tokens = 8192.0
    share = tokens / 16
    imbalance = busiest_rank_factor(16, share * 16 * 8 / 16, 256, 8, 8, 4)
    ht = ht_dispatch_combine_s(DSV3, ranks, pool, routed=share, per_domain=8, dispatch_bytes=FP8_WITH_BLOCK_SCALES,
                               combine_bytes=2.0, imbalance=imbalance)
    link = _links(pool, cfg)[1]
    got = ep_dispatch_s(DSV3, LayerKind.MOE, cfg, link, routed=tokens, pool=pool, high_throughput=True)
    assert got == pytest.approx(ht, rel=1e-12) and got > 0
    low = ep_dispatch_s(DSV3, LayerKind.MOE, cfg, link, routed=tokens, pool=pool)
    assert low == pytest.approx(ep_dispatch_s(DSV3, LayerKind.MOE, ranks, _links(pool, ranks)[1], routed=share,
                                              pool=pool), rel=1e-12)
    assert deepep_normal_step(DSV3, pool, cfg, prefill=True) and not deepep_normal_step(DSV3, pool, cfg, prefill=False)
    step = step_time(DSV3, pool, cfg, decode_seqs=0, prefill_tokens=tokens, prefills=4, prefill_len=2048,
                     context_len=0, balanced_prefill=True)
    assert step.ep_comm_s == pytest.approx(DSV3.num_moe_layers * ht, rel=1e-12)
    nvl, rdma = deepep_normal_buffer_bytes(7168, 16)
    assert deepep_sglang_engine_bytes(DSV3, pool.gpu, cfg) == nvl + max(rdma, deepep_ll_buffer_bytes(DSV3, 128, 16))
    aggregated = replace(cfg, role="aggregated")
    assert not scattered_deepep(DSV3, pool.gpu, aggregated)
    assert ep_dispatch_s(DSV3, LayerKind.MOE, aggregated, link, routed=tokens, pool=pool, high_throughput=True) == 0
    assert not scattered_deepep(DSV3, pool.gpu, replace(cfg, deep_gemm=False))  # its line runs no DeepEP
