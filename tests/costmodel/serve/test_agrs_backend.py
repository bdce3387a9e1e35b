"""vLLM 0.33.0's default MoE backend, allgather_reducescatter, on an expert-parallel engine over DP
ranks (`ServeConfig.all2all_backend`, `serve.vllm_dp_moe.agrs_ep_comm_s`): no DeepEP buffer, the
experts' workspace on every DP rank's rows in the profiling forward, one MoE pass a step, and each
MoE layer's dispatch an all-gather of the gathered rows (FP8 with block scales plus top-k ids and
weights) and its combine a reduce-scatter of their BF16 outputs, in closed form (bytes moved x link
bandwidth) for DeepSeek-V3 (hidden 7,168, 256 experts, top 8, 58 MoE layers) on 16 H100."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoshard.costmodel.serve.config import AGRS_BACKEND, ServeConfig
from autoshard.costmodel.serve.ep_buffers import VLLM_DEEPEP_NVL_BYTES, deepep_ll_buffer_bytes, uses_deepep_low_latency
from autoshard.costmodel.serve.memory import activation_peak_bytes, serve_memory
from autoshard.costmodel.serve.sharding import _links
from autoshard.costmodel.serve.step import step_time
from autoshard.costmodel.serve.vllm_dp_moe import agrs_ep_comm_s, agrs_ep_engine
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype

DSV3 = load_model("deepseek-v3")
POOL = load_cluster("dgx-h100").with_gpus(16).pools[0]
H, TOPK = 7168, 8
ROW = H * (1 + 4 / 128) + TOPK * (4 + 4)  # FP8 row, one FP32 scale per 128, FP32 weight + int32 id per pick
assert ROW == 7456


def _cfg(**kw) -> ServeConfig:
    return ServeConfig(**{**dict(tp=1, dp_attention=16, expert_parallel=True, weight_dtype=WeightDtype.FP8,
                                 max_num_seqs=256, max_num_batched_tokens=1024, all2all_backend=AGRS_BACKEND), **kw})


def test_the_field_defaults_to_autoshards_own_backend():
    assert ServeConfig().all2all_backend is None  # the solver's plans: deepep_low_latency, as before
    with pytest.raises(ValueError, match="all2all_backend must be None or allgather_reducescatter"):
        _cfg(all2all_backend="pplx")
    cfg = _cfg()
    assert agrs_ep_engine(cfg) and not agrs_ep_engine(replace(cfg, all2all_backend=None))
    assert not agrs_ep_engine(replace(cfg, expert_parallel=False)) and not agrs_ep_engine(replace(cfg, dp_attention=1))
    assert not uses_deepep_low_latency(DSV3, POOL.gpu, cfg) and uses_deepep_low_latency(
        DSV3, POOL.gpu, replace(cfg, all2all_backend=None))


def test_memory_holds_no_deepep_buffer_and_the_gathered_workspace():
    cfg = _cfg()
    mem, deepep = serve_memory(DSV3, POOL, cfg, context_len=2000), serve_memory(
        DSV3, POOL, replace(cfg, all2all_backend=None), context_len=2000)
    assert mem.ep_buffer_bytes == 0
    assert deepep.ep_buffer_bytes == deepep_ll_buffer_bytes(DSV3, 1024, 16) + VLLM_DEEPEP_NVL_BYTES
    # the profiling forward runs the experts on 16 ranks x 1,024 tokens (no DP chunking in vLLM 0.33.0)
    assert mem.activation_bytes == activation_peak_bytes(DSV3, tp=1, ep=16, tokens=16 * 1024, num_seqs=256)
    assert deepep.activation_bytes == activation_peak_bytes(DSV3, tp=1, ep=16, tokens=1024, num_seqs=256)
    assert mem.activation_bytes > 6 * deepep.activation_bytes


def test_dispatch_combine_closed_form():
    cfg = _cfg()
    link = _links(POOL, cfg)[1]
    assert link.crosses_nodes  # 16 DP ranks over two 8-GPU nodes
    bw, lat = link.bytes_per_s, link.latency_s
    # a decode step in a CUDA graph: every rank padded to the busiest's 64 tokens, 16 x 64 rows gathered
    rows = 16 * 64
    gather = 15 / 16 * rows * ROW / bw + 4 * lat
    scatter = 15 / 16 * rows * H * 2 / bw + 4 * lat
    got = agrs_ep_comm_s(DSV3, POOL, cfg, link, tokens=64, rows_sum=16 * 60)
    assert got == pytest.approx(gather + scatter, rel=1e-12)
    # 2 x 8 NIC rails of 50 GB/s at 0.9 (360 GB/s), 20 us a hop: 19.9 + 80 us gather, 38.2 + 80 us scatter
    assert (bw, lat) == pytest.approx((360e9, 20e-6), rel=1e-12) and got == pytest.approx(218.112e-6, rel=1e-9)
    # past the largest captured graph (512 tokens on an H100): the ranks' own tokens, summed
    eager = agrs_ep_comm_s(DSV3, POOL, cfg, link, tokens=1024, rows_sum=12_000)
    assert eager == pytest.approx(15 / 16 * 12_000 * (ROW + 2 * H) / bw + 8 * lat, rel=1e-12)
    # TP 2 x DP 8: the sequence-parallel MoE gathers over all 16 EP ranks (8 a node, as the DP 16 group),
    # the same 8 x 64 rows, on that group's link, not the DP group's 4 ranks a node
    tp2 = _cfg(tp=2, dp_attention=8)
    assert _links(POOL, tp2)[1].bytes_per_s == bw / 2
    assert agrs_ep_comm_s(DSV3, POOL, tp2, _links(POOL, tp2)[1], tokens=64, rows_sum=8 * 64) == pytest.approx(
        15 / 16 * 8 * 64 * (ROW + 2 * H) / bw + 8 * lat, rel=1e-12)


def test_a_decode_step_prices_the_gather_in_one_pass():
    cfg = _cfg()
    step = step_time(DSV3, POOL, cfg, decode_seqs=64, prefill_tokens=0, prefills=0, prefill_len=0, context_len=1000)
    per_layer = agrs_ep_comm_s(DSV3, POOL, cfg, _links(POOL, cfg)[1], tokens=64, rows_sum=16 * 64)
    assert step.ep_comm_s == pytest.approx(DSV3.num_moe_layers * per_layer, rel=1e-12)
    # 58 layers x (1,024 rows x 7,456 B + 1,024 x 14,336 B) x 15/16 = 1.21 GB through each GPU's NIC a step
    assert DSV3.num_moe_layers * 15 / 16 * 1024 * (ROW + 2 * H) == pytest.approx(1.2135e9, rel=1e-3)
    deepep = step_time(DSV3, POOL, replace(cfg, all2all_backend=None), decode_seqs=64, prefill_tokens=0, prefills=0,
                       prefill_len=0, context_len=1000)
    assert deepep.gemm_s == pytest.approx(step.gemm_s, rel=1e-12)  # the same experts' work on each GPU
    assert deepep.ep_comm_s != pytest.approx(step.ep_comm_s, rel=1e-3)
