"""Prefill-only serving steps on DeepEP's high-throughput (normal) kernels: copies per token with the
group-limited router, the published normal-kernel table, and which steps use them."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from autoshard.costmodel.comm import DEEPEP_NIC_FRACTION, deepep_nic_link, ep_all_to_all_s
from autoshard.costmodel.moe import GroupLimit, domains_touched_per_token, ranks_per_token, remote_domains_per_token
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.ep_dispatch import (
    DEEPEP_NORMAL_NVL_FRACTION,
    deepep_normal_step,
    ht_copies_per_token,
    ht_dispatch_combine_s,
    uses_deepep_high_throughput,
)
from autoshard.costmodel.serve.sharding import FP8_WITH_BLOCK_SCALES, _links, ep_dispatch_s
from autoshard.costmodel.serve.step import step_time
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype
from autoshard.specs.layers import LayerKind

DSV3 = load_model("deepseek-v3")
HIDDEN, TOKENS = 7168, 4096

DEEPEP_NORMAL_GBPS = {8: (153, 158), 16: (43, 43), 32: (58, 57), 64: (51, 50)}
"""deepseek-ai/DeepEP docs/legacy.md (commit dd758caf), "Normal kernels with NVLink and RDMA
forwarding": H800 (~160 GB/s NVLink), one CX7 400 Gb/s NIC per GPU, 4096 tokens per rank, hidden 7168,
top-4 groups, top-8 of 256 experts, FP8 dispatch / BF16 combine; (dispatch, combine) bottleneck GB/s,
NVLink for EP 8 (intranode), RDMA otherwise. tests/legacy/test_internode.py counts the RDMA bytes as
every (token, node) pair its experts reach, the sender's own node included, and routes with one group
per node and min(nodes, 4) groups per token, groups scored by their best expert (amax: GroupLimit
score_top 1, which vLLM also uses without an expert bias)."""


def _pool(gpus: int):
    return load_cluster("hgx-h800").with_gpus(gpus).pools[0]


def _brute_touched(e: int, k: int, ranks: int, per_domain: int, groups: int, tg: int) -> float:
    """Every group choice, every k-subset of the chosen groups' experts: mean domains reached."""
    size, per_rank = e // groups, e // ranks
    total, count = 0, 0
    for chosen in itertools.combinations(range(groups), tg):
        experts = [x for g in chosen for x in range(g * size, (g + 1) * size)]
        for pick in itertools.combinations(experts, k):
            total += len({x // per_rank // per_domain for x in pick})
            count += 1
    return total / count


@pytest.mark.parametrize(
    "e,k,ranks,per,groups,tg",
    [(16, 3, 8, 2, 4, 2), (16, 4, 8, 1, 4, 2), (12, 2, 6, 3, 6, 3), (16, 3, 4, 2, 8, 3), (12, 3, 6, 2, 1, 1)],
)
def test_domains_touched_matches_brute_force(e, k, ranks, per, groups, tg):
    """Uniform picks (score_top 0): exact against every group choice and every pick."""
    assert domains_touched_per_token(e, k, ranks, per, GroupLimit(groups, tg)) == pytest.approx(
        _brute_touched(e, k, ranks, per, groups, tg), rel=1e-12
    )


@pytest.mark.parametrize("ranks", [2, 4, 8, 16, 32, 64])
def test_ungrouped_count_is_the_training_closed_form(ranks):
    """Without the group limit it is the training side's count (remote domains + the own one, ranks)."""
    touched = domains_touched_per_token(256, 8, ranks, 1)
    assert touched == pytest.approx(ranks_per_token(256, 8, ranks), rel=1e-12)
    assert touched * (ranks - 1) / ranks == pytest.approx(remote_domains_per_token(256, 8, ranks), rel=1e-12)


def test_group_limit_bounds_deepseek_nodes():
    """DeepSeek-V3 (8 groups of 32, top-4 groups, top-8) over 8 nodes of 8 ranks, one group a node,
    picks uniform within the chosen groups: a token reaches 4 x (1 - C(96, 8) / C(128, 8)) = 3.63
    nodes (at most 4), not the 5.30 of plain top-8 of 256; over 4 nodes 2.93, not 3.61; over 2 nodes
    every token reaches both unless all its experts fall in one node's groups."""
    uniform = GroupLimit(8, 4)
    grouped = domains_touched_per_token(256, 8, 64, 8, uniform)
    assert grouped == pytest.approx(4 * (1 - math.comb(96, 8) / math.comb(128, 8)), rel=1e-12)
    assert grouped == pytest.approx(3.629, abs=1e-3)
    assert domains_touched_per_token(256, 8, 64, 8) == pytest.approx(5.295, abs=1e-3)
    assert domains_touched_per_token(256, 8, 32, 8, uniform) == pytest.approx(2.928, abs=1e-3)
    assert domains_touched_per_token(256, 8, 32, 8) == pytest.approx(3.614, abs=1e-3)
    # 2 nodes: miss one node only when the 4 chosen groups split 4-0 (2 / 70) or the 8 experts avoid it
    split = [math.comb(4, j) * math.comb(4, 4 - j) / 70 for j in range(5)]
    miss = sum(p * math.comb(128 - 32 * j, 8) / math.comb(128, 8) for j, p in enumerate(split))
    assert domains_touched_per_token(256, 8, 16, 8, uniform) == pytest.approx(2 * (1 - miss), rel=1e-12)


def test_scored_groups_nearly_always_supply_an_expert():
    """As the engines route (groups scored by their top-2, `GroupLimit.of`), a chosen group nearly
    always supplies one of the 8 experts, so over 8 nodes a token reaches close to all 4 chosen
    groups' nodes and over 4 nodes (two groups each) close to the 4 x (1 - C(6, 4) / C(8, 4)) = 3.14
    nodes its chosen groups sit on."""
    limit = GroupLimit.of(DSV3.moe, engine="vllm")
    assert limit == GroupLimit(8, 4, 2, True) == GroupLimit.of(DSV3.moe)
    over8 = domains_touched_per_token(256, 8, 64, 8, limit)
    assert 3.85 <= over8 <= 4.0, over8
    over4 = domains_touched_per_token(256, 8, 32, 8, limit)
    assert over4 == pytest.approx(3.12, abs=0.01)
    assert over4 < 4 * (1 - math.comb(6, 4) / math.comb(8, 4)) == pytest.approx(3.143, abs=1e-3)


@pytest.mark.parametrize("ep", sorted(DEEPEP_NORMAL_GBPS))
def test_normal_kernels_match_deepeps_table(ep):
    """DeepEP's setting through the pricing: the predicted time against the time its table implies
    (its counted bytes / its bandwidth). Intranode EP 8 is where DEEPEP_NORMAL_NVL_FRACTION comes from
    (+3.6 %: the combine's 158 GB/s and the kernels' latencies); EP 16 is NVLink-bound (the fan-out
    of 6.5 ranks a token), EP 32 and 64 NIC-bound (actual remote traffic 3/4 and 7/8 of the counted
    bytes, at 43.5 GB/s of 50, DEEPEP_NIC_FRACTION): all within 6 %."""
    pool = _pool(ep)
    nodes = max(1, ep // 8)
    groups, tg = (nodes, min(nodes, 4)) if nodes > 1 else (1, 1)
    model = DSV3.model_copy(
        update={"moe": DSV3.moe.model_copy(update={"num_groups": groups if groups > 1 else None,
                                                   "topk_groups": tg if groups > 1 else None,
                                                   "expert_bias": False})}  # amax group scores
    )
    cfg = ServeConfig(dp_attention=ep, expert_parallel=True, weight_dtype=WeightDtype.FP8)
    limit = GroupLimit(groups, tg, 1, True)
    assert GroupLimit.of(model.moe, engine="vllm") == (limit if tg < groups else None)
    counted = domains_touched_per_token(256, 8, ep, 8, limit) if nodes > 1 else None
    nvl, remote = ht_copies_per_token(model, cfg, 8)
    if nodes == 1:
        counted, remote_expected = nvl, 0.0  # intranode: received copies per token
    else:
        remote_expected = counted * (nodes - 1) / nodes
    assert remote == pytest.approx(remote_expected, rel=1e-12)
    both = ht_dispatch_combine_s(
        model, cfg, pool, routed=TOKENS, per_domain=8, dispatch_bytes=FP8_WITH_BLOCK_SCALES,
        combine_bytes=2.0, imbalance=1.0,
    )
    implied = sum(
        TOKENS * counted * HIDDEN * b / (gbps * 1e9)
        for b, gbps in zip((FP8_WITH_BLOCK_SCALES, 2.0), DEEPEP_NORMAL_GBPS[ep], strict=True)
    )
    assert both == pytest.approx(implied, rel=0.05 if nodes == 1 else 0.06), (ep, both, implied)


def test_prefill_only_steps_use_the_normal_kernels_and_decode_keeps_low_latency():
    """DeepSeek-V3 FP8 on 16 H800 (DP = EP 16): a decode-only step's EP term is the low-latency pricing
    (every top-8 copy on the NIC, 256-token passes), a prefill instance's step the normal kernels' (once
    per remote node + NVLink fan-out): at 8,192 prompt tokens per rank 2.5x less all-to-all (H800's
    200 GB/s NVLink bounds the fan-out of 5.3 ranks a token; the NIC carries 0.96 copies, not 4).
    vLLM keeps one backend per engine, so the same prompt-only step of an aggregated vLLM engine
    (`deepep_low_latency`) is priced on the low-latency kernels, and SGLang's `--deepep-mode auto`
    takes the normal kernels for any step with prompt tokens, a mixed one included."""
    pool = _pool(16)
    aggregated = ServeConfig(dp_attention=16, expert_parallel=True, weight_dtype=WeightDtype.FP8)
    cfg = replace(aggregated, role="prefill")
    assert uses_deepep_high_throughput(DSV3, pool, cfg)
    link = _links(pool, cfg)[1]
    ll = ep_dispatch_s(DSV3, LayerKind.MOE, cfg, link, routed=8192, pool=pool)
    ht = ep_dispatch_s(DSV3, LayerKind.MOE, cfg, link, routed=8192, pool=pool, high_throughput=True)
    assert 2.3 <= ll / ht <= 2.7, ll / ht
    prefill = step_time(DSV3, pool, cfg, decode_seqs=0, prefill_tokens=8192, prefills=8192 / 2000,
                        prefill_len=2000, context_len=0, balanced_prefill=True)
    assert prefill.ep_comm_s == pytest.approx(DSV3.num_moe_layers * ht, rel=1e-9)
    assert deepep_normal_step(DSV3, pool, cfg, prefill=True)
    assert not deepep_normal_step(DSV3, pool, aggregated, prefill=True)
    same = step_time(DSV3, pool, aggregated, decode_seqs=0, prefill_tokens=8192, prefills=8192 / 2000,
                     prefill_len=2000, context_len=0, balanced_prefill=True)
    assert same.ep_comm_s == pytest.approx(DSV3.num_moe_layers * ll, rel=1e-9)
    sglang = replace(aggregated, engine="sglang")
    mixed = step_time(DSV3, pool, sglang, decode_seqs=64, prefill_tokens=8192 - 64, prefills=(8192 - 64) / 2000,
                      prefill_len=2000, context_len=2000, balanced_prefill=True)
    ht_mixed = ep_dispatch_s(DSV3, LayerKind.MOE, sglang, link, routed=8192, pool=pool, high_throughput=True)
    assert deepep_normal_step(DSV3, pool, sglang, prefill=True)
    assert not deepep_normal_step(DSV3, pool, sglang, prefill=False)
    assert mixed.ep_comm_s == pytest.approx(DSV3.num_moe_layers * ht_mixed, rel=1e-9)
    decode = step_time(DSV3, pool, aggregated, decode_seqs=128, prefill_tokens=0, prefills=0, prefill_len=2000,
                       context_len=2000)
    per_layer = ep_dispatch_s(DSV3, LayerKind.MOE, aggregated, link, routed=128, pool=pool)
    assert decode.ep_comm_s == pytest.approx(DSV3.num_moe_layers * per_layer, rel=1e-9)
    elements = 128 * 8 * HIDDEN
    assert per_layer > sum(ep_all_to_all_s(elements * b, 16, 8, pool) for b in (FP8_WITH_BLOCK_SCALES, 2.0))


def test_engines_without_deepep_keep_the_per_copy_pricing():
    """MI300X engines (MORI, not DeepEP) and EP = TP engines price a prefill step as before."""
    pool = load_cluster("mi300x").with_gpus(16).pools[0]
    cfg = ServeConfig(dp_attention=16, expert_parallel=True, weight_dtype=WeightDtype.FP8)
    assert not uses_deepep_high_throughput(DSV3, pool, cfg)
    link = _links(pool, cfg)[1]
    kw = dict(routed=8192, pool=pool)
    assert ep_dispatch_s(DSV3, LayerKind.MOE, cfg, link, high_throughput=True, **kw) == ep_dispatch_s(
        DSV3, LayerKind.MOE, cfg, link, **kw
    )
    h800 = _pool(8)
    tp_only = ServeConfig(tp=8, expert_parallel=True, weight_dtype=WeightDtype.FP8)
    assert not uses_deepep_high_throughput(DSV3, h800, tp_only)


def test_nvlink_fraction_is_the_intranode_row():
    """7/8 of 153 GB/s (the copies that leave the rank) on H800's 200 GB/s NVLink per direction."""
    assert DEEPEP_NORMAL_NVL_FRACTION == pytest.approx(7 / 8 * 153 / 200, abs=0.005)


def test_a_saturated_prefill_instance_fills_every_ranks_budget():
    """At full load every DP rank of a prefill instance runs its own 8,192-token budget: the step is the
    one-rank step at that budget (the per-rank GEMMs and attention of exactly 8,192 tokens), not the
    busiest rank of whole 2,000-token prompts arriving at random (`expected_max_prefill_tokens`: 1.96x
    the budget over 16 ranks), which `step_time` still prices for steps of an engine at partial load."""
    from autoshard.costmodel.serve.disagg import prefill_instance
    from autoshard.costmodel.serve.memory import serve_memory
    from autoshard.costmodel.serve.sharding import expected_max_prefill_tokens
    from autoshard.specs.job import ServeJob

    pool = load_cluster("dgx-h200").with_gpus(16).pools[0]
    cfg = ServeConfig(dp_attention=16, expert_parallel=True, weight_dtype=WeightDtype.FP8)
    job = ServeJob(input_len=2000, output_len=1, weight_dtype=WeightDtype.FP8)
    inst = prefill_instance(DSV3, pool, job, cfg, serve_memory(DSV3, pool.gpu, cfg, context_len=job.context_len))
    kw = dict(decode_seqs=0, prefill_tokens=8192, prefills=8192 / 2000, prefill_len=2000, context_len=0)
    balanced = step_time(DSV3, pool, cfg, balanced_prefill=True, **kw)
    busiest = step_time(DSV3, pool, cfg, **kw)
    assert inst.step == balanced
    assert inst.requests_per_s == pytest.approx(16 * 8192 / 2000 / balanced.total_s)
    assert expected_max_prefill_tokens(8192, ranks=16, prompt_tokens=2000) / 8192 == pytest.approx(1.956, abs=0.005)
    assert busiest.gemm_s > 1.3 * balanced.gemm_s and busiest.ep_comm_s == pytest.approx(balanced.ep_comm_s)
    # one DP rank: nothing to balance
    one = ServeConfig(tp=8, expert_parallel=True, weight_dtype=WeightDtype.FP8)
    h200 = load_cluster("dgx-h200").with_gpus(8).pools[0]
    assert step_time(DSV3, h200, one, balanced_prefill=True, **kw) == step_time(DSV3, h200, one, **kw)


def test_deepep_nic_fraction_is_the_tables_remote_rate():
    """DEEPEP_NIC_FRACTION from DeepEP's internode rows: the remote (nodes - 1) / nodes of the bytes its
    test counts, over a 50 GB/s CX7, for EP 32 and 64, dispatch and combine (0.855-0.893)."""
    rates = [gbps * (ep // 8 - 1) / (ep // 8) / 50 for ep in (32, 64) for gbps in DEEPEP_NORMAL_GBPS[ep]]
    assert min(rates) <= DEEPEP_NIC_FRACTION <= max(rates)
    assert DEEPEP_NIC_FRACTION == pytest.approx(sum(rates) / len(rates), abs=0.005)
    pool = _pool(32)
    assert deepep_nic_link(pool).bytes_per_s == pytest.approx(pool.node.inter_node_gbps * 1e9 * DEEPEP_NIC_FRACTION)
