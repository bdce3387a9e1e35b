"""`solve --mode serve --target sglang` plans SGLang's attention DP with the MoE on tensor parallelism
(`--tp-size N --attn-dp-size D`, no --ep-size, no --moe-a2a-backend: `costmodel.serve.dp_tp_moe`)
where it wins, and declines it where DeepEP's expert parallelism serves more.

- Qwen3-235B-A22B BF16 on 8 A100-80GB at TPOT <= 100 ms: chosen, TP 4 x attention DP 2 with the
  experts over all 8 GPUs. On A100 SGLang runs no DeepEP (its low-latency kernels need SM90), so no
  attention-DP + EP engine is planned; Qwen3's 4 KV heads repeat twice over a TP-8 engine, halving its
  KV pool, and TP 4 x PP 2 pays the pipeline. Attention DP keeps each rank's KV for its own requests
  while no expert weight is held twice.
- DeepSeek-V3 FP8 on 8 H200 at TPOT <= 100 ms: declined. The gather and the combine all-reduce every
  DP rank's tokens over the 8 GPUs around each of the 61 FFNs, where DeepEP moves each token's top-k
  copies once; the best such engine still beats a TP-8 one (whose MLA latent is held whole on all 8
  GPUs for one engine's requests).
"""

from __future__ import annotations

import functools
import shlex

import pytest

from autoshard import api
from autoshard.search.serve.ladder import meets_targets
from autoshard.costmodel.serve.vllm_dp_moe import VLLM_DP_MOE_SPLIT
from autoshard.search.serve.space import _unpriced, enumerate_serve, tabulate
from autoshard.specs import load_cluster, load_model

QWEN_LINE = ("python -m sglang.launch_server --model-path Qwen/Qwen3-235B-A22B --tp-size 8 --pp-size 1 "
             "--attn-dp-size 2 --context-length 2000 --mem-fraction-static 0.913 --max-running-requests 276 "
             "--chunked-prefill-size 2048 --kv-cache-dtype auto")


@functools.cache
def _qwen_a100(framework: str):
    model = load_model("qwen3-235b-a22b")
    job = api.serve_job_for(model, input_len=1000, output_len=1000, tpot_ms=100, weight_dtype="bf16")
    return api.plan_serving(model, load_cluster("dgx-a100-80gb").with_gpus(8), job, top_k=1, pins=None,
                            time_limit_s=30, num_workers=1, seed=0, framework=framework).plans[0]


def test_qwen3_235b_on_a100_plans_attention_dp_with_tp_experts():
    plan = _qwen_a100("sglang")
    assert (plan.tp, plan.pp, plan.dp, plan.ep, plan.dp_attention, plan.replicas) == (4, 1, 2, 1, 2, 1)
    assert plan.describe() == "TP4 PP1 DP2 MoE TP8"
    cfg = plan.prediction.config
    assert (cfg.engine, cfg.moe_tp, cfg.expert_parallel, cfg.max_num_batched_tokens) == ("sglang", 8, False, 1024)
    doc = plan.to_json()["plan"]
    assert (doc["attention_dp"], doc["etp"], doc["ep"], doc["replicas"], doc["expert_parallel"]) == (2, 8, 1, 1, False)
    assert plan.throughput_tokens_per_s > 3000 and plan.prediction.tpot_s <= 0.1
    # the golden line: attention DP carved out of TP 8, no expert parallelism, no all-to-all backend;
    # 138 requests and 1,024 prompt tokens per DP rank (SGLang divides both flags among the DP ranks)
    assert plan.launch["sglang"] == QWEN_LINE
    words = shlex.split(QWEN_LINE)
    assert "--ep-size" not in words and "--moe-a2a-backend" not in words and "--dp-size" not in words
    # vLLM's line for it (--data-parallel-size 2, no EP) is priced as vLLM runs it: one engine, the routed
    # experts over all 8 GPUs, attention, router and lm_head at TP 4 (`costmodel.serve.vllm_dp_moe`)
    other = plan.engine_other
    assert other["engine"] == "vllm" and "priced" not in other and "vLLM" in other["note"]
    assert "--data-parallel-size 2" in plan.launch["vllm"] and "--enable-expert-parallel" not in plan.launch["vllm"]
    assert 1.0 < other["tokens_per_s"] / plan.throughput_tokens_per_s < 1.2 and other["tpot_s"] <= 0.1
    # that line read back by `evaluate --from-vllm` at the plan's running requests: the same figures
    back = api.evaluate_serve_command(plan.launch["vllm"], None, "dgx-a100-80gb", 8, input_len=1000, output_len=1000,
                                      concurrency=plan.prediction.concurrency * plan.dp)
    assert (back.throughput_tokens_per_s, back.prediction.tpot_s) == (other["tokens_per_s"], other["tpot_s"])


def test_vllm_plans_data_parallelism_of_an_moe_engine_as_one_engine():
    """vLLM runs --data-parallel-size on an MoE model as one engine whose routed experts span TP x DP GPUs
    (`costmodel.serve.vllm_dp_moe`): the vLLM space lists those engines, prices no replicas of an MoE
    engine (its --data-parallel-size line would fuse them), and keeps them out of prefill/decode
    instances. Here expert parallelism still wins, by 7 %: TP 4 x DP 2 with EP 8."""
    model, cluster = load_model("qwen3-235b-a22b"), load_cluster("dgx-a100-80gb").with_gpus(8)
    job = api.serve_job_for(model, input_len=1000, output_len=1000, tpot_ms=100, weight_dtype="bf16")
    space = enumerate_serve(model, cluster, job, framework="vllm")
    labels = {e.label() for e in space.engines}
    assert {"TP4 PP1 attention DP2, MoE TP8", "TP1 PP1 attention DP8, MoE TP8"} <= labels
    rows, _ = tabulate(model, cluster, job, space)
    assert rows and all(r.replicas == 1 for r in rows)
    best = max((r for r in rows if meets_targets(job, r) and r.engine.dp_attention == 2 and not r.engine.expert_parallel
                and r.engine.tp == 4), key=lambda r: r.throughput)
    assert best.config.expert_tp == 8 and best.prediction.decode.ep_comm_s > 0
    plan = _qwen_a100("vllm")
    assert plan.describe() == "TP4 PP1 DP2 EP8"
    assert 0.9 < best.throughput / plan.throughput_tokens_per_s < 1.0
    e = next(e for e in space.engines if e.label() == "TP4 PP1 attention DP2, MoE TP8")
    assert _unpriced(cluster.pools[0], e, split=True) == VLLM_DP_MOE_SPLIT and _unpriced(cluster.pools[0], e, split=False) is None


def test_deepseek_v3_fp8_on_h200_declines_it_for_deepep():
    model = load_model("deepseek-v3")
    cluster = load_cluster("dgx-h200").with_gpus(8)
    job = api.serve_job_for(model, input_len=1000, output_len=1000, tpot_ms=100, weight_dtype="fp8",
                            kv_cache_dtype="fp8")
    space = enumerate_serve(model, cluster, job, framework="sglang")
    labels = {e.label() for e in space.engines}
    assert {"TP1 PP1 attention DP8, MoE TP8", "TP2 PP1 attention DP4, MoE TP8"} <= labels
    rows, _ = tabulate(model, cluster, job, space)
    best: dict[str, float] = {}
    for r in rows:
        if meets_targets(job, r):
            kind = "tp_moe" if r.engine.dp_attention > 1 and not r.engine.expert_parallel else (
                "ep" if r.engine.dp_attention > 1 else "tp8" if r.engine.tp == 8 and not r.engine.expert_parallel else "")
            best[kind] = max(best.get(kind, 0.0), r.throughput)
    # EP on DeepEP 8,840 tokens/s, attention DP with TP experts 5,079, plain TP 8 4,791
    assert best["ep"] > 1.4 * best["tp_moe"] and best["tp_moe"] > 1.05 * best["tp8"]
    plan = api.plan_serving(model, cluster, job, top_k=1, pins=None, time_limit_s=30, num_workers=1, seed=0,
                            framework="sglang").plans[0]
    assert plan.expert_parallel and "--moe-a2a-backend deepep" in plan.launch["sglang"]
    assert plan.throughput_tokens_per_s == best["ep"]


def test_evaluate_reads_the_line_back():
    """`evaluate --from-sglang` reads `--attn-dp-size` without `--ep-size` as the same engine (attention DP 2
    of TP 4, experts over all 8 GPUs, 138 requests and a 1,024-token budget per DP rank), not as replicas."""
    plan = _qwen_a100("sglang")
    back = api.evaluate_serve_command(QWEN_LINE, "qwen3-235b-a22b", "dgx-a100-80gb", 8, input_len=1000,
                                      output_len=1000, concurrency=plan.prediction.concurrency * plan.dp, sglang=True)
    cfg = back.prediction.config
    assert (back.tp, back.dp, back.ep, back.dp_attention, back.replicas) == (4, 2, 1, 2, 1)
    assert (cfg.moe_tp, cfg.max_num_seqs, cfg.max_num_batched_tokens) == (8, 138, 1024)
    assert back.prediction.concurrency == plan.prediction.concurrency
    assert back.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-9)
    # relaunched as read: --mem-fraction-static 0.883 is weights + KV, the activations on top (it was taken as
    # the whole budget and relaunched at 0.86)
    assert back.launch["sglang"] == QWEN_LINE


def test_the_common_deepseek_recipe_is_one_engine():
    """`--tp 8 --dp 8 --enable-dp-attention` (SGLang's DeepSeek recipe, no EP) on 8 H200: one engine of 8
    attention-DP ranks with the experts over all 8 GPUs, 89.3 GiB of weights per GPU; it was read as 8
    replicas of TP 1, which do not fit (671 B parameters on one GPU)."""
    back = api.evaluate_serve_command(
        "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --dp 8 --enable-dp-attention",
        None, "dgx-h200", None, input_len=1000, output_len=1000, sglang=True)
    assert (back.tp, back.dp, back.ep, back.dp_attention, back.replicas, back.num_gpus) == (1, 8, 1, 8, 1, 8)
    assert back.prediction.memory.weights_bytes == 95_919_847_424  # tests/costmodel/serve/test_dp_tp_moe.py
    assert back.prediction.config.max_num_batched_tokens == 1024  # SGLang's budget split over the DP ranks
