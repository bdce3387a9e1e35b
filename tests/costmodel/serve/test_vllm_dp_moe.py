"""vLLM's --data-parallel-size on an MoE model without --enable-expert-parallel
(`autoshard.costmodel.serve.vllm_dp_moe`): one engine whose routed experts are TP-sharded over all
T x D GPUs (vLLM 0.33.0 `FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp`), not D replicas.
Per-rank weights and KV cache in closed form from Qwen3-235B-A22B's and DeepSeek-V3's config.json,
the all-gather / reduce-scatter the naive prepare/finalize runs over the DP group around every MoE
layer, a decode step's communication collective by collective, and the launch line that the replica
reading refused (Qwen3-235B BF16 on 8 H100, TP 1 x DP 8) priced as vLLM runs it."""

from __future__ import annotations

import math

import pytest

from autoshard.api_serve import evaluate_serve_command
from autoshard.costmodel.comm import Collective, Link, collective_time_s, group_link, tp_all_reduce_s
from autoshard.costmodel.serve.config import ServeConfig, stage_layers
from autoshard.costmodel.serve.memory import cuda_graph_capture_sizes, serve_memory
from autoshard.costmodel.serve.step import step_time
from autoshard.costmodel.serve.vllm_dp_moe import (
    TOPK_BYTES,
    dispatch_bytes_per_row,
    dispatch_combine_s,
    expert_config,
    gathered_rows,
    local_config,
    tp_experts_problem,
    vllm_dp_tp_moe,
)
from autoshard.costmodel.serve.weights import kv_cache_bytes_per_token_per_gpu, stage_weight_bytes
from autoshard.errors import InfeasibleError, SpecError
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype

QWEN = load_model("qwen3-235b-a22b")
DSV3 = load_model("deepseek-v3")
H100 = load_cluster("dgx-h100").with_gpus(8).pools[0]
BF16, FP8 = WeightDtype.BF16, WeightDtype.FP8
# Qwen3-235B-A22B's config.json: hidden 4,096, 94 layers (all MoE), 64 query / 4 KV heads of 128,
# 128 experts of 1,536 (top 8, no shared expert), vocab 151,936, untied embeddings, QK norm
H, LAYERS, HEADS, KV, D, EXPERTS, EFFN, TOPK, VOCAB = 4096, 94, 64, 4, 128, 128, 1536, 8, 151936


def _cfg(**kw) -> ServeConfig:
    return ServeConfig(**{**dict(tp=1, dp_attention=8, weight_dtype=BF16, max_num_seqs=64), **kw})


def test_the_engine_and_its_halves():
    cfg = _cfg(tp=2, dp_attention=4)
    assert vllm_dp_tp_moe(cfg) and not vllm_dp_tp_moe(_cfg(expert_parallel=True))
    assert not vllm_dp_tp_moe(_cfg(engine="sglang")) and not vllm_dp_tp_moe(_cfg(dp_attention=1))
    assert (cfg.gpus, cfg.ep, cfg.moe_tp, cfg.expert_tp) == (8, 1, 2, 8)
    assert (local_config(cfg).tp, local_config(cfg).dp_attention) == (2, 1)
    assert (expert_config(cfg).tp, expert_config(cfg).dp_attention) == (8, 1)


def test_weights_per_rank_closed_form():
    """TP 1 x DP 8, BF16: each GPU holds its DP rank's whole attention, router, embedding and lm_head
    (replicated, as vLLM builds them on the TP group of one) and 1/8 of every routed expert: 67.8 GiB,
    where the replica reading put the whole 470 GB model on every GPU."""
    (st,) = stage_layers(QWEN, 1)
    cfg = _cfg()
    w = stage_weight_bytes(QWEN, st, tp=1, ep=1, weight_dtype=BF16, moe_tp=cfg.moe_tp, expert_tp=cfg.expert_tp)
    assert w.experts == LAYERS * EXPERTS * 3 * H * EFFN / 8 * 2 == 56_774_098_944
    assert w.mlp == LAYERS * H * EXPERTS * 2 == 98_566_144  # the BF16 routers, whole
    per_layer = (H * (HEADS + 2 * KV) * D + HEADS * D * H) * 2 + 2 * D * 2 + 2 * H * 2  # + QK and layer norms
    assert w.attention == LAYERS * per_layer == 13_406_583_808
    assert (w.embedding, w.output) == (VOCAB * H * 2, VOCAB * H * 2 + H * 2)
    assert w.total == 72_768_576_512  # 67.77 GiB
    replica = stage_weight_bytes(QWEN, st, tp=1, ep=1, weight_dtype=BF16)
    assert replica.total - w.total == LAYERS * EXPERTS * 3 * H * EFFN * 2 * 7 / 8


def test_dense_and_shared_experts_stay_on_the_attention_tp_group():
    """DeepSeek-V3 FP8 at TP 2 x DP 4: the 3 dense MLPs, the shared expert and lm_head at TP 2, only
    the routed experts over 8 GPUs (SGLang's counterpart, `serve.dp_tp_moe`, shards all of them over 8)."""
    (st,) = stage_layers(DSV3, 1)
    cfg = _cfg(tp=2, dp_attention=4, weight_dtype=FP8)
    w = stage_weight_bytes(DSV3, st, tp=2, ep=1, weight_dtype=FP8, moe_tp=cfg.moe_tp, expert_tp=cfg.expert_tp)
    h, ffn, effn, e, moe_layers, vocab = 7168, 18432, 2048, 256, 58, 129280
    assert w.experts == moe_layers * e * 3 * h * effn / 8
    assert w.mlp == 3 * 3 * h * ffn / 2 + moe_layers * (h * e * 2 + 3 * h * effn / 2)
    assert w.output == (vocab * h / 2 + h) * 2
    sglang = stage_weight_bytes(DSV3, st, tp=2, ep=1, weight_dtype=FP8, moe_tp=8)
    assert sglang.experts == w.experts and sglang.mlp < w.mlp and sglang.output < w.output


def test_kv_cache_per_dp_rank():
    """Each DP rank caches its own requests: 94 layers x 2 x 4 KV heads x 128 x 2 B per token on each GPU
    at TP 1; the whole deployment holds 8 such pools."""
    assert kv_cache_bytes_per_token_per_gpu(QWEN, tp=1, layers=LAYERS, dtype=BF16) == LAYERS * 2 * KV * D * 2 == 192_512
    mem = serve_memory(QWEN, H100, _cfg(max_num_batched_tokens=2048, gpu_memory_utilization=0.95), context_len=4096)
    assert mem.problem() is None
    assert mem.weights_bytes == 72_768_576_512
    assert mem.kv_cache_tokens == 16 * math.floor(mem.kv_cache_bytes / 192_512 / 16)


NVL = Link(400e9, 5e-6, False)


def _coll(kind: Collective, size: float, n: int = 8) -> float:  # NCCL: (n-1)/n of the buffer, log2 n steps
    return (n - 1) / n * size / NVL.bytes_per_s + math.ceil(math.log2(n)) * NVL.latency_s


def test_dispatch_bytes_per_row():
    """The gathered row: the hidden state as the experts take it, plus top-k FP32 weights and int32 ids."""
    assert TOPK_BYTES == 8
    assert dispatch_bytes_per_row(QWEN, _cfg(), fp8_math=True) == H * 2 + TOPK * 8 == 8256  # BF16 weights
    fp8 = _cfg(weight_dtype=FP8)  # Qwen3-235B-A22B-FP8: 128 x 128 blocks, 1 x 128 activation groups
    assert dispatch_bytes_per_row(QWEN, fp8, fp8_math=True) == H * (1 + 4 / 128) + TOPK * 8 == 4288
    assert dispatch_bytes_per_row(QWEN, fp8, fp8_math=False) == 8256  # no FP8 tensor cores: BF16 rows


@pytest.mark.parametrize(("rows_sum", "rows_max", "buffer_rows"), [
    (512, 64, 512),        # decode, 64 a rank, in a CUDA graph: every rank at the largest's 64
    (400, 64, 512),        # an uneven graphed step pads the idle ranks to 64 rows each
    (8 * 2048, 2048, 16384),  # a 2,048-token prefill chunk on each rank runs eagerly: the summed rows
    (2048 + 7, 2048, 2055),   # one rank's chunk, the others' single decode tokens: no padding
])
def test_gather_and_scatter_collectives(rows_sum, rows_max, buffer_rows):
    cfg = _cfg()
    assert cuda_graph_capture_sizes(64)[-1] == 128
    assert gathered_rows(cfg, H100.gpu, rows_sum=rows_sum, rows_max=rows_max) == buffer_rows
    got = dispatch_combine_s(QWEN, cfg, NVL, rows=buffer_rows, fp8_math=True)
    expected = _coll(Collective.ALL_GATHER, buffer_rows * 8256) + _coll(Collective.REDUCE_SCATTER, buffer_rows * H * 2)
    assert got == pytest.approx(expected, rel=1e-12)
    assert collective_time_s(Collective.ALL_GATHER, buffer_rows * 8256, 8, NVL) == pytest.approx(
        _coll(Collective.ALL_GATHER, buffer_rows * 8256), rel=1e-12)


def test_eager_engine_never_pads():
    assert gathered_rows(_cfg(cuda_graphs=False), H100.gpu, rows_sum=400, rows_max=64) == 400


def test_decode_step_communication_collective_by_collective():
    """64 requests decoding on each of 8 DP ranks (TP 1): per layer the all-gather of 512 dispatch rows
    and the reduce-scatter of 512 BF16 output rows over the DP group; no TP collective (TP 1, lm_head
    whole on every GPU). At TP 2 x DP 4 the two TP all-reduces of each layer run on the rank's 64 rows
    and the DP group is 4 GPUs at stride 2."""
    st = step_time(QWEN, H100, _cfg(), decode_seqs=64, prefill_tokens=0, prefills=0, prefill_len=1000,
                   context_len=1500)
    link = group_link(H100, ranks=8, stride=1)
    per_layer = (collective_time_s(Collective.ALL_GATHER, 512 * 8256, 8, link)
                 + collective_time_s(Collective.REDUCE_SCATTER, 512 * H * 2, 8, link))
    assert st.ep_comm_s == pytest.approx(LAYERS * per_layer, rel=1e-12)
    assert st.tp_comm_s == 0.0
    cfg = _cfg(tp=2, dp_attention=4)
    st = step_time(QWEN, H100, cfg, decode_seqs=64, prefill_tokens=0, prefills=0, prefill_len=1000,
                   context_len=1500)
    dp_link = group_link(H100, ranks=4, stride=2)
    per_layer = (collective_time_s(Collective.ALL_GATHER, 256 * 8256, 4, dp_link)
                 + collective_time_s(Collective.REDUCE_SCATTER, 256 * H * 2, 4, dp_link))
    assert st.ep_comm_s == pytest.approx(LAYERS * per_layer, rel=1e-12)
    tp_link = group_link(H100, ranks=2)
    logits = collective_time_s(Collective.ALL_GATHER, 64 * VOCAB * 2, 2, tp_link)
    assert st.tp_comm_s == pytest.approx(LAYERS * 2 * tp_all_reduce_s(64 * H * 2, 2, tp_link, H100) + logits, rel=1e-9)


def test_experts_run_on_the_gathered_rows():
    """The step's routed experts are a TP-8 engine's on the 512 gathered rows, the attention a TP-1
    engine's on the rank's 64: the step is slower than one replica's TP-1 decode of 64 would be only
    by what the sharded experts and the collectives add, and faster in the expert GEMMs than a TP-1
    engine holding every expert whole."""
    cfg = _cfg()
    st = step_time(QWEN, H100, cfg, decode_seqs=64, prefill_tokens=0, prefills=0, prefill_len=1000, context_len=1500)
    whole = step_time(QWEN, H100, local_config(cfg), decode_seqs=64, prefill_tokens=0, prefills=0, prefill_len=1000,
                      context_len=1500)
    assert st.attention_s == pytest.approx(whole.attention_s, rel=1e-12)
    assert st.gemm_s < whole.gemm_s  # 1/8 of each expert's weights read, against all of them
    assert st.ep_comm_s > 0 == whole.ep_comm_s


def test_launch_line_read_as_one_engine():
    """`evaluate --from-vllm` on the brief's case: the replica reading needs the whole 470 GB on each H100
    (no start); vLLM's real deployment holds 67.8 GiB of weights a GPU and starts."""
    line = ("vllm serve Qwen/Qwen3-235B-A22B --tensor-parallel-size 1 --data-parallel-size 8 "
            "--max-num-batched-tokens 2048 --max-num-seqs 64 --gpu-memory-utilization 0.95 --max-model-len 4096")
    plan = evaluate_serve_command(line, None, "dgx-h100", None)
    assert (plan.tp, plan.dp, plan.dp_attention, plan.replicas, plan.expert_parallel) == (1, 8, 8, 1, False)
    assert plan.prediction.memory.weights_bytes == 72_768_576_512
    assert plan.prediction.config.expert_tp == 8 and plan.prediction.decode.ep_comm_s > 0
    assert plan.describe() == "TP1 PP1 DP8 MoE TP8"
    # the relaunch line (golden; check_flags.py --world-size 8 passes it): DP 8, no EP, vLLM's default backend
    assert plan.launch["vllm"] == (
        "vllm serve Qwen/Qwen3-235B-A22B --tensor-parallel-size 1 --pipeline-parallel-size 1 --data-parallel-size 8 "
        "--max-model-len 4096 --gpu-memory-utilization 0.95 --max-num-seqs 64 --max-num-batched-tokens 2048 "
        "--kv-cache-dtype auto")
    replica = serve_memory(QWEN, H100, local_config(plan.prediction.config), context_len=4096)
    assert replica.weights_bytes > 430 * 2**30 and replica.problem() is not None
    with pytest.raises(InfeasibleError, match="weights"):  # what the replica reading said of the same line: TP 1
        evaluate_serve_command(line.replace("--data-parallel-size 8 ", ""), None, "dgx-h100", 8)


def test_dense_models_keep_replicas_and_bad_widths_are_refused():
    """A dense model's DP ranks are independent replicas in vLLM (no MoE layer to meet in); an expert
    width TP x DP does not divide is refused before pricing (vLLM asserts intermediate_size % tp_size)."""
    plan = evaluate_serve_command("vllm serve meta-llama/Llama-3.1-70B-Instruct -tp 4 -dp 2", None, "dgx-h100", None)
    assert (plan.dp, plan.dp_attention, plan.replicas, plan.prediction.config.dp_attention) == (2, 1, 2, 1)
    with pytest.raises(SpecError, match="1536 intermediate rows do not split over TP x DP = 7 GPUs"):
        evaluate_serve_command("vllm serve Qwen/Qwen3-235B-A22B -tp 1 -dp 7", None, "dgx-h100", None)


def test_block_fp8_experts_need_whole_blocks_a_gpu():
    """Qwen3-235B-A22B-FP8 (128 x 128 blocks): its 1,536-row experts over TP x DP = 8 leave 192 rows a GPU,
    which vLLM 0.33.0 (`validate_fp8_block_shape_moe`) and SGLang refuse to load; over 4 GPUs, 384 = 3 blocks.
    BF16 weights have no blocks; DeepSeek-V3's 2,048 rows split into whole blocks up to 16 GPUs."""
    kw = dict(dp=4, expert_parallel=False)
    assert "leave 192 a GPU, not whole 128-row blocks" in tp_experts_problem(QWEN, FP8, tp=2, **kw)
    assert tp_experts_problem(QWEN, FP8, tp=1, **kw) is None and tp_experts_problem(QWEN, BF16, tp=2, **kw) is None
    assert tp_experts_problem(QWEN, FP8, tp=2, dp=4, expert_parallel=True) is None  # experts whole on their rank
    assert tp_experts_problem(DSV3, FP8, tp=8, dp=2, expert_parallel=False) is None
    assert "leave 64 a GPU" in tp_experts_problem(DSV3, FP8, tp=8, dp=4, expert_parallel=False)
    with pytest.raises(SpecError, match="leave 192 a GPU"):
        evaluate_serve_command("vllm serve Qwen/Qwen3-235B-A22B-FP8 -tp 1 -dp 8", None, "dgx-h100", None)


def test_replicas_fused_across_nodes_pay_the_gather():
    """The line the planner used to write for 4 TP-4 replicas of Mixtral 8x7B on 16 H100 (`--data-parallel-size
    4`): vLLM runs it as one engine whose experts span both nodes, every MoE layer gathering and scattering
    over the inter-node network. Priced so, it serves about 0.62 of four independent TP-4 servers."""
    line = ("vllm serve mistralai/Mixtral-8x7B-Instruct-v0.1 --tensor-parallel-size 4{dp} --max-num-seqs 768 "
            "--max-model-len 2000 --gpu-memory-utilization 0.90")
    fused = evaluate_serve_command(line.format(dp=" --data-parallel-size 4"), None, "dgx-h100", None,
                                   input_len=1000, output_len=1000)
    one = evaluate_serve_command(line.format(dp=""), None, "dgx-h100", 4, input_len=1000, output_len=1000)
    assert (fused.num_gpus, fused.replicas, fused.prediction.config.expert_tp) == (16, 1, 16)
    assert 0.55 < fused.throughput_tokens_per_s / (4 * one.throughput_tokens_per_s) < 0.7
    step = fused.prediction.decode
    assert step.ep_comm_s > 0.3 * step.total_s and one.prediction.decode.ep_comm_s == 0.0


def test_sglang_replicas_of_an_moe_engine_under_vllm():
    """SGLang's `--dp 2` (no attention DP) runs two independent TP-4 servers; vLLM's line for the same plan,
    `--data-parallel-size 2`, fuses them into one engine with the experts over 8 GPUs, which Qwen3-235B-FP8's
    128-row blocks do not allow: the plan says vLLM would not start it (it used to price two replicas)."""
    plan = evaluate_serve_command("python -m sglang.launch_server --model-path Qwen/Qwen3-235B-A22B-FP8 --tp 4 --dp 2",
                                  None, "dgx-h100", None, sglang=True)
    assert (plan.tp, plan.dp, plan.replicas, plan.dp_attention) == (4, 2, 2, 1)
    assert "--data-parallel-size 2" in plan.launch["vllm"] and "--enable-expert-parallel" not in plan.launch["vllm"]
    other = plan.engine_other
    assert other["differs"] and "would not start" in other["note"] and "leave 192 a GPU" in other["note"]
