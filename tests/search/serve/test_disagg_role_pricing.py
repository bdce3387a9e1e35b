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
