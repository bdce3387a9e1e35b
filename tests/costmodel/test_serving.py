"""Serving cost model: closed forms, vLLM memory accounting, monotonicity of prefill and decode."""

from __future__ import annotations

import pytest

from autoshard.costmodel.comm import Collective, collective_time_s, group_link, tp_all_reduce_s
from autoshard.costmodel.serve.attention import prefill_attention_s
from autoshard.costmodel.serve.compute import _grouped_experts_s, moe_dp_chunks
from autoshard.costmodel.serve.config import ServeConfig, pp_layer_split, stage_layers
from autoshard.costmodel.serve.memory import (
    activation_peak_bytes,
    cuda_graph_capture_sizes,
    default_max_num_batched_tokens,
    serve_memory,
)
from autoshard.costmodel.serve.predict import concurrency_ladder, predict_serve
from autoshard.costmodel.serve.sharding import expected_max_prefill_tokens
from autoshard.costmodel.serve.step import prefill_time, step_time
from autoshard.costmodel.serve.weights import (
    kv_cache_bytes_per_token,
    kv_cache_bytes_per_token_per_gpu,
    stage_weight_bytes,
    total_weight_bytes,
    weight_bytes_per_param,
)
from autoshard.errors import InfeasibleError
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.units import GIB

LLAMA70 = load_model("llama-3.1-70b")
LLAMA8 = load_model("llama-3.1-8b")
LLAMA405 = load_model("llama-3.1-405b")
DSV3 = load_model("deepseek-v3")
MIXTRAL = load_model("mixtral-8x7b")
H100 = load_cluster("dgx-h100")
POOL1 = H100.with_gpus(1).primary
POOL8 = H100.with_gpus(8).primary
JOB = ServeJob(input_len=1000, output_len=1000)


def decode(model, pool, cfg, batch, context=1500.0):
    return step_time(
        model, pool, cfg, decode_seqs=batch, prefill_tokens=0, prefills=0, prefill_len=1, context_len=context
    )


# --------------------------------------------------------------------------- closed forms


def test_kv_bytes_per_token_llama_70b():
    assert kv_cache_bytes_per_token(LLAMA70) == 2 * 80 * 8 * 128 * 2 == 327_680
    assert kv_cache_bytes_per_token(LLAMA70, WeightDtype.FP8) == 327_680 / 2


def test_mla_caches_the_latent():
    assert kv_cache_bytes_per_token(DSV3) == 61 * (512 + 64) * 2 == 70_272
    # vLLM keeps the whole latent on every TP rank: no sharding, no saving from TP
    assert kv_cache_bytes_per_token_per_gpu(DSV3, tp=8, layers=61, dtype=WeightDtype.BF16) == 70_272


@pytest.mark.parametrize(
    ("tp", "per_gpu"), [(1, 327_680), (2, 163_840), (4, 81_920), (8, 40_960), (16, 40_960)]
)
def test_kv_heads_split_over_tp_then_replicate(tp, per_gpu):
    assert kv_cache_bytes_per_token_per_gpu(LLAMA70, tp=tp, layers=80, dtype=WeightDtype.BF16) == per_gpu


def test_kv_head_replication_at_tp16_doubles_the_cache():
    per_gpu = kv_cache_bytes_per_token_per_gpu(LLAMA70, tp=16, layers=80, dtype=WeightDtype.BF16)
    assert per_gpu == 2 * 80 * 1 * 128 * 2  # one whole KV head per rank
    assert 16 * per_gpu == 2 * kv_cache_bytes_per_token(LLAMA70)  # 8 heads held twice over


def test_weights_bf16_fp8_int4():
    n = LLAMA70.num_params
    edges = 2 * LLAMA70.vocab_size * LLAMA70.hidden_size  # embedding + lm_head stay BF16
    assert total_weight_bytes(LLAMA70, WeightDtype.BF16) == pytest.approx(2 * n, rel=1e-9)
    assert total_weight_bytes(LLAMA70, WeightDtype.FP8) == pytest.approx(n + edges, rel=1e-3)
    assert weight_bytes_per_param(WeightDtype.INT4) == pytest.approx(0.5 + 2 / 128)
    assert total_weight_bytes(LLAMA70, WeightDtype.INT4) == pytest.approx(
        (n - edges) * (0.5 + 2 / 128) + 2 * edges, rel=1e-3
    )


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tp_shards_weights(tp):
    st = stage_layers(LLAMA70, 1)[0]
    per_gpu = stage_weight_bytes(LLAMA70, st, tp=tp, ep=1, weight_dtype=WeightDtype.BF16).total
    assert per_gpu * tp == pytest.approx(total_weight_bytes(LLAMA70, WeightDtype.BF16), rel=2e-3)


def test_pp_stages_cover_every_layer_once():
    for pp in (2, 3, 4, 5):
        stages = stage_layers(LLAMA405, pp)
        assert sum(s.decoders for s in stages) == 126
        assert stages[0].embedding and stages[-1].output
        w = [
            stage_weight_bytes(LLAMA405, s, tp=8, ep=1, weight_dtype=WeightDtype.BF16, pp=pp).total
            for s in stages
        ]
        assert sum(w) * 8 == pytest.approx(total_weight_bytes(LLAMA405, WeightDtype.BF16), rel=2e-3)


def test_pp_split_follows_vllm_get_pp_indices():
    # even share, remainder one apiece to the ranks before the last
    assert pp_layer_split(80, 3) == [27, 27, 26]
    assert pp_layer_split(126, 4) == [31, 32, 32, 31]
    assert pp_layer_split(80, 8) == [10] * 8


def test_moe_all_experts_in_memory_and_ep_over_dp_shards_them():
    st = stage_layers(MIXTRAL, 1)[0]
    tp8 = stage_weight_bytes(MIXTRAL, st, tp=8, ep=1, weight_dtype=WeightDtype.BF16)
    ep8 = stage_weight_bytes(MIXTRAL, st, tp=8, ep=8, weight_dtype=WeightDtype.BF16)
    ep16 = stage_weight_bytes(MIXTRAL, st, tp=8, ep=16, weight_dtype=WeightDtype.BF16)
    all_experts = 32 * 8 * MIXTRAL.expert_params() * 2
    assert tp8.experts * 8 == pytest.approx(all_experts)  # every expert, 1/TP of each
    assert ep8.experts == pytest.approx(tp8.experts)  # 1 whole expert per GPU: same bytes
    assert ep16.experts == pytest.approx(tp8.experts / 2)  # EP = TP x DP spreads over DP too


# --------------------------------------------------------------------------- vLLM memory accounting


def test_vllm_memory_identity():
    cfg = ServeConfig(tp=1, gpu_memory_utilization=0.9, max_num_seqs=256, max_num_batched_tokens=8192)
    mem = serve_memory(LLAMA8, POOL1.gpu, cfg, context_len=2048)
    budget = 0.9 * POOL1.gpu.hbm_gib * GIB
    assert mem.budget_bytes == pytest.approx(budget)
    assert mem.kv_cache_bytes == pytest.approx(
        budget - mem.weights_bytes - mem.activation_bytes - mem.cuda_graph_bytes - mem.non_torch_bytes
    )
    per_token = kv_cache_bytes_per_token(LLAMA8)
    assert mem.kv_cache_tokens % 16 == 0  # whole blocks
    assert 0 <= mem.kv_cache_bytes / per_token - mem.kv_cache_tokens < 16
    assert mem.max_concurrency == pytest.approx(mem.kv_cache_tokens / 2048)
    # vLLM logs for Llama-3.1-8B on one H100 at 0.90: ~15 GiB of weights, ~55 GiB of KV cache
    assert 14.5 < mem.weights_bytes / GIB < 15.5
    assert 52 < mem.kv_cache_bytes / GIB < 57
    assert mem.fits and mem.problem() is None


def test_kv_cache_memory_bytes_overrides_the_utilization():
    cfg = ServeConfig(tp=1, kv_cache_memory_bytes=10 * GIB)
    mem = serve_memory(LLAMA8, POOL1.gpu, cfg, context_len=2048)
    assert mem.kv_cache_bytes == 10 * GIB
    assert mem.kv_cache_tokens == int(10 * GIB / kv_cache_bytes_per_token(LLAMA8)) // 16 * 16


def test_activation_peak_grows_with_the_step_budget_and_sampler_rows():
    small = activation_peak_bytes(LLAMA70, tp=4, ep=1, tokens=2048, num_seqs=256)
    big = activation_peak_bytes(LLAMA70, tp=4, ep=1, tokens=8192, num_seqs=256)
    more_rows = activation_peak_bytes(LLAMA70, tp=4, ep=1, tokens=2048, num_seqs=512)
    assert big > small
    assert more_rows - small == pytest.approx(256 * LLAMA70.vocab_size * 4 * 3)


def test_weights_that_do_not_fit_are_reported():
    cfg = ServeConfig(tp=1)
    mem = serve_memory(LLAMA70, POOL1.gpu, cfg, context_len=2048)
    assert not mem.fits
    assert "GiB per GPU" in mem.problem()
    with pytest.raises(InfeasibleError, match="GiB per GPU"):
        predict_serve(LLAMA70, POOL1, JOB, cfg)


def test_max_model_len_beyond_the_kv_cache_does_not_start():
    cfg = ServeConfig(tp=8, kv_cache_memory_bytes=1 * GIB)
    mem = serve_memory(LLAMA70, POOL8.gpu, cfg, context_len=131072)
    assert not mem.fits and "less than one request" in mem.problem()


def test_defaults_follow_vllm():
    assert default_max_num_batched_tokens(POOL1.gpu) == 8192
    assert default_max_num_batched_tokens(load_cluster("dgx-a100-80gb").primary.gpu) == 2048
    assert default_max_num_batched_tokens(load_cluster("dgx-b200").primary.gpu) == 16384
    sizes = cuda_graph_capture_sizes(256)  # capture up to min(2 * max_num_seqs, 512)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512 and len(sizes) == 3 + 31 + 17
    assert concurrency_ladder(100) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 100]


# --------------------------------------------------------------------------- time


def test_prefill_grows_faster_than_linearly():
    cfg = ServeConfig(tp=8, max_num_batched_tokens=8192)
    times = [prefill_time(LLAMA70, POOL8, cfg, prompt_len=n).total_s for n in (1000, 2000, 8000, 32000)]
    assert times == sorted(times)
    assert times[3] > 4 * times[2]  # causal attention grows with the square of the length


def test_decode_is_hbm_bound_at_batch_1():
    cfg = ServeConfig(tp=1, weight_dtype=WeightDtype.BF16)
    t = decode(LLAMA8, POOL1, cfg, 1)
    weights = total_weight_bytes(LLAMA8, WeightDtype.BF16)
    floor = weights / (POOL1.gpu.hbm_tbps * 1e12)
    assert floor < t.total_s < 1.6 * floor


def test_decode_step_grows_with_batch_and_context_but_throughput_improves():
    cfg = ServeConfig(tp=4)
    steps = [decode(LLAMA70, POOL8, cfg, b).total_s for b in (1, 8, 64, 256, 1024)]
    assert steps == sorted(steps)
    per_token = [s / b for s, b in zip(steps, (1, 8, 64, 256, 1024), strict=True)]
    assert per_token == sorted(per_token, reverse=True)
    assert decode(LLAMA70, POOL8, cfg, 64, context=8000).total_s > decode(LLAMA70, POOL8, cfg, 64).total_s


def test_tp_cuts_latency_and_adds_all_reduces():
    t1 = decode(LLAMA8, POOL8, ServeConfig(tp=1), 1)
    t4 = decode(LLAMA8, POOL8, ServeConfig(tp=4), 1)
    assert t4.total_s < t1.total_s
    assert t1.tp_comm_s == 0 and t4.tp_comm_s > 0


def test_fp8_weights_decode_faster_than_bf16():
    bf16 = decode(LLAMA70, POOL8, ServeConfig(tp=8), 1)
    fp8 = decode(LLAMA70, POOL8, ServeConfig(tp=8, weight_dtype=WeightDtype.FP8), 1)
    assert fp8.gemm_s < 0.7 * bf16.gemm_s


def test_moe_decode_reads_only_the_experts_hit():
    pool = POOL8
    cfg = ServeConfig(tp=8)
    one = decode(MIXTRAL, pool, cfg, 1)
    many = decode(MIXTRAL, pool, cfg, 256)
    all_weights = total_weight_bytes(MIXTRAL, WeightDtype.BF16) / 8 / (pool.gpu.hbm_tbps * 1e12)
    assert one.gemm_s < 0.6 * all_weights  # top-2 of 8 experts (plus attention and launch overheads)
    assert many.gemm_s > all_weights * 0.9  # a big batch touches every expert


def test_expert_parallel_adds_all_to_all_only_with_ep():
    off = decode(MIXTRAL, POOL8, ServeConfig(tp=8), 64)
    on = decode(MIXTRAL, POOL8, ServeConfig(tp=4, dp_attention=2, expert_parallel=True), 64)
    assert off.ep_comm_s == 0 and on.ep_comm_s > 0


def test_pipeline_adds_sends_and_ticks():
    cfg = ServeConfig(tp=4, pp=2)
    pred = predict_serve(LLAMA70, POOL8, JOB, cfg, concurrency=64)
    assert pred.decode.pp_comm_s > 0
    assert pred.prefill.pp_comm_s > 0


def test_prediction_identities():
    cfg = ServeConfig(tp=8, max_num_seqs=128)
    pred = predict_serve(LLAMA70, POOL8, JOB, cfg)
    assert pred.concurrency == 128  # max_num_seqs binds before the KV cache
    assert pred.throughput_tokens_per_s == pytest.approx(128 / pred.tpot_s)
    assert pred.tpot_s == pytest.approx(pred.decode.total_s)
    assert pred.ttft_s >= pred.prefill.total_s
    assert pred.requests_per_s == pytest.approx(pred.throughput_tokens_per_s / 1000)
    low = predict_serve(LLAMA70, POOL8, JOB, cfg, concurrency=1)
    assert low.ttft_s == pytest.approx(low.prefill.total_s)  # alone: no decodes to ride along
    assert low.tpot_s < pred.tpot_s and low.throughput_tokens_per_s < pred.throughput_tokens_per_s


def test_concurrency_is_capped_by_the_kv_cache():
    cfg = ServeConfig(tp=2, max_num_seqs=1024, max_num_batched_tokens=8192)
    pred = predict_serve(LLAMA70, POOL8, JOB, cfg)
    assert pred.concurrency == pred.memory.kv_cache_tokens // 2000


def test_config_validation():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        ServeConfig(gpu_memory_utilization=1.5)
    dp_tp_moe = ServeConfig(tp=2, dp_attention=2)  # vLLM's DP on an MoE model without EP (serve.vllm_dp_moe)
    assert (dp_tp_moe.ep, dp_tp_moe.moe_tp, dp_tp_moe.expert_tp, dp_tp_moe.gpus) == (1, 2, 4, 4)
    with pytest.raises(ValueError, match="positive"):
        ServeConfig(tp=0)
    assert ServeConfig(tp=4, dp_attention=2, expert_parallel=True).ep == 8
    assert ServeConfig(tp=4).ep == 1


# --------------------------------------------------------------------------- serving physics v2


@pytest.mark.parametrize(
    ("tp", "size", "measured_us"),
    # SGLang PR #2904, H100, TensorRT-LLM-derived custom all-reduce without CUDA graphs
    [(2, 262144, 7.9), (4, 262144, 13.9), (8, 262144, 16.7), (2, 1048576, 19.9), (4, 1048576, 31.1),
     (8, 1048576, 33.8), (8, 512, 5.9)],
)
def test_custom_all_reduce_matches_published_h100_latencies(tp, size, measured_us):
    pool = H100.with_gpus(tp).primary
    link = group_link(pool, ranks=tp)
    assert tp_all_reduce_s(size, tp, link, pool) * 1e6 == pytest.approx(measured_us, rel=0.25)


def test_custom_all_reduce_only_where_engines_use_it():
    pool = H100.with_gpus(8).primary
    link = group_link(pool, ranks=8)
    nccl = collective_time_s(Collective.ALL_REDUCE, 65536, 8, link)
    assert tp_all_reduce_s(65536, 8, link, pool) < nccl / 3  # decode-sized: latency-bound ring
    assert tp_all_reduce_s(65536, 8, link, pool, custom=False) == nccl
    big = 64 * 2**20  # above the 8 MiB buffer: NCCL
    assert tp_all_reduce_s(big, 8, link, pool) == collective_time_s(Collective.ALL_REDUCE, big, 8, link)
    pcie = load_cluster("l40s-pcie").with_gpus(8).primary
    plink = group_link(pcie, ranks=8)
    assert tp_all_reduce_s(65536, 8, plink, pcie) == collective_time_s(Collective.ALL_REDUCE, 65536, 8, plink)


def test_pcie_ring_over_both_sockets_runs_at_the_cross_socket_bandwidth():
    """8x L40S: four GPUs per socket. A group within one socket runs at the PCIe link (25 GB/s), one
    that spans both sockets (TP 8; DP 2 of stride 4) at cross_socket_gbps (20 GB/s: the 28 / 35 GB/s
    8- vs 4-GPU busbw ratio of NVIDIA/nccl#1639 on the 25 GB/s link): a TP 8 ring all-reduce of S
    bytes takes 2 * 7/8 * S / (20e9 * intra_node_bw), 25/20 of the single-socket figure."""
    from pydantic import ValidationError

    from autoshard.specs.cluster import NodeSpec

    pool = load_cluster("l40s-pcie").with_gpus(8).primary
    eff = pool.gpu.efficiency.intra_node_bw
    assert (pool.node.socket_gpus, pool.node.cross_socket_gbps) == (4, 20)
    assert group_link(pool, ranks=4).bytes_per_s == pytest.approx(25e9 * eff)
    assert group_link(pool, ranks=2, stride=2).bytes_per_s == pytest.approx(25e9 * eff)  # GPUs 0, 2
    assert group_link(pool, ranks=8).bytes_per_s == pytest.approx(20e9 * eff)
    assert group_link(pool, ranks=2, stride=4).bytes_per_s == pytest.approx(20e9 * eff)  # GPUs 0, 4
    size = 64 * 2**20
    t8 = collective_time_s(Collective.ALL_REDUCE, size, 8, group_link(pool, ranks=8))
    lat = 6 * group_link(pool, ranks=8).latency_s
    assert t8 - lat == pytest.approx(2 * 7 / 8 * size / (20e9 * eff))
    # across nodes the rings of a node's 8 members still cross its sockets: capped at 20, not 25 GB/s
    two = load_cluster("l40s-pcie").with_gpus(16).primary
    inter = two.gpu.efficiency.inter_node_bw
    assert group_link(two, ranks=16).bytes_per_s == pytest.approx(min(8 * 12.5e9 * inter, 20e9 * eff))
    assert group_link(two, ranks=8, stride=2).bytes_per_s == pytest.approx(min(4 * 12.5e9 * inter, 20e9 * eff))
    assert group_link(two, ranks=2, stride=8).bytes_per_s == pytest.approx(min(12.5e9 * inter, 25e9 * eff))
    # NVLink nodes name no sockets: unchanged
    h100 = H100.with_gpus(8).primary
    assert h100.node.socket_gpus is None
    assert group_link(h100, ranks=8).bytes_per_s == pytest.approx(450e9 * h100.gpu.efficiency.intra_node_bw)
    base = dict(gpus_per_node=8, intra_node_link="pcie", intra_node_gbps=25, inter_node_gbps=12.5)
    for bad, match in (
        ({"socket_gpus": 4}, "set both or neither"),
        ({"cross_socket_gbps": 20}, "set both or neither"),
        ({"socket_gpus": 3, "cross_socket_gbps": 20}, "divisor of gpus_per_node"),
        ({"socket_gpus": 8, "cross_socket_gbps": 20}, "divisor of gpus_per_node"),
        ({"socket_gpus": 4, "cross_socket_gbps": 40}, "no faster than the PCIe link"),
        ({"socket_gpus": 4, "cross_socket_gbps": 20, "intra_node_link": "nvlink", "intra_node_gbps": 450},
         "drop socket_gpus"),
    ):
        with pytest.raises(ValidationError, match=match):
            NodeSpec(**{**base, **bad})


def _brute_max_poisson(lam: float, ranks: int) -> float:
    """E[max of `ranks` iid Poisson(lam)] by summing k * P(max = k)."""
    import math as m

    cdf = [0.0]
    term, acc = m.exp(-lam), 0.0
    for k in range(200):
        acc += term
        cdf.append(acc)
        term *= lam / (k + 1)
    return sum(k * (cdf[k + 1] ** ranks - cdf[k] ** ranks) for k in range(200))


@pytest.mark.parametrize(("lam", "ranks"), [(0.2, 8), (1.0, 4), (3.0, 16), (0.5, 2)])
def test_expected_max_prefill_is_the_poisson_maximum(lam, ranks):
    chunk = 1000
    got = expected_max_prefill_tokens(lam * chunk, ranks=ranks, prompt_tokens=chunk)
    assert got == pytest.approx(max(_brute_max_poisson(lam, ranks), lam) * chunk, rel=1e-6)
    assert expected_max_prefill_tokens(lam * chunk, ranks=1, prompt_tokens=chunk) == lam * chunk


def test_grouped_experts_read_the_hit_experts_once():
    """Qwen3-235B (128 experts, top-8, 1536 wide) decoding one token on one GPU: 8 experts hit,
    their 3 x 4096 x 1536 FP8 weights read once, two grouped launches (gate/up, down)."""
    qwen = load_model("qwen3-235b-a22b")
    cfg = ServeConfig(tp=1, weight_dtype=WeightDtype.FP8)
    gpu = POOL1.gpu
    eff = gpu.efficiency
    hit = 128 * (1 - (1 - 8 / 128) ** 1)
    weights = hit * 3 * 4096 * 1536 * 1.0
    floor = weights / (gpu.hbm_tbps * 1e12 * eff.hbm) + 2 * eff.kernel_overhead_us * 1e-6
    got = _grouped_experts_s(qwen, gpu, cfg, 1.0)
    assert got == pytest.approx(floor, rel=0.01)


def test_expert_parallel_without_attention_dp_needs_no_dispatch():
    """EP = TP (one DP rank): every rank already holds every token; the combine is the TP all-reduce."""
    step = decode(MIXTRAL, POOL8, ServeConfig(tp=8, expert_parallel=True), 64)
    assert step.ep_comm_s == 0 and step.tp_comm_s > 0


def test_attention_dp_waits_for_the_busiest_rank():
    """Eight DP ranks each averaging 0.2 prompts of 1000 tokens per step: the dense part of the step
    (here its element-wise kernels, linear in tokens) runs at the expected maximum load over the ranks,
    200 decode + ~871 prefill tokens, not at the mean rank's 400."""
    # per-tensor FP8: a block-scaled checkpoint adds the group quantization of the experts'
    # intermediate, which follows the mean rank's routed tokens, not the busiest rank's
    qwen = load_model("qwen3-235b-a22b").model_copy(update={"checkpoints": ()})
    # vLLM 0.11.0's 256-token DP chunks (ServeConfig.moe_dp_chunk), which the decode-only steps below run
    cfg = ServeConfig(tp=1, dp_attention=8, expert_parallel=True, weight_dtype=WeightDtype.FP8, moe_dp_chunk=256)
    worst = expected_max_prefill_tokens(200, ranks=8, prompt_tokens=1000)
    assert 800 < worst < 1000  # P(some rank has a prompt) = 1 - 0.8187^8 = 80 %, sometimes two
    dp8 = step_time(qwen, POOL8, cfg, decode_seqs=200, prefill_tokens=200, prefills=0.2, prefill_len=1000,
                    context_len=1500)
    def flat(tokens):
        return step_time(qwen, POOL8, cfg, decode_seqs=tokens, prefill_tokens=0, prefills=0, prefill_len=1,
                         context_len=1500)
    # a decode-only step of 1,071 tokens runs its MoE layers in 5 passes of 256 (MOE_DP_CHUNK), each
    # further pass routing again (3 kernels); a step with prefill in it takes its tokens in one pass
    assert moe_dp_chunks(cfg, 200 + worst) == 5 and moe_dp_chunks(cfg, 400) == 2

    def one_pass(tokens):
        kov = POOL8.gpu.efficiency.kernel_overhead_us
        extra = (moe_dp_chunks(cfg, tokens) - 1) * 3 * qwen.num_moe_layers * kov
        return flat(tokens).elementwise_s - extra * 1e-6

    assert dp8.elementwise_s == pytest.approx(one_pass(200 + worst), rel=1e-9)
    fixed = flat(1).elementwise_s  # launch costs, the same for any token count (plus one token)
    assert dp8.elementwise_s - fixed > 2.5 * (one_pass(400) - fixed)


@pytest.mark.parametrize(("seq", "tflops"), [(512, 430.32), (2048, 565.544), (16384, 620.73)])
def test_prefill_attention_follows_flash_attention_3_on_hopper(seq, tflops):
    """pytorch/benchmark PR #2391, FA3 forward, head dim 128 on H100: the curve stays within 5 %."""
    gpu = POOL1.gpu
    flops = 2.0 * seq * seq * LLAMA8.num_attention_heads * (128 + 128) * 0.5
    achieved = flops / prefill_attention_s(LLAMA8, gpu, tp=1, prompt_len=seq) / 1e12
    assert achieved == pytest.approx(tflops, rel=0.05)


def test_prefill_attention_elsewhere_uses_the_gpu_attention_efficiency():
    a100 = load_cluster("dgx-a100-80gb").with_gpus(1).primary.gpu
    seq = 4096
    flops = 2.0 * seq * seq * LLAMA8.num_attention_heads * 256 * 0.5
    expected = flops / (a100.bf16_tflops * 1e12 * a100.efficiency.attention)
    assert prefill_attention_s(LLAMA8, a100, tp=1, prompt_len=seq) == pytest.approx(expected)


def test_fp8_context_attention_runs_at_the_fp8_peak_only_where_asked_and_possible():
    """TensorRT-LLM FP8 engines (use_fp8_context_fmha) run the prefill attention on FP8 tensor cores:
    the same FA3 efficiency curve of the 1979 TFLOP/s FP8 peak, half the BF16 time on H100 (at 16k:
    ~1.24 PFLOP/s, FA3's "close to 1.2 PFLOPs" in FP8); a GPU without FP8 (A100) keeps BF16; a step
    uses it only with the config flag and an FP8 KV cache."""
    h100 = POOL1.gpu
    a100 = load_cluster("dgx-a100-80gb").with_gpus(1).primary.gpu
    seq = 16384
    bf16 = prefill_attention_s(LLAMA8, h100, tp=1, prompt_len=seq)
    fp8 = prefill_attention_s(LLAMA8, h100, tp=1, prompt_len=seq, fp8=True)
    assert fp8 == pytest.approx(bf16 * 989 / 1979)
    flops = 2.0 * seq * seq * LLAMA8.num_attention_heads * 256 * 0.5
    assert flops / fp8 / 1e12 == pytest.approx(1241, rel=0.03)
    assert prefill_attention_s(LLAMA8, a100, tp=1, prompt_len=seq, fp8=True) == prefill_attention_s(
        LLAMA8, a100, tp=1, prompt_len=seq
    )

    def attention(**flags):
        cfg = ServeConfig(weight_dtype=WeightDtype.FP8, **flags)
        return step_time(
            LLAMA8, POOL1, cfg, decode_seqs=0, prefill_tokens=seq, prefills=1, prefill_len=seq, context_len=0
        ).attention_s

    base = attention(kv_cache_dtype=WeightDtype.FP8)
    assert attention(kv_cache_dtype=WeightDtype.BF16, fp8_context_attention=True) == base  # BF16 cache
    fast = attention(kv_cache_dtype=WeightDtype.FP8, fp8_context_attention=True)
    assert base - fast == pytest.approx(32 * (bf16 - fp8))  # 32 layers, one prompt each


# --------------------------------------------------------------------------- host work and serving knobs


def test_host_work_is_per_request_per_step():
    """ServeConfig.host_us_per_seq x (decode requests + prompts in the step), serial with the GPU work;
    0 removes it and nothing else changes."""
    cfg = ServeConfig(tp=8, weight_dtype=WeightDtype.FP8, host_us_per_seq=5.0)
    off = ServeConfig(tp=8, weight_dtype=WeightDtype.FP8, host_us_per_seq=0.0)
    kw = dict(decode_seqs=512, prefill_tokens=2048, prefills=2.0, prefill_len=1024, context_len=1500.0)
    on_t, off_t = step_time(LLAMA70, POOL8, cfg, **kw), step_time(LLAMA70, POOL8, off, **kw)
    assert on_t.host_s == pytest.approx(5e-6 * (512 + 2))
    assert off_t.host_s == 0
    assert on_t.total_s - off_t.total_s == pytest.approx(on_t.host_s)
    assert on_t.compute_s == off_t.compute_s
    assert prefill_time(LLAMA70, POOL8, cfg, prompt_len=20000).host_s == pytest.approx(5e-6 * 3)  # 3 chunks
    with pytest.raises(ValueError, match="host_us_per_seq"):
        ServeConfig(host_us_per_seq=-1.0)


def test_serving_efficiencies_replace_the_training_ones_in_serving_only():
    """serve_gemm replaces the GEMM efficiency (FP8 at serve_fp8_ratio of it), serve_attention_hbm
    the HBM fraction of paged decode attention; a GPU without them keeps its training values."""
    from autoshard.costmodel.serve.compute import fp8_gemm_ratio, serving_gpu

    gpu = POOL1.gpu
    eff = gpu.efficiency
    assert eff.serve_gemm is not None and eff.serve_attention_hbm is not None
    seen = serving_gpu(gpu).efficiency
    assert seen.gemm == eff.serve_gemm
    # H100: serving's knobs were fitted with FP8 and BF16 GEMMs at the same fraction of their peaks
    # (serve_fp8_ratio 1.0), whatever the training knobs say (0.55 / 0.60 since the measured shape table,
    # 0.60 / 0.60 since item AF, 0.60 / 0.55 at item AG, 0.60 / 0.60 since item AH)
    assert (eff.train_gemm, eff.train_gemm_fp8, eff.gemm, eff.gemm_fp8) == (0.60, 0.60, 0.70, 0.55)
    assert eff.serve_fp8_ratio == 1.0 and fp8_gemm_ratio(gpu) == 1.0
    assert seen.gemm_fp8 == pytest.approx(eff.serve_gemm)
    # without it, a type's training fit gives the ratio (B200: 0.45 / 0.60 since item AH, 0.50 / 0.60 from item AF),
    # capped at 1 in serving_gpu
    b200 = load_cluster("dgx-b200").primary.gpu
    b200 = b200.model_copy(update={"efficiency": b200.efficiency.model_copy(update={"serve_fp8_ratio": None})})
    assert fp8_gemm_ratio(b200) == pytest.approx(0.45 / 0.60)
    untrained = gpu.model_copy(update={"efficiency": eff.model_copy(update={
        "train_gemm": None, "train_gemm_fp8": None, "serve_gemm": 0.9, "serve_fp8_ratio": None})})
    assert fp8_gemm_ratio(untrained) == pytest.approx(0.55 / 0.70)
    assert serving_gpu(untrained).efficiency.gemm_fp8 == pytest.approx(0.9 * 0.55 / 0.70)
    assert seen.hbm == eff.hbm  # weights and element-wise kernels keep the training HBM fraction
    bare_eff = eff.model_copy(update={"serve_gemm": None, "serve_attention_hbm": None})
    bare = gpu.model_copy(update={"efficiency": bare_eff})
    assert serving_gpu(bare) is bare
    # decode attention reads the KV cache at serve_attention_hbm: halve it, the HBM-bound part doubles
    slow_eff = eff.model_copy(update={"serve_attention_hbm": eff.serve_attention_hbm / 2})
    slow = gpu.model_copy(update={"efficiency": slow_eff})
    pool_slow = POOL1.model_copy(update={"gpu": slow})
    cfg = ServeConfig(weight_dtype=WeightDtype.FP8, kv_cache_dtype=WeightDtype.FP8)
    a, b = decode(LLAMA8, POOL1, cfg, 256, 4000.0), decode(LLAMA8, pool_slow, cfg, 256, 4000.0)
    overhead = 32 * eff.kernel_overhead_us * 1e-6
    assert b.attention_s - overhead == pytest.approx(2 * (a.attention_s - overhead), rel=1e-9)
    assert b.gemm_s == a.gemm_s
