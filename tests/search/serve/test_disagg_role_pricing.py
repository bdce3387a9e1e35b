"""The disaggregation tables price the instances the cost model prices, role included: every prefill
row of DeepSeek-V3 FP8 on two H100 nodes is a `role="prefill"` engine whose memory and rate are
exactly `serve_memory` / `prefill_instance` of that config (DeepEP high-throughput buffers on the
attention-DP + EP ones), every decode row a `role="decode"` engine (low-latency buffers)."""

from __future__ import annotations

from autoshard.costmodel.serve.disagg import decode_instance, prefill_instance
from autoshard.costmodel.serve.ep_buffers import deepep_ll_buffer_bytes, vllm_deepep_ht_bytes
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.search.serve.disagg import tabulate_disagg
from autoshard.search.serve.space import enumerate_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

DSV3 = load_model("deepseek-v3")
CLUSTER = load_cluster("dgx-h100").with_gpus(16)
JOB = ServeJob(input_len=2000, output_len=1000, weight_dtype=WeightDtype.FP8)


def test_disagg_rows_price_their_role_exactly():
    space = enumerate_serve(DSV3, CLUSTER, JOB)
    tables = tabulate_disagg(DSV3, CLUSTER, JOB, space, keep_all=True)
    pool = CLUSTER.pools[0]
    wide = 0
    for row in tables.prefill:
        inst = row.instance
        cfg = inst.config
        assert cfg.role == "prefill"
        mem = serve_memory(DSV3, pool, cfg, context_len=JOB.context_len)
        assert mem == inst.memory
        assert prefill_instance(DSV3, pool, JOB, cfg, mem).requests_per_s == inst.requests_per_s
        if cfg.expert_parallel and cfg.dp_attention > 1:
            wide += 1
            assert mem.ep_buffer_bytes == vllm_deepep_ht_bytes(cfg, pool.node.gpus_per_node)
            assert mem.ep_buffer_bytes == (2**31 if cfg.gpus > 8 else 2**30) and mem.cuda_graph_bytes == 0
    assert wide > 0
    for row in tables.decode[:40]:
        cfg = row.instance.config
        assert cfg.role == "decode"
        mem = serve_memory(DSV3, pool, cfg, context_len=JOB.context_len)
        assert mem == row.instance.memory
        d = decode_instance(DSV3, pool, JOB, cfg, mem, concurrency=row.instance.concurrency)
        assert d.tpot_s == row.instance.tpot_s
        if cfg.expert_parallel and cfg.dp_attention > 1:
            assert cfg.max_num_batched_tokens == max(256, -(-cfg.max_num_seqs * (1 + cfg.speculative_tokens) // 256) * 256)
            assert mem.ep_buffer_bytes == deepep_ll_buffer_bytes(DSV3, cfg.max_num_batched_tokens, cfg.ep) + 2**30


LLAMA70 = load_model("llama-3.1-70b")
H100_64 = load_cluster("dgx-h100").with_gpus(64)
SHORT = ServeJob(input_len=1000, output_len=1000)


def test_prefill_instances_admit_a_full_pipeline():
    """A PP prefill instance runs PP micro-batches at once only if its running-request cap admits PP token
    budgets of prompts (vLLM counts the requests in flight against --max-num-seqs; SGLang splits
    --max-running-requests over PP). The 70B TP1 PP4 prefill of the 5P11D plan on 64 H100 wrote
    --max-num-seqs 8 (one 8,192-token budget of 1,000-token prompts) and was priced at 16.07 req/s, the rate
    of a full pipeline; it now admits 32 and keeps that rate, and at 8 it is priced at a quarter of it."""
    from dataclasses import replace

    from autoshard.costmodel.serve.disagg import prefill_seqs

    assert (prefill_seqs(8192, 1000, 4), prefill_seqs(8192, 1000, 1), prefill_seqs(8192, 30000, 4)) == (32, 8, 4)
    tables = tabulate_disagg(LLAMA70, H100_64, SHORT, enumerate_serve(LLAMA70, H100_64, SHORT), keep_all=True)
    pool = H100_64.pools[0]
    rows = {(r.engine.tp, r.engine.pp): r.instance for r in tables.prefill}
    full = rows[(1, 4)]
    assert full.config.max_num_seqs == 32 and round(full.requests_per_s, 2) == 16.07
    for (tp, pp), inst in rows.items():  # every instance admits PP budgets of prompts
        assert inst.config.max_num_seqs == pp * (inst.config.max_num_batched_tokens // 1000), (tp, pp)
    cfg = replace(full.config, max_num_seqs=8)
    part = prefill_instance(LLAMA70, pool, SHORT, cfg, serve_memory(LLAMA70, pool, cfg, context_len=SHORT.context_len))
    assert part.requests_per_s == full.requests_per_s / 4
