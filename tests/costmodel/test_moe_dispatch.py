"""MoE token dispatch (autoshard.costmodel.moe): closed forms and brute-force cross-checks."""

from __future__ import annotations

import itertools
import math

import pytest

from autoshard.costmodel.comm import DEEPEP_NIC_FRACTION, Collective, collective_time_s, group_links
from autoshard.costmodel.moe import dispatch_time_s, imbalance_factor, ranks_per_token, remote_domains_per_token
from autoshard.parallel import MoeDispatcher, ParallelDims
from autoshard.specs import load_cluster

H100 = load_cluster("dgx-h100").with_gpus(64).primary


def _brute_remote(num_experts: int, top_k: int, domains: int) -> float:
    """Average over every top_k expert set of the number of other domains it touches (sender in domain 0)."""
    per = num_experts // domains
    total = count = 0
    for chosen in itertools.combinations(range(num_experts), top_k):
        total += len({e // per for e in chosen} - {0})
        count += 1
    return total / count


@pytest.mark.parametrize(("experts", "k", "domains"), [(8, 2, 2), (8, 2, 4), (12, 3, 3), (16, 4, 4), (16, 1, 8)])
def test_remote_domains_match_brute_force(experts, k, domains):
    assert remote_domains_per_token(experts, k, domains) == pytest.approx(_brute_remote(experts, k, domains))


def _brute_ranks(num_experts: int, top_k: int, ranks: int) -> float:
    """Average over every top_k expert set of the number of ranks (the sender's included) it touches."""
    per = num_experts // ranks
    sets = list(itertools.combinations(range(num_experts), top_k))
    return sum(len({e // per for e in chosen}) for chosen in sets) / len(sets)


@pytest.mark.parametrize(("experts", "k", "ranks"), [(8, 2, 2), (8, 2, 8), (12, 3, 3), (16, 4, 4), (16, 4, 8), (16, 1, 8)])
def test_ranks_per_token_match_brute_force(experts, k, ranks):
    assert ranks_per_token(experts, k, ranks) == pytest.approx(_brute_ranks(experts, k, ranks))


def test_ranks_per_token_closed_forms():
    # Qwen3-235B: 128 experts, top-8, EP 8 (16 experts per rank): 8 * (1 - C(112,8)/C(128,8)) = 5.34
    # copies of a token, not 8; one expert per rank (Mixtral 8 experts over EP 8) leaves top_k copies
    expect = 8 * (1 - math.comb(112, 8) / math.comb(128, 8))
    assert ranks_per_token(128, 8, 8) == pytest.approx(expect)
    assert 5.3 < expect < 5.4
    assert ranks_per_token(8, 2, 8) == pytest.approx(2.0)
    assert ranks_per_token(128, 8, 1) == 1.0


def test_remote_domains_closed_form_qwen3_ep32():
    # 128 experts over 4 nodes, top-8: 3 * (1 - C(96,8)/C(128,8)) = 2.68 remote nodes, not 8 * 3/4 = 6
    expect = 3 * (1 - math.comb(96, 8) / math.comb(128, 8))
    assert remote_domains_per_token(128, 8, 4) == pytest.approx(expect)
    assert 2.6 < expect < 2.75
    assert remote_domains_per_token(128, 8, 1) == 0.0


def test_imbalance_factor():
    assert imbalance_factor(1, 100) == 1.0
    assert imbalance_factor(8, 1000) == pytest.approx(1 + math.sqrt(2 * math.log(8) / 1000))
    assert imbalance_factor(64, 1000) > imbalance_factor(8, 1000) > imbalance_factor(8, 100000) > 1.0


T, H, K, E = 2048, 4096, 8, 128
PAIRS = T * K * H * 2  # bytes of the routed token copies one GPU sends


def test_alltoall_inside_one_node_runs_on_nvlink():
    eff = H100.gpu.efficiency
    one = 7 / 8 * PAIRS / (450e9 * eff.intra_node_bw) + 3 * eff.intra_node_latency_us * 1e-6
    got = dispatch_time_s(MoeDispatcher.ALLTOALL, tokens=T, hidden=H, top_k=K, num_experts=E, ep=8, etp=1, pool=H100)
    assert got == pytest.approx(2 * one)


def test_alltoall_across_nodes_is_bound_by_this_gpus_nic():
    eff = H100.gpu.efficiency
    nic = 50e9 * eff.inter_node_bw
    one = 24 / 32 * PAIRS / nic + 5 * eff.inter_node_latency_us * 1e-6  # 24 of 32 ranks are on other nodes
    got = dispatch_time_s(MoeDispatcher.ALLTOALL, tokens=T, hidden=H, top_k=K, num_experts=E, ep=32, etp=1, pool=H100)
    assert got == pytest.approx(2 * one)


def test_flex_sends_each_token_once_per_remote_node():
    eff = H100.gpu.efficiency
    remote = T * remote_domains_per_token(E, K, 4) * H * 2
    deepep = 50e9 * DEEPEP_NIC_FRACTION  # flex's RDMA kernels, not NCCL's fitted share of the NIC
    one = max(7 / 8 * PAIRS / (450e9 * eff.intra_node_bw), remote / deepep) + 5 * eff.inter_node_latency_us * 1e-6
    flex = dispatch_time_s(MoeDispatcher.FLEX, tokens=T, hidden=H, top_k=K, num_experts=E, ep=32, etp=1, pool=H100)
    a2a = dispatch_time_s(MoeDispatcher.ALLTOALL, tokens=T, hidden=H, top_k=K, num_experts=E, ep=32, etp=1, pool=H100)
    assert flex == pytest.approx(2 * one)
    assert flex < 0.5 * a2a
    # over NVLink a token goes once per destination rank (DeepEP's is_token_in_rank layout), not once
    # per expert: across nodes the NIC part still dominates here
    assert 7 / 8 * T * ranks_per_token(E, K, 32) * H * 2 / (450e9 * eff.intra_node_bw) < remote / deepep


def test_flex_inside_one_node_sends_each_token_once_per_rank():
    """EP 8 in one node, 128 experts top-8: alltoall sends 8 copies of a token (7/8 of them leave the
    GPU), flex one per rank holding one of its experts, 5.34 on average (7/8 of them leave)."""
    eff = H100.gpu.efficiency
    lat = 3 * eff.intra_node_latency_us * 1e-6
    kw = dict(tokens=T, hidden=H, top_k=K, num_experts=E, ep=8, etp=1, pool=H100)
    flex = dispatch_time_s(MoeDispatcher.FLEX, **kw)
    one = 7 / 8 * T * ranks_per_token(E, K, 8) * H * 2 / (450e9 * eff.intra_node_bw) + lat
    assert flex == pytest.approx(2 * one)
    a2a = dispatch_time_s(MoeDispatcher.ALLTOALL, **kw)
    assert (flex / 2 - lat) / (a2a / 2 - lat) == pytest.approx(ranks_per_token(E, K, 8) / K)
    # one expert per rank: nothing to deduplicate
    mixtral = dict(tokens=T, hidden=H, top_k=2, num_experts=8, ep=8, etp=1, pool=H100)
    assert dispatch_time_s(MoeDispatcher.FLEX, **mixtral) == pytest.approx(dispatch_time_s(MoeDispatcher.ALLTOALL, **mixtral))


def test_allgather_volume_does_not_depend_on_top_k():
    kw = dict(tokens=T, hidden=H, num_experts=E, ep=8, etp=1, pool=H100)
    t2 = dispatch_time_s(MoeDispatcher.ALLGATHER, top_k=2, **kw)
    assert t2 == dispatch_time_s(MoeDispatcher.ALLGATHER, top_k=8, **kw)
    # top-2 of 8 experts: all-gather moves 8x the tokens, all-to-all 2x: all-to-all is cheaper
    assert dispatch_time_s(MoeDispatcher.ALLTOALL, top_k=2, **kw) < t2


def test_no_dispatch_without_expert_parallelism():
    assert dispatch_time_s(MoeDispatcher.ALLTOALL, tokens=T, hidden=H, top_k=K, num_experts=E, ep=1, etp=1, pool=H100) == 0.0


# Mixtral 8x7B on 64 CDNA 3 GPUs, the plan of training_runs.yaml's aac-mi325x-mixtral-8x7b-64gpu-ep8-bf16
# (TP 1, EP 8, DP 64, micro-batch 2 x 4,096 tokens, top-2 of 8 experts, hidden 4,096), on the bundled
# MI300X nodes: the same 8-GPU Infinity Fabric mesh (7 links of 64 GB/s per direction per GPU) and 8 x
# 400 Gb/s NICs as the AAC11 MI325X nodes.
MI300X = load_cluster("mi300x").with_gpus(64).primary
MIXTRAL_TOKENS = 2 * 4096


def test_ep8_alltoall_on_the_infinity_fabric_mesh_uses_all_seven_links():
    """An EP-8 group of consecutive ranks is one node (Megatron's tp-ep-dp order, TP 1). On the full
    mesh every GPU has a direct 64 GB/s link to each of its 7 peers, and an all-to-all sends a
    different 1/8 of its buffer to each peer at once: 7/8 of S over all 7 links, 448 GB/s (a ring
    collective would run one ring per link pair and needs RCCL's several rings to approach it).
    Per micro-batch and MoE layer: dispatch + combine forward, the same backward; 64 per step."""
    eff = MI300X.gpu.efficiency
    pairs = MIXTRAL_TOKENS * 2 * 4096 * 2  # 8,192 tokens x top-2 copies x h x BF16 = 134 MB
    one = 7 / 8 * pairs / (7 * 64e9 * eff.intra_node_bw) + 3 * eff.intra_node_latency_us * 1e-6
    fwd = dispatch_time_s(MoeDispatcher.ALLTOALL, tokens=MIXTRAL_TOKENS, hidden=4096, top_k=2, num_experts=8,
                          ep=8, etp=1, pool=MI300X)
    assert fwd == pytest.approx(2 * one)
    step = 2 * fwd * 32 * 2  # forward + backward, 32 MoE layers, 2 micro-batches
    assert step == pytest.approx(0.0806, abs=5e-4)  # the 0.08 s the row's evidence quotes
    # two links of a single ring would take 3.5x as long
    assert 7 / 8 * pairs / (2 * 64e9 * eff.intra_node_bw) / (one - 3 * eff.intra_node_latency_us * 1e-6) == pytest.approx(3.5)


def test_mixtral_expert_data_parallel_group_crosses_nodes_on_one_nic_per_gpu():
    """Expert-DP for EP 8 x DP 64: the 8 ranks holding the same expert sit 8 apart, one per node, so the
    group's ring leaves every node through each member's own NIC (all 8 groups run at once, one per
    NIC), while the dense DP group of 64 consecutive ranks has 8 members per node and 8 NICs. Per
    step (distributed optimizer): FP32 reduce-scatter + BF16 all-gather of the 5.64 B expert
    parameters a GPU holds (32 layers x 3 x 4,096 x 14,336): 0.66 s."""
    dims = ParallelDims(tp=1, pp=1, dp=64, cp=1, vpp=1, ep=8, etp=1)
    links = group_links(MI300X, dims)
    eff = MI300X.gpu.efficiency
    assert links.ep.crosses_nodes is False and links.edp.crosses_nodes is True
    assert links.edp.bytes_per_s == pytest.approx(50e9 * eff.inter_node_bw)
    assert links.dp.bytes_per_s == pytest.approx(min(8 * 50e9 * eff.inter_node_bw, 448e9 * eff.intra_node_bw))
    expert = 32 * 3 * 4096 * 14336
    t = (collective_time_s(Collective.REDUCE_SCATTER, 4 * expert, 8, links.edp)
         + collective_time_s(Collective.ALL_GATHER, 2 * expert, 8, links.edp))
    closed = 7 / 8 * 6 * expert / (50e9 * eff.inter_node_bw) + 2 * 3 * eff.inter_node_latency_us * 1e-6
    assert t == pytest.approx(closed)
    assert t == pytest.approx(0.658, abs=2e-3)
