"""SGLang's attention DP with the MoE on tensor parallelism (`--tp-size N --attn-dp-size D`, no EP;
`autoshard.costmodel.serve.dp_tp_moe`): per-rank weights and KV cache in closed form from DeepSeek-V3's
config, the gather / combine collectives SGLang 0.5.23 runs around every FFN (an all-reduce of the
summed buffer each way, or an all-gather of D x the busiest rank's rows and the all-reduce of that
buffer), and a whole decode step's TP communication counted collective by collective."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autoshard.costmodel.comm import Link, group_link, tp_all_reduce_s
from autoshard.costmodel.serve.config import ServeConfig, stage_layers
from autoshard.costmodel.serve.dp_tp_moe import (
    SGLANG_CUSTOM_AR_V2_MAX_BYTES,
    custom_all_reduce_v2,
    dp_gather_combine_s,
    ffn_config,
    gathered_rows,
    padding_mode,
)
from autoshard.costmodel.serve.engines import engine_config, sglang_priced
from autoshard.costmodel.serve.memory import (
    CUDA_GRAPH_BYTES_PER_LAYER_GRAPH,
    CUDA_GRAPH_POOL_BYTES,
    activation_peak_bytes,
    serve_memory,
)
from autoshard.costmodel.serve.engine_defaults import capture_sizes
from autoshard.costmodel.serve.step import step_time
from autoshard.costmodel.serve.weights import kv_cache_bytes_per_token_per_gpu, stage_weight_bytes
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype

DSV3 = load_model("deepseek-v3")
H200 = load_cluster("dgx-h200").with_gpus(8).pools[0]
FP8 = WeightDtype.FP8
# DeepSeek-V3's config.json: hidden 7,168, dense FFN 18,432, 256 routed experts + 1 shared of 2,048,
# 61 layers (3 dense), vocab 129,280, MLA q_lora 1,536, kv_lora 512, rope 64, nope 128, v 128, 128 heads
H, FFN, EFFN, E, LAYERS, DENSE, VOCAB = 7168, 18432, 2048, 256, 61, 3, 129280


def _cfg(**kw) -> ServeConfig:
    base = dict(tp=1, dp_attention=8, weight_dtype=FP8, kv_cache_dtype=FP8, engine="sglang", max_num_seqs=64)
    return engine_config(ServeConfig(**{**base, **kw}), "sglang", gpus_per_node=8, gpu=H200.gpu)


def test_only_sglang_runs_attention_dp_without_expert_parallelism():
    vllm = ServeConfig(dp_attention=8)  # vLLM's counterpart shards the routed experts alone (serve.vllm_dp_moe)
    assert (vllm.moe_tp, vllm.expert_tp) == (1, 8)
    cfg = _cfg()
    assert (cfg.ep, cfg.moe_tp, cfg.expert_tp, cfg.gpus, cfg.deep_gemm) == (1, 8, 8, 8, False)  # Triton, no DeepEP
    assert (ffn_config(cfg).tp, ffn_config(cfg).dp_attention) == (8, 1)
    assert sglang_priced(cfg, 8) and not sglang_priced(cfg, 8, split=True)  # aggregated engines only


def test_weights_per_rank_closed_form():
    """TP 1 x attention DP 8, MoE TP 8, FP8 (1 byte) linear weights: each rank holds its DP rank's whole
    attention (as SGLang replicates it), 1/8 of every dense MLP, shared and routed expert and of the
    output projection (BF16), the whole BF16 embedding (sharded over the attention-TP group of one)."""
    (st,) = stage_layers(DSV3, 1)
    w = stage_weight_bytes(DSV3, st, tp=1, ep=1, weight_dtype=FP8, moe_tp=8)
    moe_layers = LAYERS - DENSE
    assert w.experts == moe_layers * E * 3 * H * EFFN / 8 == 81_738_596_352
    router, shared = H * E * 2, 3 * H * EFFN / 8
    assert w.mlp == DENSE * 3 * H * FFN / 8 + moe_layers * (router + shared) == 680_787_968
    mla = 7168 * 1536 + 7168 * (512 + 64) + 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    per_layer = mla * 1 + (512 + 1536) * 2 + 2 * H * 2  # FP8 projections, BF16 q/kv and layer norms
    assert w.attention == LAYERS * per_layer == 11_415_420_928
    assert w.embedding == VOCAB * H * 2
    assert w.output == (VOCAB * H / 8 + H) * 2
    # the same deployment as one TP-8 engine differs by the attention and the embedding alone
    tp8 = stage_weight_bytes(DSV3, st, tp=8, ep=1, weight_dtype=FP8)
    assert (tp8.experts, tp8.mlp, tp8.output) == (w.experts, w.mlp, w.output)
    assert w.total == pytest.approx(95_919_847_424)


def test_kv_cache_per_rank_holds_its_own_requests():
    """The MLA latent (512 + 64 FP8 bytes per layer) is whole on every rank either way; under TP 8 the
    eight GPUs hold one pool for the engine's requests, under attention DP 8 each GPU a pool for its own
    DP rank's: over 6x the engine's KV tokens here (its weights 10 GiB more per GPU)."""
    assert kv_cache_bytes_per_token_per_gpu(DSV3, tp=1, layers=LAYERS, dtype=FP8) == LAYERS * 576
    dp = serve_memory(DSV3, H200, _cfg(max_num_batched_tokens=1024), context_len=2000)  # the planner's 8,192 / 8
    tp8 = serve_memory(DSV3, H200, engine_config(ServeConfig(tp=8, weight_dtype=FP8, kv_cache_dtype=FP8,
                                                             max_num_seqs=64), "sglang", gpus_per_node=8), context_len=2000)
    # MLA's head-sharded projections (q_b, kv_b, o) and the embedding, whole instead of 1/8: 10.06 GiB
    sharded = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    assert dp.weights_bytes - tp8.weights_bytes == LAYERS * sharded * 7 / 8 + VOCAB * H * 2 * 7 / 8 == 10_800_398_336
    # the same bytes per token per GPU: the engine's KV tokens scale with its KV bytes, 8 pools against one
    ratio = 8 * dp.kv_cache_tokens / tp8.kv_cache_tokens
    assert ratio == pytest.approx(8 * dp.kv_cache_bytes / tp8.kv_cache_bytes, rel=1e-4) and 6 < ratio < 7


NVL = Link(400e9, 5e-6, False)


def _ar(size: float, n: int = 8) -> float:  # NCCL ring all-reduce: 2 (n-1)/n of the buffer, 2 log2 n steps
    return 2 * (n - 1) / n * size / NVL.bytes_per_s + 2 * math.ceil(math.log2(n)) * NVL.latency_s


def _ag(size: float, n: int = 8) -> float:
    return (n - 1) / n * size / NVL.bytes_per_s + math.ceil(math.log2(n)) * NVL.latency_s


@pytest.mark.parametrize(("rows_sum", "rows_max", "prefill", "spec", "mode", "buffer_rows", "expected"), [
    # a prefill step: SUM_LEN whatever its size, one all-reduce of the summed rows each way
    (8 * 1024, 1024, True, 0, "sum_len", 8192, lambda s: 2 * _ar(s)),
    # decode, 64 a rank: 512 x 7,168 x 2 B = 7.3 MB fits CustomAllReduceV2's 16 MiB: SUM_LEN
    (512, 64, False, 0, "sum_len", 512, lambda s: 2 * _ar(s)),
    # decode, 256 a rank: 29.4 MB does not: MAX_LEN, an all-gather of 8 x 256 rows, then its all-reduce
    (2048, 256, False, 0, "max_len", 2048, lambda s: _ag(s) + _ar(s)),
    # an uneven MAX_LEN step pads every rank to the busiest's 300 rows
    (2048, 300, False, 0, "max_len", 2400, lambda s: _ag(s) + _ar(s)),
    # speculative decoding never takes the custom-all-reduce SUM_LEN path
    (512, 64, False, 1, "max_len", 512, lambda s: _ag(s) + _ar(s)),
])
def test_gather_and_combine_collectives(rows_sum, rows_max, prefill, spec, mode, buffer_rows, expected):
    cfg = replace(_cfg(), speculative_tokens=spec)
    if mode == "sum_len" and not prefill:  # the custom-all-reduce fit decides decode steps (bf16 rows)
        assert rows_sum * H * 2 <= SGLANG_CUSTOM_AR_V2_MAX_BYTES
    assert custom_all_reduce_v2(H200, cfg, NVL)
    kw = dict(rows_sum=rows_sum, prefill=prefill, custom=True)
    assert padding_mode(DSV3, cfg, **kw) == mode
    assert gathered_rows(DSV3, cfg, rows_max=rows_max, **kw) == buffer_rows
    # across nodes (or with --disable-custom-all-reduce) no V2: decode steps take MAX_LEN, prefill SUM_LEN
    assert padding_mode(DSV3, cfg, **{**kw, "custom": False}) == ("sum_len" if prefill else "max_len")
    assert not custom_all_reduce_v2(H200, cfg, replace(NVL, crosses_nodes=True))
    cfg = replace(cfg, custom_all_reduce=False)  # NCCL: closed-form rings
    if mode == "sum_len" and not prefill:  # priced on NCCL here, as the SUM_LEN choice was made above
        got = 2 * tp_all_reduce_s(buffer_rows * H * 2, 8, NVL, H200, custom=False)
    else:
        got = dp_gather_combine_s(DSV3, H200, cfg, NVL, rows_sum=rows_sum, rows_max=rows_max, prefill=prefill)
    assert got == pytest.approx(expected(buffer_rows * H * 2), rel=1e-12)


def test_decode_step_communication_collective_by_collective():
    """A decode step of 64 requests on each of 8 attention-DP ranks (TP 1): no attention all-reduce, per
    layer the SUM_LEN gather and the combine, each an all-reduce of 512 x 7,168 BF16 rows over the 8
    GPUs (custom all-reduce, under 8 MiB), and the logits' all-gather of 512 rows x 129,280 BF16 over
    the 8 GPUs the output projection is sharded on; no expert-parallel all-to-all."""
    cfg = _cfg()
    st = step_time(DSV3, H200, cfg, decode_seqs=64, prefill_tokens=0, prefills=0, prefill_len=1000,
                   context_len=1500)
    link = group_link(H200, ranks=8)
    per_layer = 2 * tp_all_reduce_s(512 * H * 2, 8, link, H200)
    from autoshard.costmodel.comm import Collective, collective_time_s
    logits = collective_time_s(Collective.ALL_GATHER, 512 * VOCAB * 2, 8, link)
    assert st.tp_comm_s == pytest.approx(LAYERS * per_layer + logits, rel=1e-12)
    assert st.ep_comm_s == 0.0


def test_activation_and_graph_memory_hold_the_gathered_rows():
    """The FFNs run on every DP rank's rows: the profiled peak is the larger of the attention side at TP 1
    on the rank's 1,024-token budget and the FFN side at TP 8 on the 8,192 gathered rows; the decode
    graphs' pool holds the FFN side of 8 x 64 rows. SGLang captures its own list: a default largest batch
    of 512 at --tp-size 8 on a 141 GB GPU (capped at --max-running-requests 512 = 64 x 8), kept at the 64
    requests a rank (srt/arg_groups/memory_hook.py:138-145, cuda_graph_hook.py:510-516,
    base_cuda_graph_runner.py:94-101): 1, 2, 4, 8, 12, then steps of 8 from 16 to 64, 12 graphs."""
    cfg = _cfg(max_num_batched_tokens=1024)
    mem = serve_memory(DSV3, H200, cfg, context_len=2000)
    local = activation_peak_bytes(DSV3, tp=1, ep=1, tokens=1024, num_seqs=64)
    gathered = activation_peak_bytes(DSV3, tp=8, ep=1, tokens=8 * 1024, num_seqs=64)
    assert mem.activation_bytes == max(local, gathered) == gathered
    sizes = capture_sizes(H200.gpu, cfg)
    assert sizes == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
    ffn = activation_peak_bytes(DSV3, tp=8, ep=1, tokens=8 * 64, num_seqs=0)
    assert ffn > activation_peak_bytes(DSV3, tp=1, ep=1, tokens=64, num_seqs=0)
    assert mem.cuda_graph_bytes == CUDA_GRAPH_POOL_BYTES + len(sizes) * LAYERS * CUDA_GRAPH_BYTES_PER_LAYER_GRAPH + ffn
